//! The step's one-tile neighbours (`autotune --neighbours DIR`): for each knob of a unit, every
//! declared tile set that differs from the plan's in exactly one tile, fits the unit's shape and
//! compiles clean (no spills, within shared memory, a block the SM's registers hold), each as a
//! pinned table of its own. `benches/step.rs` then times the plan's tiles against all of them in
//! one run (`FLASHNEXT_STEP_TABLES` naming the folder). A unit's harness times a family between
//! copies of itself, so it cannot judge what a tile costs beside the step's other kernels (its
//! winners lost in the step in session 20, and the tiles marked `step` it holds at the plan's
//! value); the step can, and a one-tile change says which tile did it.

use engine::tuned::{Entry, Unit};

use super::{Target, enumerate_where};

/// The rule a neighbour's table carries.
pub const NEIGHBOUR_RULE: &str = "a one-tile neighbour of the plan (autotune --neighbours), not tuned: the plan's tiles \
    with one tile of one knob changed to another declared value that fits the shape and compiles clean, for timing \
    the step at the plan's tiles against it in one run (benches/step.rs with FLASHNEXT_STEP_TABLES naming this table \
    or its folder)";

/// One neighbour: which tile of which knob moved, and the unit's entry with it.
#[derive(Clone, Debug)]
pub struct Neighbour {
    pub knob: &'static str,
    /// The tile's name (a grid knob's own name) and its new value.
    pub tile: String,
    pub value: String,
    pub entry: Entry,
}

impl Neighbour {
    /// A file name for its table, `<family>.<format>.<knob>.<TILE>-<value>.json`: each part is a
    /// name or a number, so nothing needs escaping.
    pub fn file_name(&self) -> String {
        format!("{}.{}.{}.{}-{}.json", self.entry.family, self.entry.format, self.knob, self.tile, self.value)
    }
}

/// The one tile in which tile sets `from` and `to` (`NAME=value` pairs in the kernel's order, as
/// `engine::tuned::tiles_string` writes them) differ, as (name, `to`'s value); None when they
/// differ in none or in more than one. A grid setting (`8`, no pairs) is one tile, `grid`.
pub fn one_tile_change(from: &str, to: &str) -> Option<(String, String)> {
    if !from.contains('=') && !to.contains('=') {
        return (from != to).then(|| ("grid".to_owned(), to.to_owned()));
    }
    let pairs = |s: &str| -> Option<Vec<(String, String)>> {
        s.split_whitespace().map(|p| p.split_once('=').map(|(n, v)| (n.to_owned(), v.to_owned()))).collect()
    };
    let (a, b) = (pairs(from)?, pairs(to)?);
    if a.len() != b.len() || a.iter().zip(&b).any(|((n, _), (m, _))| n != m) {
        return None;
    }
    let mut changed = a.iter().zip(&b).filter(|((_, v), (_, w))| v != w);
    let (_, (name, value)) = changed.next()?;
    changed.next().is_none().then(|| (name.clone(), value.clone()))
}

/// Every one-tile neighbour of `start` (the plan's tiles) in `unit` that fits its shape and
/// compiles clean for `target`, in knob and declaration order ([`enumerate_where`]: the other
/// choices are left out before the shape checks and the compiles). Tiles the harnesses hold
/// (`#[tile(..., step)]`) are neighbours here too: the step is where they are judged.
pub fn neighbours<S: Copy + 'static>(unit: &Unit<S>, start: S, target: &Target) -> Vec<Neighbour> {
    const NOT_ONE: &str = "not a one-tile neighbour";
    let compiled = enumerate_where(unit, start, target, &|_, current, choice| match one_tile_change(current, choice) {
        Some(_) => Ok(()),
        None => Err(NOT_ONE.into()),
    });
    let mut out = Vec::new();
    let mut refused = 0;
    for (k, row) in unit.knobs.iter().zip(compiled) {
        let current = k.get(&start);
        for (choice, c) in k.choices.iter().zip(row) {
            let Some((tile, value)) = one_tile_change(&current, choice) else { continue };
            if c.pruned.is_some() {
                refused += 1;
                continue;
            }
            let mut t = start;
            k.set(&mut t, choice);
            out.push(Neighbour {
                knob: k.name,
                tile,
                value,
                entry: Entry {
                    family: unit.family.into(),
                    format: unit.format.into(),
                    shape: unit.shape.clone(),
                    winner: unit.choices(&t, target.arch),
                    us_per_layer: None,
                    default_us_per_layer: None,
                    candidates: Vec::new(),
                },
            });
        }
    }
    eprintln!(
        "[{} {}] {} one-tile neighbours ({refused} refused by the shape or the compiled resources)",
        unit.family,
        unit.format,
        out.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use engine::cuda::cache::CompileCache;
    use engine::model::config::ModelConfig;
    use engine::step::{Formats, StepPlan};
    use engine::tuned::Table;
    use kernel_dsl::Arch;

    use super::*;

    #[test]
    fn one_tile_changes_are_found_and_others_are_not() {
        let c = |a, b| one_tile_change(a, b);
        assert_eq!(c("ROWS=2 WARPS=5 CHUNKS=5", "ROWS=2 WARPS=10 CHUNKS=5"), Some(("WARPS".into(), "10".into())));
        assert_eq!(c("ROWS=2 WARPS=5", "ROWS=2 WARPS=5"), None, "no change");
        assert_eq!(c("ROWS=2 WARPS=5", "ROWS=1 WARPS=10"), None, "two changes");
        assert_eq!(c("ROWS=2 WARPS=5", "WARPS=5 ROWS=2"), None, "another kernel's order");
        assert_eq!(c("ROWS=2 WARPS=5", "ROWS=2"), None, "another kernel's tiles");
        assert_eq!(c("8", "16"), Some(("grid".into(), "16".into())));
        assert_eq!(c("8", "8"), None);
    }

    /// The published step's NVFP4 mix unit (two kernels, NVRTC only): every neighbour changes one
    /// tile of one knob from the plan's and nothing else, the step's plan reads its table back as
    /// exactly that change, its file name is unique, and the tile the harness holds (the
    /// down-projection's MAX_BLOCKS) is among them.
    #[test]
    fn the_mix_unit_neighbours_are_the_plan_with_one_tile_moved() {
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 4096).expect("plan");
        let unit = plan.units(132).mix;
        let target = Target { arch: Arch::Sm90, sms: 132, smem: 232_448, threads: 2, cache: CompileCache::new(None) };
        let all = neighbours(&unit, plan.mix_tiles, &target);
        assert!(!all.is_empty());
        let plan_choices = unit.choices(&plan.mix_tiles, Arch::Sm90);
        let mut names = Vec::new();
        for n in &all {
            let moved: Vec<_> = n.entry.winner.iter().zip(&plan_choices).filter(|(a, b)| a.tiles != b.tiles).collect();
            assert_eq!(moved.len(), 1, "{n:?}");
            let (got, was) = moved[0];
            assert_eq!(got.knob, n.knob);
            assert_eq!(one_tile_change(&was.tiles, &got.tiles), Some((n.tile.clone(), n.value.clone())));
            let table = Table {
                device: "NVIDIA H200".into(),
                arch: "sm_90".into(),
                entries: vec![n.entry.clone()],
                ..Table::default()
            };
            let (taken, notices) = plan.clone().tuned(&table, Arch::Sm90, 132);
            assert!(!notices.iter().any(|x| x.starts_with("mix")), "{notices:?}");
            assert_eq!(unit.choices(&taken.mix_tiles, Arch::Sm90), n.entry.winner, "the plan takes it as written");
            names.push(n.file_name());
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len(), "file names are unique");
        assert!(all.iter().any(|n| n.knob == "down" && n.tile == "MAX_BLOCKS"), "{all:?}");
    }
}
