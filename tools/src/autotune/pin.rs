//! Tables pinned by hand (`autotune --pin`): the plan's tiles with some knobs set to named tile
//! sets, written as a table the engine takes like a tuned one. This is how one binary compares
//! the step at its defaults against a candidate in the same run (`benches/step.rs` with
//! `FLASHNEXT_STEP_TABLES` naming pinned tables), for a change that only shows in the whole step
//! (a kernel's early loads meet its neighbours' there, not in its own bench). Nothing is timed
//! and the table says so; the kernels' versions are the current ones, so the table goes stale,
//! and is refused, as soon as a pinned kernel changes.

use std::str::FromStr;

use engine::tuned::{Entry, Unit};
use kernel_dsl::Arch;

/// The rule a pinned table carries.
pub const PINNED_RULE: &str = "pinned by hand (autotune --pin), not tuned: the plan's tiles with the named knobs set \
    to the named tile sets, for timing the step at the plan's tiles against these in one run (benches/step.rs with \
    FLASHNEXT_STEP_TABLES naming this table)";

/// One `--pin FAMILY.KNOB=TILES`: knob `knob` of family `family`'s units at tile set `tiles`,
/// `NAME=value` pairs as the tuned tables write them (`ROWS=4 MMA=0 DIRECT=1`); tiles it does not
/// name stay at the plan's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    pub family: String,
    pub knob: String,
    pub tiles: String,
}

impl FromStr for Pin {
    type Err = String;

    fn from_str(s: &str) -> Result<Pin, String> {
        let bad = || {
            format!(
                "`{s}`: a pin is FAMILY.KNOB=TILES, e.g. `gdn.in_proj=ROWS=16 WARPS=4 MMA=1 DIRECT=0 STEPS=5 MIN_BLOCKS=0`"
            )
        };
        let (at, tiles) = s.split_once('=').ok_or_else(bad)?;
        let (family, knob) = at.split_once('.').ok_or_else(bad)?;
        let tiles = tiles.split_whitespace().collect::<Vec<_>>().join(" ");
        if family.is_empty() || knob.is_empty() || tiles.is_empty() {
            return Err(bad());
        }
        Ok(Pin { family: family.into(), knob: knob.into(), tiles })
    }
}

impl std::fmt::Display for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}={}", self.family, self.knob, self.tiles)
    }
}

/// `unit`'s entry at `start` (the plan's tiles) with every pin of its family set, and which of
/// `pins` it took. None when no pin takes this unit: none names its family, or a pin names a
/// knob it lacks or a tile set its kernel does not declare (a pin of the NVFP4 kernel's tiles
/// says nothing of the bf16 unit). An error when the pinned tiles do not fit the unit's shape.
pub fn pinned<S: Copy + 'static>(
    unit: &Unit<S>,
    start: S,
    pins: &[Pin],
    arch: Arch,
) -> Result<Option<(Entry, Vec<usize>)>, String> {
    let mine: Vec<usize> = (0..pins.len()).filter(|&i| pins[i].family == unit.family).collect();
    if mine.is_empty() {
        return Ok(None);
    }
    let mut tiles = start;
    for &i in &mine {
        let pin = &pins[i];
        let Some(k) = unit.knobs.iter().find(|k| k.name == pin.knob) else { return Ok(None) };
        match over(&k.get(&tiles), &pin.tiles) {
            Some(text) if k.set(&mut tiles, &text) => {}
            _ => return Ok(None),
        }
    }
    unit.valid(&tiles).map_err(|e| {
        let pins: Vec<String> = mine.iter().map(|&i| pins[i].to_string()).collect();
        format!(
            "{} {}: the pinned tiles do not fit the step's shape ({}): {e}",
            unit.family,
            unit.format,
            pins.join(", ")
        )
    })?;
    let entry = Entry {
        family: unit.family.into(),
        format: unit.format.into(),
        shape: unit.shape.clone(),
        winner: unit.choices(&tiles, arch),
        us_per_layer: None,
        default_us_per_layer: None,
        candidates: Vec::new(),
    };
    Ok(Some((entry, mine)))
}

/// The tile set `current` (`NAME=value` pairs in the kernel's order) with the pairs of `pinned`
/// in place of its own: a pin names only the tiles it changes. None when `pinned` names a tile
/// `current` lacks, or is not `NAME=value` pairs.
fn over(current: &str, pinned: &str) -> Option<String> {
    let mut pairs: Vec<(&str, &str)> = current.split_whitespace().filter_map(|p| p.split_once('=')).collect();
    for p in pinned.split_whitespace() {
        let (name, value) = p.split_once('=')?;
        pairs.iter_mut().find(|(n, _)| *n == name)?.1 = value;
    }
    Some(pairs.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" "))
}

/// A knob of a unit, by name: what [`unplaced`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobName {
    pub family: &'static str,
    pub format: &'static str,
    pub knob: &'static str,
    pub kernel: &'static str,
}

/// The knobs of `unit`, by name.
pub fn knob_names<S>(unit: &Unit<S>) -> Vec<KnobName> {
    unit.knobs
        .iter()
        .map(|k| KnobName { family: unit.family, format: unit.format, knob: k.name, kernel: k.kernel })
        .collect()
}

/// Why `pin` took no unit, from the step's knobs: its family's knobs and their kernels.
pub fn unplaced(pin: &Pin, knobs: &[KnobName]) -> String {
    let named: Vec<String> = knobs
        .iter()
        .filter(|k| k.family == pin.family)
        .map(|k| format!("{} ({} {}: {})", k.knob, k.family, k.format, k.kernel))
        .collect();
    if named.is_empty() {
        format!("--pin {pin}: the step has no family `{}`", pin.family)
    } else {
        format!(
            "--pin {pin}: no unit has a knob `{}` that declares the tile set `{}`; the knobs: {}",
            pin.knob,
            pin.tiles,
            named.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use engine::layers::gdn::GdnTiles;
    use engine::model::config::ModelConfig;
    use engine::step::{Formats, StepPlan};
    use engine::tuned::Table;

    use super::*;

    /// The input projection's f32 path as a table writes it.
    fn f32_path() -> String {
        engine::tuned::tiles_string(&engine::kernels::gdn::in_proj::F32_PATH)
    }

    fn plan(formats: Formats) -> StepPlan {
        StepPlan::new(&ModelConfig::published(), formats, 32_768).expect("plan")
    }

    #[test]
    fn pins_parse_and_refuse_what_is_not_one() {
        let p: Pin = "gdn.in_proj=ROWS=16  WARPS=4".parse().expect("a pin");
        assert_eq!(p, Pin { family: "gdn".into(), knob: "in_proj".into(), tiles: "ROWS=16 WARPS=4".into() });
        assert_eq!(p.to_string(), "gdn.in_proj=ROWS=16 WARPS=4");
        for bad in ["gdn", "gdn.in_proj", "gdn=ROWS=16", ".in_proj=ROWS=16", "gdn.=ROWS=16", "gdn.in_proj=  "] {
            assert!(bad.parse::<Pin>().is_err(), "{bad}");
        }
    }

    /// The NVFP4 GDN unit takes a pin of its input projection's f32 path; the step's plan then
    /// reads it back from the table as those tiles, its other knobs at the plan's. The bf16 unit,
    /// whose kernel has no such tile set, is not pinned.
    #[test]
    fn a_pinned_gdn_entry_is_what_the_step_takes() {
        let pins = vec![format!("gdn.in_proj={}", f32_path()).parse::<Pin>().expect("pin")];
        let nvfp4 = plan(Formats::NVFP4);
        let (shape, tiles) = nvfp4.gdn.expect("gdn");
        let unit = nvfp4.units(132).gdn.expect("unit");
        let (entry, took) = pinned(&unit, tiles, &pins, Arch::Sm90).expect("fits").expect("taken");
        assert_eq!(took, vec![0]);
        let in_proj = entry.winner.iter().find(|c| c.knob == "in_proj").expect("in_proj");
        assert_eq!((in_proj.kernel.as_str(), in_proj.tiles.as_str()), ("gdn_in_proj_nvfp4", f32_path().as_str()));
        let table =
            Table { device: "NVIDIA H200".into(), arch: "sm_90".into(), entries: vec![entry], ..Table::default() };
        let (taken, notices) = nvfp4.clone().tuned(&table, Arch::Sm90, 132);
        let (_, got) = taken.gdn.expect("gdn");
        assert_eq!(got, GdnTiles { in_proj_nvfp4: got.in_proj_nvfp4, ..tiles }, "only the pinned knob moves");
        assert_eq!((got.in_proj_nvfp4.mma, got.in_proj_nvfp4.rows), (0, 4));
        assert_ne!(got, tiles, "the pin moved the plan's tiles");
        assert!(!notices.iter().any(|n| n.starts_with("gdn")), "{notices:?}");
        assert_eq!(format!("{shape:?}"), unit.shape);

        let bf16 = plan(Formats::BF16);
        let unit = bf16.units(132).gdn.expect("unit");
        assert!(pinned(&unit, bf16.gdn.expect("gdn").1, &pins, Arch::Sm90).expect("no error").is_none());
    }

    /// A pin names only the tiles it changes; the others keep the plan's values, in the kernel's
    /// order. A name the kernel lacks, or a pair without a value, is no tile set of it.
    #[test]
    fn a_pin_changes_only_the_tiles_it_names() {
        assert_eq!(over("ROWS=4 WARPS=4 MMA=0", "MMA=1 ROWS=16").as_deref(), Some("ROWS=16 WARPS=4 MMA=1"));
        assert_eq!(over("ROWS=4 WARPS=4", "").as_deref(), Some("ROWS=4 WARPS=4"));
        assert_eq!(over("ROWS=4 WARPS=4", "LANES=2"), None);
        assert_eq!(over("ROWS=4 WARPS=4", "ROWS"), None);
        let nvfp4 = plan(Formats::NVFP4);
        let unit = nvfp4.units(132).gdn.expect("unit");
        let short = "gdn.in_proj=ROWS=4 MMA=0 DIRECT=1".parse::<Pin>().expect("pin");
        let (entry, _) = pinned(&unit, nvfp4.gdn.expect("gdn").1, &[short], Arch::Sm90).expect("fits").expect("taken");
        assert_eq!(entry.winner[0].tiles, f32_path(), "the defaults' WARPS, STEPS and MIN_BLOCKS kept");
    }

    /// A pin whose tiles the kernel declares but the shape refuses is an error that says so; a
    /// pin of a knob no unit has is reported with the knobs there are.
    #[test]
    fn pins_that_cannot_apply_are_refused_with_the_reason() {
        let nvfp4 = plan(Formats::NVFP4);
        let unit = nvfp4.units(132).gdn.expect("unit");
        let start = nvfp4.gdn.expect("gdn").1;
        // Eight warps split 2,560 columns into 2.5 segments of 128 each: refused by the kernel.
        let wide = "gdn.in_proj=ROWS=16 WARPS=8 MMA=1 DIRECT=0 STEPS=5 MIN_BLOCKS=0".parse::<Pin>().expect("pin");
        let e = pinned(&unit, start, std::slice::from_ref(&wide), Arch::Sm90).expect_err("does not fit");
        assert!(e.contains("do not fit") && e.contains("WARPS=8"), "{e}");
        let typo = "gdn.in_prj=ROWS=16".parse::<Pin>().expect("pin");
        assert!(pinned(&unit, start, std::slice::from_ref(&typo), Arch::Sm90).expect("no error").is_none());
        let why = unplaced(&typo, &knob_names(&unit));
        assert!(why.contains("in_prj") && why.contains("in_proj (gdn nvfp4: gdn_in_proj_nvfp4)"), "{why}");
        let other = "attention.x=Y".parse::<Pin>().expect("pin");
        assert!(unplaced(&other, &knob_names(&unit)).contains("no family `attention`"));
    }
}
