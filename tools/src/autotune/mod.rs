//! The autotuner's search, apart from the GPU: each tuning unit's knobs (`engine::tuned`), every
//! declared tile set of each knob pruned by the launch's shape checks and by the compiled cubin's
//! resources (spills, registers a block cannot launch with, shared memory past the device's
//! limit), the compiles run in parallel threads through the kernel cache (NVRTC needs no GPU), and
//! the choice: by resources alone (`--untimed`), or by coordinate descent over timed candidates,
//! each checked against the CPU reference before it may win ([`harness`]).

pub mod harness;
pub mod neighbours;
pub mod pin;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use engine::cuda::cache::CompileCache;
use engine::tuned::{Candidate, Entry, Knob, Table, Unit};
use kernel_dsl::{Arch, Kernel};

/// What the search knows of the target.
#[derive(Debug)]
pub struct Target {
    pub arch: Arch,
    pub sms: u32,
    /// Shared memory one block may use.
    pub smem: u32,
    pub threads: usize,
    pub cache: CompileCache,
}

/// One knob setting's compiled resources, or why it cannot run.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub registers: Option<u32>,
    pub shared_bytes: Option<u32>,
    pub spills: Option<bool>,
    /// None when it may run; else why not (`pruned: ...`).
    pub pruned: Option<String>,
}

/// Registers one SM has (every target: 64 K 32-bit registers).
const REGISTERS_PER_SM: u32 = 65_536;

/// Compiles `kernels` on `threads` threads and judges each against the target.
pub fn compile_all(target: &Target, kernels: Vec<Kernel>) -> Vec<Compiled> {
    let jobs: Mutex<Vec<(usize, Kernel)>> = Mutex::new(kernels.into_iter().enumerate().collect());
    let done: Mutex<Vec<(usize, Compiled)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..target.threads.max(1) {
            s.spawn(|| {
                loop {
                    let Some((i, k)) = jobs.lock().unwrap_or_else(|e| e.into_inner()).pop() else { break };
                    let c = judge(target, &k);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push((i, c));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, c)| c).collect()
}

fn judge(target: &Target, k: &Kernel) -> Compiled {
    let cubin = match target.cache.get(k) {
        Ok(c) => c,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or("").to_owned();
            return Compiled {
                registers: None,
                shared_bytes: None,
                spills: None,
                pruned: Some(format!("pruned: compile: {first}")),
            };
        }
    };
    let r = cubin.resources;
    let shared = r.shared_bytes.max(k.static_shared_bytes);
    let spills = r.spills();
    let pruned = if spills {
        Some(format!(
            "pruned: spills ({} B stores, {} B loads, {} B frame)",
            r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes
        ))
    } else if shared > target.smem {
        Some(format!("pruned: {shared} B shared memory, {} B the limit", target.smem))
    } else if r.registers * k.block_threads > REGISTERS_PER_SM {
        Some(format!(
            "pruned: {} registers × {} threads exceed an SM's {REGISTERS_PER_SM}",
            r.registers, k.block_threads
        ))
    } else {
        None
    };
    Compiled { registers: Some(r.registers), shared_bytes: Some(shared), spills: Some(spills), pruned }
}

/// The tile of `chosen_in_step` (those a knob's kernel marks `step`: `#[tile(..., step)]`,
/// `TileSet::CHOSEN_IN_STEP`) that `choice` would change from `current` (tiles strings). Each decides how a kernel's launch
/// meets its neighbours in the step (when the next kernel may launch; how many blocks of a grid
/// launched early an SM takes), and a unit's harness, whose neighbours are its own family's
/// kernels, cannot time that; the search holds them at the start's value (the plan's). The step
/// can, with pinned tables (`autotune --pin`, then `benches/step.rs`), and that is how they were
/// chosen (BENCHMARKS.md, step section: the mix's down-projection one block an SM, let in after
/// its predecessors' wait, 4.4% on an H100).
fn held_change(chosen_in_step: &[&'static str], current: &str, choice: &str) -> Option<&'static str> {
    chosen_in_step.iter().copied().find(|t| tile_value(current, t) != tile_value(choice, t))
}

/// Tile `name`'s value in a tiles string (`ROWS=2 WARPS=5 ...`, as `engine::tuned::tiles_string` writes it).
fn tile_value<'a>(tiles: &'a str, name: &str) -> Option<&'a str> {
    tiles.split_whitespace().find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
}

/// Every knob's settings, each set into `start`: the held tiles ([`held_change`]), the shape checks,
/// then the compiles. `result[knob][choice]`.
pub fn enumerate<S: Copy + 'static>(unit: &Unit<S>, start: S, target: &Target) -> Vec<Vec<Compiled>> {
    enumerate_where(unit, start, target, &|k, current, choice| match held_change(k.chosen_in_step, current, choice) {
        Some(tile) => Err(format!("pruned: held: {tile} is chosen in the step, not by this unit's timing")),
        None => Ok(()),
    })
}

/// A first rule over a knob's choices ([`enumerate_where`]): Ok passes one on, Err is its verdict.
pub type Admit<S> = dyn Fn(&Knob<S>, &str, &str) -> Result<(), String>;

/// [`enumerate`] with its own first rule: `admit(knob, the knob's setting in start, choice)`
/// passes a choice on to the shape checks and the compile, or gives the verdict it stands at.
pub fn enumerate_where<S: Copy + 'static>(
    unit: &Unit<S>,
    start: S,
    target: &Target,
    admit: &Admit<S>,
) -> Vec<Vec<Compiled>> {
    let mut kernels = Vec::new();
    // (knob, choice) → index into `kernels`, or the shape's verdict.
    let mut slots: Vec<Vec<Result<Option<usize>, String>>> = Vec::new();
    for k in &unit.knobs {
        let mut row = Vec::new();
        let current = k.get(&start);
        for c in &k.choices {
            let mut t = start;
            k.set(&mut t, c);
            if let Err(verdict) = admit(k, &current, c) {
                row.push(Err(verdict));
                continue;
            }
            let slot = match k.fits(&t).and_then(|()| unit.valid(&t)) {
                Err(e) => Err(format!("pruned: shape: {e}")),
                Ok(()) => match k.specialize(&t, target.arch) {
                    None => Ok(None),
                    Some(Err(e)) => Err(format!("pruned: {e}")),
                    Some(Ok(kernel)) => {
                        kernels.push(kernel);
                        Ok(Some(kernels.len() - 1))
                    }
                },
            };
            row.push(slot);
        }
        slots.push(row);
    }
    let t0 = Instant::now();
    let n = kernels.len();
    let compiled = compile_all(target, kernels);
    eprintln!(
        "[{} {}] {n} kernels compiled or found in the cache in {:.1} s",
        unit.family,
        unit.format,
        t0.elapsed().as_secs_f64()
    );
    slots
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|slot| match slot {
                    Err(why) => Compiled { registers: None, shared_bytes: None, spills: None, pruned: Some(why) },
                    Ok(None) => Compiled { registers: None, shared_bytes: None, spills: None, pruned: None },
                    Ok(Some(i)) => compiled[i].clone(),
                })
                .collect()
        })
        .collect()
}

fn candidate(knob: &str, tiles: &str, c: &Compiled, verdict: String, us: Option<f64>) -> Candidate {
    Candidate {
        knob: knob.into(),
        tiles: tiles.into(),
        registers: c.registers,
        shared_bytes: c.shared_bytes,
        spills: c.spills,
        verdict,
        us_per_layer: us,
    }
}

/// The rule of untimed tables, written into them.
pub const UNTIMED_RULE: &str = "untimed: per knob, the plan's tiles (the defaults, or the first declared candidate that \
    fits the shape) when they compile without spills, within the shared memory and with a block the SM's registers hold; \
    otherwise the clean candidate with the fewest registers per thread (declared order breaks ties); the grid's waves stay \
    at the default. The whole unit must then pass the family's check, else the plan's tiles stand.";

/// The untimed choice for `unit` from `start` (the plan's tiles): [`UNTIMED_RULE`].
pub fn choose_untimed<S: Copy + 'static>(unit: &Unit<S>, start: S, target: &Target) -> Entry {
    let compiled = enumerate(unit, start, target);
    let mut best = start;
    let mut candidates = Vec::new();
    for (k, row) in unit.knobs.iter().zip(&compiled) {
        let current = k.get(&start);
        let mut pick: Option<(&str, u32)> = None;
        for (c, comp) in k.choices.iter().zip(row) {
            candidates.push(candidate(k.name, c, comp, comp.pruned.clone().unwrap_or_else(|| "ok".into()), None));
        }
        let current_ok = k.choices.iter().zip(row).any(|(c, comp)| *c == current && comp.pruned.is_none());
        if current_ok || k.kernel == "grid" {
            continue;
        }
        for (c, comp) in k.choices.iter().zip(row) {
            if comp.pruned.is_none() {
                let regs = comp.registers.unwrap_or(u32::MAX);
                if pick.is_none_or(|(_, r)| regs < r) {
                    pick = Some((c, regs));
                }
            }
        }
        if let Some((c, _)) = pick {
            eprintln!("[{} {}] {}: {current} is not clean here; {c} instead", unit.family, unit.format, k.name);
            k.set(&mut best, c);
        }
    }
    if let Err(e) = unit.valid(&best) {
        eprintln!("[{} {}] the untimed choice does not fit ({e}); the plan's tiles", unit.family, unit.format);
        best = start;
    }
    Entry {
        family: unit.family.into(),
        format: unit.format.into(),
        shape: unit.shape.clone(),
        winner: unit.choices(&best, target.arch),
        us_per_layer: None,
        default_us_per_layer: None,
        candidates,
    }
}

/// Times and checks one unit's tiles on the GPU: a family's harness.
pub trait Harness<S> {
    /// Microseconds per layer: the median of graph replays over layers with distinct weights.
    fn measure(&mut self, tiles: &S) -> Result<f64, String>;
    /// Ok when one layer's output at these tiles matches the CPU reference.
    fn verify(&mut self, tiles: &S) -> Result<(), String>;
}

/// Candidates whose time is within this fraction of the best do not replace it on one timing
/// (noise)...
const MARGIN: f64 = 0.01;
/// ...but one faster than the best by less is timed again against it, in turn, this many times
/// ([`confirm`]): a kernel that is a small part of its unit (GDN's out_proj, 7 of 35 µs: the
/// bench's 3.5% on it is 0.7% of the layer) can still win when its gain is steady.
const PAIRS: usize = 3;
/// In each pair the candidate must be faster than the best by more than this fraction.
const PAIR_MARGIN: f64 = 0.002;

/// Times `best` and `candidate` in turn [`PAIRS`] times: the candidate's median time when it was
/// faster by more than [`PAIR_MARGIN`] in every pair, else None (also when a timing fails).
fn confirm<S>(harness: &mut dyn Harness<S>, best: &S, candidate: &S) -> Option<f64> {
    let mut times = Vec::with_capacity(PAIRS);
    for _ in 0..PAIRS {
        let b = harness.measure(best).ok()?;
        let c = harness.measure(candidate).ok()?;
        if c >= b * (1.0 - PAIR_MARGIN) {
            return None;
        }
        times.push(c);
    }
    times.sort_by(f64::total_cmp);
    Some(times[times.len() / 2])
}

/// Coordinate descent from `start`: each knob in turn tries every clean setting with the other
/// knobs at the best so far; a setting must match the reference before its time counts, and wins
/// when more than [`MARGIN`] faster than the best, or faster and then confirmed ([`confirm`]).
/// None when the budget ran out first (the unit is left for a later run).
pub fn choose_timed<S: Copy + PartialEq + 'static>(
    unit: &Unit<S>,
    start: S,
    target: &Target,
    harness: &mut dyn Harness<S>,
    deadline: Instant,
) -> Result<Option<Entry>, String> {
    let compiled = enumerate(unit, start, target);
    descend(unit, start, &compiled, target.arch, harness, deadline)
}

/// The descent of [`choose_timed`] over candidates already judged (`compiled[knob][choice]`, as
/// [`enumerate`] returns them): only those not pruned are checked and timed.
pub fn descend<S: Copy + PartialEq + 'static>(
    unit: &Unit<S>,
    start: S,
    compiled: &[Vec<Compiled>],
    arch: Arch,
    harness: &mut dyn Harness<S>,
    deadline: Instant,
) -> Result<Option<Entry>, String> {
    let label = format!("{} {}", unit.family, unit.format);
    harness.verify(&start).map_err(|e| format!("[{label}] the plan's own tiles fail the reference check: {e}"))?;
    let mut best = start;
    let mut best_us = harness.measure(&start)?;
    let default_us = best_us;
    eprintln!("[{label}] plan's tiles: {best_us:.2} us per layer");
    let mut candidates = Vec::new();
    let mut timed: HashMap<String, f64> = HashMap::new();
    for (k, row) in unit.knobs.iter().zip(compiled) {
        let current = k.get(&best);
        candidates.push(candidate(
            k.name,
            &current,
            &Compiled { registers: None, shared_bytes: None, spills: None, pruned: None },
            "ok (start)".into(),
            Some(best_us),
        ));
        for (i, (c, comp)) in k.choices.iter().zip(row).enumerate() {
            if *c == current {
                continue;
            }
            if let Some(why) = &comp.pruned {
                candidates.push(candidate(k.name, c, comp, why.clone(), None));
                continue;
            }
            if Instant::now() > deadline {
                eprintln!("[{label}] budget spent; the unit is left for a later run");
                return Ok(None);
            }
            let mut t = best;
            k.set(&mut t, c);
            let key = unit.knobs.iter().map(|k| k.get(&t)).collect::<Vec<_>>().join("|");
            if let Err(e) = harness.verify(&t) {
                eprintln!("[{label}] {} {c}: WRONG ({e})", k.name);
                candidates.push(candidate(k.name, c, comp, format!("wrong: {e}"), None));
                continue;
            }
            let us = match timed.get(&key) {
                Some(&us) => us,
                None => match harness.measure(&t) {
                    Ok(us) => us,
                    Err(e) => {
                        candidates.push(candidate(k.name, c, comp, format!("failed: {e}"), None));
                        continue;
                    }
                },
            };
            timed.insert(key, us);
            let clear = us < best_us * (1.0 - MARGIN);
            let confirmed = if !clear && us < best_us { confirm(harness, &best, &t) } else { None };
            let wins = clear || confirmed.is_some();
            eprintln!(
                "[{label}] {} {}/{} {c}: {us:.2} us{}",
                k.name,
                i + 1,
                k.choices.len(),
                match confirmed {
                    Some(again) => format!(" (best so far: faster in {PAIRS} alternating pairs, {again:.2} us)"),
                    None if wins => " (best so far)".to_owned(),
                    None => String::new(),
                }
            );
            let verdict = match confirmed {
                Some(_) => format!("ok (confirmed: faster in {PAIRS} alternating pairs)"),
                None => "ok".into(),
            };
            candidates.push(candidate(k.name, c, comp, verdict, Some(us)));
            if wins {
                best = t;
                best_us = confirmed.unwrap_or(us);
            }
        }
    }
    eprintln!("[{label}] winner {:.2} us per layer against {default_us:.2} at the plan's tiles", best_us);
    Ok(Some(Entry {
        family: unit.family.into(),
        format: unit.format.into(),
        shape: unit.shape.clone(),
        winner: unit.choices(&best, arch),
        us_per_layer: Some(best_us),
        default_us_per_layer: Some(default_us),
        candidates,
    }))
}

/// Whether `table` already holds a current entry for `unit` (same key, every knob's version as
/// now): a resumed run skips it.
pub fn done<S: Copy + 'static>(table: &Table, unit: &Unit<S>, start: S, arch: Arch) -> bool {
    unit.apply(table, arch, start).is_ok()
}

#[cfg(test)]
mod tests {
    use engine::layers::gdn::GdnTiles;
    use engine::layers::qsa::QsaTiles;
    use engine::model::config::ModelConfig;
    use engine::step::{Formats, StepPlan};

    use super::*;

    fn target(smem: u32) -> Target {
        Target { arch: Arch::Sm121a, sms: 48, smem, threads: 2, cache: CompileCache::new(None) }
    }

    /// The mix unit of the published step (8 kernels, NVRTC only): every candidate compiled and
    /// judged; the plan's tiles stand when clean; with no shared memory allowed, the kernels that
    /// need some are pruned for it.
    #[test]
    fn untimed_choice_from_compiled_resources() {
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 4096).expect("plan");
        let unit = plan.units(48).mix;
        let e = choose_untimed(&unit, plan.mix_tiles, &target(101_376));
        assert_eq!(e.winner, unit.choices(&plan.mix_tiles, Arch::Sm121a));
        let judged = |v: &str| v.starts_with("pruned: shape") || v.starts_with("pruned: held");
        assert!(e.candidates.iter().all(|c| c.registers.is_some() || judged(&c.verdict)), "{e:?}");
        // The down-projections' residency bound is the step's choice: held at the plan's 1.
        let held: Vec<_> = e.candidates.iter().filter(|c| c.verdict.starts_with("pruned: held")).collect();
        assert!(!held.is_empty(), "{e:?}");
        assert!(held.iter().all(|c| c.knob == "down" && c.tiles.contains("MAX_BLOCKS=0")), "{held:?}");
        assert!(
            e.candidates
                .iter()
                .filter(|c| c.knob == "down")
                .all(|c| !c.tiles.contains("MAX_BLOCKS=0") || judged(&c.verdict))
        );
        let starved = choose_untimed(&unit, plan.mix_tiles, &target(0));
        let shared: Vec<_> = starved.candidates.iter().filter(|c| c.shared_bytes.is_some_and(|b| b > 0)).collect();
        assert!(!shared.is_empty(), "the mix kernels use shared memory");
        assert!(shared.iter().all(|c| c.verdict.contains("shared memory")), "{shared:?}");
    }

    /// The kernels whose launch the step's timing chose mark those tiles `step`, and the knobs
    /// carry the marks: dropping a mark would let the unit harnesses choose the tile again.
    #[test]
    fn the_step_chosen_tiles_are_marked() {
        use engine::kernels::gdn::delta_rule_normed::gdn_delta_rule_normed;
        use engine::kernels::gemv_nvfp4::gemv_nvfp4;
        use engine::kernels::mix::{mix_down_bf16, mix_down_nvfp4};
        use engine::kernels::moe::down::moe_down_nvfp4;
        use kernel_dsl::TileSet;
        assert_eq!(gemv_nvfp4::Tiles::CHOSEN_IN_STEP, ["TRIGGER"]);
        assert_eq!(moe_down_nvfp4::Tiles::CHOSEN_IN_STEP, ["TRIGGER"]);
        assert_eq!(gdn_delta_rule_normed::Tiles::CHOSEN_IN_STEP, ["TRIGGER"]);
        assert_eq!(mix_down_bf16::Tiles::CHOSEN_IN_STEP, ["MAX_BLOCKS"]);
        assert_eq!(mix_down_nvfp4::Tiles::CHOSEN_IN_STEP, ["MAX_BLOCKS"]);
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 4096).expect("plan");
        let unit = plan.units(48).mix;
        let down = unit.knobs.iter().find(|k| k.kernel == "mix_down_nvfp4").expect("the down knob");
        assert_eq!(down.chosen_in_step, ["MAX_BLOCKS"]);
    }

    /// A held tile counts by its exact name, and only when it changes.
    #[test]
    fn held_tiles_count_when_they_change() {
        let row = "LANES=16 WARPS=4 K_SPLIT=1 UNROLL=4 MMA=0 EARLY=8 ROWS=2 STEPS=3 TRIGGER=0";
        assert_eq!(held_change(&["TRIGGER"], row, &row.replace("TRIGGER=0", "TRIGGER=1")), Some("TRIGGER"));
        assert_eq!(held_change(&["TRIGGER"], row, &row.replace("WARPS=4", "WARPS=8")), None);
        assert_eq!(held_change(&[], row, &row.replace("TRIGGER=0", "TRIGGER=1")), None, "not held there");
        let down = "ROWS=2 WARPS=5 CHUNKS=5 MAX_BLOCKS=1";
        assert_eq!(
            held_change(&["MAX_BLOCKS"], down, &down.replace("MAX_BLOCKS=1", "MAX_BLOCKS=0")),
            Some("MAX_BLOCKS")
        );
        assert_eq!(held_change(&["MAX_BLOCKS"], down, &down.replace("ROWS=2", "ROWS=4")), None);
        assert_eq!(held_change(&["BLOCKS"], down, &down.replace("MAX_BLOCKS=1", "MAX_BLOCKS=0")), None, "whole names");
    }

    /// The QSA unit at 32k and the PLE unit (NVFP4 rows) of the published step, without their
    /// GEMVs (a hundred-odd tile sets each, the GDN unit compiles the same kernels): every other
    /// candidate compiled and judged, the plan's tiles standing when clean; and the GEMVs' tile
    /// sets pruned by the launch checks alone where the shape refuses them (a split-K that does
    /// not divide the 2560 input columns of QSA's stacked projection, in bf16 and in NVFP4, or of
    /// PLE's).
    #[test]
    fn qsa_and_ple_units_enumerate_and_prune() {
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 32_768).expect("plan");
        let (Some((_, qsa_tiles)), Some((_, ple_tiles))) = (plan.qsa, plan.ple) else { panic!("QSA and PLE") };
        let units = plan.units(48);
        let (mut qu, mut pu) = (units.qsa.expect("qsa unit"), units.ple.expect("ple unit"));
        let bf16_plan = StepPlan::new(&ModelConfig::published(), Formats::BF16, 32_768).expect("plan");
        let bf16_qu = bf16_plan.units(48).qsa.expect("qsa unit");

        // Shape pruning of the GEMVs, no compile: gemv_bf16 (bf16 plan) and gemv_nvfp4 (NVFP4).
        for (u, refused) in [(&bf16_qu, ["K_SPLIT=16"].as_slice()), (&qu, ["LANES=32 WARPS=4 K_SPLIT=2"].as_slice())] {
            let verdicts = shape_verdicts(u, qsa_tiles, "in_proj");
            assert!(verdicts.iter().any(|(_, ok)| *ok) && verdicts.iter().any(|(_, ok)| !*ok), "{verdicts:?}");
            for (c, ok) in &verdicts {
                if refused.iter().any(|r| c.contains(r)) {
                    assert!(!ok, "{} {c}: 2560 columns do not split that way", u.format);
                }
            }
            assert!(verdicts.iter().any(|(c, _)| refused.iter().any(|r| c.contains(r))), "{verdicts:?}");
        }
        let proj = pu.knobs.iter().find(|k| k.name == "proj").expect("proj");
        assert!(proj.choices.iter().any(|c| {
            let mut t = ple_tiles;
            proj.set(&mut t, c) && proj.fits(&t).and_then(|()| pu.valid(&t)).is_err()
        }));

        // Everything else compiled for sm_121a and judged.
        qu.knobs.retain(|k| !k.kernel.starts_with("gemv_"));
        pu.knobs.retain(|k| !k.kernel.starts_with("gemv_"));
        for (e, plan_choices) in [
            (choose_untimed(&qu, qsa_tiles, &target(101_376)), qu.choices(&qsa_tiles, Arch::Sm121a)),
            (choose_untimed(&pu, ple_tiles, &target(101_376)), pu.choices(&ple_tiles, Arch::Sm121a)),
        ] {
            assert_eq!(e.winner, plan_choices, "{} keeps the plan's tiles", e.family);
            assert!(
                e.candidates.iter().all(|c| c.registers.is_some() || c.verdict.starts_with("pruned: shape")),
                "{e:?}"
            );
            assert!(e.candidates.iter().any(|c| c.verdict == "ok"), "{e:?}");
        }
    }

    /// Each choice of knob `name` set into `start`: whether the knob's launch and the unit's
    /// check take it (the shape pruning of [`enumerate`], without the compile).
    fn shape_verdicts<S: Copy + 'static>(unit: &Unit<S>, start: S, name: &str) -> Vec<(String, bool)> {
        let k = unit.knobs.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} knob"));
        k.choices
            .iter()
            .map(|c| {
                let mut t = start;
                assert!(k.set(&mut t, c), "{name}: {c}");
                (c.clone(), k.fits(&t).and_then(|()| unit.valid(&t)).is_ok())
            })
            .collect()
    }

    /// Every knob's choices judged by the shape alone, as [`enumerate`] would without spills or
    /// resource limits (no compile: registers unknown).
    fn judged_by_shape<S: Copy + 'static>(unit: &Unit<S>, start: S) -> Vec<Vec<Compiled>> {
        unit.knobs
            .iter()
            .map(|k| {
                shape_verdicts(unit, start, k.name)
                    .into_iter()
                    .map(|(_, ok)| Compiled {
                        registers: None,
                        shared_bytes: None,
                        spills: None,
                        pruned: (!ok).then(|| "pruned: shape: refused".to_owned()),
                    })
                    .collect()
            })
            .collect()
    }

    /// A harness with made-up times: `cost` of the tiles, each candidate that `wrong` names
    /// failing the check; it records what it timed, and refuses tiles the unit's check refuses
    /// (the descent must never time a pruned candidate).
    struct Fake<'u, S> {
        unit: &'u Unit<S>,
        cost: fn(&S) -> f64,
        wrong: fn(&S) -> bool,
        timed: Vec<S>,
    }

    impl<S: Copy + 'static> Harness<S> for Fake<'_, S> {
        fn measure(&mut self, tiles: &S) -> Result<f64, String> {
            self.unit.valid(tiles).expect("only tiles the unit takes are timed");
            self.timed.push(*tiles);
            Ok((self.cost)(tiles))
        }

        fn verify(&mut self, tiles: &S) -> Result<(), String> {
            if (self.wrong)(tiles) { Err("made wrong".into()) } else { Ok(()) }
        }
    }

    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    /// The NVFP4 GDN unit varies the tiles of the out_proj the step runs (`gemv_nvfp4` at
    /// `out_proj_nvfp4`; bf16: `gemv_bf16` at `out_proj`), prunes by the launch's checks (32 lanes
    /// of 16 values split 8 ways do not divide 6144 columns), and the descent finds a set that
    /// only differs from the plan's in that knob: with BENCHMARKS.md's times (8 warps, split 4:
    /// 6.66 µs; the plan's split 4: 6.90; the rest slower) in a layer of 35 µs, 8 warps split 4
    /// wins, 0.7% faster, by confirmation; a set that fails the check never wins however fast.
    #[test]
    fn gdn_nvfp4_unit_searches_the_nvfp4_out_proj() {
        use engine::kernels::gemv_nvfp4::gemv_nvfp4;
        let cfg = ModelConfig::published();
        let plan = StepPlan::new(&cfg, Formats::NVFP4, 32_768).expect("plan");
        let (_, plan_start) = plan.gdn.expect("GDN");
        // From the split path: the descent's moves below are among its tile sets.
        let start = GdnTiles { out_proj_nvfp4: engine::kernels::gemv_nvfp4::SPLIT_PATH, ..plan_start };
        let unit = plan.units(132).gdn.expect("gdn unit");
        assert_eq!(unit.format, "nvfp4");
        let names: Vec<_> = unit.knobs.iter().map(|k| (k.name, k.kernel)).collect();
        assert_eq!(
            names,
            [
                ("in_proj", "gdn_in_proj_nvfp4"),
                ("delta_rule_normed", "gdn_delta_rule_normed"),
                ("out_proj", "gemv_nvfp4")
            ]
        );
        let bf16 = StepPlan::new(&cfg, Formats::BF16, 32_768).expect("plan").units(132).gdn.expect("gdn unit");
        assert_eq!(bf16.knobs[2].kernel, "gemv_bf16");

        let verdicts = shape_verdicts(&unit, start, "out_proj");
        // The f16x2 path's LANES × WARPS × K_SPLIT × UNROLL × EARLY, the tensor-core path's
        // (LANES 2, EARLY 0) and the row path's ROWS × WARPS × STEPS × EARLY × XBULK, each at
        // both TRIGGER values.
        assert_eq!(
            verdicts.len(),
            (3 * 3 * 4 * 3 * 2 + 3 * 4 * 3 + 2 * 3 * 3 * 2 * 2) * 2,
            "every declared tile set of gemv_nvfp4"
        );
        let best = gemv_nvfp4::Tiles { warps: 8, k_split: 4, ..start.out_proj_nvfp4 };
        let best_text = engine::tuned::tiles_string(&best);
        assert!(verdicts.contains(&(best_text.clone(), true)), "{verdicts:?}");
        for (c, ok) in &verdicts {
            if c.starts_with("LANES=32") && c.contains("K_SPLIT=8") {
                assert!(!ok, "{c}: 8 · 16 · 32 does not divide 6144");
            }
        }
        assert!(verdicts.iter().filter(|(_, ok)| !ok).count() >= 9, "{verdicts:?}");

        let compiled = judged_by_shape(&unit, start);
        let mut h = Fake {
            unit: &unit,
            // The rest of the layer (28.45 µs) and out_proj: 6.66 µs in the winner, so that it is
            // 0.7% faster than the plan's layer, within MARGIN: it must win by confirmation.
            cost: |t: &GdnTiles| {
                28.45
                    + match (t.out_proj_nvfp4.warps, t.out_proj_nvfp4.k_split) {
                        (8, 4) if t.out_proj_nvfp4.lanes == 16 && t.out_proj_nvfp4.unroll == 4 => 6.66,
                        (4, 4) if t.out_proj_nvfp4.lanes == 16 && t.out_proj_nvfp4.unroll == 4 => 6.90,
                        // Wrong output (below): never the winner however fast.
                        (2, 4) => 1.0,
                        _ => 9.0 + f64::from(t.out_proj_nvfp4.unroll) / 8.0,
                    }
            },
            // The fastest-looking sets give wrong output: 2 warps, split 4.
            wrong: |t: &GdnTiles| t.out_proj_nvfp4.warps == 2 && t.out_proj_nvfp4.k_split == 4,
            timed: Vec::new(),
        };
        let e = descend(&unit, start, &compiled, Arch::Sm90, &mut h, far()).expect("descent").expect("within budget");
        let out = e.winner.iter().find(|c| c.knob == "out_proj").expect("out_proj");
        assert_eq!((out.kernel.as_str(), out.tiles.as_str()), ("gemv_nvfp4", best_text.as_str()), "{e:?}");
        assert_eq!(e.us_per_layer, Some(28.45 + 6.66));
        assert_eq!(e.default_us_per_layer, Some(28.45 + 6.90));
        let won = e.candidates.iter().find(|c| c.knob == "out_proj" && c.tiles == best_text).expect("timed");
        assert!(won.verdict.starts_with("ok (confirmed"), "{won:?}");
        assert!(h.timed.iter().any(|t| t.out_proj_nvfp4 == best));
        let out_proj: Vec<_> = e.candidates.iter().filter(|c| c.knob == "out_proj").collect();
        assert_eq!(out_proj.len(), verdicts.len(), "every out_proj choice in the entry once");
        assert!(out_proj.iter().any(|c| c.verdict.starts_with("wrong")), "{out_proj:?}");
        assert!(out_proj.iter().any(|c| c.verdict.starts_with("pruned: shape")), "{out_proj:?}");
        // The winner as the plan takes it.
        let mut table = Table { device: "test".into(), arch: Arch::Sm90.to_string(), ..Table::default() };
        table.upsert(e);
        let tuned = unit.apply(&table, Arch::Sm90, start).expect("the entry applies");
        assert_eq!(tuned.out_proj_nvfp4, best);
        assert_eq!(tuned.out_proj, start.out_proj);
    }

    /// A candidate faster than the plan's by less than the pairs' margin (0.08% against 0.2%) is
    /// timed again once against it and does not win: the plan's tiles stand.
    #[test]
    fn a_gain_within_the_noise_does_not_win() {
        let plan = StepPlan::new(&ModelConfig::published(), Formats::NVFP4, 32_768).expect("plan");
        let (_, start) = plan.gdn.expect("GDN");
        let unit = plan.units(132).gdn.expect("gdn unit");
        let compiled = judged_by_shape(&unit, start);
        let mut h = Fake {
            unit: &unit,
            cost: |t: &GdnTiles| if t.out_proj_nvfp4.warps == 8 { 35.32 } else { 35.35 },
            wrong: |_: &GdnTiles| false,
            timed: Vec::new(),
        };
        let e = descend(&unit, start, &compiled, Arch::Sm90, &mut h, far()).expect("descent").expect("within budget");
        assert_eq!(e.winner, unit.choices(&start, Arch::Sm90));
        assert_eq!(e.us_per_layer, Some(35.35));
        let retimed = h.timed.iter().filter(|t| **t == start).count();
        let eight = e
            .candidates
            .iter()
            .filter(|c| c.knob == "out_proj" && c.tiles.contains("WARPS=8") && c.verdict.starts_with("ok"))
            .count();
        assert!(retimed > eight, "each faster candidate retimed against the plan's: {retimed} for {eight}");
    }

    /// The NVFP4 QSA unit varies `gemv_nvfp4`'s tiles for the stacked projection and o_proj
    /// (`in_proj_nvfp4`, `o_proj_nvfp4`; bf16: `gemv_bf16` at `in_proj`, `o_proj`), and the
    /// descent finds a set away from the plan's in each when the times say so.
    #[test]
    fn qsa_nvfp4_unit_searches_the_nvfp4_projections() {
        use engine::kernels::gemv_nvfp4::gemv_nvfp4;
        let cfg = ModelConfig::published();
        let plan = StepPlan::new(&cfg, Formats::NVFP4, 32_768).expect("plan");
        let (_, plan_start) = plan.qsa.expect("QSA");
        // From the split path: the descent's moves below are among its tile sets.
        let start = QsaTiles { o_proj_nvfp4: engine::kernels::gemv_nvfp4::SPLIT_PATH, ..plan_start };
        let unit = plan.units(132).qsa.expect("qsa unit");
        assert_eq!(unit.format, "nvfp4");
        let gemvs: Vec<_> =
            unit.knobs.iter().filter(|k| k.kernel.starts_with("gemv_")).map(|k| (k.name, k.kernel)).collect();
        assert_eq!(gemvs, [("in_proj", "gemv_nvfp4"), ("o_proj", "gemv_nvfp4")]);
        let bf16 = StepPlan::new(&cfg, Formats::BF16, 32_768).expect("plan").units(132).qsa.expect("qsa unit");
        assert_eq!(bf16.format, "bf16");
        let gemvs: Vec<_> =
            bf16.knobs.iter().filter(|k| k.kernel.starts_with("gemv_")).map(|k| (k.name, k.kernel)).collect();
        assert_eq!(gemvs, [("in_proj", "gemv_bf16"), ("o_proj", "gemv_bf16")]);

        // The stacked projection's set the fake costs favour (a const: the cost is a plain fn).
        const IN_BEST: gemv_nvfp4::Tiles = gemv_nvfp4::Tiles {
            lanes: 32,
            warps: 8,
            k_split: 1,
            unroll: 2,
            early: 8,
            ..<gemv_nvfp4::Tiles as kernel_dsl::TileSet>::DEFAULT
        };
        let in_best = IN_BEST;
        let o_best = gemv_nvfp4::Tiles { warps: 8, k_split: 4, ..start.o_proj_nvfp4 };
        for (name, best) in [("in_proj", in_best), ("o_proj", o_best)] {
            let v = shape_verdicts(&unit, start, name);
            assert!(v.contains(&(engine::tuned::tiles_string(&best), true)), "{name}: {v:?}");
            assert!(v.iter().any(|(_, ok)| !ok), "{name}: some tile sets do not fit: {v:?}");
        }
        let compiled = judged_by_shape(&unit, start);
        let mut h = Fake {
            unit: &unit,
            cost: |t: &QsaTiles| {
                let o = (t.o_proj_nvfp4.warps, t.o_proj_nvfp4.k_split, t.o_proj_nvfp4.lanes, t.o_proj_nvfp4.unroll);
                (if t.in_proj_nvfp4 == IN_BEST { 9.0 } else { 10.65 }) + if o == (8, 4, 16, 4) { 6.66 } else { 6.90 }
            },
            wrong: |_: &QsaTiles| false,
            timed: Vec::new(),
        };
        let e = descend(&unit, start, &compiled, Arch::Sm90, &mut h, far()).expect("descent").expect("within budget");
        let mut table = Table { device: "test".into(), arch: Arch::Sm90.to_string(), ..Table::default() };
        table.upsert(e);
        let tuned = unit.apply(&table, Arch::Sm90, start).expect("the entry applies");
        assert_eq!((tuned.in_proj_nvfp4, tuned.o_proj_nvfp4), (in_best, o_best));
        assert_eq!((tuned.in_proj, tuned.o_proj), (start.in_proj, start.o_proj), "the bf16 GEMVs untouched");
    }

    /// The QSA, PLE and GDN harnesses on the device at the plan's tiles (what a timed run does
    /// first for each unit): layer 0 matches the CPU reference (GDN: the plan's own output, run
    /// twice), and the graph over 8 layers times. QSA at 32k tokens (sparse: 8,192 blocks, 512
    /// kept) with NVFP4 and with bf16 projections; PLE with NVFP4 and with bf16 rows; GDN with
    /// both matrices NVFP4 (out_proj through `gemv_nvfp4`) and in bf16. In NVFP4 the bench's best
    /// out_proj and o_proj set (8 warps, split 4) passes the checks and times too.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn qsa_ple_and_gdn_harnesses_check_and_time_the_plan_tiles() {
        use engine::kernels::gemv_nvfp4::gemv_nvfp4;
        let gpu = engine::cuda::Gpu::open(0).expect("GPU");
        let cfg = ModelConfig::published();
        for formats in [Formats::NVFP4, Formats::BF16] {
            let plan = StepPlan::new(&cfg, formats, 32_768).expect("plan");
            let (Some((qs, qt)), Some((ps, pt)), Some((gs, gt))) = (plan.qsa, plan.ple, plan.gdn) else {
                panic!("QSA, PLE and GDN")
            };
            let fmt = if formats.qsa { "NVFP4" } else { "bf16" };
            let w8_split4 = |t: gemv_nvfp4::Tiles| gemv_nvfp4::Tiles { warps: 8, k_split: 4, ..t };

            let mut h = harness::qsa(&gpu, &cfg, qs, plan.capacity, formats.qsa).expect("qsa harness").expect("made");
            for _ in 0..3 {
                h.verify(&qt).expect("QSA at the plan's tiles against the reference");
            }
            let us = h.measure(&qt).expect("QSA timed");
            println!("QSA at 32k, {fmt} projections, plan's tiles: {us:.2} us per layer");
            assert!(us.is_finite() && us > 1.0, "{us}");
            if formats.qsa {
                let t = QsaTiles { o_proj_nvfp4: w8_split4(qt.o_proj_nvfp4), ..qt };
                h.verify(&t).expect("QSA, o_proj at 8 warps split 4, against the reference");
                println!("QSA, o_proj at 8 warps split 4: {:.2} us per layer", h.measure(&t).expect("timed"));
            }
            drop(h);

            let mut h =
                harness::ple(&gpu, &cfg, ps, formats.ple_table, formats.ple_proj).expect("ple harness").expect("made");
            for _ in 0..3 {
                h.verify(&pt).expect("PLE at the plan's tiles against the reference");
            }
            let us = h.measure(&pt).expect("PLE timed");
            println!("PLE, {:?} rows, plan's tiles: {us:.2} us per layer", formats.ple_table);
            assert!(us.is_finite() && us > 0.5, "{us}");
            drop(h);

            let mut h = harness::gdn(&gpu, gs, formats.gdn_in_proj, formats.gdn_out_proj, gt)
                .expect("gdn harness")
                .expect("made");
            h.verify(&gt).expect("GDN at the plan's tiles against themselves");
            let us = h.measure(&gt).expect("GDN timed");
            println!("GDN, {fmt} in_proj and out_proj, plan's tiles: {us:.2} us per layer");
            assert!(us.is_finite() && us > 1.0, "{us}");
            if formats.gdn_out_proj {
                let t = GdnTiles { out_proj_nvfp4: w8_split4(gt.out_proj_nvfp4), ..gt };
                h.verify(&t).expect("GDN, out_proj at 8 warps split 4, against the plan's tiles");
                println!("GDN, out_proj at 8 warps split 4: {:.2} us per layer", h.measure(&t).expect("timed"));
            }
        }
    }

    /// A resumed run skips a unit the table holds with current versions, and redoes it when a
    /// kernel changed since (its version in the table no longer the kernel's): the table as
    /// written and read back.
    #[test]
    fn a_run_resumes_past_current_units_only() {
        let plan = StepPlan::new(&ModelConfig::published(), Formats::BF16, 32_768).expect("plan");
        let (_, ple_tiles) = plan.ple.expect("PLE");
        let (_, qsa_tiles) = plan.qsa.expect("QSA");
        let units = plan.units(48);
        let (pu, qu) = (units.ple.expect("ple unit"), units.qsa.expect("qsa unit"));
        let arch = Arch::Sm121a;
        let entry = |family: &str, shape: &str, winner| Entry {
            family: family.into(),
            format: "bf16".into(),
            shape: shape.into(),
            winner,
            us_per_layer: Some(3.0),
            default_us_per_layer: Some(3.5),
            candidates: vec![],
        };
        let mut table = Table { device: "NVIDIA GB10".into(), arch: arch.to_string(), ..Table::default() };
        assert!(!done(&table, &pu, ple_tiles, arch) && !done(&table, &qu, qsa_tiles, arch));
        table.upsert(entry("ple", &pu.shape, pu.choices(&ple_tiles, arch)));
        let path = std::env::temp_dir().join(format!("flashnext-resume-{}.json", std::process::id()));
        table.write(&path).expect("write");
        let resumed = Table::read(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(resumed, table);
        assert!(done(&resumed, &pu, ple_tiles, arch), "the PLE unit is current: skipped");
        assert!(!done(&resumed, &qu, qsa_tiles, arch), "the QSA unit is still to do");
        let mut stale = pu.choices(&ple_tiles, arch);
        stale[0].version = "0000000000000000".into();
        table.upsert(entry("ple", &pu.shape, stale));
        assert_eq!(table.entries.len(), 1, "the same key is replaced, not added");
        assert!(!done(&table, &pu, ple_tiles, arch), "a stale unit is redone");
    }
}
