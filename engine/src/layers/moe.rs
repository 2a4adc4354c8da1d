//! One MoE block on the device: its weights stacked as the kernels read them, its scratch, and
//! its three launches (router, gate+up, down).

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::moe::down::{moe_down_bf16, moe_down_nvfp4};
use crate::kernels::moe::gate_up::{moe_gate_up_bf16, moe_gate_up_nvfp4};
use crate::kernels::moe::router::moe_router;
use crate::layers::paired_codes;
use crate::model::nvfp4::Nvfp4Matrix;

/// The shape of a MoE block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
    pub shared_inter: usize,
    pub renormalise: bool,
}

impl MoeShape {
    /// Row stride of the intermediate activations h: the larger intermediate size, rounded up to 16
    /// (whole 16-value chunks, as the NVFP4 down kernel reads them).
    pub fn h_stride(&self) -> usize {
        self.inter.max(self.shared_inter).div_ceil(16) * 16
    }

    /// Bytes one token's pass must read: the router, the shared gate, x, and the chosen experts'
    /// and the shared expert's three matrices (NVFP4: values, block scales, global scales).
    pub fn bytes_read(&self, nvfp4: bool) -> usize {
        let d = self.hidden;
        let matrices = 3 * (self.top_k * self.inter + self.shared_inter) * d;
        let experts = if nvfp4 { matrices / 2 + matrices / 16 + 4 * 3 * (self.top_k + 1) } else { 2 * matrices };
        2 * (self.experts * d + d + d) + experts
    }
}

/// One expert's three matrices in NVFP4: gate and up [inter, hidden], down [hidden, inter].
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertNvfp4 {
    pub gate: Nvfp4Matrix,
    pub up: Nvfp4Matrix,
    pub down: Nvfp4Matrix,
}

/// NVFP4 experts stacked: the routed experts in order, then the shared expert.
#[derive(Clone, Debug, PartialEq)]
pub struct StackedNvfp4 {
    /// Rows: expert e's gate rows, then its up rows; [Σ 2·inter_e, hidden / 2] bytes.
    pub gate_up_packed: Vec<u8>,
    pub gate_up_scales: Vec<u8>,
    /// [E + 1, 2]: gate and up global scales.
    pub gate_up_scale2: Vec<f32>,
    /// Expert e's [hidden, inter_e] down matrix after the others.
    pub down_packed: Vec<u8>,
    pub down_scales: Vec<u8>,
    /// [E + 1].
    pub down_scale2: Vec<f32>,
}

impl StackedNvfp4 {
    pub fn stack(experts: &[ExpertNvfp4], shared: &ExpertNvfp4) -> StackedNvfp4 {
        let mut s = StackedNvfp4 {
            gate_up_packed: vec![],
            gate_up_scales: vec![],
            gate_up_scale2: vec![],
            down_packed: vec![],
            down_scales: vec![],
            down_scale2: vec![],
        };
        for e in experts.iter().chain(std::iter::once(shared)) {
            for m in [&e.gate, &e.up] {
                s.gate_up_packed.extend_from_slice(&m.packed);
                s.gate_up_scales.extend_from_slice(&m.scales);
                s.gate_up_scale2.push(m.scale_2);
            }
            s.down_packed.extend_from_slice(&e.down.packed);
            s.down_scales.extend_from_slice(&e.down.scales);
            s.down_scale2.push(e.down.scale_2);
        }
        s
    }
}

/// The expert weights on the device. (One per layer: the size difference of the variants costs
/// nothing worth a box.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum ExpertsOnDevice {
    Nvfp4 {
        gate_up_packed: DeviceBuffer<E2m1x2>,
        gate_up_scales: DeviceBuffer<E4m3>,
        gate_up_scale2: DeviceBuffer<f32>,
        down_packed: DeviceBuffer<E2m1x2>,
        down_scales: DeviceBuffer<E4m3>,
        down_scale2: DeviceBuffer<f32>,
    },
    /// Stacked as the NVFP4 ones: gate_up [Σ 2·inter_e, hidden], down [Σ hidden·inter_e].
    Bf16 { gate_up: DeviceBuffer<bf16>, down: DeviceBuffer<bf16> },
}

/// A MoE block's weights on the device.
#[derive(Debug)]
pub struct MoeWeightsOnDevice {
    pub shape: MoeShape,
    /// [experts, hidden].
    pub router: DeviceBuffer<bf16>,
    /// [hidden].
    pub shared_gate: DeviceBuffer<bf16>,
    pub experts: ExpertsOnDevice,
}

impl MoeWeightsOnDevice {
    pub fn upload_nvfp4(
        gpu: &Gpu,
        shape: MoeShape,
        router: &[bf16],
        shared_gate: &[bf16],
        s: &StackedNvfp4,
    ) -> Result<Self> {
        let (d, e) = (shape.hidden, shape.experts);
        let gate_up_values = 2 * (e * shape.inter + shape.shared_inter) * d;
        let down_values = (e * shape.inter + shape.shared_inter) * d;
        let checks = [
            ("router", router.len(), e * d),
            ("shared expert gate", shared_gate.len(), d),
            ("stacked gate/up values", s.gate_up_packed.len() * 2, gate_up_values),
            ("stacked gate/up scales", s.gate_up_scales.len() * 16, gate_up_values),
            ("stacked gate/up global scales", s.gate_up_scale2.len(), 2 * (e + 1)),
            ("stacked down values", s.down_packed.len() * 2, down_values),
            ("stacked down scales", s.down_scales.len() * 16, down_values),
            ("stacked down global scales", s.down_scale2.len(), e + 1),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("MoE {what}: {got} values for a shape that needs {want}")));
            }
        }
        let bytes = |v: &[u8]| v.iter().map(|&b| E2m1x2(b)).collect::<Vec<_>>();
        let codes = |v: &[u8]| v.iter().map(|&b| E4m3(b)).collect::<Vec<_>>();
        Ok(MoeWeightsOnDevice {
            shape,
            router: gpu.upload(router)?,
            shared_gate: gpu.upload(shared_gate)?,
            experts: ExpertsOnDevice::Nvfp4 {
                // The gate/up kernel reads its codes in the paired layout of the architecture.
                gate_up_packed: paired_codes::upload(gpu, "MoE stacked gate/up codes", &s.gate_up_packed)?,
                gate_up_scales: gpu.upload(&codes(&s.gate_up_scales))?,
                gate_up_scale2: gpu.upload(&s.gate_up_scale2)?,
                down_packed: gpu.upload(&bytes(&s.down_packed))?,
                down_scales: gpu.upload(&codes(&s.down_scales))?,
                down_scale2: gpu.upload(&s.down_scale2)?,
            },
        })
    }

    pub fn upload_bf16(
        gpu: &Gpu,
        shape: MoeShape,
        router: &[bf16],
        shared_gate: &[bf16],
        gate_up: &[bf16],
        down: &[bf16],
    ) -> Result<Self> {
        let (d, e) = (shape.hidden, shape.experts);
        let values = (e * shape.inter + shape.shared_inter) * d;
        if router.len() != e * d || shared_gate.len() != d || gate_up.len() != 2 * values || down.len() != values {
            return Err(Error::Buffer(format!(
                "bf16 MoE weights: router {}, shared gate {}, gate/up {}, down {} values for a shape that needs {}, {}, {}, {}",
                router.len(),
                shared_gate.len(),
                gate_up.len(),
                down.len(),
                e * d,
                d,
                2 * values,
                values
            )));
        }
        Ok(MoeWeightsOnDevice {
            shape,
            router: gpu.upload(router)?,
            shared_gate: gpu.upload(shared_gate)?,
            experts: ExpertsOnDevice::Bf16 { gate_up: gpu.upload(gate_up)?, down: gpu.upload(down)? },
        })
    }
}

/// What one MoE pass writes besides its output. The counters must be zero before the first pass;
/// every pass leaves them zero.
#[derive(Debug)]
pub struct MoeScratch {
    /// The experts' logits, then the shared expert's gate logit [experts + 1].
    pub logits: DeviceBuffer<f32>,
    pub router_counter: DeviceBuffer<u32>,
    /// The chosen experts [top_k].
    pub ids: DeviceBuffer<u32>,
    /// Their routing weights, then the shared expert's gate [top_k + 1].
    pub weights: DeviceBuffer<f32>,
    /// x as the NVFP4 kernels read it: f16 pairs [hidden / 8], each 16-value chunk divided by its
    /// largest |x| (`x_scale` [hidden / 16]).
    pub x_staged: DeviceBuffer<[u32; 4]>,
    pub x_scale: DeviceBuffer<f32>,
    /// SiLU(gate)·up per slot, f32 [top_k + 1, h_stride] (NVFP4 path).
    pub h: DeviceBuffer<f32>,
    /// h as the NVFP4 down kernel reads it: f16 pairs [(top_k + 1)·h_stride / 8], each 16-value
    /// chunk divided by its largest |h| (`h_scale` [(top_k + 1)·h_stride / 16]), then the chunks
    /// in int8 [(top_k + 1)·h_stride / 16], times 127 over that largest |h|.
    pub h_staged: DeviceBuffer<[u32; 4]>,
    pub h_scale: DeviceBuffer<f32>,
    /// SiLU(gate)·up per slot in bf16 (bf16 path).
    pub h_bf16: DeviceBuffer<bf16>,
}

impl MoeScratch {
    pub fn new(gpu: &Gpu, shape: MoeShape) -> Result<MoeScratch> {
        let slots = shape.top_k + 1;
        Ok(MoeScratch {
            logits: gpu.alloc(shape.experts + 1)?,
            router_counter: gpu.alloc(1)?,
            ids: gpu.alloc(shape.top_k)?,
            weights: gpu.alloc(slots)?,
            x_staged: gpu.alloc(shape.hidden / 8)?,
            x_scale: gpu.alloc(shape.hidden / 16)?,
            h: gpu.alloc(slots * shape.h_stride())?,
            h_staged: gpu.alloc(slots * shape.h_stride() / 8 + slots * shape.h_stride() / 16)?,
            h_scale: gpu.alloc(slots * shape.h_stride() / 16)?,
            h_bf16: gpu.alloc(slots * shape.h_stride())?,
        })
    }
}

/// The MoE kernels, compiled for one device at chosen tiles.
#[derive(Debug)]
pub struct MoeKernels {
    pub router: LoadedKernel<moe_router::Kernel>,
    pub gate_up_nvfp4: LoadedKernel<moe_gate_up_nvfp4::Kernel>,
    pub down_nvfp4: LoadedKernel<moe_down_nvfp4::Kernel>,
    pub gate_up_bf16: LoadedKernel<moe_gate_up_bf16::Kernel>,
    pub down_bf16: LoadedKernel<moe_down_bf16::Kernel>,
}

/// Tile choices for the MoE kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeTiles {
    pub router: moe_router::Tiles,
    pub gate_up_nvfp4: moe_gate_up_nvfp4::Tiles,
    pub down_nvfp4: moe_down_nvfp4::Tiles,
    pub gate_up_bf16: moe_gate_up_bf16::Tiles,
    pub down_bf16: moe_down_bf16::Tiles,
}

impl Default for MoeTiles {
    fn default() -> Self {
        MoeTiles {
            router: TileSet::DEFAULT,
            gate_up_nvfp4: TileSet::DEFAULT,
            down_nvfp4: TileSet::DEFAULT,
            gate_up_bf16: TileSet::DEFAULT,
            down_bf16: TileSet::DEFAULT,
        }
    }
}

impl MoeTiles {
    /// Each launch at its default tiles where they take `shape`, else at its first declared
    /// candidate that does; None when no candidate takes it.
    pub fn fitting(shape: MoeShape) -> Option<MoeTiles> {
        use kernel_dsl::KernelDef;
        fn first<T: TileSet>(fits: impl Fn(&T) -> bool) -> Option<T> {
            std::iter::once(T::DEFAULT).chain(T::candidates()).find(|t| fits(t))
        }
        let (b, n) = (MoeLaunches::unbound(shape, false), MoeLaunches::unbound(shape, true));
        let (GateUp::Bf16(gb), Down::Bf16(db), GateUp::Nvfp4(gn), Down::Nvfp4(dn)) =
            (b.gate_up, b.down, n.gate_up, n.down)
        else {
            unreachable!("unbound makes the format it is asked for")
        };
        let t = MoeTiles {
            router: first(|t| moe_router::Kernel::launch_dims(t, &b.router).is_ok())?,
            gate_up_nvfp4: first(|t| moe_gate_up_nvfp4::Kernel::launch_dims(t, &gn).is_ok())?,
            down_nvfp4: first(|t| moe_down_nvfp4::Kernel::launch_dims(t, &dn).is_ok())?,
            gate_up_bf16: first(|t| moe_gate_up_bf16::Kernel::launch_dims(t, &gb).is_ok())?,
            down_bf16: first(|t| moe_down_bf16::Kernel::launch_dims(t, &db).is_ok())?,
        };
        t.check(shape).ok().map(|()| t)
    }

    /// Whether these tiles can run `shape`: each kernel's requirements, checked as a launch would
    /// check them (the addresses do not matter to the checks).
    pub fn check(&self, shape: MoeShape) -> std::result::Result<(), kernel_dsl::LaunchError> {
        use kernel_dsl::KernelDef;
        for nvfp4 in [true, false] {
            let a = MoeLaunches::unbound(shape, nvfp4);
            moe_router::Kernel::launch_dims(&self.router, &a.router)?;
            match (&a.gate_up, &a.down) {
                (GateUp::Nvfp4(g), Down::Nvfp4(d)) => {
                    moe_gate_up_nvfp4::Kernel::launch_dims(&self.gate_up_nvfp4, g)?;
                    moe_down_nvfp4::Kernel::launch_dims(&self.down_nvfp4, d)?;
                }
                (GateUp::Bf16(g), Down::Bf16(d)) => {
                    moe_gate_up_bf16::Kernel::launch_dims(&self.gate_up_bf16, g)?;
                    moe_down_bf16::Kernel::launch_dims(&self.down_bf16, d)?;
                }
                _ => unreachable!("the two stages are built for one format"),
            }
        }
        Ok(())
    }
}

impl MoeKernels {
    pub fn load(gpu: &Gpu, tiles: MoeTiles) -> Result<MoeKernels> {
        Ok(MoeKernels {
            router: gpu.kernel(tiles.router)?,
            gate_up_nvfp4: gpu.kernel(tiles.gate_up_nvfp4)?,
            down_nvfp4: gpu.kernel(tiles.down_nvfp4)?,
            gate_up_bf16: gpu.kernel(tiles.gate_up_bf16)?,
            down_bf16: gpu.kernel(tiles.down_bf16)?,
        })
    }
}

/// The gate/up launch of one format.
#[derive(Clone, Copy, Debug)]
pub enum GateUp {
    Nvfp4(moe_gate_up_nvfp4::Args),
    Bf16(moe_gate_up_bf16::Args),
}

/// The down launch of one format.
#[derive(Clone, Copy, Debug)]
pub enum Down {
    Nvfp4(moe_down_nvfp4::Args),
    Bf16(moe_down_bf16::Args),
}

/// The three launches of one MoE pass, arguments bound.
#[derive(Clone, Copy, Debug)]
pub struct MoeLaunches {
    pub router: moe_router::Args,
    pub gate_up: GateUp,
    pub down: Down,
}

/// One of the three launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Router,
    GateUp,
    Down,
}

/// The values of all addresses of a pass, so that one function builds the arguments both for a
/// pass and for checking a shape (with every address 0).
struct Addresses {
    x: u64,
    y: u64,
    router: u64,
    shared_gate: u64,
    gate_up: [u64; 3],
    down: [u64; 3],
    s: [u64; 10],
}

impl MoeLaunches {
    /// The launches of `y = MoE(x)` with these weights and scratch.
    pub fn new(w: &MoeWeightsOnDevice, s: &mut MoeScratch, x: DevPtr<bf16>, y: DevPtrMut<bf16>) -> MoeLaunches {
        let (gate_up, down, nvfp4) = match &w.experts {
            ExpertsOnDevice::Nvfp4 {
                gate_up_packed,
                gate_up_scales,
                gate_up_scale2,
                down_packed,
                down_scales,
                down_scale2,
            } => (
                [gate_up_packed.ptr().addr(), gate_up_scales.ptr().addr(), gate_up_scale2.ptr().addr()],
                [down_packed.ptr().addr(), down_scales.ptr().addr(), down_scale2.ptr().addr()],
                true,
            ),
            ExpertsOnDevice::Bf16 { gate_up, down } => ([gate_up.ptr().addr(), 0, 0], [down.ptr().addr(), 0, 0], false),
        };
        let a = Addresses {
            x: x.addr(),
            y: y.addr(),
            router: w.router.ptr().addr(),
            shared_gate: w.shared_gate.ptr().addr(),
            gate_up,
            down,
            s: [
                s.logits.ptr_mut().addr(),
                s.router_counter.ptr_mut().addr(),
                s.ids.ptr_mut().addr(),
                s.weights.ptr_mut().addr(),
                s.x_staged.ptr_mut().addr(),
                s.x_scale.ptr_mut().addr(),
                s.h.ptr_mut().addr(),
                s.h_staged.ptr_mut().addr(),
                s.h_scale.ptr_mut().addr(),
                s.h_bf16.ptr_mut().addr(),
            ],
        };
        MoeLaunches::build(w.shape, nvfp4, &a)
    }

    /// The launches with every address 0: for checking a shape against tiles.
    pub fn unbound(shape: MoeShape, nvfp4: bool) -> MoeLaunches {
        let a = Addresses { x: 0, y: 0, router: 0, shared_gate: 0, gate_up: [0; 3], down: [0; 3], s: [0; 10] };
        MoeLaunches::build(shape, nvfp4, &a)
    }

    fn build(sh: MoeShape, nvfp4: bool, a: &Addresses) -> MoeLaunches {
        fn r<T>(addr: u64) -> DevPtr<T> {
            DevPtr::from_addr(addr)
        }
        fn w<T>(addr: u64) -> DevPtrMut<T> {
            DevPtrMut::from_addr(addr)
        }
        let u = |v: usize| v as u32;
        let (experts, hidden, inter, shared_inter, h_stride, top_k) =
            (u(sh.experts), u(sh.hidden), u(sh.inter), u(sh.shared_inter), u(sh.h_stride()), u(sh.top_k));
        let [logits, router_counter, ids, weights, x_staged, x_scale, h, h_staged, h_scale, h_bf16] = a.s;
        let router = moe_router::Args {
            router: r(a.router),
            shared_gate: r(a.shared_gate),
            x: r(a.x),
            logits: w(logits),
            counter: w(router_counter),
            ids: w(ids),
            weights: w(weights),
            x_staged: w(x_staged),
            x_scale: w(x_scale),
            experts,
            hidden,
            top_k,
            renormalise: sh.renormalise,
        };
        let (gate_up, down) = if nvfp4 {
            (
                GateUp::Nvfp4(moe_gate_up_nvfp4::Args {
                    x_staged: r(x_staged),
                    x_scale: r(x_scale),
                    ids: r(ids),
                    packed: r(a.gate_up[0]),
                    scales: r(a.gate_up[1]),
                    scale2: r(a.gate_up[2]),
                    h: w(h),
                    h_staged: w(h_staged),
                    h_scale: w(h_scale),
                    experts,
                    hidden,
                    inter,
                    shared_inter,
                    h_stride,
                    top_k,
                }),
                Down::Nvfp4(moe_down_nvfp4::Args {
                    h_staged: r(h_staged),
                    h_scale: r(h_scale),
                    ids: r(ids),
                    weights: r(weights),
                    packed: r(a.down[0]),
                    scales: r(a.down[1]),
                    scale2: r(a.down[2]),
                    y: w(a.y),
                    experts,
                    hidden,
                    inter,
                    shared_inter,
                    h_stride,
                    top_k,
                }),
            )
        } else {
            (
                GateUp::Bf16(moe_gate_up_bf16::Args {
                    x: r(a.x),
                    ids: r(ids),
                    weights: r(a.gate_up[0]),
                    h: w(h_bf16),
                    experts,
                    hidden,
                    inter,
                    shared_inter,
                    h_stride,
                    top_k,
                }),
                Down::Bf16(moe_down_bf16::Args {
                    h: r(h_bf16),
                    ids: r(ids),
                    weights: r(weights),
                    down: r(a.down[0]),
                    y: w(a.y),
                    experts,
                    hidden,
                    inter,
                    shared_inter,
                    h_stride,
                    top_k,
                }),
            )
        };
        MoeLaunches { router, gate_up, down }
    }

    /// Enqueues one of the three launches.
    ///
    /// # Safety
    /// The launches were built by [`MoeLaunches::new`] from buffers that are still alive, with
    /// `x` and `y` addressing `hidden` bf16 elements that overlap neither weights nor scratch.
    pub unsafe fn enqueue_stage(&self, gpu: &Gpu, k: &MoeKernels, stage: Stage) -> Result<()> {
        // SAFETY: every buffer behind the arguments was sized from the shape when it was made (the
        // upload checks the weights' lengths against it); the caller vouches for x, y and liveness.
        unsafe {
            match (stage, &self.gate_up, &self.down) {
                (Stage::Router, ..) => k.router.launch(gpu, &self.router),
                (Stage::GateUp, GateUp::Nvfp4(a), _) => k.gate_up_nvfp4.launch(gpu, a),
                (Stage::GateUp, GateUp::Bf16(a), _) => k.gate_up_bf16.launch(gpu, a),
                (Stage::Down, _, Down::Nvfp4(a)) => k.down_nvfp4.launch(gpu, a),
                (Stage::Down, _, Down::Bf16(a)) => k.down_bf16.launch(gpu, a),
            }
        }
    }

    /// Enqueues the pass: router, gate/up, down.
    ///
    /// # Safety
    /// As for [`MoeLaunches::enqueue_stage`].
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &MoeKernels) -> Result<()> {
        for stage in [Stage::Router, Stage::GateUp, Stage::Down] {
            // SAFETY: forwarded from the caller.
            unsafe { self.enqueue_stage(gpu, k, stage) }?;
        }
        Ok(())
    }
}

/// Enqueues one MoE pass: y = MoE(x), three launches, nothing read back.
///
/// # Safety
/// `x` and `y` must address `hidden` live bf16 elements on this device, not overlapping the
/// weights or the scratch.
pub unsafe fn enqueue(
    gpu: &Gpu,
    k: &MoeKernels,
    w: &MoeWeightsOnDevice,
    s: &mut MoeScratch,
    x: DevPtr<bf16>,
    y: DevPtrMut<bf16>,
) -> Result<()> {
    let launches = MoeLaunches::new(w, s, x, y);
    // SAFETY: the buffers outlive the enqueue; the caller vouches for x and y.
    unsafe { launches.enqueue(gpu, k) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacking_puts_gate_then_up_per_expert_and_the_shared_expert_last() {
        let m = |v: u8, rows, cols| Nvfp4Matrix {
            rows,
            cols,
            packed: vec![v; rows * cols / 2],
            scales: vec![v; rows * cols / 16],
            scale_2: f32::from(v),
        };
        let e = |v| ExpertNvfp4 { gate: m(v, 2, 16), up: m(v + 1, 2, 16), down: m(v + 2, 16, 2 * 16 / 16 * 2) };
        let s = StackedNvfp4::stack(&[e(10), e(20)], &e(30));
        assert_eq!(s.gate_up_scale2, [10.0, 11.0, 20.0, 21.0, 30.0, 31.0]);
        assert_eq!(s.down_scale2, [12.0, 22.0, 32.0]);
        assert_eq!(&s.gate_up_packed[..16], &[vec![10u8; 16]][0][..]);
        assert_eq!(s.gate_up_packed[16], 11);
        assert_eq!(s.gate_up_packed.len(), 6 * 16);
    }

    #[test]
    fn bytes_read_at_the_published_shape() {
        let sh = MoeShape { hidden: 2560, experts: 512, top_k: 10, inter: 640, shared_inter: 640, renormalise: true };
        // 11 experts × 3 × 640 × 2560 values at 0.5625 B, plus the 2.6 MB bf16 router.
        let b = sh.bytes_read(true);
        assert!((b as f64 - (11.0 * 3.0 * 640.0 * 2560.0 * 0.5625 + 2.0 * 512.0 * 2560.0)).abs() < 20_000.0, "{b}");
    }
}
