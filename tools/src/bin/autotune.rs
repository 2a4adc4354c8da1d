//! Tunes the step's kernels for one device and writes its table (`tuned/<device-slug>.json`),
//! which `StepPlan::for_device` then takes. `--help` explains.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use engine::cuda::cache::{self, CompileCache};
use engine::model::config::ModelConfig;
use engine::step::{Formats, StepPlan};
use engine::tuned::{Table, Unit, device_slug};
use kernel_dsl::Arch;
use tools::autotune::neighbours;
use tools::autotune::pin::{self, KnobName, Pin};
use tools::autotune::{self, Target};

/// Tunes the tile sets of the decode step's kernels at the shapes the step runs them, for one
/// device, and writes the table the engine loads at start.
///
/// Units: each layer family the step tunes (moe, mix, gdn, lm_head, qsa, ple) in NVFP4 and in
/// bf16, at the shapes of `StepPlan` for the model (the published config by default), each
/// matrix in the format the step runs it in: in NVFP4, GDN's out_proj and QSA's two projections
/// are `gemv_nvfp4`, whose tiles are then the out_proj, in_proj and o_proj knobs. QSA is timed
/// at the last position of caches of `--context` tokens (32,768 by default: 8,192 blocks, past
/// the budget of 512, so the top-k selects; the top-k kernel is the one the plan takes at that
/// context, and names the unit); PLE's format is its table rows', read from pinned host memory
/// mapped for the device. Each knob (one kernel's tiles;
/// the lm_head's waves) enumerates its declared tile sets; those that change a tile the step
/// chooses (marked `#[tile(..., step)]`: when the next kernel may launch, how many blocks an SM
/// holds; the neighbours it meets there are not the unit's) are held at the plan's value, those
/// the launch's shape checks refuse
/// are pruned, the rest compiled through NVRTC in parallel (and the kernel cache), and pruned again
/// on the cubin's resources: spills, shared memory past the device's limit, a block the SM's
/// registers cannot hold.
///
/// Timed (default, on the GPU): coordinate descent from the plan's tiles, one knob at a time,
/// each candidate checked against the CPU reference on one layer before its time counts (GDN:
/// against the plan's tiles' output, which tests/gpu_gdn.rs checks against the reference); time per
/// layer is the median of graph replays over ≥ 8 layers with distinct weights (beyond the L2; PLE:
/// the ids and every layer's gather on a side stream, joined, then the blocks, as the step runs).
/// A candidate wins when more than 1% faster than the best so far, or faster and then faster by
/// more than 0.2% in each of 3 alternating timings of the two (a kernel that is a small part of
/// its layer, as GDN's out_proj, gains less than 1% of the layer). Units already in the output with current kernel versions are skipped, so an interrupted or
/// budget-limited run resumes where it stopped. Progress goes to stderr.
///
/// Untimed (`--untimed`, no GPU needed): a choice from the compiled resources alone for a device
/// described by `--device --arch --sms --smem`, marked untimed (the rule is written into the table).
/// For the GB10: `autotune --untimed --device "NVIDIA GB10" --arch sm_121a --sms 48 --smem 101376
/// --out tuned/gb10-untimed.json`.
///
/// Pinned (`--pin`, no GPU needed): no search; a table of the plan's tiles with the pinned knobs
/// set, for timing the step at its defaults against those tiles in one run: `autotune --pin
/// "gdn.in_proj=ROWS=4 MMA=0 DIRECT=1" --device "NVIDIA H200" --arch sm_90 --sms 132 --out
/// pinned.json` (the tiles a pin does not name stay at the plan's), then on that device
/// `FLASHNEXT_STEP_TABLES=pinned.json cargo bench --bench step -- nvfp4`, which times the defaults
/// and the pinned tiles in turn.
///
/// Neighbours (`--neighbours DIR`, no GPU needed): every one-tile neighbour of the NVFP4 plan's
/// tiles (one tile of one knob moved to another declared value that fits the shape and compiles
/// clean, the tiles the harnesses hold included), each a pinned table in DIR, for timing them
/// all in the step in one run: `autotune --neighbours nb --only moe,mix --device "NVIDIA H200"
/// --arch sm_90 --sms 132 --smem 232448`, then `FLASHNEXT_STEP_TABLES=nb FLASHNEXT_STEP_ROUNDS=2
/// cargo bench --bench step -- nvfp4`.
#[derive(Debug, Parser)]
#[command(name = "autotune")]
struct Args {
    /// The model's config.json (default: the published Qwen3.8-Flash-Next).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Tune these families only, comma-separated: moe, mix, gdn, lm_head, qsa, ple (e.g.
    /// `--only qsa,ple`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Stop starting candidates after this many seconds; finished units are kept.
    #[arg(long, default_value_t = 420)]
    budget_secs: u64,
    /// The table to write (and resume from); default tuned/<device-slug>.json, or
    /// tuned/<device-slug>-untimed.json with --untimed.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Choose from compiled resources alone, without a GPU.
    #[arg(long)]
    untimed: bool,
    /// Untimed: the device's name as the driver reports it.
    #[arg(long, default_value = "NVIDIA GB10")]
    device: String,
    /// Untimed: the architecture (sm_90, sm_121a).
    #[arg(long, default_value = "sm_121a")]
    arch: Arch,
    /// Untimed: the device's SMs.
    #[arg(long, default_value_t = 48)]
    sms: u32,
    /// Untimed: shared memory one block may use, bytes.
    #[arg(long, default_value_t = 101_376)]
    smem: u32,
    /// Context the plan's caches are sized for: QSA is timed at its last position, and its
    /// top-k kernel follows it (the one-block kernel up to 64k tokens, the multi-block one past);
    /// the other families' shapes do not depend on it.
    #[arg(long, default_value_t = 32_768)]
    context: usize,
    /// Compile threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Pin a knob instead of tuning, FAMILY.KNOB=TILES (repeatable; the tiles as tables write
    /// them): writes --out (required), a table of the plan's tiles with the pinned knobs set, for
    /// --device, --arch and --sms; nothing is timed and no GPU is needed.
    #[arg(long)]
    pin: Vec<Pin>,
    /// Write every one-tile neighbour of the NVFP4 plan's tiles as a pinned table into this
    /// folder, new or empty (for --device, --arch, --sms and --smem; --only picks families);
    /// nothing is timed and no GPU is needed.
    #[arg(long, conflicts_with_all = ["pin", "untimed"])]
    neighbours: Option<PathBuf>,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("autotune: {e}");
        std::process::exit(1);
    }
}

fn run(a: Args) -> Result<(), String> {
    let cfg = match &a.config {
        Some(p) => ModelConfig::from_file(p).map_err(|e| e.to_string())?,
        None => ModelConfig::published(),
    };
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()));
    let families = ["moe", "mix", "gdn", "lm_head", "qsa", "ple"];
    if let Some(f) = a.only.iter().find(|f| !families.contains(&f.as_str())) {
        return Err(format!("--only {f}: the families are {}", families.join(", ")));
    }
    if !a.pin.is_empty() {
        return run_pinned(&a, &cfg);
    }
    let wanted = |f: &str| a.only.is_empty() || a.only.iter().any(|o| o == f);
    if let Some(dir) = &a.neighbours {
        let target =
            Target { arch: a.arch, sms: a.sms, smem: a.smem, threads, cache: CompileCache::new(cache::default_dir()) };
        return run_neighbours(&a, &cfg, dir, &target, &wanted);
    }
    let deadline = Instant::now() + Duration::from_secs(a.budget_secs);
    let gpu = if a.untimed { None } else { Some(engine::cuda::Gpu::open(0).map_err(|e| e.to_string())?) };
    let (device, arch, sms, smem) = match &gpu {
        Some(g) => (g.info().name.clone(), g.info().arch, g.info().sm_count, g.info().max_shared_per_block),
        None => (a.device.clone(), a.arch, a.sms, a.smem),
    };
    let target = Target { arch, sms, smem, threads, cache: CompileCache::new(cache::default_dir()) };
    let out = a.out.clone().unwrap_or_else(|| {
        let slug = device_slug(&device);
        let name = if a.untimed { format!("{slug}-untimed.json") } else { format!("{slug}.json") };
        engine::tuned::default_dir().join(name)
    });
    let mut table = match Table::read(&out) {
        Ok(t) if t.device == device && t.arch == arch.to_string() && t.untimed == a.untimed => t,
        _ => Table { device: device.clone(), arch: arch.to_string(), ..Table::default() },
    };
    table.sms = sms;
    table.smem_per_block = smem;
    table.untimed = a.untimed;
    table.rule = if a.untimed {
        autotune::UNTIMED_RULE.into()
    } else {
        "timed: coordinate descent from the plan's tiles over each knob's clean candidates (no spills, within shared \
         memory and registers); a candidate must match the CPU reference on one layer, then wins if its median time per \
         layer (graph replays over layers with distinct weights) is more than 1% below the best so far, or below it and \
         then more than 0.2% below it in each of 3 alternating timings of the two"
            .into()
    };
    eprintln!(
        "autotune: {device} ({arch}, {sms} SMs, {smem} B shared per block), {threads} compile threads → {}",
        out.display()
    );

    // The units of the plans of both formats, each once.
    let mut seen = Vec::new();
    for formats in [Formats::NVFP4, Formats::BF16] {
        let plan = StepPlan::new(&cfg, formats, a.context).map_err(|e| e.to_string())?;
        let u = plan.units(sms);
        let mut step = |key: String| {
            if seen.contains(&key) {
                return false;
            }
            seen.push(key);
            true
        };
        if wanted("moe") && step(format!("moe {}", u.moe.format)) {
            tune(&target, &mut table, &out, &u.moe, plan.moe_tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::moe(g, plan.moe, formats.experts)
            })?;
        }
        if wanted("mix") && step(format!("mix {}", u.mix.format)) {
            tune(&target, &mut table, &out, &u.mix, plan.mix_tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::mix(g, plan.mix, plan.eps, formats.mix)
            })?;
        }
        if let (Some(unit), Some((shape, tiles))) = (&u.gdn, plan.gdn)
            && wanted("gdn")
            && step(format!("gdn {}", unit.format))
        {
            tune(&target, &mut table, &out, unit, tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::gdn(g, shape, formats.gdn_in_proj, formats.gdn_out_proj, tiles)
            })?;
        }
        if let (Some(unit), Some((shape, tiles))) = (&u.qsa, plan.qsa)
            && wanted("qsa")
            && step(format!("qsa {} {}", unit.format, unit.shape))
        {
            tune(&target, &mut table, &out, unit, tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::qsa(g, &cfg, shape, plan.capacity, formats.qsa)
            })?;
        }
        if let (Some(unit), Some((shape, tiles))) = (&u.ple, plan.ple)
            && wanted("ple")
            && step(format!("ple {}", unit.format))
        {
            tune(&target, &mut table, &out, unit, tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::ple(g, &cfg, shape, formats.ple_table, formats.ple_proj)
            })?;
        }
        if wanted("lm_head") && step(format!("lm_head {}", u.lm_head.format)) {
            tune(&target, &mut table, &out, &u.lm_head, plan.lm_head_tiles, gpu.as_ref(), deadline, |g| {
                autotune::harness::lm_head(g, plan.vocab, plan.mix.hidden, formats.lm_head)
            })?;
        }
    }
    eprintln!("autotune: {} entries in {}", table.entries.len(), out.display());
    Ok(())
}

/// `--pin`: the table of the plan's tiles with the pinned knobs set, each unit a pin takes
/// once (both formats' plans); every pin must take at least one unit.
fn run_pinned(a: &Args, cfg: &ModelConfig) -> Result<(), String> {
    let out = a.out.clone().ok_or("--pin writes a table: name it with --out")?;
    let mut table = Table {
        device: a.device.clone(),
        arch: a.arch.to_string(),
        sms: a.sms,
        smem_per_block: a.smem,
        untimed: true,
        rule: pin::PINNED_RULE.into(),
        entries: Vec::new(),
    };
    let mut took = vec![false; a.pin.len()];
    let mut knobs: Vec<KnobName> = Vec::new();
    // One unit: its knobs named for the refusals, its entry taken where a pin takes it.
    let mut pin_unit = |table: &mut Table, names: Vec<KnobName>, entry: Option<(engine::tuned::Entry, Vec<usize>)>| {
        knobs.extend(names);
        if let Some((e, which)) = entry {
            which.iter().for_each(|&i| took[i] = true);
            eprintln!("autotune: pinned {} {}", e.family, e.format);
            table.upsert(e);
        }
    };
    for formats in [Formats::NVFP4, Formats::BF16] {
        let plan = StepPlan::new(cfg, formats, a.context).map_err(|e| e.to_string())?;
        let u = plan.units(a.sms);
        let (pins, arch) = (&a.pin, a.arch);
        pin_unit(&mut table, pin::knob_names(&u.moe), pin::pinned(&u.moe, plan.moe_tiles, pins, arch)?);
        pin_unit(&mut table, pin::knob_names(&u.mix), pin::pinned(&u.mix, plan.mix_tiles, pins, arch)?);
        if let (Some(unit), Some((_, tiles))) = (&u.gdn, plan.gdn) {
            pin_unit(&mut table, pin::knob_names(unit), pin::pinned(unit, tiles, pins, arch)?);
        }
        if let (Some(unit), Some((_, tiles))) = (&u.qsa, plan.qsa) {
            pin_unit(&mut table, pin::knob_names(unit), pin::pinned(unit, tiles, pins, arch)?);
        }
        if let (Some(unit), Some((_, tiles))) = (&u.ple, plan.ple) {
            pin_unit(&mut table, pin::knob_names(unit), pin::pinned(unit, tiles, pins, arch)?);
        }
        pin_unit(&mut table, pin::knob_names(&u.lm_head), pin::pinned(&u.lm_head, plan.lm_head_tiles, pins, arch)?);
    }
    let missed: Vec<String> =
        a.pin.iter().zip(&took).filter(|(_, t)| !**t).map(|(p, _)| pin::unplaced(p, &knobs)).collect();
    if !missed.is_empty() {
        return Err(missed.join("\n"));
    }
    table.write(&out).map_err(|e| e.to_string())?;
    eprintln!("autotune: {} pinned entries for {} {} in {}", table.entries.len(), a.device, a.arch, out.display());
    Ok(())
}

/// `--neighbours DIR`: each one-tile neighbour of the NVFP4 plan's units (the families wanted) as
/// a pinned table of its own in `dir`.
fn run_neighbours(
    a: &Args,
    cfg: &ModelConfig,
    dir: &std::path::Path,
    target: &Target,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<(), String> {
    // The step bench times every table in the folder: one left from another plan would be timed
    // as a neighbour of this one.
    if let Ok(entries) = std::fs::read_dir(dir) {
        let old = entries.filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "json")).count();
        if old > 0 {
            return Err(format!(
                "--neighbours {}: the folder holds {old} tables already; name a new or empty one",
                dir.display()
            ));
        }
    }
    let plan = StepPlan::new(cfg, Formats::NVFP4, a.context).map_err(|e| e.to_string())?;
    let u = plan.units(a.sms);
    let mut all = Vec::new();
    if wanted("moe") {
        all.extend(neighbours::neighbours(&u.moe, plan.moe_tiles, target));
    }
    if wanted("mix") {
        all.extend(neighbours::neighbours(&u.mix, plan.mix_tiles, target));
    }
    if let (Some(unit), Some((_, tiles))) = (&u.gdn, plan.gdn)
        && wanted("gdn")
    {
        all.extend(neighbours::neighbours(unit, tiles, target));
    }
    if let (Some(unit), Some((_, tiles))) = (&u.qsa, plan.qsa)
        && wanted("qsa")
    {
        all.extend(neighbours::neighbours(unit, tiles, target));
    }
    if let (Some(unit), Some((_, tiles))) = (&u.ple, plan.ple)
        && wanted("ple")
    {
        all.extend(neighbours::neighbours(unit, tiles, target));
    }
    if wanted("lm_head") {
        all.extend(neighbours::neighbours(&u.lm_head, plan.lm_head_tiles, target));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for n in &all {
        let table = Table {
            device: a.device.clone(),
            arch: a.arch.to_string(),
            sms: a.sms,
            smem_per_block: a.smem,
            untimed: true,
            rule: neighbours::NEIGHBOUR_RULE.into(),
            entries: vec![n.entry.clone()],
        };
        let path = dir.join(n.file_name());
        table.write(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("{}", path.display());
    }
    eprintln!("autotune: {} one-tile neighbours for {} {} in {}", all.len(), a.device, a.arch, dir.display());
    Ok(())
}

/// Tunes one unit (unless the table has it current) and writes the table after it.
#[allow(clippy::too_many_arguments)]
fn tune<'g, S: Copy + PartialEq + 'static>(
    target: &Target,
    table: &mut Table,
    out: &std::path::Path,
    unit: &Unit<S>,
    start: S,
    gpu: Option<&'g engine::cuda::Gpu>,
    deadline: Instant,
    harness: impl FnOnce(&'g engine::cuda::Gpu) -> Result<Option<Box<dyn autotune::Harness<S> + 'g>>, String>,
) -> Result<(), String> {
    let label = format!("{} {}", unit.family, unit.format);
    if autotune::done(table, unit, start, target.arch) {
        eprintln!("[{label}] current in the table: skipped");
        return Ok(());
    }
    let entry = match gpu {
        None => autotune::choose_untimed(unit, start, target),
        Some(g) => {
            let Some(mut h) = harness(g)? else {
                eprintln!("[{label}] no timed harness for this family yet: not tuned");
                return Ok(());
            };
            match autotune::choose_timed(unit, start, target, h.as_mut(), deadline)? {
                Some(e) => e,
                None => return Ok(()),
            }
        }
    };
    table.upsert(entry);
    table.write(out).map_err(|e| e.to_string())
}
