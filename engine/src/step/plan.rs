//! What the step is made of before anything touches a GPU: each block's shape from the config,
//! the weight formats asked for, and tiles that every kernel of the step accepts at those shapes.
//! Made and checked on the host, so a model the kernels cannot take is refused at load with the
//! kernel and the requirement it breaks, not at the first token.

use kernel_dsl::Arch;

use crate::cuda::DeviceInfo;
use crate::error::{Error, Result};
use crate::layers::gdn::{GdnShape, GdnTiles};
use crate::layers::lm_head::LmHeadTiles;
use crate::layers::mix::{MixShape, MixTiles};
use crate::layers::moe::{MoeShape, MoeTiles};
use crate::layers::ple::{PleShape, PleTiles};
use crate::layers::qsa::{QsaShape, QsaTiles, TopK};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::ple_table::RowFormat;
use crate::tuned;

/// Which weights are kept in NVFP4 on the device (an NVFP4 checkpoint's as stored, a bf16 one's
/// quantised at load, or made so by the synthetic model); the rest stay bf16. Norms, convs, gates,
/// the routers and QSA's attention are always bf16 or f32 (their kernels take those).
///
/// A new field here is a new format choice every `Formats { .. }` literal must make: the two
/// constants below are the usual starting points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    /// The routed and shared experts' gate, up and down projections.
    pub experts: bool,
    /// The Gated Residual's projections (every mix site).
    pub mix: bool,
    /// The GDN layers' stacked input projection.
    pub gdn_in_proj: bool,
    /// The GDN layers' out_proj ([`crate::kernels::gemv_nvfp4`]).
    pub gdn_out_proj: bool,
    /// The QSA layers' stacked input projection and o_proj ([`crate::kernels::gemv_nvfp4`]).
    pub qsa: bool,
    pub lm_head: bool,
    /// The PLE layers' stacked key and value projections ([`crate::kernels::gemv_nvfp4`]).
    pub ple_proj: bool,
    /// The PLE n-gram table's rows in host memory (a table file says its own; a checkpoint's
    /// tables are put in host memory in bf16).
    pub ple_table: RowFormat,
}

impl Formats {
    /// Everything that has an NVFP4 kernel in NVFP4: the format of the benchmarks.
    pub const NVFP4: Formats = Formats {
        experts: true,
        mix: true,
        gdn_in_proj: true,
        gdn_out_proj: true,
        qsa: true,
        lm_head: true,
        ple_proj: true,
        ple_table: RowFormat::Nvfp4,
    };
    /// Everything in bf16, as checkpoints ship: the format parity is checked in.
    pub const BF16: Formats = Formats {
        experts: false,
        mix: false,
        gdn_in_proj: false,
        gdn_out_proj: false,
        qsa: false,
        lm_head: false,
        ple_proj: false,
        ple_table: RowFormat::Bf16,
    };

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
    /// The lm_head's rows.
    pub vocab: usize,
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
            let tiles = GdnTiles::fitting(shape, formats.gdn_in_proj)
                .ok_or_else(|| unsupported("Gated DeltaNet layers", format!("{shape:?}")))?;
            if formats.gdn_out_proj {
                tiles.check_out_proj_nvfp4(shape).map_err(|e| unsupported("GDN out_proj in NVFP4", e))?;
            }
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
            if formats.qsa {
                tiles.check_nvfp4(shape).map_err(|e| unsupported("QSA projections in NVFP4", e))?;
            }
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
        let ple = if cfg.ple_layers.is_empty() {
            None
        } else {
            // A checkpoint's tables go to host memory in bf16 whatever `formats` says, so the
            // plan is checked with bf16 rows; the NVFP4 gather (synthetic tables and table files)
            // is checked where such a table is made (`ModelOnDevice::synthetic`).
            let shape = PleShape::from_config(cfg)?;
            let tiles = PleTiles::fitting(shape);
            tiles.check(shape, RowFormat::Bf16).map_err(|e| unsupported("PLE layers", e))?;
            if formats.ple_proj {
                tiles.check_nvfp4(shape).map_err(|e| unsupported("PLE projections in NVFP4", e))?;
            }
            Some((shape, tiles))
        };
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
            vocab: cfg.vocab_size,
        })
    }

    /// [`StepPlan::new`] with the tiles of the device's tuned table (`crate::tuned::find_for`),
    /// family by family; a family without a current entry keeps the plan's own tiles, and one line
    /// on stderr says so (as does a missing table).
    pub fn for_device(cfg: &ModelConfig, formats: Formats, context: usize, info: &DeviceInfo) -> Result<StepPlan> {
        let plan = StepPlan::new(cfg, formats, context)?;
        match tuned::find_for(&info.name, info.arch) {
            Ok(table) => {
                let (plan, notices) = plan.tuned(&table, info.arch, info.sm_count);
                for n in notices {
                    eprintln!("tuned tiles: {n}; default tiles for it");
                }
                Ok(plan)
            }
            Err(why) => {
                eprintln!("tuned tiles: {why}; default tiles");
                Ok(plan)
            }
        }
    }

    /// The tuning units of this plan (the families the step runs, in the formats it runs them),
    /// with the lm_head's grid on `sms` SMs.
    pub fn units(&self, sms: u32) -> PlanUnits {
        PlanUnits {
            moe: tuned::moe_unit(self.moe, self.formats.experts),
            mix: tuned::mix_unit(self.mix, self.final_mix, self.formats.mix),
            gdn: self.gdn.map(|(shape, _)| tuned::gdn_unit(shape, self.formats.gdn_in_proj, self.formats.gdn_out_proj)),
            qsa: self.qsa.map(|(shape, tiles)| {
                tuned::qsa_unit(shape, self.capacity, matches!(tiles.top_k, TopK::Grid(_)), self.formats.qsa)
            }),
            ple: self.ple.map(|(shape, _)| tuned::ple_unit(shape, self.formats.ple_table, self.formats.ple_proj)),
            lm_head: tuned::lm_head_unit(self.vocab, self.mix.hidden, sms, self.formats.lm_head),
        }
    }

    /// This plan with `table`'s entries taken where they are current and fit, and a notice for
    /// each family that keeps its own tiles.
    pub fn tuned(mut self, table: &tuned::Table, arch: Arch, sms: u32) -> (StepPlan, Vec<String>) {
        let u = self.units(sms);
        let mut notices = Vec::new();
        let mut take = |r: std::result::Result<(), String>| {
            if let Err(n) = r {
                notices.push(n);
            }
        };
        take(u.moe.apply(table, arch, self.moe_tiles).map(|t| self.moe_tiles = t));
        take(u.mix.apply(table, arch, self.mix_tiles).map(|t| self.mix_tiles = t));
        if let (Some(unit), Some((_, tiles))) = (&u.gdn, self.gdn.as_mut()) {
            take(unit.apply(table, arch, *tiles).map(|t| *tiles = t));
        }
        if let (Some(unit), Some((_, tiles))) = (&u.qsa, self.qsa.as_mut()) {
            take(unit.apply(table, arch, *tiles).map(|t| *tiles = t));
        }
        if let (Some(unit), Some((_, tiles))) = (&u.ple, self.ple.as_mut()) {
            take(unit.apply(table, arch, *tiles).map(|t| *tiles = t));
        }
        take(u.lm_head.apply(table, arch, self.lm_head_tiles).map(|t| self.lm_head_tiles = t));
        (self, notices)
    }
}

/// The units [`StepPlan::units`] makes.
#[derive(Debug)]
pub struct PlanUnits {
    pub moe: tuned::Unit<MoeTiles>,
    pub mix: tuned::Unit<MixTiles>,
    pub gdn: Option<tuned::Unit<GdnTiles>>,
    /// At the plan's capacity, for the top-k kernel it chose.
    pub qsa: Option<tuned::Unit<QsaTiles>>,
    /// In the format of the plan's PLE table rows.
    pub ple: Option<tuned::Unit<PleTiles>>,
    pub lm_head: tuned::Unit<LmHeadTiles>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config of tests/data/`name`.
    fn golden(name: &str) -> ModelConfig {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name).join("config.json");
        ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{name} config: {e}"))
    }

    /// Every golden model (tests/gpu_step.rs runs each on the device) fits every kernel, in both
    /// formats, each with the blocks it has.
    #[test]
    fn every_golden_fits_every_kernel() {
        // The NVFP4 input projection of GDN reads 512 columns a block: hidden 256 cannot take it.
        let nvfp4 = Formats { gdn_in_proj: false, ..Formats::NVFP4 };
        for name in ["tiny-step", "tiny-sparse", "tiny-dense", "tiny-sparse-nvfp4"] {
            let cfg = golden(name);
            for f in [Formats::BF16, nvfp4] {
                let p = StepPlan::new(&cfg, f, 128).unwrap_or_else(|e| panic!("{name} {f:?}: {e}"));
                assert!(p.gdn.is_some() && p.qsa.is_some(), "{name}");
                assert_eq!(p.ple.is_some(), !cfg.ple_layers.is_empty(), "{name}");
                assert!(p.capacity >= 128);
                // Every launch of the planned blocks, with the rows a checkpoint's tables have.
                if let Some((shape, tiles)) = p.ple {
                    tiles.check(shape, RowFormat::Bf16).unwrap_or_else(|e| panic!("{name} PLE: {e}"));
                }
            }
        }
    }

    /// A table entry with current versions changes the plan's tiles; a stale one is refused with
    /// a notice, and the family keeps its tiles; families without entries say so.
    #[test]
    fn tuned_tables_are_taken_when_current_and_refused_when_stale() {
        let cfg = ModelConfig::published();
        let plan = StepPlan::new(&cfg, Formats::NVFP4, 32_768).expect("plan");
        let arch = Arch::Sm90;
        let units = plan.units(132);
        // A MoE winner that differs from the plan: the first other gate_up tile set that fits.
        let mut tiles = plan.moe_tiles;
        let gate_up = units.moe.knobs.iter().find(|k| k.name == "gate_up").expect("gate_up knob");
        let other = gate_up
            .choices
            .iter()
            .find(|c| {
                let mut t = plan.moe_tiles;
                gate_up.set(&mut t, c) && t != plan.moe_tiles && units.moe.valid(&t).is_ok()
            })
            .expect("another gate_up tile set fits the published shape");
        assert!(gate_up.set(&mut tiles, other));
        let entry = |winner| tuned::Entry {
            family: "moe".into(),
            format: "nvfp4".into(),
            shape: units.moe.shape.clone(),
            winner,
            us_per_layer: None,
            default_us_per_layer: None,
            candidates: vec![],
        };
        let mut table = tuned::Table { device: "test".into(), arch: arch.to_string(), ..Default::default() };
        table.upsert(entry(units.moe.choices(&tiles, arch)));
        let (tuned_plan, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(tuned_plan.moe_tiles, tiles);
        assert_ne!(tuned_plan.moe_tiles, plan.moe_tiles);
        assert_eq!(tuned_plan.mix_tiles, plan.mix_tiles);
        assert_eq!(notices.len(), 5, "{notices:?}");
        assert!(notices.iter().all(|n| n.contains("no entry")), "{notices:?}");

        let mut stale = units.moe.choices(&tiles, arch);
        stale[1].version = "0123456789abcdef".into();
        table.upsert(entry(stale));
        let (fallback, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(fallback.moe_tiles, plan.moe_tiles);
        assert!(notices.iter().any(|n| n.starts_with("moe nvfp4: stale entry")), "{notices:?}");

        // The table written and read back is the same table.
        let path = std::env::temp_dir().join(format!("flashnext-tuned-{}.json", std::process::id()));
        table.write(&path).expect("write");
        assert_eq!(tuned::Table::read(&path).expect("read"), table);
        let _ = std::fs::remove_file(&path);
    }

    /// A unit's first other clean-at-the-shape setting of knob `name`, set into `start`.
    fn other_tiles<S: Copy + PartialEq + 'static>(unit: &tuned::Unit<S>, start: S, name: &str) -> S {
        let knob = unit.knobs.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} knob"));
        knob.choices
            .iter()
            .find_map(|c| {
                let mut t = start;
                (knob.set(&mut t, c) && t != start && unit.valid(&t).is_ok()).then_some(t)
            })
            .unwrap_or_else(|| panic!("another {name} tile set fits"))
    }

    fn entry_of<S: Copy + 'static>(unit: &tuned::Unit<S>, tiles: &S, arch: Arch) -> tuned::Entry {
        tuned::Entry {
            family: unit.family.into(),
            format: unit.format.into(),
            shape: unit.shape.clone(),
            winner: unit.choices(tiles, arch),
            us_per_layer: Some(1.0),
            default_us_per_layer: Some(2.0),
            candidates: vec![],
        }
    }

    /// QSA and PLE take their entries like the other families: the tuned attention, NVFP4 o_proj
    /// and gather tiles replace the plan's; the QSA entry of the one-block top-k (32k) is refused
    /// with a notice by a plan whose caches take the multi-block top-k (128k), which keeps its
    /// tiles; a stale PLE entry is refused; the bf16 plan's PLE (bf16 rows) does not take the NVFP4
    /// rows' entry, nor its QSA (bf16 projections) the NVFP4 projections' entry.
    #[test]
    fn qsa_and_ple_take_tuned_tiles() {
        let cfg = ModelConfig::published();
        let arch = Arch::Sm90;
        let plan = StepPlan::new(&cfg, Formats::NVFP4, 32_768).expect("plan");
        let (Some((_, qsa_tiles)), Some((_, ple_tiles))) = (plan.qsa, plan.ple) else { panic!("QSA and PLE") };
        assert!(matches!(qsa_tiles.top_k, TopK::OneBlock(_)));
        let units = plan.units(132);
        let (qu, pu) = (units.qsa.as_ref().expect("qsa unit"), units.ple.as_ref().expect("ple unit"));
        assert_eq!(qu.format, "nvfp4");
        assert_eq!(pu.format, "nvfp4");
        let names: Vec<_> = qu.knobs.iter().map(|k| k.name).collect();
        assert_eq!(names, ["in_proj", "prepare", "block_scores", "top_k", "attention", "combine", "o_proj"]);
        assert_eq!(qu.knobs[3].kernel, "qsa_top_blocks");
        assert_eq!((qu.knobs[0].kernel, qu.knobs[6].kernel), ("gemv_nvfp4", "gemv_nvfp4"));
        let names: Vec<_> = pu.knobs.iter().map(|k| k.name).collect();
        assert_eq!(names, ["gather", "proj", "gate_conv"]);
        assert_eq!(pu.knobs[0].kernel, "ple_gather_nvfp4");
        let q = other_tiles(qu, qsa_tiles, "attention");
        let q = other_tiles(qu, q, "top_k");
        let q = other_tiles(qu, q, "o_proj");
        assert_ne!(q.o_proj_nvfp4, qsa_tiles.o_proj_nvfp4);
        let p = other_tiles(pu, ple_tiles, "gather");
        let p = other_tiles(pu, p, "gate_conv");
        let mut table = tuned::Table { device: "test".into(), arch: arch.to_string(), ..Default::default() };
        table.upsert(entry_of(qu, &q, arch));
        table.upsert(entry_of(pu, &p, arch));
        let (tuned_plan, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(tuned_plan.qsa.map(|(_, t)| t), Some(q));
        assert_eq!(tuned_plan.ple.map(|(_, t)| t), Some(p));
        assert_ne!(q, qsa_tiles);
        assert_ne!(p, ple_tiles);
        assert!(!notices.iter().any(|n| n.starts_with("qsa") || n.starts_with("ple")), "{notices:?}");

        // 128k: the multi-block top-k, another unit; the 32k entry is not its.
        let long = StepPlan::new(&cfg, Formats::NVFP4, 131_072).expect("plan");
        let (long_tuned, notices) = long.clone().tuned(&table, arch, 132);
        assert_eq!(long_tuned.qsa.map(|(_, t)| t), long.qsa.map(|(_, t)| t));
        assert!(notices.iter().any(|n| n == "qsa nvfp4: no entry"), "{notices:?}");
        assert_eq!(long.units(132).qsa.expect("qsa").knobs[3].kernel, "qsa_top_blocks_grid");

        // bf16 rows and projections: the NVFP4 entries are not theirs.
        let bf16 = StepPlan::new(&cfg, Formats::BF16, 32_768).expect("plan");
        let (bf16_tuned, notices) = bf16.clone().tuned(&table, arch, 132);
        assert_eq!(bf16_tuned.ple.map(|(_, t)| t), bf16.ple.map(|(_, t)| t));
        assert!(notices.iter().any(|n| n == "ple bf16: no entry"), "{notices:?}");
        assert_eq!(bf16_tuned.qsa.map(|(_, t)| t), bf16.qsa.map(|(_, t)| t));
        assert!(notices.iter().any(|n| n == "qsa bf16: no entry"), "{notices:?}");

        // A stale PLE entry: refused, the plan's tiles kept.
        let mut stale = entry_of(pu, &p, arch);
        stale.winner[2].version = "0123456789abcdef".into();
        table.upsert(stale);
        let (fallback, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(fallback.ple.map(|(_, t)| t), Some(ple_tiles));
        assert!(notices.iter().any(|n| n.starts_with("ple nvfp4: stale entry for ple_gate_conv")), "{notices:?}");
    }

    /// The NVFP4 plan runs GDN's out_proj through `gemv_nvfp4`, and its unit tunes those tiles
    /// (`out_proj_nvfp4`): an entry with a set of its split path (8 warps, split 4) is taken; an entry
    /// of the tables written when the unit's out_proj was the bf16 GEMV (the same `gdn nvfp4` key)
    /// is reported stale and the plan keeps its tiles; a plan with GDN's input projection alone in
    /// NVFP4 has a key of its own, whose out_proj is the bf16 GEMV.
    #[test]
    fn gdn_takes_entries_of_the_out_proj_it_runs() {
        use crate::kernels::gemv_nvfp4::gemv_nvfp4;
        let cfg = ModelConfig::published();
        let arch = Arch::Sm90;
        let plan = StepPlan::new(&cfg, Formats::NVFP4, 32_768).expect("plan");
        let (shape, gdn_tiles) = plan.gdn.expect("GDN");
        let units = plan.units(132);
        let gu = units.gdn.as_ref().expect("gdn unit");
        assert_eq!(gu.format, "nvfp4");
        let out = gu.knobs.iter().find(|k| k.name == "out_proj").expect("out_proj knob");
        assert_eq!(out.kernel, "gemv_nvfp4");
        let split_path = crate::kernels::gemv_nvfp4::SPLIT_PATH;
        let best = tuned::tiles_string(&gemv_nvfp4::Tiles { warps: 8, k_split: 4, ..split_path });
        assert!(out.choices.contains(&best), "{best} among {:?}", out.choices);
        let mut t = gdn_tiles;
        assert!(out.set(&mut t, &best));
        assert_eq!((t.out_proj_nvfp4.warps, t.out_proj_nvfp4.k_split), (8, 4));
        assert_eq!(t.out_proj, gdn_tiles.out_proj, "the bf16 GEMV's tiles are not this knob's");
        gu.valid(&t).expect("8 warps, split 4 fits the published out_proj");

        let mut table = tuned::Table { device: "test".into(), arch: arch.to_string(), ..Default::default() };
        table.upsert(entry_of(gu, &t, arch));
        let (tuned_plan, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(tuned_plan.gdn.map(|(_, t)| t), Some(t));
        assert!(!notices.iter().any(|n| n.starts_with("gdn")), "{notices:?}");

        // The earlier unit: out_proj the bf16 GEMV, keyed `nvfp4` by the input projection.
        let old_unit = tuned::gdn_unit(shape, true, false);
        assert_eq!(old_unit.format, "nvfp4 in_proj");
        let mut old = entry_of(&old_unit, &gdn_tiles, arch);
        old.format = "nvfp4".into();
        table.upsert(old.clone());
        assert_eq!(table.entries.len(), 1, "the same key");
        let (fallback, notices) = plan.clone().tuned(&table, arch, 132);
        assert_eq!(fallback.gdn.map(|(_, t)| t), Some(gdn_tiles));
        assert!(
            notices
                .iter()
                .any(|n| n == "gdn nvfp4: stale entry: its `out_proj` is gemv_bf16's, the step runs gemv_nvfp4"),
            "{notices:?}"
        );

        // The input projection alone in NVFP4: its own key, out_proj in bf16.
        let mixed = StepPlan::new(&cfg, Formats { gdn_out_proj: false, ..Formats::NVFP4 }, 32_768).expect("plan");
        let mu = mixed.units(132).gdn.expect("gdn unit");
        assert_eq!(mu.format, "nvfp4 in_proj");
        assert_eq!(mu.knobs.iter().find(|k| k.name == "out_proj").map(|k| k.kernel), Some("gemv_bf16"));
        let (_, notices) = mixed.clone().tuned(&table, arch, 132);
        assert!(notices.iter().any(|n| n == "gdn nvfp4 in_proj: no entry"), "{notices:?}");
        old.format = "nvfp4 in_proj".into();
        table.upsert(old);
        let (_, notices) = mixed.tuned(&table, arch, 132);
        assert!(!notices.iter().any(|n| n.starts_with("gdn")), "{notices:?}");
    }

    /// The committed GB10 table is current: every family of the published step, in both formats,
    /// takes its entry on sm_121a with 48 SMs. Fails when a kernel changed since the table was
    /// chosen: `cargo run --release -p tools --bin autotune -- --untimed --device "NVIDIA GB10"
    /// --arch sm_121a --sms 48 --smem 101376 --out tuned/gb10-untimed.json` makes it again.
    #[test]
    fn the_gb10_table_is_current() {
        let path = tuned::default_dir().join("gb10-untimed.json");
        let table = tuned::Table::read(&path).expect("the GB10 table");
        assert!(table.untimed && table.device == "NVIDIA GB10" && table.arch == "sm_121a");
        let cfg = ModelConfig::published();
        for formats in [Formats::NVFP4, Formats::BF16] {
            let plan = StepPlan::new(&cfg, formats, 32_768).expect("plan");
            let (_, notices) = plan.tuned(&table, Arch::Sm121a, 48);
            assert!(notices.is_empty(), "{formats:?}: {notices:?}");
        }
    }

    /// The committed H100 table (four tiles pinned from the step's measurements) is current: the
    /// NVFP4 step takes its MoE, GDN and QSA entries, and every other family keeps the plan's
    /// tiles for want of an entry. Fails when one of those kernels changed since: the pins of its
    /// rule, `autotune --pin ... --device "NVIDIA H100 80GB HBM3" --arch sm_90 --sms 132 --smem
    /// 232448`, make it again (then its bf16 GDN entry is dropped: that step was not measured).
    #[test]
    fn the_h100_table_is_current() {
        let path = tuned::default_dir().join("nvidia-h100-80gb-hbm3.json");
        let table = tuned::Table::read(&path).expect("the H100 table");
        assert!(table.untimed && table.device == "NVIDIA H100 80GB HBM3" && table.arch == "sm_90");
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 32_768).expect("plan");
        let (tuned, notices) = plan.clone().tuned(&table, Arch::Sm90, table.sms);
        for n in &notices {
            assert!(n.ends_with(": no entry") && !["moe", "gdn", "qsa"].iter().any(|f| n.starts_with(f)), "{n}");
        }
        assert_ne!(tuned.moe_tiles, plan.moe_tiles, "the MoE entry's gate/up WARPS=4 is taken");
    }

    /// The committed H200 table, as the timed run left it, is read and taken where current: a
    /// family without an entry (the mix; QSA with NVFP4 projections) keeps the plan's tiles with a
    /// notice, as does any family whose kernels changed since the run or whose entry was tuned
    /// with another kernel (GDN's NVFP4 entry of the bf16 out_proj).
    #[test]
    fn the_h200_table_is_accepted_as_it_is() {
        let path = tuned::default_dir().join("nvidia-h200.json");
        let table = tuned::Table::read(&path).expect("the H200 table");
        assert!(!table.untimed && table.device == "NVIDIA H200" && table.arch == "sm_90");
        let cfg = ModelConfig::published();
        for formats in [Formats::NVFP4, Formats::BF16] {
            let plan = StepPlan::new(&cfg, formats, 32_768).expect("plan");
            let (_, notices) = plan.tuned(&table, Arch::Sm90, table.sms);
            println!("{formats:?}: {notices:?}");
            for n in &notices {
                assert!(n.contains(": no entry") || n.contains(": stale entry"), "{formats:?}: {n}");
            }
            for family in ["qsa", "ple"] {
                let has = table.entries.iter().any(|e| e.family == family);
                let noticed = notices.iter().any(|n| n.starts_with(family));
                assert!(has || noticed, "{formats:?}: {family} has no entry and no notice: {notices:?}");
            }
        }
    }

    /// A PLE conv whose state has more rows than the gate/conv kernel keeps in registers (17) is
    /// refused at planning, naming the kernel and its requirement, before anything is allocated.
    #[test]
    fn a_ple_conv_state_past_the_kernel_is_refused_with_the_reason() {
        let mut cfg = golden("tiny-step");
        assert!(!cfg.ple_layers.is_empty(), "tiny-step has PLE");
        let dilation = cfg.ngram_size;
        cfg.ple_conv_kernel = 17 / dilation + 2;
        assert!((cfg.ple_conv_kernel - 1) * dilation > 17);
        let e = StepPlan::new(&cfg, Formats::BF16, 64).expect_err("the state is too deep").to_string();
        assert!(e.contains("ple_gate_conv") && e.contains("dilation <= 17"), "{e}");
        cfg.ple_conv_kernel = 17 / dilation + 1;
        StepPlan::new(&cfg, Formats::BF16, 64).expect("17 rows or fewer fit");
    }

    /// A hidden size the 16-byte lanes cannot take is refused with the reason, and so are three
    /// streams (the Gated Residual's lanes split over the streams: their count divides 32).
    #[test]
    fn a_narrow_model_is_refused_with_the_reason() {
        let mut cfg = golden("tiny-dense");
        cfg.hidden_size = 64;
        let e = StepPlan::new(&cfg, Formats::BF16, 64).expect_err("hidden 64 does not fit").to_string();
        assert!(e.contains("GPU kernels cannot run") && e.contains("hidden size"), "{e}");
        let mut cfg = golden("tiny-dense");
        cfg.hc_streams = 3;
        let e = StepPlan::new(&cfg, Formats::BF16, 64).expect_err("three streams do not fit").to_string();
        assert!(e.contains("GPU kernels cannot run") && e.contains("Gated Residual"), "{e}");
    }
}
