//! One Gated Residual site on the device (`hc_pre_attn`, `hc_pre_ffn` or `hc_head`), with the
//! previous block's write (`hc_post`) folded in: its weights as the kernels read them, its
//! scratch, and its two launches.
//!
//! Where the write went: a block's output y is not added to the residual streams by a launch of
//! its own, nor by its producer. The next mix site takes y and the previous site's gains and
//! applies `X_s ← bf16(fma(ω_s, y, X_s))` as it reads X; its second launch stores the updated
//! streams back, each element once. The final `hc_head` does the same for the last MoE output.
//! The gains a site computes are for the block after it, so they go to a buffer of the caller's
//! (two alternating buffers in a decode step: the attention site's and the MoE site's).

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::mix::{mix_down_bf16, mix_up_bf16};
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

    /// Bytes of weights a site reads: the norm weight, W_down, W_inj and W_up, bf16.
    pub fn weight_bytes(&self) -> usize {
        2 * (self.width() + self.proj_rows() * self.width() + self.width() * self.rank)
    }

    /// Bytes a site must move with the write folded in: the weights, X read and written back, y
    /// read and x written (bf16); the few gains and scales are left out.
    pub fn bytes_moved(&self) -> usize {
        self.weight_bytes() + 2 * 2 * self.width() + 2 * 2 * self.hidden
    }
}

/// A mix site's weights on the device, bf16.
#[derive(Debug)]
pub struct MixWeightsOnDevice {
    pub shape: MixShape,
    /// hc_norm [n·d].
    pub norm: DeviceBuffer<bf16>,
    /// W_down [r, n·d], then W_inj [n, n·d] when the site injects: one matrix for launch 1.
    pub proj: DeviceBuffer<bf16>,
    /// W_up [n·d, r].
    pub up: DeviceBuffer<bf16>,
}

impl MixWeightsOnDevice {
    /// Uploads bf16 weights as a checkpoint ships them; `inject` is absent for the final mixer.
    pub fn upload_bf16(
        gpu: &Gpu,
        shape: MixShape,
        norm: &[bf16],
        down: &[bf16],
        up: &[bf16],
        inject: Option<&[bf16]>,
    ) -> Result<MixWeightsOnDevice> {
        let (w, r) = (shape.width(), shape.rank);
        let inject_len = inject.map_or(0, <[bf16]>::len);
        let checks = [
            ("norm", norm.len(), w),
            ("down projection", down.len(), r * w),
            ("up projection", up.len(), w * r),
            ("inject projection", inject_len, shape.inject_rows() * w),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("mix {what}: {got} values for a shape that needs {want}")));
            }
        }
        let mut proj = Vec::with_capacity(shape.proj_rows() * w);
        proj.extend_from_slice(down);
        proj.extend_from_slice(inject.unwrap_or(&[]));
        Ok(MixWeightsOnDevice { shape, norm: gpu.upload(norm)?, proj: gpu.upload(&proj)?, up: gpu.upload(up)? })
    }

    /// Uploads the CPU reference's weights, rounded to bf16.
    pub fn upload(gpu: &Gpu, w: &MixWeights, streams: usize) -> Result<MixWeightsOnDevice> {
        let shape =
            MixShape { streams, hidden: w.norm.len() / streams, rank: w.down.rows, inject: w.inject.is_some() };
        let b = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let inject = w.inject.as_ref().map(|l| b(&l.w));
        MixWeightsOnDevice::upload_bf16(gpu, shape, &b(&w.norm), &b(&w.down.w), &b(&w.up.w), inject.as_deref())
    }
}

/// What a site writes between its two launches. The counter must be zero before the first site;
/// every site leaves it zero, so one scratch serves every site of a step.
#[derive(Debug)]
pub struct MixScratch {
    /// Launch 1's per-split sums [K_SPLIT, r + n].
    pub partial: DeviceBuffer<f32>,
    /// Σ X'² per split [K_SPLIT].
    pub sum_sq: DeviceBuffer<f32>,
    pub counter: DeviceBuffer<u32>,
    /// SiLU(W_down·X̂ / n) [r].
    pub u: DeviceBuffer<f32>,
    /// Each stream's RMS scale [n].
    pub scale: DeviceBuffer<f32>,
}

impl MixScratch {
    /// Scratch for any site of `shape` at any tiles.
    pub fn new(gpu: &Gpu, shape: MixShape) -> Result<MixScratch> {
        let splits = max_candidate(&mix_down_bf16::Tiles::candidates(), |t| t.k_split as usize);
        Ok(MixScratch {
            partial: gpu.alloc(splits * (shape.rank + shape.streams))?,
            sum_sq: gpu.alloc(splits)?,
            counter: gpu.alloc(1)?,
            u: gpu.alloc(shape.rank)?,
            scale: gpu.alloc(shape.streams)?,
        })
    }
}

fn max_candidate<T>(candidates: &[T], f: impl Fn(&T) -> usize) -> usize {
    candidates.iter().map(f).max().unwrap_or(1)
}

/// The mix kernels, compiled for one device at chosen tiles.
#[derive(Debug)]
pub struct MixKernels {
    pub down: LoadedKernel<mix_down_bf16::Kernel>,
    pub up: LoadedKernel<mix_up_bf16::Kernel>,
}

impl MixKernels {
    pub fn load(gpu: &Gpu, tiles: MixTiles) -> Result<MixKernels> {
        Ok(MixKernels { down: gpu.kernel(tiles.down)?, up: gpu.kernel(tiles.up)? })
    }
}

/// Tile choices for the two launches: the autotuner's space is the product of the kernels'
/// declared candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixTiles {
    pub down: mix_down_bf16::Tiles,
    pub up: mix_up_bf16::Tiles,
}

impl Default for MixTiles {
    fn default() -> Self {
        MixTiles { down: TileSet::DEFAULT, up: TileSet::DEFAULT }
    }
}

impl MixTiles {
    /// Whether these tiles can run `shape`: each kernel's requirements, checked as a launch would
    /// check them (the addresses do not matter to the checks).
    pub fn check(&self, shape: MixShape) -> std::result::Result<(), kernel_dsl::LaunchError> {
        use kernel_dsl::KernelDef;
        let a = MixLaunches::build(shape, &Addresses::default(), true);
        mix_down_bf16::Kernel::launch_dims(&self.down, &a.down)?;
        mix_up_bf16::Kernel::launch_dims(&self.up, &a.up)?;
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

#[derive(Default)]
struct Addresses {
    residual: u64,
    y: u64,
    gains_prev: u64,
    x: u64,
    gains: u64,
    norm: u64,
    proj: u64,
    up: u64,
    partial: u64,
    sum_sq: u64,
    counter: u64,
    u: u64,
    scale: u64,
}

/// The two launches of one site, arguments bound.
#[derive(Clone, Copy, Debug)]
pub struct MixLaunches {
    pub down: mix_down_bf16::Args,
    pub up: mix_up_bf16::Args,
}

impl MixLaunches {
    /// The launches of one site with these weights, scratch and buffers.
    pub fn new(w: &MixWeightsOnDevice, s: &mut MixScratch, io: MixIo) -> MixLaunches {
        let (y, gains_prev) = io.post.map_or((0, 0), |(y, g)| (y.addr(), g.addr()));
        let a = Addresses {
            residual: io.residual.addr(),
            y,
            gains_prev,
            x: io.x.addr(),
            gains: io.gains.map_or(0, |g| g.addr()),
            norm: w.norm.ptr().addr(),
            proj: w.proj.ptr().addr(),
            up: w.up.ptr().addr(),
            partial: s.partial.ptr_mut().addr(),
            sum_sq: s.sum_sq.ptr_mut().addr(),
            counter: s.counter.ptr_mut().addr(),
            u: s.u.ptr_mut().addr(),
            scale: s.scale.ptr_mut().addr(),
        };
        MixLaunches::build(w.shape, &a, io.post.is_some())
    }

    fn build(sh: MixShape, a: &Addresses, post: bool) -> MixLaunches {
        fn r<T>(addr: u64) -> DevPtr<T> {
            DevPtr::from_addr(addr)
        }
        fn w<T>(addr: u64) -> DevPtrMut<T> {
            DevPtrMut::from_addr(addr)
        }
        let (n, d, rank) = (sh.streams as u32, sh.hidden as u32, sh.rank as u32);
        MixLaunches {
            down: mix_down_bf16::Args {
                residual: r(a.residual),
                y: r(a.y),
                gains_prev: r(a.gains_prev),
                norm: r(a.norm),
                proj: r(a.proj),
                partial: w(a.partial),
                sum_sq: w(a.sum_sq),
                counter: w(a.counter),
                u: w(a.u),
                gains: w(a.gains),
                scale: w(a.scale),
                n,
                d,
                rank,
                inject: sh.inject_rows() as u32,
                post,
                eps: 0.0,
            },
            up: mix_up_bf16::Args {
                residual: w(a.residual),
                y: r(a.y),
                gains_prev: r(a.gains_prev),
                norm: r(a.norm),
                up: r(a.up),
                u: r(a.u),
                scale: r(a.scale),
                x: w(a.x),
                n,
                d,
                rank,
                post,
            },
        }
    }

    /// The RMS norm's epsilon (the config's rms_norm_eps).
    pub fn with_eps(mut self, eps: f32) -> MixLaunches {
        self.down.eps = eps;
        self
    }

    /// Enqueues the two launches.
    ///
    /// # Safety
    /// The launches were built by [`MixLaunches::new`] from buffers that are still alive; the
    /// residual holds n·d elements, y and x d, the gains n each; x, y, the residual and the two
    /// gains buffers overlap neither each other nor the weights or the scratch.
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &MixKernels) -> Result<()> {
        // SAFETY: the weight and scratch buffers were sized from the shape when they were made
        // (the upload checks the weights' lengths); the caller vouches for the rest.
        unsafe {
            k.down.launch(gpu, &self.down)?;
            k.up.launch(gpu, &self.up)
        }
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
    let launches = MixLaunches::new(w, s, io).with_eps(eps);
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
        assert_eq!(PUBLISHED.weight_bytes(), 13_209_600);
        assert_eq!(PUBLISHED.bytes_moved(), 13_209_600 + 40_960 + 10_240);
    }

    #[test]
    fn default_tiles_fit_the_published_shape_and_the_final_mixer() {
        MixTiles::default().check(PUBLISHED).expect("the attention and MoE sites");
        MixTiles::default().check(MixShape { inject: false, ..PUBLISHED }).expect("the final mixer");
    }
}
