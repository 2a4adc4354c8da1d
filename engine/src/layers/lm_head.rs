//! The lm_head with its fused greedy choice on the device: the weights in either format, the
//! scratch its last-block reduction needs, and one launch per token.

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, E2m1x2, E4m3, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::lm_head::{lm_head_argmax_bf16, lm_head_argmax_nvfp4};
use crate::model::nvfp4::Nvfp4Matrix;

/// The lm_head's weights on the device.
#[derive(Debug)]
pub enum LmHeadWeights {
    /// [vocab, hidden] row-major.
    Bf16(DeviceBuffer<bf16>),
    /// ModelOpt layout: codes [vocab, hidden/2], e4m3 block scales [vocab, hidden/16], the global
    /// scale.
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
    /// Zero at allocation; the last block of every launch puts it back to zero.
    counter: DeviceBuffer<u32>,
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
        let packed: Vec<E2m1x2> = m.packed.iter().map(|&b| E2m1x2(b)).collect();
        let scales: Vec<E4m3> = m.scales.iter().map(|&b| E4m3(b)).collect();
        let weights = LmHeadWeights::Nvfp4 {
            packed: gpu.upload(&packed)?,
            scales: gpu.upload(&scales)?,
            scale2: gpu.upload(&[m.scale_2])?,
        };
        let kernel = LmHeadKernel::Nvfp4(gpu.kernel(tiles.nvfp4)?);
        LmHead::with(gpu, vocab, hidden, weights, kernel, tiles.waves)
    }

    fn with(
        gpu: &Gpu,
        vocab: usize,
        hidden: usize,
        weights: LmHeadWeights,
        kernel: LmHeadKernel,
        waves: u32,
    ) -> Result<LmHead> {
        let blocks = (gpu.info().sm_count * waves.max(1)).min(65_535);
        let mut counter = gpu.alloc::<u32>(1)?;
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

    fn check(&self) -> Result<()> {
        use kernel_dsl::KernelDef;
        // Only the shape matters here: the addresses are placeholders.
        fn r<T>() -> DevPtr<T> {
            DevPtr::from_addr(0)
        }
        fn w<T>() -> DevPtrMut<T> {
            DevPtrMut::from_addr(0)
        }
        let (vocab, hidden, blocks) = (self.vocab as u32, self.hidden as u32, self.blocks);
        let dims = match &self.kernel {
            LmHeadKernel::Bf16(k) => {
                let a = lm_head_argmax_bf16::Args {
                    w: r(),
                    x: r(),
                    logits: w(),
                    best_key: w(),
                    best_row: w(),
                    counter: w(),
                    token: w(),
                    vocab,
                    hidden,
                    blocks,
                };
                lm_head_argmax_bf16::Kernel::launch_dims(k.tiles(), &a)
            }
            LmHeadKernel::Nvfp4(k) => {
                let a = lm_head_argmax_nvfp4::Args {
                    packed: r(),
                    scales: r(),
                    scale2: r(),
                    x: r(),
                    logits: w(),
                    best_key: w(),
                    best_row: w(),
                    counter: w(),
                    token: w(),
                    vocab,
                    hidden,
                    blocks,
                };
                lm_head_argmax_nvfp4::Kernel::launch_dims(k.tiles(), &a)
            }
        };
        dims.map(|_| ()).map_err(|e| Error::Buffer(format!("lm_head {vocab} × {hidden}: {e}")))
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
        let (vocab, hidden, blocks) = (self.vocab as u32, self.hidden as u32, self.blocks);
        match (&self.kernel, &self.weights) {
            (LmHeadKernel::Bf16(k), LmHeadWeights::Bf16(w)) => {
                let a = lm_head_argmax_bf16::Args {
                    w: w.ptr(),
                    x: x.ptr(),
                    logits: logits.ptr_mut(),
                    best_key: self.best_key.ptr_mut(),
                    best_row: self.best_row.ptr_mut(),
                    counter: self.counter.ptr_mut(),
                    token: token.ptr_mut(),
                    vocab,
                    hidden,
                    blocks,
                };
                // SAFETY: w is vocab × hidden, x hidden, logits ≥ vocab, the partials `blocks`,
                // counter and token one each, all checked above or sized at construction.
                unsafe { k.launch(gpu, &a) }
            }
            (LmHeadKernel::Nvfp4(k), LmHeadWeights::Nvfp4 { packed, scales, scale2 }) => {
                let a = lm_head_argmax_nvfp4::Args {
                    packed: packed.ptr(),
                    scales: scales.ptr(),
                    scale2: scale2.ptr(),
                    x: x.ptr(),
                    logits: logits.ptr_mut(),
                    best_key: self.best_key.ptr_mut(),
                    best_row: self.best_row.ptr_mut(),
                    counter: self.counter.ptr_mut(),
                    token: token.ptr_mut(),
                    vocab,
                    hidden,
                    blocks,
                };
                // SAFETY: as for bf16, with the codes vocab × hidden/2 and the scales
                // vocab × hidden/16 (checked at upload).
                unsafe { k.launch(gpu, &a) }
            }
            _ => unreachable!("the kernel is compiled for the weights' format"),
        }
    }

    /// The reduction's counter (zero between launches): for tests.
    pub fn counter(&self, gpu: &Gpu) -> Result<u32> {
        Ok(gpu.download(&self.counter)?[0])
    }
}
