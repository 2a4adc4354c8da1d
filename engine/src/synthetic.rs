//! Synthetic weights of any geometry, made on the device from a seed (issue #9, `decode
//! --synthetic`): benchmarks of the published model need no checkpoint. At full size the MoE
//! experts alone are ~70 GB in NVFP4; making them on the host and copying them over would take
//! minutes and as much host memory, while the fill kernels ([`crate::kernels::fill`]) write them
//! at the device's bandwidth. The PLE table lives in host memory anyway, so it is filled there,
//! by every core ([`ple_table`]).
//!
//! Every buffer is a deterministic function of the seed: its own stream seed
//! ([`stream_seed`]: the caller's seed, a tag naming the buffer, and which stream: values, NVFP4
//! codes or NVFP4 scales) and the element index ([`crate::reference::fill`] makes the same values
//! on the CPU). Each function below takes the seed of its part; [`layer`] derives one per part
//! of a layer from the model's seed and the layer's index.
//!
//! Magnitudes: the values are uniform (zero mean) and chosen so that activations stay sane
//! through 48 layers, as a trained model's do (every block's input is normalised by its mix site,
//! so what matters is that no block's output explodes or vanishes and that gates and decays sit
//! where they work):
//! - projections: standard deviation 1/√fan_in (variance-preserving), so a projection of a
//!   unit-RMS input has unit-RMS outputs: router logits ~N(0, 1) (a real top-k), gates σ(·) near
//!   0.5, the write gains 2σ(·) near 1;
//! - zero-centred norm weights (the norm multiplies by 1 + w: the mix's `hc_norm`, QSA's q/k and
//!   indexer norms, PLE's three): w uniform in ±[`ZC_NORM`] (0.1);
//! - the GDN's plain norm weight: uniform in [0.9, 1.1];
//! - the GDN's A_log: uniform in [0, ln 16], so A = exp(A_log) is log-uniform in [1, 16] (the
//!   reference initialises A uniform in that range); dt_bias uniform in [ln 10⁻³, ln 10⁻¹], the
//!   inverse softplus of a step dt log-uniform in [10⁻³, 10⁻¹] (softplus⁻¹(dt) ≈ ln dt for small
//!   dt): the decays α = exp(−A·softplus(a·x + dt_bias)) then lie mostly in (0.7, 1);
//! - the convolutions (GDN's, PLE's): 1/√kernel;
//! - the embedding and the PLE table's rows: standard deviation 1 (the streams start at unit RMS).
//!
//! NVFP4 matrices: uniformly random code bytes (every byte is a valid pair of e2m1 codes; their
//! mean square is [`CODE_MEAN_SQUARE`]), block scales uniform over the e4m3 codes
//! [`SCALE_LO`]..[`SCALE_LO`] + [`SCALE_SPAN`] (1.0 to 3.75: positive, finite, two binades), and
//! the global scale chosen on the host ([`nvfp4_scale_2`]) so that the dequantised values have
//! the standard deviation a bf16 matrix of the same place would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use half::bf16;
use kernel_dsl::e2m1_pairs::Layout;
use kernel_dsl::{DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel, MappedHostBuffer};
use crate::error::{Error, Result};
use crate::kernels::e2m1_pairs::e2m1_pair_words;
use crate::kernels::fill::{fill_bf16, fill_e4m3_scales, fill_f32, fill_nvfp4_codes};
use crate::layers::gdn::{CONV_KERNEL, GdnShape, GdnWeightsOnDevice, InProjOnDevice};
use crate::layers::lm_head::{LmHead, LmHeadTiles, LmHeadWeights};
use crate::layers::matrix::MatrixOnDevice;
use crate::layers::mix::{MixMatrices, MixShape, MixWeightsOnDevice};
use crate::layers::moe::{ExpertsOnDevice, MoeShape, MoeWeightsOnDevice};
use crate::layers::paired_codes;
use crate::layers::ple::{PleShape, PleTableOnHost, PleWeightsOnDevice};
use crate::layers::qsa::{QsaShape, QsaWeightsOnDevice};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::nvfp4::BLOCK;
use crate::model::ple_table::{RowFormat, TableHeader};
use crate::reference::fill::{self as reference, Uniform, derive_seed};
use crate::step::Formats;
use crate::step::weights::{LayerOnDevice, MixerOnDevice};

/// The first e4m3 code of the block scales (0x38 = 1.0).
pub const SCALE_LO: u8 = 0x38;
/// How many consecutive codes the block scales take (0x38..0x47: 1.0 to 3.75).
pub const SCALE_SPAN: u8 = 16;
/// The mean square of a uniformly random e2m1 code: (0 + 0.25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8.
pub const CODE_MEAN_SQUARE: f32 = 8.5625;
/// Zero-centred norm weights are uniform in ±this.
pub const ZC_NORM: f32 = 0.1;

/// The mean square of the block scales' values.
pub fn scale_mean_square() -> f32 {
    let codes = SCALE_LO..SCALE_LO + SCALE_SPAN;
    codes.map(|c| E4m3(c).to_f32().powi(2)).sum::<f32>() / f32::from(SCALE_SPAN)
}

/// The global scale that gives NVFP4 values (random codes, [`SCALE_LO`]-based scales) the
/// standard deviation `std`.
pub fn nvfp4_scale_2(std: f32) -> f32 {
    std / (CODE_MEAN_SQUARE * scale_mean_square()).sqrt()
}

/// The standard deviation of a projection's weights over `fan_in` inputs: 1/√fan_in.
pub fn projection_std(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}

/// Which of a buffer's streams: plain values (bf16 or f32), or an NVFP4 matrix's codes or scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Values = 0,
    Codes = 1,
    Scales = 2,
}

/// The tags naming every synthetic buffer (one seed per tag and stream: [`stream_seed`]).
pub mod tag {
    pub const MIX_NORM: u64 = 1;
    /// W_down and W_inj stacked, one stream.
    pub const MIX_PROJ: u64 = 2;
    pub const MIX_UP: u64 = 3;
    /// [qkv; z; b; a] stacked, one stream.
    pub const GDN_IN_PROJ: u64 = 10;
    pub const GDN_CONV: u64 = 11;
    pub const GDN_A_LOG: u64 = 12;
    pub const GDN_DT_BIAS: u64 = 13;
    pub const GDN_NORM: u64 = 14;
    pub const GDN_OUT_PROJ: u64 = 15;
    pub const QSA_IN_PROJ: u64 = 20;
    pub const QSA_O_PROJ: u64 = 21;
    pub const QSA_Q_NORM: u64 = 22;
    pub const QSA_K_NORM: u64 = 23;
    pub const QSA_INDEX_Q_NORM: u64 = 24;
    pub const QSA_INDEX_K_NORM: u64 = 25;
    pub const MOE_ROUTER: u64 = 30;
    pub const MOE_SHARED_GATE: u64 = 31;
    /// Every expert's gate and up rows, the shared expert's last: one stream.
    pub const MOE_GATE_UP: u64 = 32;
    /// Every expert's down matrix, the shared expert's last: one stream.
    pub const MOE_DOWN: u64 = 33;
    pub const PLE_PROJ: u64 = 40;
    pub const PLE_NORM_KEY: u64 = 41;
    pub const PLE_NORM_QUERY: u64 = 42;
    pub const PLE_NORM_CONV: u64 = 43;
    pub const PLE_CONV: u64 = 44;
    pub const EMBED: u64 = 50;
    pub const LM_HEAD: u64 = 51;
    pub const PLE_TABLE: u64 = 52;
}

/// The seed of stream `stream` of buffer `tag` of a part seeded with `seed`.
pub fn stream_seed(seed: u64, tag: u64, stream: Stream) -> u64 {
    derive_seed(seed, &[tag, stream as u64])
}

/// The four fill kernels, and the NVFP4 codes' rearrangement into the paired layout, compiled for
/// one device.
#[derive(Debug)]
pub struct Fills {
    bf16: LoadedKernel<fill_bf16::Kernel>,
    f32: LoadedKernel<fill_f32::Kernel>,
    codes: LoadedKernel<fill_nvfp4_codes::Kernel>,
    scales: LoadedKernel<fill_e4m3_scales::Kernel>,
    pairs: LoadedKernel<e2m1_pair_words::Kernel>,
}

/// Checks that `len` elements of `size` bytes at element `at` lie inside a buffer of `buf_len`
/// elements and start 16-byte aligned (the fills store 16 bytes at a time).
fn check_range(what: &str, buf_len: usize, at: usize, len: usize, size: usize) -> Result<()> {
    if at.checked_add(len).is_none_or(|end| end > buf_len) || !(at * size).is_multiple_of(16) {
        return Err(Error::Buffer(format!(
            "{what} fill of {len} elements at {at} in a buffer of {buf_len}: out of range or not 16-byte aligned"
        )));
    }
    Ok(())
}

impl Fills {
    /// Compiles (or finds in the caches) the fill kernels at their default tiles.
    pub fn load(gpu: &Gpu) -> Result<Fills> {
        Ok(Fills {
            bf16: gpu.kernel(TileSet::DEFAULT)?,
            f32: gpu.kernel(TileSet::DEFAULT)?,
            codes: gpu.kernel(TileSet::DEFAULT)?,
            scales: gpu.kernel(TileSet::DEFAULT)?,
            pairs: gpu.kernel(TileSet::DEFAULT)?,
        })
    }

    /// `buf[at..at + len]` = elements `first..first + len` of the bf16 fill of `seed` (`at` a
    /// multiple of 8); enqueued, not waited for.
    #[allow(clippy::too_many_arguments)]
    pub fn bf16_range(
        &self,
        gpu: &Gpu,
        buf: &mut DeviceBuffer<bf16>,
        at: usize,
        len: usize,
        first: u64,
        seed: u64,
        u: Uniform,
    ) -> Result<()> {
        check_range("bf16", buf.len(), at, len, 2)?;
        if len == 0 {
            return Ok(());
        }
        let out = DevPtrMut::from_addr(buf.ptr_mut().addr() + 2 * at as u64);
        let a = fill_bf16::Args { out, len: len as u64, first, seed, lo: u.lo, step: u.step };
        // SAFETY: the kernel writes out[0..len), inside `buf` (checked above), and reads nothing.
        unsafe { self.bf16.launch(gpu, &a) }
    }

    /// The whole of `buf` from element 0 of the bf16 fill of `seed`.
    pub fn bf16(&self, gpu: &Gpu, buf: &mut DeviceBuffer<bf16>, seed: u64, u: Uniform) -> Result<()> {
        let len = buf.len();
        self.bf16_range(gpu, buf, 0, len, 0, seed, u)
    }

    /// The whole of `buf` from element 0 of the f32 fill of `seed`.
    pub fn f32(&self, gpu: &Gpu, buf: &mut DeviceBuffer<f32>, seed: u64, u: Uniform) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let a = fill_f32::Args { out: buf.ptr_mut(), len: buf.len() as u64, first: 0, seed, lo: u.lo, step: u.step };
        // SAFETY: the kernel writes out[0..len) of `buf` and reads nothing.
        unsafe { self.f32.launch(gpu, &a) }
    }

    /// The whole of `buf` from byte 0 of the byte stream of `seed` (random e2m1 pairs).
    pub fn codes(&self, gpu: &Gpu, buf: &mut DeviceBuffer<E2m1x2>, seed: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let a = fill_nvfp4_codes::Args {
            out: DevPtrMut::from_addr(buf.ptr_mut().addr()),
            len: buf.len() as u64,
            first: 0,
            seed,
        };
        // SAFETY: the kernel writes bytes [0, len) of `buf` (one byte an element) and reads nothing.
        unsafe { self.codes.launch(gpu, &a) }
    }

    /// The codes in `buf` (ModelOpt's layout) rearranged in place into `layout`
    /// (`kernel_dsl::e2m1_pairs`); enqueued, not waited for.
    pub fn to_layout(&self, gpu: &Gpu, buf: &mut DeviceBuffer<E2m1x2>, layout: Layout) -> Result<()> {
        if layout == Layout::Nibbles || buf.is_empty() {
            return Ok(());
        }
        if !buf.len().is_multiple_of(16) {
            return Err(Error::Buffer(format!(
                "{} NVFP4 code bytes: the paired layout needs whole 16-byte groups",
                buf.len()
            )));
        }
        let a = e2m1_pair_words::Args { codes: DevPtrMut::from_addr(buf.ptr_mut().addr()), len: buf.len() as u64 };
        // SAFETY: the kernel reads and writes bytes [0, len) of `buf` (one byte an element).
        unsafe { self.pairs.launch(gpu, &a) }
    }

    /// The whole of `buf`: e4m3 block scales [`SCALE_LO`]..+[`SCALE_SPAN`] from the byte stream of
    /// `seed`.
    pub fn scales(&self, gpu: &Gpu, buf: &mut DeviceBuffer<E4m3>, seed: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let a = fill_e4m3_scales::Args {
            out: DevPtrMut::from_addr(buf.ptr_mut().addr()),
            len: buf.len() as u64,
            first: 0,
            seed,
            lo: u32::from(SCALE_LO),
            span: u32::from(SCALE_SPAN),
        };
        // SAFETY: as for `codes`.
        unsafe { self.scales.launch(gpu, &a) }
    }

    /// A new buffer of `len` values of stream `tag` of `seed`.
    pub fn new_bf16(&self, gpu: &Gpu, len: usize, seed: u64, tag: u64, u: Uniform) -> Result<DeviceBuffer<bf16>> {
        let mut b = gpu.alloc(len)?;
        self.bf16(gpu, &mut b, stream_seed(seed, tag, Stream::Values), u)?;
        Ok(b)
    }

    pub fn new_f32(&self, gpu: &Gpu, len: usize, seed: u64, tag: u64, u: Uniform) -> Result<DeviceBuffer<f32>> {
        let mut b = gpu.alloc(len)?;
        self.f32(gpu, &mut b, stream_seed(seed, tag, Stream::Values), u)?;
        Ok(b)
    }

    /// The codes and block scales of NVFP4 matrices of `values` values in rows of `cols` (a
    /// multiple of 16; several matrices stacked when they share `cols`), streams of `tag`.
    pub fn new_nvfp4(
        &self,
        gpu: &Gpu,
        values: usize,
        cols: usize,
        seed: u64,
        tag: u64,
    ) -> Result<(DeviceBuffer<E2m1x2>, DeviceBuffer<E4m3>)> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) || !values.is_multiple_of(cols) {
            return Err(Error::Buffer(format!(
                "NVFP4 rows of {cols} values ({values} in all): not whole blocks of {BLOCK}"
            )));
        }
        let mut packed = gpu.alloc(values / 2)?;
        let mut scales = gpu.alloc(values / BLOCK)?;
        self.codes(gpu, &mut packed, stream_seed(seed, tag, Stream::Codes))?;
        self.scales(gpu, &mut scales, stream_seed(seed, tag, Stream::Scales))?;
        Ok((packed, scales))
    }
}

/// A mix site's shape in `cfg`; `inject` for every site but the final mixer.
pub fn mix_shape(cfg: &ModelConfig, inject: bool) -> MixShape {
    MixShape { streams: cfg.hc_streams, hidden: cfg.hidden_size, rank: cfg.hc_rank, inject }
}

/// The MoE block's shape in `cfg`.
pub fn moe_shape(cfg: &ModelConfig) -> MoeShape {
    MoeShape {
        hidden: cfg.hidden_size,
        experts: cfg.num_experts,
        top_k: cfg.experts_per_token,
        inter: cfg.expert_intermediate,
        shared_inter: cfg.shared_intermediate,
        renormalise: cfg.norm_topk_prob,
    }
}

/// A mix site: `hc_norm` zero-centred, W_down and W_inj (one stream) 1/√(n·d), W_up 1/√r; NVFP4
/// with the three global scales when `nvfp4`.
pub fn mix(gpu: &Gpu, shape: MixShape, nvfp4: bool, seed: u64) -> Result<MixWeightsOnDevice> {
    let f = Fills::load(gpu)?;
    let (w, r) = (shape.width(), shape.rank);
    let norm = f.new_bf16(gpu, w, seed, tag::MIX_NORM, Uniform::symmetric(ZC_NORM))?;
    let (proj_std, up_std) = (projection_std(w), projection_std(r));
    let matrices = if nvfp4 {
        let (proj_packed, proj_scales) = f.new_nvfp4(gpu, shape.proj_rows() * w, w, seed, tag::MIX_PROJ)?;
        let (up_packed, up_scales) = f.new_nvfp4(gpu, w * r, r, seed, tag::MIX_UP)?;
        let s = nvfp4_scale_2(proj_std);
        let scale2 = gpu.upload(&[s, if shape.inject { s } else { 0.0 }, nvfp4_scale_2(up_std)])?;
        MixMatrices::Nvfp4 { proj_packed, proj_scales, up_packed, up_scales, scale2 }
    } else {
        MixMatrices::Bf16 {
            proj: f.new_bf16(gpu, shape.proj_rows() * w, seed, tag::MIX_PROJ, Uniform::with_std(proj_std))?,
            up: f.new_bf16(gpu, w * r, seed, tag::MIX_UP, Uniform::with_std(up_std))?,
        }
    };
    Ok(MixWeightsOnDevice { shape, norm, matrices })
}

/// A GDN layer: the stacked input projection and out_proj (each bf16, or NVFP4 when asked)
/// 1/√fan_in, the conv 1/√4, A_log, dt_bias and the norm as the module's doc says.
pub fn gdn(
    gpu: &Gpu,
    shape: GdnShape,
    nvfp4_in_proj: bool,
    nvfp4_out_proj: bool,
    seed: u64,
) -> Result<GdnWeightsOnDevice> {
    let f = Fills::load(gpu)?;
    let (d, hv) = (shape.hidden, shape.value_heads);
    let in_std = projection_std(d);
    let in_proj = if nvfp4_in_proj {
        let (packed, scales) = f.new_nvfp4(gpu, shape.in_rows() * d, d, seed, tag::GDN_IN_PROJ)?;
        InProjOnDevice::Nvfp4 {
            packed,
            scales,
            scale2: gpu.upload(&[nvfp4_scale_2(in_std); 4])?,
            layout: Layout::Nibbles,
        }
    } else {
        InProjOnDevice::Bf16(f.new_bf16(gpu, shape.in_rows() * d, seed, tag::GDN_IN_PROJ, Uniform::with_std(in_std))?)
    };
    let conv_std = projection_std(CONV_KERNEL);
    let out_std = projection_std(shape.z_dim());
    let out_proj = if nvfp4_out_proj {
        let (packed, scales) = f.new_nvfp4(gpu, d * shape.z_dim(), shape.z_dim(), seed, tag::GDN_OUT_PROJ)?;
        MatrixOnDevice::Nvfp4 {
            packed,
            scales,
            scale2: gpu.upload(&[nvfp4_scale_2(out_std), 0.0, 0.0, 0.0])?,
            segs: [d as u32; 3],
        }
    } else {
        MatrixOnDevice::Bf16(f.new_bf16(gpu, d * shape.z_dim(), seed, tag::GDN_OUT_PROJ, Uniform::with_std(out_std))?)
    };
    Ok(GdnWeightsOnDevice {
        shape,
        in_proj,
        conv: f.new_bf16(gpu, CONV_KERNEL * shape.conv_dim(), seed, tag::GDN_CONV, Uniform::with_std(conv_std))?,
        a_log: f.new_f32(gpu, hv, seed, tag::GDN_A_LOG, Uniform::new(0.0, 16f32.ln()))?,
        dt_bias: f.new_f32(gpu, hv, seed, tag::GDN_DT_BIAS, Uniform::new(1e-3f32.ln(), 1e-1f32.ln()))?,
        norm: f.new_bf16(gpu, shape.value_dim, seed, tag::GDN_NORM, Uniform::new(0.9, 1.1))?,
        out_proj,
    })
}

/// The NVFP4 input projections of `layers`' GDN layers (made in ModelOpt's layout by [`gdn`])
/// in `layout`, the one the plan's kernel reads: rearranged in place on the device (codes in
/// another layout already go through the host, [`GdnWeightsOnDevice::set_in_proj_layout`]).
pub fn gdn_in_proj_to_layout(gpu: &Gpu, layers: &mut [LayerOnDevice], layout: Layout) -> Result<()> {
    let f = Fills::load(gpu)?;
    for l in layers {
        let MixerOnDevice::Gdn(w) = &mut l.mixer else { continue };
        match &mut w.in_proj {
            InProjOnDevice::Nvfp4 { packed, layout: now, .. } if *now == Layout::Nibbles && layout != *now => {
                f.to_layout(gpu, packed, layout)?;
                *now = layout;
            }
            // bf16 weights, codes already in `layout`, or codes in another one.
            _ => w.set_in_proj_layout(gpu, layout)?,
        }
    }
    gpu.synchronize()
}

/// A QSA layer (bf16): the stacked projection 1/√d, o_proj 1/√(Hq·D), the four norms zero-centred.
pub fn qsa(gpu: &Gpu, shape: QsaShape, nvfp4: bool, seed: u64) -> Result<QsaWeightsOnDevice> {
    let f = Fills::load(gpu)?;
    let (d, a) = (shape.hidden, shape.attn_dim());
    let zc = Uniform::symmetric(ZC_NORM);
    let (in_std, o_std) = (projection_std(d), projection_std(a));
    let (in_proj, o_proj) = if nvfp4 {
        // One global scale for the four stacked matrices (same std): the boundaries all at the end.
        let rows = shape.in_rows() as u32;
        let (packed, scales) = f.new_nvfp4(gpu, shape.in_rows() * d, d, seed, tag::QSA_IN_PROJ)?;
        let s = nvfp4_scale_2(in_std);
        let in_proj = MatrixOnDevice::Nvfp4 { packed, scales, scale2: gpu.upload(&[s, s, s, s])?, segs: [rows; 3] };
        let (packed, scales) = f.new_nvfp4(gpu, d * a, a, seed, tag::QSA_O_PROJ)?;
        let o_scale2 = gpu.upload(&[nvfp4_scale_2(o_std), 0.0, 0.0, 0.0])?;
        (in_proj, MatrixOnDevice::Nvfp4 { packed, scales, scale2: o_scale2, segs: [d as u32; 3] })
    } else {
        (
            MatrixOnDevice::Bf16(f.new_bf16(
                gpu,
                shape.in_rows() * d,
                seed,
                tag::QSA_IN_PROJ,
                Uniform::with_std(in_std),
            )?),
            MatrixOnDevice::Bf16(f.new_bf16(gpu, d * a, seed, tag::QSA_O_PROJ, Uniform::with_std(o_std))?),
        )
    };
    Ok(QsaWeightsOnDevice {
        shape,
        in_proj,
        o_proj,
        q_norm: f.new_bf16(gpu, shape.head_dim, seed, tag::QSA_Q_NORM, zc)?,
        k_norm: f.new_bf16(gpu, shape.head_dim, seed, tag::QSA_K_NORM, zc)?,
        index_q_norm: f.new_bf16(gpu, shape.index_dim, seed, tag::QSA_INDEX_Q_NORM, zc)?,
        index_k_norm: f.new_bf16(gpu, shape.index_dim, seed, tag::QSA_INDEX_K_NORM, zc)?,
    })
}

/// A MoE block: the router and the shared expert's gate 1/√d (bf16 in both formats), every
/// expert's gate and up rows 1/√d and down 1/√inter (the shared expert's 1/√shared_inter), bf16
/// or NVFP4 (one global scale per matrix, as a checkpoint has them).
pub fn moe(gpu: &Gpu, shape: MoeShape, nvfp4: bool, seed: u64) -> Result<MoeWeightsOnDevice> {
    let f = Fills::load(gpu)?;
    let (d, e) = (shape.hidden, shape.experts);
    let routed = e * shape.inter * d;
    let shared = shape.shared_inter * d;
    let (in_std, down_std, shared_down_std) =
        (projection_std(d), projection_std(shape.inter), projection_std(shape.shared_inter));
    let experts = if nvfp4 {
        if !shape.inter.is_multiple_of(BLOCK) || !shape.shared_inter.is_multiple_of(BLOCK) {
            return Err(Error::Buffer(format!(
                "NVFP4 down projections of {} and {} columns: not whole blocks of {BLOCK}",
                shape.inter, shape.shared_inter
            )));
        }
        let (mut gate_up_packed, gate_up_scales) =
            f.new_nvfp4(gpu, 2 * (routed + shared), d, seed, tag::MOE_GATE_UP)?;
        // The gate/up kernel reads its codes in the paired layout of the architecture.
        f.to_layout(gpu, &mut gate_up_packed, paired_codes::layout(gpu))?;
        // Rows of inter (routed) and shared_inter (shared) values, both whole blocks (checked).
        let (down_packed, down_scales) = f.new_nvfp4(gpu, routed + shared, BLOCK, seed, tag::MOE_DOWN)?;
        let mut down_scale2 = vec![nvfp4_scale_2(down_std); e];
        down_scale2.push(nvfp4_scale_2(shared_down_std));
        ExpertsOnDevice::Nvfp4 {
            gate_up_packed,
            gate_up_scales,
            gate_up_scale2: gpu.upload(&vec![nvfp4_scale_2(in_std); 2 * (e + 1)])?,
            down_packed,
            down_scales,
            down_scale2: gpu.upload(&down_scale2)?,
        }
    } else {
        let gate_up = f.new_bf16(gpu, 2 * (routed + shared), seed, tag::MOE_GATE_UP, Uniform::with_std(in_std))?;
        // One stream over every down matrix, the shared expert's part at its own magnitude.
        let mut down = gpu.alloc(routed + shared)?;
        let s = stream_seed(seed, tag::MOE_DOWN, Stream::Values);
        f.bf16_range(gpu, &mut down, 0, routed, 0, s, Uniform::with_std(down_std))?;
        f.bf16_range(gpu, &mut down, routed, shared, routed as u64, s, Uniform::with_std(shared_down_std))?;
        ExpertsOnDevice::Bf16 { gate_up, down }
    };
    Ok(MoeWeightsOnDevice {
        shape,
        router: f.new_bf16(gpu, e * d, seed, tag::MOE_ROUTER, Uniform::with_std(in_std))?,
        shared_gate: f.new_bf16(gpu, d, seed, tag::MOE_SHARED_GATE, Uniform::with_std(in_std))?,
        experts,
    })
}

/// A PLE layer's device weights: the stacked key and value projections 1/√embed_dim (bf16, or
/// NVFP4 with one global scale for both: the same std), the three norms zero-centred, the conv
/// 1/√kernel.
pub fn ple(gpu: &Gpu, shape: PleShape, nvfp4: bool, seed: u64) -> Result<PleWeightsOnDevice> {
    let f = Fills::load(gpu)?;
    let (nd, p) = (shape.residual_width(), shape.embed_dim());
    let zc = Uniform::symmetric(ZC_NORM);
    let std = projection_std(p);
    let proj = if nvfp4 {
        let (packed, scales) = f.new_nvfp4(gpu, shape.proj_rows() * p, p, seed, tag::PLE_PROJ)?;
        let s = nvfp4_scale_2(std);
        let rows = shape.proj_rows() as u32;
        MatrixOnDevice::Nvfp4 { packed, scales, scale2: gpu.upload(&[s, s, 0.0, 0.0])?, segs: [nd as u32, rows, rows] }
    } else {
        MatrixOnDevice::Bf16(f.new_bf16(gpu, shape.proj_rows() * p, seed, tag::PLE_PROJ, Uniform::with_std(std))?)
    };
    Ok(PleWeightsOnDevice {
        shape,
        proj,
        norm_key: f.new_bf16(gpu, nd, seed, tag::PLE_NORM_KEY, zc)?,
        norm_query: f.new_bf16(gpu, nd, seed, tag::PLE_NORM_QUERY, zc)?,
        norm_conv: f.new_bf16(gpu, nd, seed, tag::PLE_NORM_CONV, zc)?,
        conv: f.new_bf16(
            gpu,
            nd * shape.conv_kernel,
            seed,
            tag::PLE_CONV,
            Uniform::with_std(projection_std(shape.conv_kernel)),
        )?,
    })
}

/// The token embedding [vocab, hidden], standard deviation 1.
pub fn embed(gpu: &Gpu, vocab: usize, hidden: usize, seed: u64) -> Result<DeviceBuffer<bf16>> {
    Fills::load(gpu)?.new_bf16(gpu, vocab * hidden, seed, tag::EMBED, Uniform::with_std(1.0))
}

/// The lm_head [vocab, hidden], 1/√hidden, bf16 or NVFP4, ready to launch.
pub fn lm_head(gpu: &Gpu, vocab: usize, hidden: usize, nvfp4: bool, seed: u64, tiles: LmHeadTiles) -> Result<LmHead> {
    let f = Fills::load(gpu)?;
    let std = projection_std(hidden);
    let weights = if nvfp4 {
        let (mut packed, scales) = f.new_nvfp4(gpu, vocab * hidden, hidden, seed, tag::LM_HEAD)?;
        // The lm_head kernel reads its codes in the paired layout of the architecture.
        f.to_layout(gpu, &mut packed, paired_codes::layout(gpu))?;
        LmHeadWeights::Nvfp4 { packed, scales, scale2: gpu.upload(&[nvfp4_scale_2(std)])? }
    } else {
        LmHeadWeights::Bf16(f.new_bf16(gpu, vocab * hidden, seed, tag::LM_HEAD, Uniform::with_std(std))?)
    };
    LmHead::from_device(gpu, weights, vocab, hidden, tiles)
}

/// Rows per unit of work of the table fill (and of its progress).
const TABLE_CHUNK_ROWS: usize = 1 << 16;

/// PLE table rows `first_row..` into `out` (whole rows of `format` and `width`), from `seed`:
/// bf16 rows are elements `row·width..` of the bf16 fill (standard deviation 1); NVFP4 rows hold
/// the codes and scales an NVFP4 matrix [rows, width] would have from the codes and scales
/// streams (its global scale [`nvfp4_scale_2`]`(1)` goes in the header), then zeros.
pub fn fill_ple_rows(out: &mut [u8], first_row: u64, format: RowFormat, width: usize, seed: u64) {
    let row_bytes = format.row_bytes(width);
    for (k, row) in out.chunks_exact_mut(row_bytes).enumerate() {
        let r = first_row + k as u64;
        match format {
            RowFormat::Bf16 => {
                let s = stream_seed(seed, tag::PLE_TABLE, Stream::Values);
                let u = Uniform::with_std(1.0);
                for (i, v) in row.chunks_exact_mut(2).enumerate() {
                    v.copy_from_slice(&reference::uniform_bf16(s, r * width as u64 + i as u64, u).to_le_bytes());
                }
            }
            RowFormat::Nvfp4 => {
                let (codes, blocks) = (width / 2, width / BLOCK);
                let (c, rest) = row.split_at_mut(codes);
                let (sc, pad) = rest.split_at_mut(blocks);
                reference::fill_nvfp4_codes(c, r * codes as u64, stream_seed(seed, tag::PLE_TABLE, Stream::Codes));
                let scales_seed = stream_seed(seed, tag::PLE_TABLE, Stream::Scales);
                reference::fill_e4m3_scales(sc, r * blocks as u64, scales_seed, SCALE_LO, SCALE_SPAN);
                pad.fill(0);
            }
        }
    }
}

/// A synthetic PLE table for `cfg` in pinned host memory mapped for the device, rows of `format`,
/// filled by every core of the host (29 GB in NVFP4 at full size); `progress(what, rows done,
/// rows)` is called from this thread every ~100 ms and at the end.
pub fn ple_table(
    gpu: &Gpu,
    cfg: &ModelConfig,
    format: RowFormat,
    seed: u64,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<PleTableOnHost> {
    let mut header = TableHeader::for_config(cfg, format).map_err(|e| Error::Buffer(e.to_string()))?;
    if format == RowFormat::Nvfp4 {
        header.scale_2 = vec![nvfp4_scale_2(1.0); header.layers as usize];
    }
    let row_bytes = header.row_bytes();
    let bytes = usize::try_from(header.data_bytes())
        .map_err(|_| Error::Buffer(format!("a PLE table of {} bytes", header.data_bytes())))?;
    progress("PLE table: pinning host memory", 0, header.rows as usize);
    let mut rows = MappedHostBuffer::<u8>::new(gpu.context(), bytes)?;
    let width = header.width as usize;
    fill_table_parallel(
        rows.as_mut_slice(),
        row_bytes,
        &|out, first| fill_ple_rows(out, first, format, width, seed),
        progress,
    );
    Ok(PleTableOnHost::Pinned { header, rows })
}

/// Fills `rows` (whole rows of `row_bytes`) with `fill(chunk, first row)` on every core, in
/// chunks, reporting rows done through `progress` from this thread.
fn fill_table_parallel(
    rows: &mut [u8],
    row_bytes: usize,
    fill: &(dyn Fn(&mut [u8], u64) + Sync),
    progress: &mut dyn FnMut(&str, usize, usize),
) {
    const WHAT: &str = "PLE table: filling rows";
    let total = rows.len() / row_bytes;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, total.max(1));
    let per_thread = total.div_ceil(threads).max(1);
    let done = AtomicU64::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = rows
            .chunks_mut(per_thread * row_bytes)
            .enumerate()
            .map(|(t, part)| {
                let done = &done;
                s.spawn(move || {
                    let first = (t * per_thread) as u64;
                    for (k, chunk) in part.chunks_mut(TABLE_CHUNK_ROWS * row_bytes).enumerate() {
                        fill(chunk, first + (k * TABLE_CHUNK_ROWS) as u64);
                        done.fetch_add((chunk.len() / row_bytes) as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // A worker that panics ends its loop early; the scope's join then passes the panic on.
        while !workers.iter().all(|w| w.is_finished()) {
            progress(WHAT, done.load(Ordering::Relaxed) as usize, total);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    progress(WHAT, done.load(Ordering::Relaxed) as usize, total);
}

/// The seed of part `part` of layer `layer` of a model seeded with `seed` (parts: 0 the attention
/// mix site, 1 the mixer, 2 the MoE mix site, 3 the MoE, 4 PLE); [`model_part_seed`] for the
/// parts outside the layers.
pub fn layer_part_seed(seed: u64, layer: usize, part: u64) -> u64 {
    derive_seed(seed, &[layer as u64, part])
}

/// The seed of the final mixer (0), the embedding (1), the lm_head (2) or the PLE table (3) of a
/// model seeded with `seed`.
pub fn model_part_seed(seed: u64, part: u64) -> u64 {
    derive_seed(seed, &[u64::MAX, part])
}

/// Layer `layer` of `cfg` in `formats`, from the model's `seed`.
pub fn layer(gpu: &Gpu, cfg: &ModelConfig, layer: usize, formats: &Formats, seed: u64) -> Result<LayerOnDevice> {
    let part = |p| layer_part_seed(seed, layer, p);
    let site = mix_shape(cfg, true);
    let kind = *cfg
        .layer_kinds
        .get(layer)
        .ok_or_else(|| Error::Buffer(format!("layer {layer} of a {}-layer config", cfg.num_layers)))?;
    let mixer = match kind {
        LayerKind::Gdn => MixerOnDevice::Gdn(gdn(
            gpu,
            GdnShape::from_config(cfg)?,
            formats.gdn_in_proj,
            formats.gdn_out_proj,
            part(1),
        )?),
        LayerKind::Qsa => MixerOnDevice::Qsa(qsa(gpu, QsaShape::from_config(cfg)?, formats.qsa, part(1))?),
    };
    let ple_weights = if cfg.is_ple_layer(layer) {
        Some(ple(gpu, PleShape::from_config(cfg)?, formats.ple_proj, part(4))?)
    } else {
        None
    };
    Ok(LayerOnDevice {
        attn_mix: mix(gpu, site, formats.mix, part(0))?,
        mixer,
        mlp_mix: mix(gpu, site, formats.mix, part(2))?,
        moe: moe(gpu, moe_shape(cfg), formats.experts, part(3))?,
        ple: ple_weights,
    })
}

/// Every layer of `cfg`; `progress("layer", done, layers)` after each, once the device has
/// written it (a layer of the published model is 1.5 GB in NVFP4: a millisecond or so).
pub fn layers(
    gpu: &Gpu,
    cfg: &ModelConfig,
    formats: &Formats,
    seed: u64,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<LayerOnDevice>> {
    let mut out = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        out.push(layer(gpu, cfg, l, formats, seed)?);
        gpu.synchronize()?;
        progress("layer", l + 1, cfg.num_layers);
    }
    Ok(out)
}

/// The final mixer (`hc_head`, no write gains).
pub fn final_mix(gpu: &Gpu, cfg: &ModelConfig, formats: &Formats, seed: u64) -> Result<MixWeightsOnDevice> {
    mix(gpu, mix_shape(cfg, false), formats.mix, model_part_seed(seed, 0))
}

/// The bytes of a synthetic model of `cfg` in `formats`: what [`layers`] and the other parts
/// allocate on the device (and fill) per kind of part, the PLE table in host memory, and the
/// weight bytes one token reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightBytes {
    /// Every mix site (two a layer and the final mixer).
    pub mix: usize,
    pub gdn: usize,
    pub qsa: usize,
    pub moe: usize,
    /// PLE's device weights (the projections, norms and conv).
    pub ple: usize,
    pub embed: usize,
    pub lm_head: usize,
    /// The PLE table's rows, in host memory.
    pub ple_table: u64,
    /// Weights one decode step reads: every mix site, mixer, PLE block and the lm_head whole, of
    /// each MoE block its router, shared gate, the chosen experts and the shared expert
    /// ([`MoeShape::bytes_read`], which counts x too), one embedding row, the PLE rows.
    pub read_per_token: usize,
}

impl WeightBytes {
    /// Everything in device memory.
    pub fn device(&self) -> usize {
        self.mix + self.gdn + self.qsa + self.moe + self.ple + self.embed + self.lm_head
    }
}

/// Bytes of a MoE block's weights.
fn moe_weight_bytes(sh: &MoeShape, nvfp4: bool) -> usize {
    let values = 3 * (sh.experts * sh.inter + sh.shared_inter) * sh.hidden;
    let experts = if nvfp4 { values / 2 + values / 16 + 4 * 3 * (sh.experts + 1) } else { 2 * values };
    2 * (sh.experts * sh.hidden + sh.hidden) + experts
}

/// [`WeightBytes`] of `cfg` in `formats`.
pub fn synthetic_weight_bytes(cfg: &ModelConfig, formats: &Formats) -> Result<WeightBytes> {
    let (d, v) = (cfg.hidden_size, cfg.vocab_size);
    let sites = 2 * cfg.num_layers;
    let mix = sites * mix_shape(cfg, true).weight_bytes(formats.mix) + mix_shape(cfg, false).weight_bytes(formats.mix);
    let count = |k| cfg.layer_kinds.iter().filter(|&&x| x == k).count();
    let gdn = if count(LayerKind::Gdn) > 0 {
        count(LayerKind::Gdn) * GdnShape::from_config(cfg)?.weight_bytes(formats.gdn_in_proj, formats.gdn_out_proj)
    } else {
        0
    };
    let qsa = if count(LayerKind::Qsa) > 0 {
        count(LayerKind::Qsa) * QsaShape::from_config(cfg)?.weight_bytes(formats.qsa)
    } else {
        0
    };
    let moe_sh = moe_shape(cfg);
    let moe = cfg.num_layers * moe_weight_bytes(&moe_sh, formats.experts);
    let (ple, ple_table, ple_rows) = if cfg.ple_layers.is_empty() {
        (0, 0, 0)
    } else {
        let sh = PleShape::from_config(cfg)?;
        let nd = sh.residual_width();
        let one = sh.proj_bytes(formats.ple_proj) + 2 * (3 * nd + nd * sh.conv_kernel);
        let header = TableHeader::for_config(cfg, formats.ple_table).map_err(|e| Error::Buffer(e.to_string()))?;
        let rows = cfg.ple_layers.len() * sh.heads * header.row_bytes();
        (cfg.ple_layers.len() * one, header.data_bytes(), rows)
    };
    let embed = 2 * v * d;
    let lm_head = if formats.lm_head { v * d / 2 + v * d / 16 + 4 } else { 2 * v * d };
    let read_per_token =
        mix + gdn + qsa + cfg.num_layers * moe_sh.bytes_read(formats.experts) + ple + ple_rows + 2 * d + lm_head;
    Ok(WeightBytes { mix, gdn, qsa, moe, ple, embed, lm_head, ple_table, read_per_token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvfp4_values_get_the_asked_standard_deviation() {
        // The mean square of code × scale × scale_2 over every code byte and scale code.
        let s2 = nvfp4_scale_2(0.02);
        let mut sq = 0f64;
        let mut n = 0f64;
        for byte in 0u8..=255 {
            for code in SCALE_LO..SCALE_LO + SCALE_SPAN {
                for v in E2m1x2(byte).to_f32() {
                    let x = f64::from(v * E4m3(code).to_f32() * s2);
                    sq += x * x;
                    n += 1.0;
                }
            }
        }
        let std = (sq / n).sqrt();
        assert!((std - 0.02).abs() < 1e-6, "{std}");
        for code in SCALE_LO..SCALE_LO + SCALE_SPAN {
            let v = E4m3(code).to_f32();
            assert!(v.is_finite() && (1.0..=3.75).contains(&v), "{code:#x}: {v}");
        }
    }

    #[test]
    fn ple_rows_are_the_matrix_streams_and_the_parallel_fill_matches() {
        let width = 160;
        for format in [RowFormat::Nvfp4, RowFormat::Bf16] {
            let rb = format.row_bytes(width);
            let rows = 3 * TABLE_CHUNK_ROWS / 2 + 7;
            let mut serial = vec![0u8; rows * rb];
            fill_ple_rows(&mut serial, 0, format, width, 11);
            let mut parallel = vec![0xabu8; rows * rb];
            let mut calls = 0;
            fill_table_parallel(
                &mut parallel,
                rb,
                &|o, f| fill_ple_rows(o, f, format, width, 11),
                &mut |_, done, total| {
                    calls += 1;
                    assert!(done <= total);
                },
            );
            assert!(calls >= 1);
            assert!(serial == parallel, "{format:?}: the parallel fill differs");
            // Row 5 against the streams.
            let row = &serial[5 * rb..6 * rb];
            match format {
                RowFormat::Nvfp4 => {
                    let mut codes = vec![0u8; 80];
                    reference::fill_nvfp4_codes(&mut codes, 5 * 80, stream_seed(11, tag::PLE_TABLE, Stream::Codes));
                    assert_eq!(row[..80], codes[..]);
                    let mut scales = vec![0u8; 10];
                    let s = stream_seed(11, tag::PLE_TABLE, Stream::Scales);
                    reference::fill_e4m3_scales(&mut scales, 5 * 10, s, SCALE_LO, SCALE_SPAN);
                    assert_eq!(row[80..90], scales[..]);
                    assert_eq!(row[90..], [0; 6]);
                }
                RowFormat::Bf16 => {
                    let s = stream_seed(11, tag::PLE_TABLE, Stream::Values);
                    let want = reference::uniform_bf16(s, 5 * 160 + 7, Uniform::with_std(1.0));
                    assert_eq!(row[14..16], want.to_le_bytes());
                }
            }
        }
    }

    #[test]
    fn published_bytes() {
        let cfg = ModelConfig::published();
        let b = synthetic_weight_bytes(&cfg, &Formats::all(true)).expect("bytes");
        // 48 × (513 experts × 3 × 640 × 2560 values at 0.5625 B + router and shared gate): 68.2 GB.
        let values = 3 * 513 * 640 * 2560;
        assert_eq!(b.moe, 48 * (values / 2 + values / 16 + 12 * 513 + 2 * (512 * 2560 + 2560)));
        assert!(b.moe > 68_000_000_000 && b.moe < 69_000_000_000, "{}", b.moe);
        // 320,001,536 rows of 96 bytes.
        assert_eq!(b.ple_table, 320_001_536 * 96);
        assert!(b.read_per_token > 3_000_000_000 && b.read_per_token < 6_000_000_000, "{}", b.read_per_token);
        let bf16 = synthetic_weight_bytes(&cfg, &Formats::all(false)).expect("bytes");
        assert_eq!(bf16.ple_table, 320_001_536 * 320);
        assert!(bf16.device() > 3 * b.device());
    }
}
