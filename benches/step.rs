//! The whole decode step at the published geometry (48 layers: 36 Gated DeltaNet, 12 QSA; 512
//! experts top-10; the Gated Residual of 4 streams at rank 320; PLE with its 29 GB NVFP4 n-gram
//! table in pinned host memory), random weights made on the device from a seed
//! (`ModelOnDevice::synthetic`), at contexts of 1k and 32k tokens.
//!
//! For each weight format and context it reports:
//! - the graph replay's device time per token (median, p10, p90 of CUDA events around replays,
//!   the per-token upload of [position, token] included);
//! - the wall time per token of `Engine::step` as a user sees it: upload, replay, the download of
//!   the token and the one host wait;
//! - the bytes the token must move (`Engine::bytes_per_token`), the floor at 4.27 TB/s and the
//!   fraction reached, the fraction of the device's copy rate (measured at the start), and the
//!   GB10 projection of the same bytes at 230 GB/s (a projection, not a measurement);
//! - launches per token and host waits per token (1);
//! - a per-stage profile from events between the launch groups of one eager step at the first
//!   context's last position (PDL overlap is lost at each event, so its sum is above the
//!   replay's time).
//!
//! Tuned against default tiles in one run: with `FLASHNEXT_TUNED` set (a table file or a folder of
//! tables, as `engine::tuned::find_for` reads it) or `--tuned`, the nvfp4 variant runs at the
//! plan's default tiles and at the device's tuned table (`StepPlan::for_device`), in turn, after
//! the burn-in below, and a last line compares their ms/token (`FLASHNEXT_STEP_VARIANTS=all`:
//! every variant so).
//!
//! Tables against the defaults in one run: `FLASHNEXT_STEP_TABLES=a.json,b.json` (table files, as
//! `autotune --pin` writes them, or folders of them, as `autotune --neighbours` writes them) times
//! the first variant at the defaults and at each table's tiles, in turn, `FLASHNEXT_STEP_ROUNDS`
//! times (default 1; each round runs every tile set, every second round in reverse order, so a
//! steady drift of the device adds alike to every mean and an unsteady one shows as a spread, not
//! as a difference), and a last line a table and context compares the means. Each tile set
//! makes its own model (the tiles choose the device weights' layouts), but the PLE table in host
//! memory is made once and kept from model to model.
//!
//! The step's speed depends on where its buffers land, by about 1%. In one process the first three
//! models ran 0.8–1.7% faster than every later one (2.3% traced), whatever their tiles, in each of
//! the twelve such processes of sessions 51 and 52 (H100s), with the clocks fixed (1980 / 2619 MHz,
//! no throttle reason) and after 10 s of replays as well; and single-model processes with 1 B,
//! 1 MiB, 37 MiB or 1 GiB allocated ahead of the model (`FLASHNEXT_STEP_PAD_BYTES`) ran 2.955 and
//! 2.959, 2.929, 2.937 and 2.949 ms at 1k. Traced, the later models lose it in the kernels bound by
//! L2 round trips on small buffers (the mix up-projection, `gemv_nvfp4`, QSA's), not in the
//! streaming ones (BENCHMARKS.md, Autotuning, session 52); `FLASHNEXT_STEP_ENGINE_PADS=0,4096,...`
//! makes one model and, over it, one engine per pad (`FLASHNEXT_STEP_ROUNDS` rounds), its own
//! buffers allocated after that many bytes held: on an H100 (session 53) eight pads moved the
//! step by at most 0.8%, less than the first runs' lead, so most of that is the weights' place.
//! So when more than one run is asked for, the first `FLASHNEXT_STEP_BURN_IN` runs (default 3,
//! the first entries of a round) are extra and not in the means, and the counted rounds compare
//! tile sets where the later models land (the defaults' runs there repeat to ±0.2% in every
//! process); the burn-in's first run, the defaults on a fresh process as the decode binary runs
//! them, is the figure to quote, within that 1%.
//!
//! A filter argument names the one variant to run (`step --bench nvfp4`: the NVFP4 step only).
//!
//! With `FLASHNEXT_TRACE=1` every kernel is the traced build (`engine::cuda::trace`), and after
//! each context's timing one more token's replay is laid out as a timeline: per kernel, the
//! launches, what they added to the replay's span, the hand-off (predecessor's end to the wait's
//! return) and the work after the wait; then, from the blocks' own records, the block that ended
//! each launch (how late it was let in, how long it ran after its wait, beside the median block's
//! run) and the most blocks a launch put on one SM. Every launch's stamps go to
//! $OUT/step-trace-<variant>-<context>.jsonl, every block's (SM, start, wait return, end, ns from
//! the replay's first start) to $OUT/step-blocks-<variant>-<context>.jsonl (`<variant>-tuned` for
//! the tuned tile set's half, `<variant>-<table>` for a table's; a later run of the same tiles, a
//! burn-in's or another round's, writes over an earlier one's files, and stdout keeps each). The
//! timed lines of such a run are the traced build's (the stamps' cost is their difference from a
//! plain run).
//!
//! Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-step.jsonl (or
//! target/).

use std::path::PathBuf;
use std::time::Instant;

use engine::cuda::timing::EventTimer;
use engine::model::config::ModelConfig;
use engine::step::{Engine, Formats, ModelOnDevice, StepPlan};
use engine::tuned::Table;
use flashnext::bench::{Recorder, Sample, Unit, env_count, percentile};

const H200_BYTES_PER_S: f64 = 4.27e12;
const GB10_BYTES_PER_S: f64 = 230e9;
const CONTEXTS: [usize; 2] = [1024, 32_768];
const SAMPLES: usize = 50;

/// The tiles a half of a run takes: the plan's defaults, the device's tuned table
/// (`StepPlan::for_device`), or a table file.
#[derive(Clone, Debug, PartialEq)]
enum TileSource {
    Defaults,
    Tuned,
    File(PathBuf),
}

impl TileSource {
    fn name(&self) -> String {
        match self {
            TileSource::Defaults => "default tiles".into(),
            TileSource::Tuned => "tuned tiles".into(),
            TileSource::File(p) => format!("table {}", p.file_name().unwrap_or(p.as_os_str()).to_string_lossy()),
        }
    }

    /// The trace files' tag for it.
    fn tag(&self) -> String {
        match self {
            TileSource::Defaults => String::new(),
            TileSource::Tuned => "-tuned".into(),
            TileSource::File(p) => format!("-{}", p.file_stem().unwrap_or(p.as_os_str()).to_string_lossy()),
        }
    }

    fn plan(&self, cfg: &ModelConfig, formats: Formats, context: usize, info: &engine::cuda::DeviceInfo) -> StepPlan {
        match self {
            TileSource::Defaults => StepPlan::new(cfg, formats, context).expect("plan"),
            TileSource::Tuned => StepPlan::for_device(cfg, formats, context, info).expect("plan"),
            TileSource::File(p) => {
                let table = Table::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                if table.device != info.name || table.arch != info.arch.to_string() {
                    println!(
                        "{}: a table for {} {}, taken on {} {}",
                        p.display(),
                        table.device,
                        table.arch,
                        info.name,
                        info.arch
                    );
                }
                let plan = StepPlan::new(cfg, formats, context).expect("plan");
                let (plan, notices) = plan.tuned(&table, info.arch, info.sm_count);
                for n in notices {
                    println!("{}: {n}; default tiles for it", p.display());
                }
                plan
            }
        }
    }
}

/// A table file named in `FLASHNEXT_STEP_TABLES`, or a folder's tables (`autotune --neighbours`
/// writes one a neighbour) in name order.
fn tables_at(path: PathBuf) -> Vec<PathBuf> {
    if !path.is_dir() {
        return vec![path];
    }
    let read = std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut files: Vec<PathBuf> = read
        .map(|f| f.unwrap_or_else(|e| panic!("{}: {e}", path.display())).path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: no .json table in the folder", path.display());
    files
}

fn main() {
    // criterion's harness flags (`--bench`) are accepted and ignored; a filter picks a variant.
    // The device's own copy rate, measured first: the step's share of it is comparable across
    // machines of one kind (H100s copy at 3.01-3.04 TB/s, the H200 at 4.27). Measured later in the
    // process it can read lower for the allocator's sake (benches/memory_churn.rs).
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("step") else { return };
    // Bytes allocated ahead of the first model and held, so that its buffers land elsewhere
    // (module doc: where they land moves the step by about 1%).
    let pad = env_count("FLASHNEXT_STEP_PAD_BYTES", 0);
    // Held to the end of main, under every model.
    let _pad = (pad > 0).then(|| gpu.alloc::<u8>(pad).expect("the pad"));
    let cfg = ModelConfig::published();
    let tables: Vec<PathBuf> = std::env::var("FLASHNEXT_STEP_TABLES")
        .map(|v| v.split(',').filter(|p| !p.is_empty()).flat_map(|p| tables_at(PathBuf::from(p))).collect())
        .unwrap_or_default();
    let rounds = env_count("FLASHNEXT_STEP_ROUNDS", 1).max(1);
    let compare =
        std::env::var_os("FLASHNEXT_TUNED").is_some() || std::env::args().any(|a| a == "--tuned") || !tables.is_empty();
    let mut variants = vec![
        ("nvfp4", Formats::NVFP4),
        // The NVFP4 step before GDN's out_proj and QSA's projections had an NVFP4 GEMV.
        ("nvfp4, bf16 GDN out_proj and QSA", Formats { gdn_out_proj: false, qsa: false, ..Formats::NVFP4 }),
        // bf16 mix weights: on sm_90 (software FP4 decode) the faster mix until session 32, whose
        // NVFP4 step (3.14 ms/token at 1k) beat this one (3.27 in the same session).
        ("nvfp4, bf16 mix", Formats { mix: false, ..Formats::NVFP4 }),
        ("nvfp4 experts, bf16 mix/GDN/lm_head", Formats { experts: true, ..Formats::BF16 }),
        // The NVFP4 step before the PLE projections had an NVFP4 GEMV (65.5 MB a token in bf16,
        // 18.4 MB in NVFP4).
        ("nvfp4, bf16 PLE projections", Formats { ple_proj: false, ..Formats::NVFP4 }),
    ];
    if compare && std::env::var("FLASHNEXT_STEP_VARIANTS").as_deref() != Ok("all") {
        variants.truncate(1);
    }
    // Filter arguments (criterion's place for one) name variants exactly: `step --bench nvfp4`
    // times the NVFP4 step alone, `step --bench nvfp4 "nvfp4, bf16 mix"` those two.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if !only.is_empty() {
        for o in &only {
            assert!(variants.iter().any(|(name, _)| name == o), "no step variant is named {o:?}");
        }
        variants.retain(|(name, _)| only.iter().any(|o| o == name));
    }
    let mut tile_sets = vec![TileSource::Defaults];
    if !tables.is_empty() {
        tile_sets.extend(tables.into_iter().map(TileSource::File));
    } else if compare {
        tile_sets.push(TileSource::Tuned);
    }
    // Round after round, each round every variant at every tile set, so that a drift of the
    // device's speed over the run falls on every variant alike (session 45 ran two formats one
    // after the other and could not tell its gain from such a drift). Every second round runs
    // in the reverse order, so that each pair of rounds puts every run at the same mean place
    // and a steady drift adds the same to every mean (session 51's two-round sweeps ran the
    // defaults first in both rounds, and the tables after them).
    let one_round: Vec<(&str, Formats, TileSource)> =
        variants.iter().flat_map(|&(v, f)| tile_sets.iter().map(move |t| (v, f, t.clone()))).collect();
    let counted = (0..rounds).flat_map(|r| {
        let mut round = one_round.clone();
        if r % 2 == 1 {
            round.reverse();
        }
        round
    });
    // The burn-in ahead of them (module doc), whenever more than one run is asked for.
    let burn_in = if rounds * one_round.len() > 1 { env_count("FLASHNEXT_STEP_BURN_IN", 3) } else { 0 };
    // Each run: its variant, formats, tiles, and its burn-in number (None: counted).
    let runs: Vec<(&str, Formats, TileSource, Option<usize>)> = one_round
        .iter()
        .cycle()
        .take(burn_in)
        .enumerate()
        .map(|(i, (v, f, t))| (*v, *f, t.clone(), Some(i + 1)))
        .chain(counted.map(|(v, f, t)| (v, f, t, None)))
        .collect();
    let first_variant = variants[0].0;
    let mut rec = Recorder::new(&gpu, "step", Some(copy_bw));
    // Bytes held ahead of each engine's own buffers, one engine per entry, over one model: the
    // placement sweep, instead of the runs above.
    if let Ok(list) = std::env::var("FLASHNEXT_STEP_ENGINE_PADS") {
        let pads: Vec<usize> = list
            .split(',')
            .map(|p| {
                p.trim().parse().unwrap_or_else(|_| panic!("FLASHNEXT_STEP_ENGINE_PADS: {p:?} is not a byte count"))
            })
            .collect();
        assert!(!pads.is_empty(), "FLASHNEXT_STEP_ENGINE_PADS names no pad");
        engine_pad_sweep(gpu, variants[0].1, &pads, rounds, &mut rec);
        return;
    }
    let mut gpu = Some(gpu);
    // The PLE table of the last model (30.7 GB of pinned host memory, filled on the CPU: most of
    // a model's making), kept for the next, whose tiles change only the device weights' layouts.
    let mut kept_table: Option<engine::step::SyntheticPleTable> = None;
    // (variant, tiles, context) → ms/token on the device.
    let mut results: Vec<(&str, String, usize, f64)> = Vec::new();
    for &(variant, formats, ref source, burn) in &runs {
        let g = gpu.take().expect("the device");
        let context = *CONTEXTS.iter().max().expect("contexts");
        let plan = source.plan(&cfg, formats, context, g.info());
        let tiles = source.name();
        // Burn-in runs are named apart (numbered), so that their records are kept apart too.
        let name = match burn {
            None => format!("{variant} ({tiles})"),
            Some(i) => format!("{variant} ({tiles}, burn-in {i}/{burn_in})"),
        };
        let t0 = Instant::now();
        let kept = kept_table.take().filter(|t| t.format() == formats.ple_table);
        let model = synthetic_model(&g, &cfg, &plan, kept);
        println!("{name}: made on the device in {:.1} s", t0.elapsed().as_secs_f64());
        let mut e = Engine::new(g, plan, model).expect("engine");
        e.step(1).expect("warm-up");
        // The profile at the first context's last position, where its timed steps run: the
        // attention's work grows with the position (at position 1 it attends to two tokens).
        let profile_position = CONTEXTS[0] - 1;
        e.seek(profile_position).expect("seek");
        let (_, profile) = e.step_profiled(2).expect("profile");
        e.capture().expect("capture");
        for context in CONTEXTS {
            let position = context - 1;
            let bytes = e.bytes_per_token(position) as f64;
            let (device, wall) = time_steps(&mut e, position);
            let (med, p10, p90) = (percentile(&device, 0.5), percentile(&device, 0.1), percentile(&device, 0.9));
            let wall_med = percentile(&wall, 0.5);
            let floor = bytes / H200_BYTES_PER_S;
            let line = format!(
                "step {name} context {context}: {:.3} ms/token on the device (p10 {:.3}, p90 {:.3}), {:.3} ms wall per \
                 Engine::step; {:.1} MB/token, floor {:.3} ms at 4.27 TB/s ({:.1}% reached, {:.1}% of the copy rate); {} \
                 launches, 1 host wait per token; GB10 projection {:.1} ms/token at 230 GB/s (bytes only)",
                med * 1e3,
                p10 * 1e3,
                p90 * 1e3,
                wall_med * 1e3,
                bytes / 1e6,
                floor * 1e3,
                100.0 * floor / med,
                100.0 * bytes / med / copy_bw,
                e.launches_per_token(),
                bytes / GB10_BYTES_PER_S * 1e3
            );
            println!("{line}");
            if burn.is_none() {
                results.push((variant, tiles.clone(), context, med * 1e3));
            }
            let what = Sample::new("step", format!("{name}, context {context}"), Unit::Token, (med, p10, p90));
            let notes = format!("wall per Engine::step {:.3} ms, 1 host wait per token", wall_med * 1e3);
            rec.record_quietly(what.bytes(bytes as usize).launches(e.launches_per_token()).notes(notes));
            if e.gpu().traced() {
                // The tuned half's files beside the default half's, not over them.
                let tag = format!("{variant}{}-{context}", source.tag());
                trace_one_token(&mut e, position, &tag);
            }
        }
        let total: f64 = profile.stages.iter().map(|(_, t, _)| t).sum();
        println!(
            "  profile of one eager step at position {profile_position} (events between launch groups), {:.3} ms in all:",
            total * 1e3
        );
        for (stage, t, n) in &profile.stages {
            println!("    {:<22} {:>8.3} ms  {:>5.1}%  ({n} groups)", stage.name(), t * 1e3, 100.0 * t / total);
            let group = format!("eager profile at position {profile_position}, {name}");
            let what = Sample::median(group, stage.name(), Unit::Token, *t);
            rec.record_quietly(what.notes(format!("{n} groups, events between groups")));
        }
        let (mut g, table) = e.into_gpu_and_ple_table();
        kept_table = table;
        if g.traced() {
            // The next tile set's model and captures start from an empty arena.
            g.trace_forget().expect("trace forget");
        }
        gpu = Some(g);
    }
    // Each mean against its baseline, per context: another tile set against the same variant's
    // defaults (an A/B of tiles), another variant's defaults against the first variant's (an A/B
    // of formats, round by round).
    let mean = |variant: &str, tiles: &str, context: usize| {
        let v: Vec<f64> =
            results.iter().filter(|r| r.0 == variant && r.1 == tiles && r.2 == context).map(|r| r.3).collect();
        (v.iter().sum::<f64>() / v.len().max(1) as f64, v.len())
    };
    const DEFAULT: &str = "default tiles";
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for (variant, tiles, context, _) in &results {
        let key = (*variant, tiles.as_str(), *context);
        let base = if tiles != DEFAULT {
            (*variant, DEFAULT)
        } else if *variant != first_variant {
            (first_variant, DEFAULT)
        } else {
            continue;
        };
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let ((other, n), (baseline, m)) = (mean(variant, tiles, *context), mean(base.0, base.1, *context));
        if m == 0 {
            continue;
        }
        let change = format!("{:+.1}%; means of {n} and {m} runs", 100.0 * (other - baseline) / baseline);
        if tiles != DEFAULT {
            let label = if tiles == "tuned tiles" { "tuned" } else { tiles.as_str() };
            println!(
                "step {variant} context {context}: {label} {other:.3} ms/token against default {baseline:.3} ms/token ({change})"
            );
        } else {
            println!(
                "step context {context}: {variant} {other:.3} ms/token against {first_variant} {baseline:.3} ms/token ({change}, default tiles)"
            );
        }
    }
}

/// The published model's synthetic weights (seed 1) for `plan`, on `kept`'s PLE table when there
/// is one, each part's end said on stderr.
fn synthetic_model(
    gpu: &engine::cuda::Gpu,
    cfg: &ModelConfig,
    plan: &StepPlan,
    kept: Option<engine::step::SyntheticPleTable>,
) -> ModelOnDevice {
    ModelOnDevice::synthetic_with(gpu, cfg, plan, 1, kept, &mut |what, done, total| {
        if done == total {
            eprintln!("  {what}: {done}/{total}");
        }
    })
    .expect("synthetic model")
}

/// SAMPLES steps at `position` (each seeks back to it): the device time of each (CUDA events
/// around the replay, the upload included) and its wall time as `Engine::step` takes it, sorted.
fn time_steps(e: &mut Engine, position: usize) -> (Vec<f64>, Vec<f64>) {
    let timer = EventTimer::new(e.gpu()).expect("events");
    let mut device = Vec::new();
    let mut wall = Vec::new();
    for _ in 0..SAMPLES {
        e.seek(position).expect("seek");
        let t = Instant::now();
        timer.start(e.gpu()).expect("start");
        e.step(3).expect("step");
        wall.push(t.elapsed().as_secs_f64());
        // The step waited for its token, so the end event lands right after it.
        device.push(timer.stop(e.gpu()).expect("stop").as_secs_f64());
    }
    device.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    (device, wall)
}

/// The placement sweep (`FLASHNEXT_STEP_ENGINE_PADS`): one model of the first variant at the
/// default tiles, and over it, round after round (every second one in reverse), one engine per
/// pad, its buffers, states and scratch allocated after `pad` bytes held for its life, timed at
/// every context. The weights stay where they are, so a difference between pads that repeats
/// from round to round is the engine's own buffers' placement.
fn engine_pad_sweep(gpu: engine::cuda::Gpu, formats: Formats, pads: &[usize], rounds: usize, rec: &mut Recorder) {
    let cfg = ModelConfig::published();
    let context = *CONTEXTS.iter().max().expect("contexts");
    let plan = StepPlan::new(&cfg, formats, context).expect("plan");
    let t0 = Instant::now();
    let model = synthetic_model(&gpu, &cfg, &plan, None);
    println!("placement sweep: the model made on the device in {:.1} s", t0.elapsed().as_secs_f64());
    let mut parts = Some((gpu, plan, model));
    // (pad, context) → ms/token, one per round.
    let mut results: Vec<(usize, usize, f64)> = Vec::new();
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 1 { pads.iter().rev().copied().collect() } else { pads.to_vec() };
        for pad in order {
            let (g, plan, model) = parts.take().expect("the parts");
            let held = (pad > 0).then(|| g.alloc::<u8>(pad).expect("the pad"));
            let mut e = Engine::new(g, plan, model).expect("engine");
            e.step(1).expect("warm-up");
            e.capture().expect("capture");
            for context in CONTEXTS {
                let (device, _) = time_steps(&mut e, context - 1);
                let (med, p10, p90) = (percentile(&device, 0.5), percentile(&device, 0.1), percentile(&device, 0.9));
                println!(
                    "placement round {} pad {pad} B context {context}: {:.3} ms/token on the device (p10 {:.3}, p90 {:.3})",
                    round + 1,
                    med * 1e3,
                    p10 * 1e3,
                    p90 * 1e3
                );
                results.push((pad, context, med * 1e3));
                let what = Sample::new(
                    "step placement",
                    format!("engine pad {pad} B, context {context}"),
                    Unit::Token,
                    (med, p10, p90),
                );
                rec.record_quietly(what.launches(e.launches_per_token()));
            }
            let (g, plan, model) = e.into_parts();
            drop(held);
            parts = Some((g, plan, model));
        }
    }
    for context in CONTEXTS {
        let of =
            |pad: usize| -> Vec<f64> { results.iter().filter(|r| r.0 == pad && r.1 == context).map(|r| r.2).collect() };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let base = mean(&of(pads[0]));
        for &pad in pads {
            let v = of(pad);
            let mean = mean(&v);
            let (lo, hi) = (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max));
            println!(
                "placement context {context} pad {pad} B: mean {mean:.3} ms/token (min {lo:.3}, max {hi:.3}, {} rounds), {:+.2}% against pad {} B",
                v.len(),
                100.0 * (mean - base) / base,
                pads[0]
            );
        }
    }
}

/// One token's replay at `position`, traced: the timeline by kernel to stdout, each launch's
/// stamps to $OUT/step-trace-<tag>.jsonl (or target/).
fn trace_one_token(e: &mut Engine, position: usize, tag: &str) {
    use engine::cuda::trace::Timeline;
    e.seek(position).expect("seek");
    e.gpu().trace_reset().expect("trace reset");
    e.step(3).expect("step");
    let launches = e.gpu().trace_read().expect("trace read");
    let t = Timeline::of(&launches);
    println!(
        "  trace at position {position}: {} launches, span {:.3} ms (first start to last end)",
        launches.len(),
        t.span / 1e6
    );
    println!(
        "  {:<28} {:>8} {:>12} {:>7} {:>14} {:>14} {:>14}",
        "kernel", "launches", "advance ms", "share", "hand-off us", "after wait us", "advance us"
    );
    for k in t.by_kernel() {
        let per = |v: f64, n: usize| if n == 0 { f64::NAN } else { v / n as f64 / 1e3 };
        println!(
            "  {:<28} {:>8} {:>12.3} {:>6.1}% {:>14.2} {:>14.2} {:>14.2}",
            k.kernel,
            k.launches,
            k.advance / 1e6,
            100.0 * k.advance / t.span,
            per(k.handoff, k.waits),
            per(k.after_wait, k.launches),
            per(k.advance, k.launches)
        );
    }
    print_critical_blocks(&launches, &t);
    let dir = std::env::var_os("OUT").map(std::path::PathBuf::from).unwrap_or_else(|| "target".into());
    let write = |kind: &str, lines: String| {
        let path = dir.join(format!("step-{kind}-{}.jsonl", tag.replace([' ', ',', '/'], "_")));
        std::fs::write(&path, lines).unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
    };
    let first = launches.first().map_or(0, |l| l.first_start);
    let rel = |v: u64| v as i64 - first as i64;
    let mut out = String::new();
    for (l, s) in launches.iter().zip(&t.steps) {
        out.push_str(
            &serde_json::json!({
                "slot": l.slot,
                "kernel": l.kernel,
                "first_start_ns": rel(l.first_start),
                "last_start_ns": rel(l.last_start),
                "first_wait_ns": l.first_wait.map(rel),
                "last_end_ns": rel(l.last_end),
                "advance_ns": s.advance,
                "handoff_ns": s.handoff,
                "after_wait_ns": s.after_wait,
                "lead_ns": s.lead,
            })
            .to_string(),
        );
        out.push('\n');
    }
    write("trace", out);

    // Every block, a line a launch: its SM, start, wait return (null: no wait) and end.
    let mut out = String::new();
    for l in &launches {
        out.push_str(
            &serde_json::json!({
                "slot": l.slot,
                "kernel": l.kernel,
                "sm": l.blocks.iter().map(|b| b.sm).collect::<Vec<_>>(),
                "start_ns": l.blocks.iter().map(|b| rel(b.start)).collect::<Vec<_>>(),
                "wait_ns": l.blocks.iter().map(|b| b.wait.map(rel)).collect::<Vec<_>>(),
                "end_ns": l.blocks.iter().map(|b| rel(b.end)).collect::<Vec<_>>(),
            })
            .to_string(),
        );
        out.push('\n');
    }
    write("blocks", out);
}

/// Per kernel, means over its launches: the blocks, the most on one SM, the block that ended the
/// launch (how long after the launch's first start it started, how long it ran after its wait)
/// and the median block's run, in the order of the timeline's table.
fn print_critical_blocks(launches: &[engine::cuda::trace::LaunchStamps], t: &engine::cuda::trace::Timeline) {
    println!(
        "  {:<28} {:>8} {:>10} {:>10} {:>16} {:>16} {:>16}",
        "kernel", "blocks", "most/SM", "last: SM", "last: late us", "last: run us", "median run us"
    );
    for k in t.by_kernel() {
        let mine: Vec<_> = launches.iter().filter(|l| l.kernel == k.kernel).collect();
        let criticals: Vec<_> = mine.iter().filter_map(|l| l.critical()).collect();
        let runs: Vec<f64> = mine.iter().filter_map(|l| l.median_run()).collect();
        if criticals.is_empty() {
            continue;
        }
        let mean = |v: &mut dyn Iterator<Item = f64>, n: usize| v.sum::<f64>() / n as f64;
        let n = criticals.len();
        // The SM the last block ran on most often: a fixed SM would mean a placement pattern.
        let mut sms = std::collections::BTreeMap::new();
        for c in &criticals {
            *sms.entry(c.sm).or_insert(0usize) += 1;
        }
        let (sm, times) =
            sms.iter().max_by_key(|(sm, n)| (**n, std::cmp::Reverse(**sm))).map_or((0, 0), |(s, n)| (*s, *n));
        println!(
            "  {:<28} {:>8.0} {:>10.1} {:>6} x{:<3} {:>16.2} {:>16.2} {:>16.2}",
            k.kernel,
            mean(&mut mine.iter().map(|l| l.blocks.len() as f64), mine.len()),
            mean(&mut mine.iter().map(|l| l.most_blocks_an_sm() as f64), mine.len()),
            sm,
            times,
            mean(&mut criticals.iter().map(|c| c.late / 1e3), n),
            mean(&mut criticals.iter().map(|c| c.run / 1e3), n),
            mean(&mut runs.iter().map(|r| r / 1e3), runs.len()),
        );
    }
}
