//! Temperature and top-p sampling on the device after the lm_head: the kernel, its scratch, and
//! one launch per token that reads the position from device memory (one graph serves every step).

use kernel_dsl::{DevPtr, DevPtrMut, KernelDef, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::sample::{MASS_WORDS, SCRATCH_BARRIER, SCRATCH_WORDS, sample_top_p};
pub use crate::reference::sample::SampleParams;

/// The sampler ready to launch: its kernel, its scratch and its parameters.
#[derive(Debug)]
pub struct Sampler {
    vocab: usize,
    pub params: SampleParams,
    kernel: LoadedKernel<sample_top_p::Kernel>,
    /// The histograms' masses (u64) and the count histograms, barrier and per-block words (u32):
    /// zero at allocation, made ready for the next launch by every launch.
    mass: DeviceBuffer<u64>,
    scratch: DeviceBuffer<u32>,
}

impl Sampler {
    /// Compiles the kernel for `vocab` logits; refuses a grid the device cannot hold at once (its
    /// grid barriers would wait forever) and a shape the kernel does not take.
    pub fn load(gpu: &Gpu, vocab: usize, params: SampleParams, tiles: sample_top_p::Tiles) -> Result<Sampler> {
        let kernel = gpu.kernel(tiles)?;
        let resident = kernel.co_resident_blocks(gpu)?;
        if resident < tiles.blocks {
            return Err(Error::Buffer(format!(
                "the sampler needs its {} blocks resident at once; this device holds {resident}",
                tiles.blocks
            )));
        }
        let sampler =
            Sampler { vocab, params, kernel, mass: gpu.alloc(MASS_WORDS)?, scratch: gpu.alloc(SCRATCH_WORDS)? };
        sample_top_p::Kernel::launch_dims(&tiles, &sampler.args(0, 0, 0))
            .map_err(|e| Error::Buffer(format!("sampler over {vocab} logits: {e}")))?;
        Ok(sampler)
    }

    /// The sampler at the tiles [`Sampler::tiles_for`] picks for this device.
    pub fn new(gpu: &Gpu, vocab: usize, params: SampleParams) -> Result<Sampler> {
        Sampler::load(gpu, vocab, params, Sampler::tiles_for(gpu)?)
    }

    /// The default tiles with the widest block whose whole grid this device holds at once: 512
    /// threads where it holds 128 such blocks (an H100 or H200, one an SM: a thread's four logits
    /// take fewer serial adds than eight, 19% to 25% faster on an H100, BENCHMARKS.md), else the
    /// default 256 (the GB10's 48 SMs hold 128 blocks only at three an SM, too many for 512).
    pub fn tiles_for(gpu: &Gpu) -> Result<sample_top_p::Tiles> {
        let default: sample_top_p::Tiles = TileSet::DEFAULT;
        let wide = sample_top_p::Tiles { threads: 512, ..default };
        let resident = gpu.kernel::<sample_top_p::Kernel>(wide)?.co_resident_blocks(gpu)?;
        Ok(if resident >= wide.blocks { wide } else { default })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The arguments for these addresses of the logits, the position and the token (0 for each
    /// when only the shape is checked).
    fn args(&self, logits: u64, position: u64, token: u64) -> sample_top_p::Args {
        sample_top_p::Args {
            logits: DevPtr::from_addr(logits),
            position: DevPtr::from_addr(position),
            token: DevPtrMut::from_addr(token),
            mass: DevPtrMut::from_addr(self.mass.ptr().addr()),
            scratch: DevPtrMut::from_addr(self.scratch.ptr().addr()),
            vocab: self.vocab as u32,
            temperature: self.params.temperature,
            top_p: self.params.top_p,
            seed: self.params.seed,
        }
    }

    /// Enqueues `token[0]` = a token sampled from `logits` [vocab] with the parameters, the
    /// uniform drawn from the seed and `position[0]` (which the engine writes per token).
    /// Graph-safe; the parameters are baked into a captured launch.
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        logits: &DeviceBuffer<f32>,
        position: &DeviceBuffer<u32>,
        token: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        let p = self.params;
        if logits.len() < self.vocab || position.is_empty() || token.is_empty() {
            return Err(Error::Buffer(format!(
                "sampler: logits {} (vocab {}), position {}, token {}",
                logits.len(),
                self.vocab,
                position.len(),
                token.len()
            )));
        }
        if !(p.temperature > 0.0 && p.temperature.is_finite() && p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(Error::Buffer(format!(
                "sampler: temperature {} must be positive and finite, top_p {} in (0, 1]",
                p.temperature, p.top_p
            )));
        }
        let args = self.args(logits.ptr().addr(), position.ptr().addr(), token.ptr_mut().addr());
        // SAFETY: logits ≥ vocab (checked above, and vocab ≤ BLOCKS·THREADS·8 at load), position
        // and token one word each, the scratch sized by the kernel module's constants.
        unsafe { self.kernel.launch(gpu, &args) }
    }

    /// The grid barrier's arrival counter, a multiple of 128 between launches: for tests.
    pub fn barrier_count(&self, gpu: &Gpu) -> Result<u32> {
        Ok(gpu.download(&self.scratch)?[SCRATCH_BARRIER])
    }
}
