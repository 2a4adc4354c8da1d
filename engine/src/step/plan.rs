//! What the step is made of before anything touches a GPU: each block's shape from the config,
//! the weight formats asked for, and tiles that every kernel of the step accepts at those shapes.
//! Made and checked on the host, so a model the kernels cannot take is refused at load with the
//! kernel and the requirement it breaks, not at the first token.

use crate::error::{Error, Result};
use crate::layers::gdn::{GdnShape, GdnTiles, NormAt};
use crate::layers::lm_head::LmHeadTiles;
use crate::layers::mix::{MixShape, MixTiles};
use crate::layers::moe::{MoeShape, MoeTiles};
use crate::layers::ple::{PleShape, PleTiles};
use crate::layers::qsa::{QsaShape, QsaTiles};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::ple_table::RowFormat;

/// Which weights are kept in NVFP4 on the device (quantised at load from a bf16 checkpoint, or
/// made so by the synthetic model); the rest stay bf16. Norms, convs, gates, the routers, QSA and
/// the PLE projections are always bf16 or f32 (their kernels take those).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    /// The routed and shared experts' gate, up and down projections.
    pub experts: bool,
    /// The Gated Residual's projections (every mix site).
    pub mix: bool,
    /// The GDN layers' stacked input projection.
    pub gdn_in_proj: bool,
    pub lm_head: bool,
    /// The PLE n-gram table's rows in host memory (a table file says its own; a checkpoint's
    /// tables are put in host memory in bf16).
    pub ple_table: RowFormat,
}

impl Formats {
    /// Everything that has an NVFP4 kernel in NVFP4: the format of the benchmarks.
    pub const NVFP4: Formats =
        Formats { experts: true, mix: true, gdn_in_proj: true, lm_head: true, ple_table: RowFormat::Nvfp4 };
    /// Everything in bf16, as checkpoints ship: the format parity is checked in.
    pub const BF16: Formats =
        Formats { experts: false, mix: false, gdn_in_proj: false, lm_head: false, ple_table: RowFormat::Bf16 };

    /// [`Formats::NVFP4`] or [`Formats::BF16`].
    pub const fn all(nvfp4: bool) -> Formats {
        if nvfp4 { Formats::NVFP4 } else { Formats::BF16 }
    }
}

/// Every block's shape and the tiles its kernels run at.
#[derive(Clone, Debug)]
pub struct StepPlan {
    pub formats: Formats,
    /// The RMS norms' epsilon (the mix sites take it as an argument).
    pub eps: f32,
    /// Tokens the QSA caches hold (the context asked for, rounded up to whole block groups).
    pub capacity: usize,
    /// The attention and MoE sites (with write gains) and the final mixer (without).
    pub mix: MixShape,
    pub final_mix: MixShape,
    pub mix_tiles: MixTiles,
    pub gdn: Option<(GdnShape, GdnTiles)>,
    pub qsa: Option<(QsaShape, QsaTiles)>,
    pub moe: MoeShape,
    pub moe_tiles: MoeTiles,
    pub ple: Option<(PleShape, PleTiles)>,
    pub lm_head_tiles: LmHeadTiles,
}

fn unsupported(what: &str, why: impl std::fmt::Display) -> Error {
    Error::Buffer(format!("the GPU kernels cannot run this model's {what}: {why}"))
}

impl StepPlan {
    /// The plan for `cfg` in `formats` with caches for `context` tokens.
    pub fn new(cfg: &ModelConfig, formats: Formats, context: usize) -> Result<StepPlan> {
        let (n, d) = (cfg.hc_streams, cfg.hidden_size);
        if !d.is_multiple_of(256) {
            return Err(unsupported(
                "hidden size",
                format!("{d} is not a multiple of 256 (16-byte lanes over a warp)"),
            ));
        }
        let mix = MixShape { streams: n, hidden: d, rank: cfg.hc_rank, inject: true };
        let final_mix = MixShape { inject: false, ..mix };
        let mix_tiles = MixTiles::fitting(mix)
            .filter(|t| t.check(final_mix).is_ok())
            .ok_or_else(|| unsupported("Gated Residual", format!("{n} streams of {d}, rank {}", cfg.hc_rank)))?;
        let has = |k: LayerKind| cfg.layer_kinds.contains(&k);
        let gdn = if has(LayerKind::Gdn) {
            let shape = GdnShape::from_config(cfg)?;
            let tiles = GdnTiles::fitting(shape, formats.gdn_in_proj, NormAt::DeltaRuleBlock)
                .ok_or_else(|| unsupported("Gated DeltaNet layers", format!("{shape:?}")))?;
            Some((shape, tiles))
        } else {
            None
        };
        let mut capacity = context;
        let qsa = if has(LayerKind::Qsa) {
            let shape = QsaShape::from_config(cfg)?;
            capacity = shape.capacity_for(context);
            let tiles = QsaTiles { top_k: QsaTiles::for_capacity(shape, capacity).top_k, ..QsaTiles::fitting(shape) };
            tiles.check(shape, capacity).map_err(|e| unsupported("QSA layers", e))?;
            Some((shape, tiles))
        } else {
            None
        };
        let moe = MoeShape {
            hidden: d,
            experts: cfg.num_experts,
            top_k: cfg.experts_per_token,
            inter: cfg.expert_intermediate,
            shared_inter: cfg.shared_intermediate,
            renormalise: cfg.norm_topk_prob,
        };
        let moe_tiles = MoeTiles::fitting(moe).ok_or_else(|| unsupported("MoE", format!("{moe:?}")))?;
        let ple =
            if cfg.ple_layers.is_empty() { None } else { Some((PleShape::from_config(cfg)?, PleTiles::default())) };
        Ok(StepPlan {
            formats,
            eps: cfg.rms_norm_eps,
            capacity,
            mix,
            final_mix,
            mix_tiles,
            gdn,
            qsa,
            moe,
            moe_tiles,
            ple,
            lm_head_tiles: LmHeadTiles::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_step() -> ModelConfig {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-step/config.json");
        ModelConfig::from_file(std::path::Path::new(path)).expect("tiny-step config")
    }

    /// The model the GPU step is checked against fits every kernel, in both formats.
    #[test]
    fn tiny_step_fits_every_kernel() {
        let cfg = tiny_step();
        // The NVFP4 input projection of GDN reads 512 columns a block: hidden 256 cannot take it.
        let nvfp4 = Formats { gdn_in_proj: false, ..Formats::NVFP4 };
        for f in [Formats::BF16, nvfp4] {
            let p = StepPlan::new(&cfg, f, 128).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            assert!(p.gdn.is_some() && p.qsa.is_some() && p.ple.is_some());
            assert!(p.capacity >= 128);
        }
    }

    /// A hidden size the 16-byte lanes cannot take is refused with the reason.
    #[test]
    fn a_narrow_model_is_refused_with_the_reason() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-dense/config.json");
        let cfg = ModelConfig::from_file(std::path::Path::new(path)).expect("tiny-dense config");
        let e = StepPlan::new(&cfg, Formats::BF16, 64).expect_err("hidden 48/64 does not fit").to_string();
        assert!(e.contains("GPU kernels cannot run"), "{e}");
    }
}
