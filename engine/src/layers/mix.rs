//! One Gated Residual site on the device (`hc_pre_attn`, `hc_pre_ffn` or `hc_head`), with the
//! previous block's write (`hc_post`) folded in: its weights as the kernels read them, its
//! scratch, and its two launches, which overlap their predecessors (each streams its weights
//! into registers while the kernel before it runs; `engine::kernels::mix` says how).
//!
//! Where the write went: a block's output y is not added to the residual streams by a launch of
//! its own, nor by its producer. The next mix site takes y and the previous site's gains and
//! applies `X_s ← bf16(fma(ω_s, y, X_s))` as it reads X; its second launch stores the updated
//! streams back, each element once. The final `hc_head` does the same for the last MoE output.
//! The gains a site computes are for the block after it, so they go to a buffer of the caller's
//! (two alternating buffers in a decode step: the attention site's and the MoE site's).

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::mix::{mix_down_bf16, mix_down_nvfp4, mix_up_bf16, mix_up_nvfp4};
use crate::model::nvfp4::Nvfp4Matrix;
use crate::model::weights::MixWeights;

/// The shape of a mix site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixShape {
    /// Residual streams n.
    pub streams: usize,
    pub hidden: usize,
    /// The low rank r.
    pub rank: usize,
    /// Whether the site computes write gains (every site but the final mixer).
    pub inject: bool,
}

impl MixShape {
    /// n·d: the width of the residual state.
    pub fn width(&self) -> usize {
        self.streams * self.hidden
    }

    /// Rows of the stacked first projection: W_down's r, then W_inj's n.
    pub fn proj_rows(&self) -> usize {
        self.rank + self.inject_rows()
    }

    pub fn inject_rows(&self) -> usize {
        if self.inject { self.streams } else { 0 }
    }

    /// Bytes of weights a site reads: the bf16 norm weight, and W_down, W_inj and W_up in bf16 or
    /// in NVFP4 (half a byte a value and an e4m3 scale per 16; the three global scales).
    pub fn weight_bytes(&self, nvfp4: bool) -> usize {
        let values = self.proj_rows() * self.width() + self.width() * self.rank;
        let matrices = if nvfp4 { values / 2 + values / 16 + 4 * 3 } else { 2 * values };
        2 * self.width() + matrices
    }

    /// Bytes a site must move with the write folded in: the weights, X read and written back, y
    /// read and x written (bf16); the few gains and scales are left out.
    pub fn bytes_moved(&self, nvfp4: bool) -> usize {
        self.weight_bytes(nvfp4) + 2 * 2 * self.width() + 2 * 2 * self.hidden
    }
}

/// The two matrices of a site on the device. (One per site: the size difference of the variants
/// costs nothing worth a box.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum MixMatrices {
    /// W_down [r, n·d], then W_inj [n, n·d] when the site injects (one matrix for launch 1), and
    /// W_up [n·d, r].
    Bf16 { proj: DeviceBuffer<bf16>, up: DeviceBuffer<bf16> },
    /// The same in ModelOpt's NVFP4 layout: codes [rows, cols / 2], e4m3 block scales
    /// [rows, cols / 16]; `scale2` holds the global scales of W_down, W_inj (0 without) and W_up.
    Nvfp4 {
        proj_packed: DeviceBuffer<E2m1x2>,
        proj_scales: DeviceBuffer<E4m3>,
        up_packed: DeviceBuffer<E2m1x2>,
        up_scales: DeviceBuffer<E4m3>,
        scale2: DeviceBuffer<f32>,
    },
}

/// A mix site's weights on the device.
#[derive(Debug)]
pub struct MixWeightsOnDevice {
    pub shape: MixShape,
    /// hc_norm [n·d], bf16 in either format.
    pub norm: DeviceBuffer<bf16>,
    pub matrices: MixMatrices,
}

impl MixWeightsOnDevice {
    pub fn is_nvfp4(&self) -> bool {
        matches!(self.matrices, MixMatrices::Nvfp4 { .. })
    }

    fn check_lengths(shape: MixShape, norm: usize, down: usize, up: usize, inject: usize) -> Result<()> {
        let (w, r) = (shape.width(), shape.rank);
        let checks = [
            ("norm", norm, w),
            ("down projection", down, r * w),
            ("up projection", up, w * r),
            ("inject projection", inject, shape.inject_rows() * w),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("mix {what}: {got} values for a shape that needs {want}")));
            }
        }
        Ok(())
    }

    /// Uploads bf16 weights as a checkpoint ships them; `inject` is absent for the final mixer.
    pub fn upload_bf16(
        gpu: &Gpu,
        shape: MixShape,
        norm: &[bf16],
        down: &[bf16],
        up: &[bf16],
        inject: Option<&[bf16]>,
    ) -> Result<MixWeightsOnDevice> {
        Self::check_lengths(shape, norm.len(), down.len(), up.len(), inject.map_or(0, <[bf16]>::len))?;
        let mut proj = Vec::with_capacity(shape.proj_rows() * shape.width());
        proj.extend_from_slice(down);
        proj.extend_from_slice(inject.unwrap_or(&[]));
        Ok(MixWeightsOnDevice {
            shape,
            norm: gpu.upload(norm)?,
            matrices: MixMatrices::Bf16 { proj: gpu.upload(&proj)?, up: gpu.upload(up)? },
        })
    }

    /// Uploads NVFP4 matrices (W_down and W_inj quantised apart: each keeps its global scale).
    pub fn upload_nvfp4(
        gpu: &Gpu,
        shape: MixShape,
        norm: &[bf16],
        down: &Nvfp4Matrix,
        up: &Nvfp4Matrix,
        inject: Option<&Nvfp4Matrix>,
    ) -> Result<MixWeightsOnDevice> {
        let values = |m: &Nvfp4Matrix| m.packed.len() * 2;
        Self::check_lengths(shape, norm.len(), values(down), values(up), inject.map_or(0, values))?;
        for m in [Some(down), Some(up), inject].into_iter().flatten() {
            if m.scales.len() * 16 != m.rows * m.cols || m.packed.len() * 2 != m.rows * m.cols {
                return Err(Error::Buffer(format!(
                    "an NVFP4 mix matrix [{}, {}] has {} code bytes and {} scales",
                    m.rows,
                    m.cols,
                    m.packed.len(),
                    m.scales.len()
                )));
            }
        }
        if down.cols != shape.width() || up.cols != shape.rank {
            return Err(Error::Buffer(format!(
                "NVFP4 mix matrices of {} and {} columns for a shape of width {} and rank {}",
                down.cols,
                up.cols,
                shape.width(),
                shape.rank
            )));
        }
        let codes = |v: &[u8]| v.iter().map(|&b| E2m1x2(b)).collect::<Vec<_>>();
        let e4m3 = |v: &[u8]| v.iter().map(|&b| E4m3(b)).collect::<Vec<_>>();
        let mut proj_packed = codes(&down.packed);
        let mut proj_scales = e4m3(&down.scales);
        if let Some(inj) = inject {
            proj_packed.extend(codes(&inj.packed));
            proj_scales.extend(e4m3(&inj.scales));
        }
        let scale2 = [down.scale_2, inject.map_or(0.0, |m| m.scale_2), up.scale_2];
        Ok(MixWeightsOnDevice {
            shape,
            norm: gpu.upload(norm)?,
            matrices: MixMatrices::Nvfp4 {
                proj_packed: gpu.upload(&proj_packed)?,
                proj_scales: gpu.upload(&proj_scales)?,
                up_packed: gpu.upload(&codes(&up.packed))?,
                up_scales: gpu.upload(&e4m3(&up.scales))?,
                scale2: gpu.upload(&scale2)?,
            },
        })
    }

    /// Quantises bf16 weights to NVFP4 at load (each matrix on its own) and uploads them.
    pub fn upload_quantised(
        gpu: &Gpu,
        shape: MixShape,
        norm: &[bf16],
        down: &[bf16],
        up: &[bf16],
        inject: Option<&[bf16]>,
    ) -> Result<MixWeightsOnDevice> {
        Self::check_lengths(shape, norm.len(), down.len(), up.len(), inject.map_or(0, <[bf16]>::len))?;
        let (w, r, n) = (shape.width(), shape.rank, shape.streams);
        let q = |v: &[bf16], rows, cols| {
            let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
            Nvfp4Matrix::quantise(&f, rows, cols)
        };
        let inject = inject.map(|v| q(v, n, w));
        Self::upload_nvfp4(gpu, shape, norm, &q(down, r, w), &q(up, w, r), inject.as_ref())
    }

    /// Uploads the CPU reference's weights, rounded to bf16.
    pub fn upload(gpu: &Gpu, w: &MixWeights, streams: usize) -> Result<MixWeightsOnDevice> {
        let shape = MixShape { streams, hidden: w.norm.len() / streams, rank: w.down.rows, inject: w.inject.is_some() };
        let b = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let inject = w.inject.as_ref().map(|l| b(&l.w));
        MixWeightsOnDevice::upload_bf16(gpu, shape, &b(&w.norm), &b(&w.down.w), &b(&w.up.w), inject.as_deref())
    }
}

/// What a site writes between its two launches; one scratch serves every site of a step.
#[derive(Debug)]
pub struct MixScratch {
    /// Launch 1's per-stream partial sums [n, r + n], each times its stream's RMS scale.
    pub partial: DeviceBuffer<f32>,
    /// Each stream's RMS scale [n].
    pub scale: DeviceBuffer<f32>,
}

impl MixScratch {
    /// Scratch for any site of `shape` at any tiles.
    pub fn new(gpu: &Gpu, shape: MixShape) -> Result<MixScratch> {
        Ok(MixScratch { partial: gpu.alloc(shape.streams * shape.proj_rows())?, scale: gpu.alloc(shape.streams)? })
    }
}

/// The mix kernels, compiled for one device at chosen tiles.
#[derive(Debug)]
pub struct MixKernels {
    pub down_bf16: LoadedKernel<mix_down_bf16::Kernel>,
    pub up_bf16: LoadedKernel<mix_up_bf16::Kernel>,
    pub down_nvfp4: LoadedKernel<mix_down_nvfp4::Kernel>,
    pub up_nvfp4: LoadedKernel<mix_up_nvfp4::Kernel>,
}

impl MixKernels {
    pub fn load(gpu: &Gpu, tiles: MixTiles) -> Result<MixKernels> {
        Ok(MixKernels {
            down_bf16: gpu.kernel(tiles.down_bf16)?,
            up_bf16: gpu.kernel(tiles.up_bf16)?,
            down_nvfp4: gpu.kernel(tiles.down_nvfp4)?,
            up_nvfp4: gpu.kernel(tiles.up_nvfp4)?,
        })
    }
}

/// Tile choices for the two launches of each format: the autotuner's space is the product of
/// the kernels' declared candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixTiles {
    pub down_bf16: mix_down_bf16::Tiles,
    pub up_bf16: mix_up_bf16::Tiles,
    pub down_nvfp4: mix_down_nvfp4::Tiles,
    pub up_nvfp4: mix_up_nvfp4::Tiles,
}

impl Default for MixTiles {
    fn default() -> Self {
        MixTiles {
            down_bf16: TileSet::DEFAULT,
            up_bf16: TileSet::DEFAULT,
            down_nvfp4: TileSet::DEFAULT,
            up_nvfp4: TileSet::DEFAULT,
        }
    }
}

impl MixTiles {
    /// Each launch at its default tiles where they take `shape`, else at its first declared
    /// candidate that does (small shapes cannot take the published shape's splits); None when no
    /// candidate takes it.
    pub fn fitting(shape: MixShape) -> Option<MixTiles> {
        use kernel_dsl::KernelDef;
        fn first<T: TileSet>(fits: impl Fn(&T) -> bool) -> Option<T> {
            std::iter::once(T::DEFAULT).chain(T::candidates()).find(|t| fits(t))
        }
        let a = Addresses::default();
        let (
            MixLaunches { down: Down::Bf16(db), up: Up::Bf16(ub) },
            MixLaunches { down: Down::Nvfp4(dn), up: Up::Nvfp4(un) },
        ) = (MixLaunches::build(shape, &a, false, true), MixLaunches::build(shape, &a, true, true))
        else {
            unreachable!("build makes the format it is asked for")
        };
        let t = MixTiles {
            down_bf16: first(|t| mix_down_bf16::Kernel::launch_dims(t, &db).is_ok())?,
            up_bf16: first(|t| mix_up_bf16::Kernel::launch_dims(t, &ub).is_ok())?,
            down_nvfp4: first(|t| mix_down_nvfp4::Kernel::launch_dims(t, &dn).is_ok())?,
            up_nvfp4: first(|t| mix_up_nvfp4::Kernel::launch_dims(t, &un).is_ok())?,
        };
        t.check(shape).ok().map(|()| t)
    }

    /// Whether these tiles can run `shape` in both formats: each kernel's requirements, checked
    /// as a launch would check them (the addresses do not matter to the checks).
    pub fn check(&self, shape: MixShape) -> std::result::Result<(), kernel_dsl::LaunchError> {
        use kernel_dsl::KernelDef;
        for nvfp4 in [false, true] {
            match MixLaunches::build(shape, &Addresses::default(), nvfp4, true) {
                MixLaunches { down: Down::Bf16(d), up: Up::Bf16(u) } => {
                    mix_down_bf16::Kernel::launch_dims(&self.down_bf16, &d)?;
                    mix_up_bf16::Kernel::launch_dims(&self.up_bf16, &u)?;
                }
                MixLaunches { down: Down::Nvfp4(d), up: Up::Nvfp4(u) } => {
                    mix_down_nvfp4::Kernel::launch_dims(&self.down_nvfp4, &d)?;
                    mix_up_nvfp4::Kernel::launch_dims(&self.up_nvfp4, &u)?;
                }
                _ => unreachable!("the two launches are built for one format"),
            }
        }
        Ok(())
    }
}

/// The buffers a site reads and writes besides its weights and scratch.
#[derive(Clone, Copy, Debug)]
pub struct MixIo {
    /// The residual streams X, bf16 [n, d]: read, and written back when `post` is given.
    pub residual: DevPtrMut<bf16>,
    /// The previous block's output y [d] and the gains [n] of the site before it, whose write
    /// this site performs; None for the first site of a step.
    pub post: Option<(DevPtr<bf16>, DevPtr<f32>)>,
    /// The block input x [d].
    pub x: DevPtrMut<bf16>,
    /// This site's write gains ω [n] (None at the final mixer). Must not be the post's gains.
    pub gains: Option<DevPtrMut<f32>>,
}

/// Every address a site's launches take, so that one function builds the arguments both for a
/// site and for checking a shape (with every address 0).
#[derive(Default)]
struct Addresses {
    residual: u64,
    y: u64,
    gains_prev: u64,
    x: u64,
    gains: u64,
    norm: u64,
    /// The first matrix (bf16, or the NVFP4 codes) and its block scales (NVFP4).
    proj: [u64; 2],
    /// W_up likewise.
    up: [u64; 2],
    scale2: u64,
    partial: u64,
    scale: u64,
}

/// Launch 1 of one format.
#[derive(Clone, Copy, Debug)]
pub enum Down {
    Bf16(mix_down_bf16::Args),
    Nvfp4(mix_down_nvfp4::Args),
}

/// Launch 2 of one format.
#[derive(Clone, Copy, Debug)]
pub enum Up {
    Bf16(mix_up_bf16::Args),
    Nvfp4(mix_up_nvfp4::Args),
}

/// One of the two launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Down,
    Up,
}

/// The two launches of one site, arguments bound.
#[derive(Clone, Copy, Debug)]
pub struct MixLaunches {
    pub down: Down,
    pub up: Up,
}

impl MixLaunches {
    /// The launches of one site with these weights, scratch and buffers; `eps` is the RMS norm's
    /// epsilon (the config's rms_norm_eps).
    pub fn new(w: &MixWeightsOnDevice, s: &mut MixScratch, io: MixIo, eps: f32) -> MixLaunches {
        let (y, gains_prev) = io.post.map_or((0, 0), |(y, g)| (y.addr(), g.addr()));
        let (proj, up, scale2) = match &w.matrices {
            MixMatrices::Bf16 { proj, up } => ([proj.ptr().addr(), 0], [up.ptr().addr(), 0], 0),
            MixMatrices::Nvfp4 { proj_packed, proj_scales, up_packed, up_scales, scale2 } => (
                [proj_packed.ptr().addr(), proj_scales.ptr().addr()],
                [up_packed.ptr().addr(), up_scales.ptr().addr()],
                scale2.ptr().addr(),
            ),
        };
        let a = Addresses {
            residual: io.residual.addr(),
            y,
            gains_prev,
            x: io.x.addr(),
            gains: io.gains.map_or(0, |g| g.addr()),
            norm: w.norm.ptr().addr(),
            proj,
            up,
            scale2,
            partial: s.partial.ptr_mut().addr(),
            scale: s.scale.ptr_mut().addr(),
        };
        let mut l = MixLaunches::build(w.shape, &a, w.is_nvfp4(), io.post.is_some());
        match &mut l.down {
            Down::Bf16(d) => d.eps = eps,
            Down::Nvfp4(d) => d.eps = eps,
        }
        l
    }

    /// The launches of a site with every address 0 (and a post write): for checking a shape
    /// against tiles.
    pub fn unbound(shape: MixShape, nvfp4: bool) -> MixLaunches {
        MixLaunches::build(shape, &Addresses::default(), nvfp4, true)
    }

    fn build(sh: MixShape, a: &Addresses, nvfp4: bool, post: bool) -> MixLaunches {
        fn r<T>(addr: u64) -> DevPtr<T> {
            DevPtr::from_addr(addr)
        }
        fn w<T>(addr: u64) -> DevPtrMut<T> {
            DevPtrMut::from_addr(addr)
        }
        let (n, d, rank, inject) = (sh.streams as u32, sh.hidden as u32, sh.rank as u32, sh.inject_rows() as u32);
        if nvfp4 {
            MixLaunches {
                down: Down::Nvfp4(mix_down_nvfp4::Args {
                    residual: r(a.residual),
                    y: r(a.y),
                    gains_prev: r(a.gains_prev),
                    norm: r(a.norm),
                    packed: r(a.proj[0]),
                    scales: r(a.proj[1]),
                    scale2: r(a.scale2),
                    partial: w(a.partial),
                    scale: w(a.scale),
                    n,
                    d,
                    rank,
                    inject,
                    post,
                    eps: 0.0,
                }),
                up: Up::Nvfp4(mix_up_nvfp4::Args {
                    residual: w(a.residual),
                    y: r(a.y),
                    gains_prev: r(a.gains_prev),
                    norm: r(a.norm),
                    packed: r(a.up[0]),
                    scales: r(a.up[1]),
                    scale2: r(a.scale2),
                    partial: r(a.partial),
                    scale: r(a.scale),
                    x: w(a.x),
                    gains: w(a.gains),
                    n,
                    d,
                    rank,
                    inject,
                    post,
                }),
            }
        } else {
            MixLaunches {
                down: Down::Bf16(mix_down_bf16::Args {
                    residual: r(a.residual),
                    y: r(a.y),
                    gains_prev: r(a.gains_prev),
                    norm: r(a.norm),
                    proj: r(a.proj[0]),
                    partial: w(a.partial),
                    scale: w(a.scale),
                    n,
                    d,
                    rank,
                    inject,
                    post,
                    eps: 0.0,
                }),
                up: Up::Bf16(mix_up_bf16::Args {
                    residual: w(a.residual),
                    y: r(a.y),
                    gains_prev: r(a.gains_prev),
                    norm: r(a.norm),
                    up: r(a.up[0]),
                    partial: r(a.partial),
                    scale: r(a.scale),
                    x: w(a.x),
                    gains: w(a.gains),
                    n,
                    d,
                    rank,
                    inject,
                    post,
                }),
            }
        }
    }

    /// Enqueues one of the two launches. The launches overlap their predecessors (programmatic
    /// dependent launch): each streams its weights while the kernel before it runs.
    ///
    /// # Safety
    /// The launches were built by [`MixLaunches::new`] from buffers that are still alive; the
    /// residual holds n·d elements, y and x d, the gains n each; x, y, the residual and the two
    /// gains buffers overlap neither each other nor the weights or the scratch.
    pub unsafe fn enqueue_stage(&self, gpu: &Gpu, k: &MixKernels, stage: Stage) -> Result<()> {
        // SAFETY: the weight and scratch buffers were sized from the shape when they were made
        // (the uploads check the weights' lengths); the caller vouches for the rest.
        unsafe {
            match (stage, &self.down, &self.up) {
                (Stage::Down, Down::Bf16(a), _) => k.down_bf16.launch(gpu, a),
                (Stage::Down, Down::Nvfp4(a), _) => k.down_nvfp4.launch(gpu, a),
                (Stage::Up, _, Up::Bf16(a)) => k.up_bf16.launch(gpu, a),
                (Stage::Up, _, Up::Nvfp4(a)) => k.up_nvfp4.launch(gpu, a),
            }
        }
    }

    /// Enqueues the site: launch 1, then launch 2.
    ///
    /// # Safety
    /// As for [`MixLaunches::enqueue_stage`].
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &MixKernels) -> Result<()> {
        for stage in [Stage::Down, Stage::Up] {
            // SAFETY: forwarded from the caller.
            unsafe { self.enqueue_stage(gpu, k, stage) }?;
        }
        Ok(())
    }
}

/// Enqueues one mix site: (x, ω) = mix(X) after `X_s += ω_prev,s · y` when `io.post` is given;
/// two launches, nothing read back.
///
/// # Safety
/// As for [`MixLaunches::enqueue`].
pub unsafe fn enqueue(
    gpu: &Gpu,
    k: &MixKernels,
    w: &MixWeightsOnDevice,
    s: &mut MixScratch,
    io: MixIo,
    eps: f32,
) -> Result<()> {
    if w.shape.inject != io.gains.is_some() {
        return Err(Error::Buffer(format!(
            "a mix site {} write gains, but {} buffer for them was given",
            if w.shape.inject { "computes" } else { "has no" },
            if io.gains.is_some() { "a" } else { "no" }
        )));
    }
    let launches = MixLaunches::new(w, s, io, eps);
    // SAFETY: the buffers outlive the enqueue; the caller vouches for the I/O buffers.
    unsafe { launches.enqueue(gpu, k) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED: MixShape = MixShape { streams: 4, hidden: 2560, rank: 320, inject: true };

    #[test]
    fn bytes_at_the_published_shape() {
        // 13.2 MB of weights: two rank-320 projections over 4 × 2560, the inject and the norm.
        assert_eq!(PUBLISHED.weight_bytes(false), 13_209_600);
        assert_eq!(PUBLISHED.bytes_moved(false), 13_209_600 + 40_960 + 10_240);
        // NVFP4: 6,594,560 values at 0.5625 B, the bf16 norm, three global scales.
        assert_eq!(PUBLISHED.weight_bytes(true), 6_594_560 / 2 + 6_594_560 / 16 + 20_480 + 12);
    }

    #[test]
    fn every_candidate_fits_the_published_shape() {
        let base = MixTiles::default();
        let sets = (mix_down_bf16::Tiles::candidates().into_iter().map(|t| MixTiles { down_bf16: t, ..base }))
            .chain(mix_up_bf16::Tiles::candidates().into_iter().map(|t| MixTiles { up_bf16: t, ..base }))
            .chain(mix_down_nvfp4::Tiles::candidates().into_iter().map(|t| MixTiles { down_nvfp4: t, ..base }))
            .chain(mix_up_nvfp4::Tiles::candidates().into_iter().map(|t| MixTiles { up_nvfp4: t, ..base }));
        for t in sets {
            for inject in [true, false] {
                t.check(MixShape { inject, ..PUBLISHED }).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    #[test]
    fn default_tiles_fit_the_published_shape_and_the_final_mixer() {
        MixTiles::default().check(PUBLISHED).expect("the attention and MoE sites");
        MixTiles::default().check(MixShape { inject: false, ..PUBLISHED }).expect("the final mixer");
    }
}
