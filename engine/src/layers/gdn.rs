//! One Gated DeltaNet layer on the device: its weights as the kernels read them, its carried state
//! (the conv history and the fp32 delta-rule state), its scratch, and its three launches:
//!
//! 1. [`gdn_in_proj_bf16`] or [`gdn_in_proj_nvfp4`]: [in_proj_qkv; in_proj_z; in_proj_b;
//!    in_proj_a]·x in one grouped GEMV, bf16 or NVFP4 weights, with the causal conv, SiLU and the
//!    gates β and α in the epilogue;
//! 2. [`gdn_delta_rule_normed`]: the l2 norms of q and k, the delta rule on the state (read
//!    once, written once), o = Sᵀq̂, and the gated RMSNorm of each head in its epilogue (one block
//!    a head, so the norm is one block reduction);
//! 3. out_proj: [`gemv_bf16`], or [`gemv_nvfp4`] for NVFP4 weights, the plain GEMV of the normed
//!    heads.
//!
//! The norm had two other places once, both slower and removed (session 42; the H200 figures in
//! BENCHMARKS.md, GDN section): the last block of each head of a column-split state update (a
//! fence and a counter a head; the layer 40.51 µs against 39.08 in bf16), and out_proj's
//! prologue after a delta rule with no cross-block step (46.67 µs: every out_proj block
//! renormalised its heads from L2 before its products).

use half::bf16;
use kernel_dsl::e2m1_pairs::Layout;
use kernel_dsl::{Arch, DevPtr, DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::gdn::delta_rule_normed::gdn_delta_rule_normed;
use crate::kernels::gdn::in_proj::{gdn_in_proj_bf16, gdn_in_proj_nvfp4, nvfp4_codes_layout};
use crate::kernels::gemv_bf16::gemv_bf16;
use crate::kernels::gemv_nvfp4::gemv_nvfp4;
use crate::layers::matrix::{MatrixOnDevice, matrix_bytes};
use crate::layers::paired_codes;
use crate::model::config::ModelConfig;
use crate::model::nvfp4::Nvfp4Matrix;
use crate::model::weights::GdnWeights;

/// The conv kernel size the in_proj kernel implements (the published one).
pub const CONV_KERNEL: usize = 4;
/// The largest K_SPLIT among out_proj's tile candidates: its partial sums are sized for it.
const MAX_OUT_SPLIT: usize = 16;

/// The shape of a GDN layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnShape {
    pub hidden: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    /// The gated norm's eps (rms_norm_eps).
    pub eps: f32,
    /// The output gate: σ if true, SiLU otherwise.
    pub sigmoid_gate: bool,
}

impl GdnShape {
    pub fn from_config(cfg: &ModelConfig) -> Result<GdnShape> {
        if cfg.linear_conv_kernel != CONV_KERNEL {
            return Err(Error::Buffer(format!(
                "the GDN kernels implement a conv of kernel {CONV_KERNEL}; the config has {}",
                cfg.linear_conv_kernel
            )));
        }
        Ok(GdnShape {
            hidden: cfg.hidden_size,
            key_heads: cfg.linear_key_heads,
            value_heads: cfg.linear_value_heads,
            key_dim: cfg.linear_key_dim,
            value_dim: cfg.linear_value_dim,
            eps: cfg.rms_norm_eps,
            sigmoid_gate: cfg.gdn_gate_sigmoid,
        })
    }

    /// Channels of the conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Width of z, of o and of out_proj's input.
    pub fn z_dim(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// Rows of the stacked input projection: qkv, z, b, a.
    pub fn in_rows(&self) -> usize {
        self.conv_dim() + self.z_dim() + 2 * self.value_heads
    }

    /// Elements of the fp32 delta-rule state.
    pub fn state_len(&self) -> usize {
        self.value_heads * self.key_dim * self.value_dim
    }

    /// Bytes the state update ([`gdn_delta_rule_normed`]) moves: the state read and written, q, k,
    /// v, z, the gates and the norm weight read, y written in bf16.
    pub fn state_update_bytes(&self) -> usize {
        let qkvz = self.conv_dim() + self.z_dim() + 2 * self.value_heads;
        8 * self.state_len() + 4 * qkvz + 2 * self.value_dim + 2 * self.z_dim()
    }

    /// Bytes of the stacked input projection's weights: bf16, or NVFP4 (0.5625 B a value: codes
    /// and e4m3 block scales, plus the four matrices' global scales).
    pub fn in_proj_weight_bytes(&self, nvfp4: bool) -> usize {
        matrix_bytes(self.in_rows(), self.hidden, nvfp4, 4)
    }

    /// Bytes of out_proj's weights: bf16, or NVFP4 (codes, e4m3 block scales, one global scale).
    pub fn out_proj_weight_bytes(&self, nvfp4: bool) -> usize {
        matrix_bytes(self.hidden, self.z_dim(), nvfp4, 1)
    }

    /// Bytes of the layer's weights: the input projection and out_proj in their formats, the conv
    /// and the norm in bf16, A_log and dt_bias in f32.
    pub fn weight_bytes(&self, nvfp4_in_proj: bool, nvfp4_out_proj: bool) -> usize {
        self.in_proj_weight_bytes(nvfp4_in_proj)
            + self.out_proj_weight_bytes(nvfp4_out_proj)
            + 2 * (CONV_KERNEL * self.conv_dim() + self.value_dim)
            + 4 * 2 * self.value_heads
    }

    /// Bytes one token's pass over the layer must move at least: the weights, x, the conv history
    /// read and written, the state update's traffic, y.
    pub fn layer_bytes(&self, nvfp4_in_proj: bool, nvfp4_out_proj: bool) -> usize {
        let d = self.hidden;
        let conv_hist = 2 * 4 * (CONV_KERNEL - 1) * self.conv_dim();
        self.weight_bytes(nvfp4_in_proj, nvfp4_out_proj) + 2 * d + conv_hist + self.state_update_bytes() + 2 * d
    }
}

/// The stacked input projection [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a] in bf16.
pub fn stack_in_proj(w: &GdnWeights) -> Vec<bf16> {
    [&w.in_qkv, &w.in_z, &w.in_b, &w.in_a].iter().flat_map(|l| l.w.iter().map(|&v| bf16::from_f32(v))).collect()
}

/// The stacked input projection on the device.
#[derive(Debug)]
pub enum InProjOnDevice {
    /// [in_rows, hidden].
    Bf16(DeviceBuffer<bf16>),
    /// The four matrices' rows stacked: codes [in_rows, hidden/2] in `layout` (ModelOpt's, or
    /// the paired layout the tensor-core path decodes: [`nvfp4_codes_layout`]), e4m3 block
    /// scales [in_rows, hidden/16], global scales [4] (qkv, z, b, a).
    Nvfp4 { packed: DeviceBuffer<E2m1x2>, scales: DeviceBuffer<E4m3>, scale2: DeviceBuffer<f32>, layout: Layout },
}

/// A GDN layer's weights on the device: the input projection bf16 or NVFP4, the rest bf16
/// (A_log and dt_bias in f32).
#[derive(Debug)]
pub struct GdnWeightsOnDevice {
    pub shape: GdnShape,
    pub in_proj: InProjOnDevice,
    /// [conv_dim, 4].
    pub conv: DeviceBuffer<bf16>,
    /// [value_heads].
    pub a_log: DeviceBuffer<f32>,
    pub dt_bias: DeviceBuffer<f32>,
    /// [value_dim].
    pub norm: DeviceBuffer<bf16>,
    /// [hidden, z_dim]: bf16, or NVFP4 (run by [`gemv_nvfp4`], the plain GEMV paths only).
    pub out_proj: MatrixOnDevice,
}

impl GdnWeightsOnDevice {
    /// Uploads `w`, its matrices, conv and norm rounded to bf16 (exact for a bf16 checkpoint).
    pub fn upload_bf16(gpu: &Gpu, shape: GdnShape, w: &GdnWeights) -> Result<Self> {
        Self::upload(gpu, shape, w, None, None, Layout::Nibbles)
    }

    /// Uploads the input projection from its four NVFP4 matrices (qkv, z, b, a), its codes in
    /// ModelOpt's layout, and the rest of `w` (whose input projections are not read) in bf16.
    pub fn upload_nvfp4(gpu: &Gpu, shape: GdnShape, in_proj: [&Nvfp4Matrix; 4], w: &GdnWeights) -> Result<Self> {
        Self::upload(gpu, shape, w, Some(in_proj), None, Layout::Nibbles)
    }

    /// Uploads `w` with the input projection from its four NVFP4 matrices (qkv, z, b, a) where
    /// given, its codes in `in_proj_layout` (what the tiles' kernel reads:
    /// [`GdnTiles::in_proj_layout`]), and out_proj from its NVFP4 matrix [hidden, z_dim] where
    /// given, the rest in bf16. Each matrix goes up once, in the format it runs in.
    pub fn upload(
        gpu: &Gpu,
        shape: GdnShape,
        w: &GdnWeights,
        in_proj: Option<[&Nvfp4Matrix; 4]>,
        out_proj: Option<&Nvfp4Matrix>,
        in_proj_layout: Layout,
    ) -> Result<Self> {
        let (d, hv) = (shape.hidden, shape.value_heads);
        let rows = [shape.conv_dim(), shape.z_dim(), hv, hv];
        let names = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"];
        let nvfp4_rows = in_proj.iter().flat_map(|m| m.iter().zip(rows).zip(names));
        for ((m, r), name) in nvfp4_rows.chain(out_proj.iter().map(|m| ((m, d), "out_proj"))) {
            if m.rows != r {
                return Err(Error::Buffer(format!("GDN {name} in NVFP4: {} rows for a shape that needs {r}", m.rows)));
            }
        }
        Self::check_lengths(shape, w)?;
        let in_proj = match in_proj {
            // The four matrices stacked with their global scales, their codes and scales checked
            // against `hidden` columns; the kernel finds each matrix's rows itself.
            Some(m) => match MatrixOnDevice::nvfp4_in(gpu, "GDN input projection", &m, d, in_proj_layout)? {
                MatrixOnDevice::Nvfp4 { packed, scales, scale2, .. } => {
                    InProjOnDevice::Nvfp4 { packed, scales, scale2, layout: in_proj_layout }
                }
                MatrixOnDevice::Bf16(_) => unreachable!("MatrixOnDevice::nvfp4 makes NVFP4"),
            },
            None => InProjOnDevice::Bf16(gpu.upload(&stack_in_proj(w))?),
        };
        let out_proj = match out_proj {
            Some(m) => MatrixOnDevice::nvfp4(gpu, "GDN out_proj", &[m], shape.z_dim())?,
            None => MatrixOnDevice::bf16(gpu, &w.out.w)?,
        };
        let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        Ok(GdnWeightsOnDevice {
            shape,
            in_proj,
            conv: gpu.upload(&to_bf16(&w.conv))?,
            a_log: gpu.upload(&w.a_log)?,
            dt_bias: gpu.upload(&w.dt_bias)?,
            norm: gpu.upload(&to_bf16(&w.norm))?,
            out_proj,
        })
    }

    /// Rearranges the NVFP4 input projection's codes into `layout` where they are in another
    /// ([`paired_codes::rearrange`], through the host: for tests and tools that run one upload at
    /// tile sets whose kernels read different layouts). Nothing to do for bf16 weights.
    pub fn set_in_proj_layout(&mut self, gpu: &Gpu, layout: Layout) -> Result<()> {
        let InProjOnDevice::Nvfp4 { packed, layout: now, .. } = &mut self.in_proj else { return Ok(()) };
        paired_codes::rearrange(gpu, packed, *now, layout)?;
        *now = layout;
        Ok(())
    }

    fn check_lengths(shape: GdnShape, w: &GdnWeights) -> Result<()> {
        let (d, hv) = (shape.hidden, shape.value_heads);
        let checks = [
            ("in_proj_qkv", w.in_qkv.w.len(), shape.conv_dim() * d),
            ("in_proj_z", w.in_z.w.len(), shape.z_dim() * d),
            ("in_proj_b", w.in_b.w.len(), hv * d),
            ("in_proj_a", w.in_a.w.len(), hv * d),
            ("conv1d", w.conv.len(), CONV_KERNEL * shape.conv_dim()),
            ("A_log", w.a_log.len(), hv),
            ("dt_bias", w.dt_bias.len(), hv),
            ("norm", w.norm.len(), shape.value_dim),
            ("out_proj", w.out.w.len(), d * shape.z_dim()),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("GDN {what}: {got} values for a shape that needs {want}")));
            }
        }
        let biased = [&w.in_qkv, &w.in_z, &w.in_b, &w.in_a, &w.out].iter().any(|l| l.bias.is_some());
        if biased {
            return Err(Error::Buffer("GDN projections have no bias in this model".to_owned()));
        }
        Ok(())
    }
}

/// What a GDN layer carries from token to token, zero at the start of a sequence.
#[derive(Debug)]
pub struct GdnStateOnDevice {
    /// The last 3 conv inputs [3, conv_dim], oldest first, f32.
    pub conv_hist: DeviceBuffer<f32>,
    /// [value_heads, key_dim, value_dim], f32.
    pub state: DeviceBuffer<f32>,
}

impl GdnStateOnDevice {
    pub fn new(gpu: &Gpu, shape: GdnShape) -> Result<GdnStateOnDevice> {
        let mut s = GdnStateOnDevice {
            conv_hist: gpu.alloc((CONV_KERNEL - 1) * shape.conv_dim())?,
            state: gpu.alloc(shape.state_len())?,
        };
        s.reset(gpu)?;
        Ok(s)
    }

    /// Back to the start of a sequence: no history, a zero state.
    pub fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.fill_bytes(&mut self.conv_hist, 0)?;
        gpu.fill_bytes(&mut self.state, 0)
    }
}

/// What one GDN pass writes besides its output and the state. The counters must be zero before
/// the first pass; every pass leaves them zero.
#[derive(Debug)]
pub struct GdnScratch {
    /// The in_proj epilogue's output [in_rows]: conv'd q, k, v, then z, β, α (f32).
    pub proj: DeviceBuffer<f32>,
    /// The gated-normed heads, out_proj's input [z_dim], bf16.
    pub normed: DeviceBuffer<bf16>,
    /// out_proj's split-K partials [16, hidden] and tile counters [hidden].
    pub out_partial: DeviceBuffer<f32>,
    pub out_counters: DeviceBuffer<u32>,
}

impl GdnScratch {
    pub fn new(gpu: &Gpu, shape: GdnShape) -> Result<GdnScratch> {
        let mut s = GdnScratch {
            proj: gpu.alloc(shape.in_rows())?,
            normed: gpu.alloc(shape.z_dim())?,
            out_partial: gpu.alloc(MAX_OUT_SPLIT * shape.hidden)?,
            out_counters: gpu.alloc(shape.hidden)?,
        };
        gpu.fill_bytes(&mut s.out_counters, 0)?;
        Ok(s)
    }
}

/// Tile choices for the GDN kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnTiles {
    pub in_proj: gdn_in_proj_bf16::Tiles,
    pub in_proj_nvfp4: gdn_in_proj_nvfp4::Tiles,
    pub delta_rule_normed: gdn_delta_rule_normed::Tiles,
    pub out_proj: gemv_bf16::Tiles,
    /// out_proj when its weights are NVFP4.
    pub out_proj_nvfp4: gemv_nvfp4::Tiles,
}

impl Default for GdnTiles {
    fn default() -> Self {
        GdnTiles {
            in_proj: TileSet::DEFAULT,
            in_proj_nvfp4: TileSet::DEFAULT,
            delta_rule_normed: TileSet::DEFAULT,
            // out_proj is 2560 × 6144: split K four ways so its 320 row tiles fill the SMs
            // (H200, benches/gdn.rs: 10.5 µs against 15.1 µs unsplit).
            out_proj: gemv_bf16::Tiles { k_split: 4, ..TileSet::DEFAULT },
            // NVFP4: the row path, two rows a block of four warps that split the 6144 columns,
            // the weights loaded before the wait (H200, 2026-12-01: 5.63 µs alone against 6.73
            // split four ways, and the step 1.7% faster; BENCHMARKS.md, gemv_nvfp4 section).
            // Shapes it does not fit fall back to the split path (`fitting`).
            out_proj_nvfp4: crate::kernels::gemv_nvfp4::ROW_PATH,
        }
    }
}

impl GdnTiles {
    /// The layout the NVFP4 input projection's codes must be in for these tiles on `arch`.
    pub fn in_proj_layout(&self, arch: Arch) -> Layout {
        nvfp4_codes_layout(&self.in_proj_nvfp4, arch)
    }

    /// Whether these tiles can run `shape` with a bf16 or an NVFP4 input projection: each
    /// kernel's requirements, checked as a launch would.
    pub fn check(&self, shape: GdnShape, nvfp4: bool) -> std::result::Result<(), kernel_dsl::LaunchError> {
        use kernel_dsl::KernelDef;
        let a = GdnLaunches::unbound(shape, nvfp4);
        match &a.in_proj {
            InProj::Bf16(args) => gdn_in_proj_bf16::Kernel::launch_dims(&self.in_proj, args)?,
            InProj::Nvfp4(args) => gdn_in_proj_nvfp4::Kernel::launch_dims(&self.in_proj_nvfp4, args)?,
        };
        gdn_delta_rule_normed::Kernel::launch_dims(&self.delta_rule_normed, &a.delta_rule_normed)?;
        let dims = gemv_bf16::Kernel::launch_dims(&self.out_proj, &a.out_proj)?;
        // out_proj's counters and partials are sized for at most `hidden` row tiles and 16 splits.
        if dims.grid[0] as usize > shape.hidden || dims.grid[1] as usize > MAX_OUT_SPLIT {
            return Err(kernel_dsl::LaunchError {
                kernel: "gemv_bf16",
                message: "out_proj's scratch is sized for 16 splits and one counter per row".to_owned(),
            });
        }
        Ok(())
    }

    /// Whether out_proj in NVFP4 can run `shape` at these tiles: its requirements, its scratch.
    pub fn check_out_proj_nvfp4(&self, shape: GdnShape) -> std::result::Result<(), kernel_dsl::LaunchError> {
        use kernel_dsl::KernelDef;
        let a = GdnLaunches::unbound(shape, false);
        let dims = gemv_nvfp4::Kernel::launch_dims(&self.out_proj_nvfp4, &a.out_proj_nvfp4)?;
        if dims.grid[0] as usize > shape.hidden || dims.grid[1] as usize > MAX_OUT_SPLIT {
            return Err(kernel_dsl::LaunchError {
                kernel: "gemv_nvfp4",
                message: "out_proj's scratch is sized for 16 splits and one counter per row".to_owned(),
            });
        }
        Ok(())
    }

    /// Tiles that run `shape`: each kernel at its default where that fits (the
    /// defaults are tuned for the published head size and width), otherwise at its first
    /// candidate that fits (out_proj's GEMV trying the layer's split first, then its own unsplit
    /// default). None if some kernel has no candidate that fits.
    pub fn fitting(shape: GdnShape, nvfp4: bool) -> Option<GdnTiles> {
        use kernel_dsl::{KernelDef, LaunchDims};
        /// The first of `tries` whose launch fits, `scratch_ok` included.
        fn pick<K: KernelDef>(
            args: &K::Args,
            tries: Vec<K::Tiles>,
            scratch_ok: fn(&LaunchDims) -> bool,
        ) -> Option<K::Tiles> {
            tries.into_iter().find(|t| K::launch_dims(t, args).is_ok_and(|d| scratch_ok(&d)))
        }
        fn tries<T: TileSet>(first: T) -> Vec<T> {
            let mut v = vec![first, T::DEFAULT];
            v.extend(T::candidates());
            v
        }
        let a = GdnLaunches::unbound(shape, nvfp4);
        let any = |_: &LaunchDims| true;
        // out_proj's counters and partials are sized for 16 splits and at most `hidden` row tiles
        // (the published shape's rows; every candidate has at least one row a tile).
        let out_ok = |d: &LaunchDims| d.grid[1] as usize <= MAX_OUT_SPLIT;
        let d = GdnTiles::default();
        let mut t = d;
        match &a.in_proj {
            InProj::Bf16(args) => t.in_proj = pick::<gdn_in_proj_bf16::Kernel>(args, tries(d.in_proj), any)?,
            InProj::Nvfp4(args) => {
                t.in_proj_nvfp4 = pick::<gdn_in_proj_nvfp4::Kernel>(args, tries(d.in_proj_nvfp4), any)?
            }
        }
        t.delta_rule_normed =
            pick::<gdn_delta_rule_normed::Kernel>(&a.delta_rule_normed, tries(d.delta_rule_normed), any)?;
        t.out_proj = pick::<gemv_bf16::Kernel>(&a.out_proj, tries(d.out_proj), out_ok)?;
        // NVFP4 out_proj: the row path, or the split path lowered until it fits (the GEMV's own
        // fallback, as QSA's projections take it), else the first candidate that fits. It is
        // optional: a shape none of its tiles cover keeps the default, and `check_out_proj_nvfp4`
        // refuses it where NVFP4 is asked for.
        let found = crate::kernels::gemv_nvfp4::fitting(d.out_proj_nvfp4, &a.out_proj_nvfp4, out_ok)
            .or_else(|| pick::<gemv_nvfp4::Kernel>(&a.out_proj_nvfp4, tries(d.out_proj_nvfp4), out_ok));
        if let Some(n) = found {
            t.out_proj_nvfp4 = n;
        }
        t.check(shape, nvfp4).is_ok().then_some(t)
    }
}

/// The GDN kernels, compiled for one device at chosen tiles.
#[derive(Debug)]
pub struct GdnKernels {
    pub in_proj: LoadedKernel<gdn_in_proj_bf16::Kernel>,
    pub in_proj_nvfp4: LoadedKernel<gdn_in_proj_nvfp4::Kernel>,
    pub delta_rule_normed: LoadedKernel<gdn_delta_rule_normed::Kernel>,
    pub out_proj: LoadedKernel<gemv_bf16::Kernel>,
    /// out_proj for NVFP4 weights.
    pub out_proj_nvfp4: LoadedKernel<gemv_nvfp4::Kernel>,
}

impl GdnKernels {
    /// The layout the loaded NVFP4 input projection reads its codes in on `arch`.
    pub fn in_proj_layout(&self, arch: Arch) -> Layout {
        nvfp4_codes_layout(self.in_proj_nvfp4.tiles(), arch)
    }

    pub fn load(gpu: &Gpu, tiles: GdnTiles) -> Result<GdnKernels> {
        Ok(GdnKernels {
            in_proj: gpu.kernel(tiles.in_proj)?,
            in_proj_nvfp4: gpu.kernel(tiles.in_proj_nvfp4)?,
            delta_rule_normed: gpu.kernel(tiles.delta_rule_normed)?,
            out_proj: gpu.kernel(tiles.out_proj)?,
            out_proj_nvfp4: gpu.kernel(tiles.out_proj_nvfp4)?,
        })
    }
}

/// One of the three launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    InProj,
    StateUpdate,
    OutProj,
}

/// The input projection's launch in one format.
#[derive(Clone, Copy, Debug)]
pub enum InProj {
    Bf16(gdn_in_proj_bf16::Args),
    Nvfp4(gdn_in_proj_nvfp4::Args),
}

/// The launches of one GDN pass, arguments bound: the input projection, the state update and
/// out_proj in both formats (the weights say which runs).
#[derive(Clone, Copy, Debug)]
pub struct GdnLaunches {
    pub in_proj: InProj,
    pub delta_rule_normed: gdn_delta_rule_normed::Args,
    pub out_proj: gemv_bf16::Args,
    pub out_proj_nvfp4: gemv_nvfp4::Args,
    /// Whether out_proj's weights are NVFP4 (then `out_proj_nvfp4` runs in place of the bf16 GEMV).
    pub nvfp4_out_proj: bool,
    /// The layout of the NVFP4 input projection's codes (ModelOpt's for bf16 weights): a launch
    /// whose kernel reads another is refused.
    pub in_proj_layout: Layout,
}

/// Every address of a pass, so that one function builds the arguments both for a pass and for
/// checking a shape (with every address 0).
struct Addresses {
    x: u64,
    y: u64,
    /// in_proj (bf16 values or NVFP4 codes), NVFP4 block scales, NVFP4 global scales, conv,
    /// a_log, dt_bias, norm, out_proj (bf16 values or NVFP4 codes), out_proj's NVFP4 block
    /// scales and global scale.
    w: [u64; 10],
    nvfp4: bool,
    nvfp4_out_proj: bool,
    in_proj_layout: Layout,
    /// conv_hist, state.
    st: [u64; 2],
    /// proj, normed, out_partial, out_counters.
    s: [u64; 4],
}

impl GdnLaunches {
    /// The launches of `y = GDN(x)` with these weights, state and scratch.
    pub fn new(
        w: &GdnWeightsOnDevice,
        st: &mut GdnStateOnDevice,
        s: &mut GdnScratch,
        x: DevPtr<bf16>,
        y: DevPtrMut<bf16>,
    ) -> GdnLaunches {
        let (in_proj, nvfp4, in_proj_layout) = match &w.in_proj {
            InProjOnDevice::Bf16(b) => ([b.ptr().addr(), 0, 0], false, Layout::Nibbles),
            InProjOnDevice::Nvfp4 { packed, scales, scale2, layout } => {
                ([packed.ptr().addr(), scales.ptr().addr(), scale2.ptr().addr()], true, *layout)
            }
        };
        let (out_proj, _) = w.out_proj.addresses();
        let nvfp4_out_proj = w.out_proj.is_nvfp4();
        let a = Addresses {
            x: x.addr(),
            y: y.addr(),
            w: [
                in_proj[0],
                in_proj[1],
                in_proj[2],
                w.conv.ptr().addr(),
                w.a_log.ptr().addr(),
                w.dt_bias.ptr().addr(),
                w.norm.ptr().addr(),
                out_proj[0],
                out_proj[1],
                out_proj[2],
            ],
            nvfp4,
            nvfp4_out_proj,
            in_proj_layout,
            st: [st.conv_hist.ptr_mut().addr(), st.state.ptr_mut().addr()],
            s: [
                s.proj.ptr_mut().addr(),
                s.normed.ptr_mut().addr(),
                s.out_partial.ptr_mut().addr(),
                s.out_counters.ptr_mut().addr(),
            ],
        };
        GdnLaunches::build(w.shape, &a)
    }

    /// The launches with every address 0: for checking a shape against tiles.
    pub fn unbound(shape: GdnShape, nvfp4: bool) -> GdnLaunches {
        GdnLaunches::build(
            shape,
            &Addresses {
                x: 0,
                y: 0,
                w: [0; 10],
                nvfp4,
                nvfp4_out_proj: false,
                in_proj_layout: Layout::Nibbles,
                st: [0; 2],
                s: [0; 4],
            },
        )
    }

    fn build(sh: GdnShape, a: &Addresses) -> GdnLaunches {
        fn r<T>(addr: u64) -> DevPtr<T> {
            DevPtr::from_addr(addr)
        }
        fn w<T>(addr: u64) -> DevPtrMut<T> {
            DevPtrMut::from_addr(addr)
        }
        let u = |v: usize| v as u32;
        let [in_proj, in_scales, in_scale2, conv, a_log, dt_bias, norm, out_proj, out_scales, out_scale2] = a.w;
        let [conv_hist, state] = a.st;
        let [proj, normed, out_partial, out_counters] = a.s;
        let in_proj = if a.nvfp4 {
            InProj::Nvfp4(gdn_in_proj_nvfp4::Args {
                packed: r(in_proj),
                scales: r(in_scales),
                scale2: r(in_scale2),
                x: r(a.x),
                conv_w: r(conv),
                a_log: r(a_log),
                dt_bias: r(dt_bias),
                conv_hist: w(conv_hist),
                proj: w(proj),
                conv_dim: u(sh.conv_dim()),
                z_dim: u(sh.z_dim()),
                heads: u(sh.value_heads),
                hidden: u(sh.hidden),
            })
        } else {
            InProj::Bf16(gdn_in_proj_bf16::Args {
                w: r(in_proj),
                x: r(a.x),
                conv_w: r(conv),
                a_log: r(a_log),
                dt_bias: r(dt_bias),
                conv_hist: w(conv_hist),
                proj: w(proj),
                conv_dim: u(sh.conv_dim()),
                z_dim: u(sh.z_dim()),
                heads: u(sh.value_heads),
                hidden: u(sh.hidden),
            })
        };
        GdnLaunches {
            in_proj,
            delta_rule_normed: gdn_delta_rule_normed::Args {
                proj: r(proj),
                norm_w: r(norm),
                state: w(state),
                y: w(normed),
                key_heads: u(sh.key_heads),
                value_heads: u(sh.value_heads),
                dk: u(sh.key_dim),
                dv: u(sh.value_dim),
                eps: sh.eps,
                sigmoid_gate: sh.sigmoid_gate,
            },
            out_proj: gemv_bf16::Args {
                w: r(out_proj),
                x: r(normed),
                y: w(a.y),
                partial: w(out_partial),
                counters: w(out_counters),
                rows: u(sh.hidden),
                cols: u(sh.z_dim()),
            },
            out_proj_nvfp4: gemv_nvfp4::Args {
                packed: r(out_proj),
                scales: r(out_scales),
                scale2: r(out_scale2),
                x: r(normed),
                y: w(a.y),
                partial: w(out_partial),
                counters: w(out_counters),
                rows: u(sh.hidden),
                cols: u(sh.z_dim()),
                seg1: u(sh.hidden),
                seg2: u(sh.hidden),
                seg3: u(sh.hidden),
            },
            nvfp4_out_proj: a.nvfp4_out_proj,
            in_proj_layout: a.in_proj_layout,
        }
    }

    /// Enqueues one of the three launches.
    ///
    /// # Safety
    /// The launches were built by [`GdnLaunches::new`] from buffers that are still alive, with
    /// `x` and `y` addressing `hidden` bf16 elements that overlap neither weights, state nor
    /// scratch.
    pub unsafe fn enqueue_stage(&self, gpu: &Gpu, k: &GdnKernels, stage: Stage) -> Result<()> {
        // SAFETY: every buffer behind the arguments was sized from the shape when it was made (the
        // upload checks the weights' lengths against it); the caller vouches for x, y and liveness.
        unsafe {
            match stage {
                Stage::InProj => match &self.in_proj {
                    InProj::Bf16(a) => k.in_proj.launch(gpu, a),
                    InProj::Nvfp4(a) => {
                        let reads = k.in_proj_layout(gpu.arch());
                        if reads != self.in_proj_layout {
                            return Err(Error::Buffer(format!(
                                "GDN input projection: its NVFP4 codes are in the {:?} layout, but the kernel at {:?} \
                                 reads {reads:?} (upload with GdnTiles::in_proj_layout, or set_in_proj_layout)",
                                self.in_proj_layout,
                                k.in_proj_nvfp4.tiles()
                            )));
                        }
                        k.in_proj_nvfp4.launch(gpu, a)
                    }
                },
                Stage::StateUpdate => k.delta_rule_normed.launch(gpu, &self.delta_rule_normed),
                Stage::OutProj if self.nvfp4_out_proj => k.out_proj_nvfp4.launch(gpu, &self.out_proj_nvfp4),
                Stage::OutProj => k.out_proj.launch(gpu, &self.out_proj),
            }
        }
    }

    /// Enqueues the pass: in_proj, state update, out_proj.
    ///
    /// # Safety
    /// As for [`GdnLaunches::enqueue_stage`].
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &GdnKernels) -> Result<()> {
        for stage in [Stage::InProj, Stage::StateUpdate, Stage::OutProj] {
            // SAFETY: forwarded from the caller.
            unsafe { self.enqueue_stage(gpu, k, stage) }?;
        }
        Ok(())
    }
}

/// Enqueues one GDN pass: y = GDN(x), the state carried on; three launches, nothing read back.
///
/// # Safety
/// `x` and `y` must address `hidden` live bf16 elements on this device, not overlapping the
/// weights, the state or the scratch.
pub unsafe fn enqueue(
    gpu: &Gpu,
    k: &GdnKernels,
    w: &GdnWeightsOnDevice,
    st: &mut GdnStateOnDevice,
    s: &mut GdnScratch,
    x: DevPtr<bf16>,
    y: DevPtrMut<bf16>,
) -> Result<()> {
    let launches = GdnLaunches::new(w, st, s, x, y);
    // SAFETY: the buffers outlive the enqueue; the caller vouches for x and y.
    unsafe { launches.enqueue(gpu, k) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED: GdnShape = GdnShape {
        hidden: 2560,
        key_heads: 16,
        value_heads: 48,
        key_dim: 128,
        value_dim: 128,
        eps: 1e-6,
        sigmoid_gate: true,
    };

    #[test]
    fn published_shape_sizes() {
        assert_eq!(PUBLISHED.conv_dim(), 10240);
        assert_eq!(PUBLISHED.in_rows(), 10240 + 6144 + 96);
        // 3 MiB of state per layer.
        assert_eq!(4 * PUBLISHED.state_len(), 3 << 20);
        // The state update moves the state twice (6.29 MB) and ~0.1 MB of vectors.
        let b = PUBLISHED.state_update_bytes() as f64;
        assert!((6.29e6..6.6e6).contains(&b), "{b}");
        // ~58 M bf16 weights: ~116 MB, plus the state.
        let l = PUBLISHED.layer_bytes(false, false) as f64;
        assert!((122e6..124e6).contains(&l), "{l}");
        // The 42 M input-projection values at 0.5625 B instead of 2.
        let saved = (PUBLISHED.layer_bytes(false, false) - PUBLISHED.layer_bytes(true, false)) as f64;
        assert!((saved - 16480.0 * 2560.0 * 1.4375).abs() < 100.0, "{saved}");
        // And out_proj's 15.7 M (less its one global scale).
        let saved = (PUBLISHED.layer_bytes(true, false) - PUBLISHED.layer_bytes(true, true)) as f64;
        assert!((saved - 2560.0 * 6144.0 * 1.4375 + 4.0).abs() < 1.0, "{saved}");
    }

    #[test]
    fn default_tiles_fit_the_published_shape() {
        GdnTiles::default().check(PUBLISHED, false).expect("default tiles, bf16");
        GdnTiles::default().check(PUBLISHED, true).expect("default tiles, NVFP4");
        for nvfp4 in [false, true] {
            let t = GdnTiles::fitting(PUBLISHED, nvfp4).expect("fitting tiles");
            assert_eq!(t, GdnTiles::default());
            t.check_out_proj_nvfp4(PUBLISHED).expect("NVFP4 out_proj at the defaults");
        }
    }

    /// The tensor-core input projection (the default) reads the paired layout where the
    /// architecture decodes E2M1 in software (sm_90) and ModelOpt's where it converts in hardware
    /// (sm_121a); the f32 path reads ModelOpt's on both. The step uploads by this answer.
    #[test]
    fn the_input_projections_layout_follows_its_path() {
        let mma = GdnTiles::default();
        assert_eq!((mma.in_proj_nvfp4.mma, mma.in_proj_nvfp4.rows), (1, 16));
        let f32_path = GdnTiles { in_proj_nvfp4: crate::kernels::gdn::in_proj::F32_PATH, ..mma };
        f32_path.check(PUBLISHED, true).expect("the f32 path fits the published shape");
        for (tiles, arch, want) in [
            (f32_path, Arch::Sm90, Layout::Nibbles),
            (f32_path, Arch::Sm121a, Layout::Nibbles),
            (mma, Arch::Sm90, Layout::Pairs),
            (mma, Arch::Sm121a, Layout::Nibbles),
        ] {
            assert_eq!(tiles.in_proj_layout(arch), want, "{:?} on {arch}", tiles.in_proj_nvfp4);
        }
    }

    /// A shape off the defaults (head size 64, a narrow model) still finds tiles.
    #[test]
    fn fitting_tiles_for_a_small_shape() {
        let small = GdnShape { hidden: 512, key_heads: 2, value_heads: 6, key_dim: 64, ..PUBLISHED };
        for nvfp4 in [false, true] {
            let t = GdnTiles::fitting(small, nvfp4).expect("fitting tiles");
            assert!(t.check(small, nvfp4).is_ok());
        }
        // out_proj's NVFP4 GEMV: the row path at the published width; at 384 columns, where its
        // steps do not fit, the split path.
        let published = GdnTiles::fitting(PUBLISHED, true).expect("fitting tiles");
        assert_eq!(published.out_proj_nvfp4, crate::kernels::gemv_nvfp4::ROW_PATH);
        let t = GdnTiles::fitting(small, true).expect("fitting tiles");
        assert_eq!(t.out_proj_nvfp4.rows, 0);
        t.check_out_proj_nvfp4(small).expect("the split path fits");
    }
}
