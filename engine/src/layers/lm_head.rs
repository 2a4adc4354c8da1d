//! The lm_head with its fused greedy choice on the device: the weights in either format, the
//! scratch its last-block reduction needs, and one launch per token.

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::lm_head::{lm_head_argmax_bf16, lm_head_argmax_nvfp4};
use crate::layers::paired_codes;
use crate::model::nvfp4::Nvfp4Matrix;

/// The lm_head's weights on the device.
#[derive(Debug)]
pub enum LmHeadWeights {
    /// [vocab, hidden] row-major.
    Bf16(DeviceBuffer<bf16>),
    /// Codes [vocab, hidden/2] (ModelOpt's, in the paired layout of the architecture:
    /// [`paired_codes`]), e4m3 block scales [vocab, hidden/16], the global scale.
    Nvfp4 { packed: DeviceBuffer<E2m1x2>, scales: DeviceBuffer<E4m3>, scale2: DeviceBuffer<f32> },
}

/// Tile sets of the two formats' kernels, and the grid: `waves` blocks per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LmHeadTiles {
    pub bf16: lm_head_argmax_bf16::Tiles,
    pub nvfp4: lm_head_argmax_nvfp4::Tiles,
    pub waves: u32,
}

impl Default for LmHeadTiles {
    fn default() -> Self {
        LmHeadTiles { bf16: TileSet::DEFAULT, nvfp4: TileSet::DEFAULT, waves: 8 }
    }
}

/// The lm_head ready to launch: its weights, its kernel and the scratch of its reduction.
#[derive(Debug)]
pub struct LmHead {
    vocab: usize,
    hidden: usize,
    weights: LmHeadWeights,
    kernel: LmHeadKernel,
    blocks: u32,
    best_key: DeviceBuffer<u32>,
    best_row: DeviceBuffer<u32>,
    /// Blocks done and the next ticket of the rows handed out at run time (the NVFP4 kernel's
    /// DYNAMIC): zero at allocation; the last block of every launch puts both back to zero.
    counter: DeviceBuffer<u32>,
}

/// One launch's arguments, in the weights' format.
enum Args {
    Bf16(lm_head_argmax_bf16::Args),
    Nvfp4(lm_head_argmax_nvfp4::Args),
}

#[derive(Debug)]
enum LmHeadKernel {
    Bf16(LoadedKernel<lm_head_argmax_bf16::Kernel>),
    Nvfp4(LoadedKernel<lm_head_argmax_nvfp4::Kernel>),
}

impl LmHead {
    /// Uploads bf16 weights [vocab, hidden] and compiles the bf16 kernel.
    pub fn bf16(gpu: &Gpu, w: &[bf16], vocab: usize, hidden: usize, tiles: LmHeadTiles) -> Result<LmHead> {
        if w.len() != vocab * hidden {
            return Err(Error::Buffer(format!(
                "lm_head: {} values for a {vocab} × {hidden} matrix ({} expected)",
                w.len(),
                vocab * hidden
            )));
        }
        let weights = LmHeadWeights::Bf16(gpu.upload(w)?);
        let kernel = LmHeadKernel::Bf16(gpu.kernel(tiles.bf16)?);
        LmHead::with(gpu, vocab, hidden, weights, kernel, tiles.waves)
    }

    /// Uploads an NVFP4 matrix [vocab, hidden] and compiles the NVFP4 kernel.
    pub fn nvfp4(gpu: &Gpu, m: &Nvfp4Matrix, tiles: LmHeadTiles) -> Result<LmHead> {
        let (vocab, hidden) = (m.rows, m.cols);
        if m.packed.len() * 2 != vocab * hidden || m.scales.len() * 16 != vocab * hidden {
            return Err(Error::Buffer(format!(
                "lm_head: {} codes and {} scales for a {vocab} × {hidden} NVFP4 matrix",
                m.packed.len() * 2,
                m.scales.len()
            )));
        }
        let scales: Vec<E4m3> = m.scales.iter().map(|&b| E4m3(b)).collect();
        let weights = LmHeadWeights::Nvfp4 {
            // The kernel reads its codes in the paired layout of the architecture.
            packed: paired_codes::upload(gpu, "lm_head codes", &m.packed)?,
            scales: gpu.upload(&scales)?,
            scale2: gpu.upload(&[m.scale_2])?,
        };
        let kernel = LmHeadKernel::Nvfp4(gpu.kernel(tiles.nvfp4)?);
        LmHead::with(gpu, vocab, hidden, weights, kernel, tiles.waves)
    }

    /// Takes weights already on the device (made there: `crate::synthetic`; NVFP4 codes in
    /// [`paired_codes::layout`]), checks their lengths
    /// against vocab × hidden and compiles the kernel of their format.
    pub fn from_device(
        gpu: &Gpu,
        weights: LmHeadWeights,
        vocab: usize,
        hidden: usize,
        tiles: LmHeadTiles,
    ) -> Result<LmHead> {
        let values = vocab * hidden;
        let (ok, what) = match &weights {
            LmHeadWeights::Bf16(w) => (w.len() == values, format!("{} values", w.len())),
            LmHeadWeights::Nvfp4 { packed, scales, scale2 } => (
                packed.len() * 2 == values && scales.len() * 16 == values && scale2.len() == 1,
                format!("{} codes, {} scales and {} global scales", packed.len() * 2, scales.len(), scale2.len()),
            ),
        };
        if !ok {
            return Err(Error::Buffer(format!("lm_head: {what} for a {vocab} × {hidden} matrix")));
        }
        let kernel = match &weights {
            LmHeadWeights::Bf16(_) => LmHeadKernel::Bf16(gpu.kernel(tiles.bf16)?),
            LmHeadWeights::Nvfp4 { .. } => LmHeadKernel::Nvfp4(gpu.kernel(tiles.nvfp4)?),
        };
        LmHead::with(gpu, vocab, hidden, weights, kernel, tiles.waves)
    }

    /// The weights, for tests that read them back.
    pub fn weights(&self) -> &LmHeadWeights {
        &self.weights
    }

    fn with(
        gpu: &Gpu,
        vocab: usize,
        hidden: usize,
        weights: LmHeadWeights,
        kernel: LmHeadKernel,
        waves: u32,
    ) -> Result<LmHead> {
        let mut blocks = (gpu.info().sm_count * waves.max(1)).min(65_535);
        // A grid that hands rows out at run time is held to the blocks the device runs at once: a
        // block that waits for a slot would start when the others are done, the very tail the
        // tickets remove (the first form of the kernel took 72 registers, an SM held 7 of its
        // blocks, not the 8 of the default waves, and the H100 launch took 206 µs against 140 µs;
        // 2026-12-06).
        if let LmHeadKernel::Nvfp4(k) = &kernel
            && k.tiles().dynamic > 0
        {
            blocks = blocks.min(k.co_resident_blocks(gpu)?.max(1));
        }
        let mut counter = gpu.alloc::<u32>(2)?;
        gpu.fill_bytes(&mut counter, 0)?;
        let head = LmHead {
            vocab,
            hidden,
            weights,
            kernel,
            blocks,
            best_key: gpu.alloc(blocks as usize)?,
            best_row: gpu.alloc(blocks as usize)?,
            counter,
        };
        // The shape against the kernel's requirements, now rather than at the first token.
        head.check()?;
        Ok(head)
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Blocks of the grid.
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Bytes of weights one launch reads.
    pub fn weight_bytes(&self) -> usize {
        match &self.weights {
            LmHeadWeights::Bf16(w) => w.size_bytes(),
            LmHeadWeights::Nvfp4 { packed, scales, .. } => packed.size_bytes() + scales.size_bytes() + 4,
        }
    }

    /// Both kernels' arguments for these addresses of x, the logits and the token (0 for each
    /// when only the shape is checked): one builder for the check and the launch.
    fn args(&self, x: u64, logits: u64, token: u64) -> Args {
        let (vocab, hidden, blocks) = (self.vocab as u32, self.hidden as u32, self.blocks);
        let (best_key, best_row, counter) =
            (self.best_key.ptr().addr(), self.best_row.ptr().addr(), self.counter.ptr().addr());
        match &self.weights {
            LmHeadWeights::Bf16(w) => Args::Bf16(lm_head_argmax_bf16::Args {
                w: w.ptr(),
                x: DevPtr::from_addr(x),
                logits: DevPtrMut::from_addr(logits),
                best_key: DevPtrMut::from_addr(best_key),
                best_row: DevPtrMut::from_addr(best_row),
                counter: DevPtrMut::from_addr(counter),
                token: DevPtrMut::from_addr(token),
                vocab,
                hidden,
                blocks,
            }),
            LmHeadWeights::Nvfp4 { packed, scales, scale2 } => Args::Nvfp4(lm_head_argmax_nvfp4::Args {
                packed: packed.ptr(),
                scales: scales.ptr(),
                scale2: scale2.ptr(),
                x: DevPtr::from_addr(x),
                logits: DevPtrMut::from_addr(logits),
                best_key: DevPtrMut::from_addr(best_key),
                best_row: DevPtrMut::from_addr(best_row),
                counter: DevPtrMut::from_addr(counter),
                token: DevPtrMut::from_addr(token),
                vocab,
                hidden,
                blocks,
            }),
        }
    }

    fn check(&self) -> Result<()> {
        use kernel_dsl::KernelDef;
        let dims = match (&self.kernel, self.args(0, 0, 0)) {
            (LmHeadKernel::Bf16(k), Args::Bf16(a)) => {
                lm_head_argmax_bf16::Kernel::launch_dims(k.tiles(), &a).map(|_| ())
            }
            (LmHeadKernel::Nvfp4(k), Args::Nvfp4(a)) => {
                lm_head_argmax_nvfp4::Kernel::launch_dims(k.tiles(), &a).map(|_| ())
            }
            _ => unreachable!("the kernel is compiled for the weights' format"),
        };
        dims.map_err(|e| Error::Buffer(format!("lm_head {} × {}: {e}", self.vocab, self.hidden)))
    }

    /// Enqueues logits = lm_head·x ([vocab] f32) and `token[0]` = the lowest id of the largest
    /// logit. Graph-safe: the scratch is left as it was found.
    pub fn launch(
        &mut self,
        gpu: &Gpu,
        x: &DeviceBuffer<bf16>,
        logits: &mut DeviceBuffer<f32>,
        token: &mut DeviceBuffer<u32>,
    ) -> Result<()> {
        if x.len() != self.hidden || logits.len() < self.vocab || token.is_empty() {
            return Err(Error::Buffer(format!(
                "lm_head: x has {} values (hidden {}), logits {} (vocab {}), token {}",
                x.len(),
                self.hidden,
                logits.len(),
                self.vocab,
                token.len()
            )));
        }
        let args = self.args(x.ptr().addr(), logits.ptr_mut().addr(), token.ptr_mut().addr());
        // SAFETY: the weights are vocab × hidden (bf16, or codes vocab × hidden/2 and scales
        // vocab × hidden/16, checked at upload), x hidden, logits ≥ vocab, the partials `blocks`,
        // counter and token one each: all checked above or sized at construction.
        unsafe {
            match (&self.kernel, &args) {
                (LmHeadKernel::Bf16(k), Args::Bf16(a)) => k.launch(gpu, a),
                (LmHeadKernel::Nvfp4(k), Args::Nvfp4(a)) => k.launch(gpu, a),
                _ => unreachable!("the kernel is compiled for the weights' format"),
            }
        }
    }

    /// The reduction's counters, blocks done and the next ticket (both zero between launches):
    /// for tests.
    pub fn counters(&self, gpu: &Gpu) -> Result<[u32; 2]> {
        let c = gpu.download(&self.counter)?;
        Ok([c[0], c[1]])
    }
}
