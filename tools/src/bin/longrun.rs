//! Long runs of the GPU engine (issue #11 item 4) and one decode step for the sanitizers: `longrun
//! --help` lists the modes, `longrun <mode> --help` their options. Each mode prints what it did and
//! one JSON line (also appended to $OUT/longrun.jsonl when OUT is set); the exit status is 0 when
//! the check passed, 1 when it failed (a mismatch, memory growth), 2 when the run could not be made
//! (no CUDA device, a bad option, an engine error).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use engine::cuda::Gpu;
use engine::model::config::ModelConfig;
use engine::model::weights::ModelWeights;
use engine::step::{Engine, Formats, ModelOnDevice, StepPlan};
use safetensors::SafeTensors;
use serde_json::json;
use tools::longrun::decode::{self, Mode, Request, Trace, greedy, steps_for};
use tools::longrun::memory::{self, Limits, Sample};
use tools::longrun::{Mismatch, emit, first_mismatch, sparse_positions, synthetic_prompt};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// tests/data/tiny-step where this binary was built.
const TINY_AT_BUILD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tiny-step");

/// Long runs of the GPU decode step: graph replay against eager launches over thousands of greedy
/// tokens, on the tiny model (tests/data/tiny-step) and on the published geometry with random
/// weights made on the device; memory over a 100,000-token sequence; one step for the sanitizers.
/// Needs a CUDA device.
#[derive(Parser, Debug)]
#[command(version, about, long_about, name = "longrun")]
struct Cli {
    #[command(subcommand)]
    mode: Command,

    /// The tiny model's directory (config.json, model.safetensors, goldens.safetensors). Default:
    /// tests/data/tiny-step of the checkout this binary was built in, else of the working
    /// directory (the repository root of a copy).
    #[arg(long, global = true, value_name = "DIR")]
    tiny: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One eager step and one graph replay of the tiny model at position 0 (the goldens' first
    /// token), or --steps of each over the goldens' tokens: logits bit-identical, and at position 0
    /// near the transformers goldens. What compute-sanitizer runs as "a full decode step"
    /// (tools/sanitize.sh, with --steps 20: the tiny QSA layer's top-k selects from position 15).
    StepOnce {
        /// Steps of each kind, teacher-forced over the goldens' tokens (at most 88).
        #[arg(long, default_value_t = 1)]
        steps: usize,
        /// NVFP4 experts, mix and lm_head (quantised at load; GDN stays bf16 at hidden 256).
        #[arg(long)]
        nvfp4: bool,
    },
    /// Greedy decoding of the tiny model from the goldens' prompt (48 tokens), eager and then
    /// through the graph (one engine, reset between): the same new tokens, and each step's logits
    /// bit-identical. Reports the first mismatch.
    TinyParity {
        /// New tokens to generate (the context is sized for the prompt and them).
        #[arg(long, default_value_t = 10_000)]
        tokens: usize,
        /// Compare the logits' digests at every this many steps (0: tokens only).
        #[arg(long, default_value_t = 1, value_name = "STEPS")]
        logits_every: usize,
        /// NVFP4 experts, mix and lm_head (quantised at load; GDN stays bf16 at hidden 256).
        #[arg(long)]
        nvfp4: bool,
    },
    /// Greedy decoding of the published geometry (48 layers, NVFP4, random weights made on the
    /// device; the n-gram table in pinned host memory), eager and then through the graph from the
    /// same random prompt: the same new tokens, each step's logits bit-identical. The prompt and
    /// the new tokens must carry the positions past QSA's budget (2,048 tokens), where its top-k
    /// selects blocks; the run refuses otherwise.
    SyntheticParity {
        /// New tokens to generate.
        #[arg(long, default_value_t = 2_000)]
        tokens: usize,
        /// Random prompt ids (decoded one step each, like new tokens).
        #[arg(long, default_value_t = 512)]
        prompt_len: usize,
        /// The weights' and the prompt's seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Compare the logits' digests at every this many steps (0: tokens only).
        #[arg(long, default_value_t = 1, value_name = "STEPS")]
        logits_every: usize,
    },
    /// One greedy sequence of the tiny model through the graph (or eagerly), with the device's free
    /// memory and the process's resident set sampled every --every tokens: both must be flat after
    /// the warm-up (the first sample at or past --warmup tokens is the baseline).
    TinyMemory {
        /// New tokens in the sequence (the context is sized for the prompt and them).
        #[arg(long, default_value_t = 100_000)]
        tokens: usize,
        /// Sample every this many new tokens.
        #[arg(long, default_value_t = 10_000)]
        every: usize,
        /// Tokens of warm-up before the baseline sample (default: --every).
        #[arg(long)]
        warmup: Option<usize>,
        /// Device memory the run may take after the baseline, bytes.
        #[arg(long, default_value_t = 0)]
        device_tolerance_bytes: u64,
        /// Growth of the resident set allowed after the baseline, kB.
        #[arg(long, default_value_t = 1024)]
        rss_tolerance_kb: u64,
        /// Eager launches instead of the graph.
        #[arg(long)]
        eager: bool,
    },
}

fn open_gpu() -> Result<Gpu> {
    let gpu = Gpu::open(0).map_err(|e| format!("longrun needs a CUDA device: {e}"))?;
    let i = gpu.info();
    eprintln!(
        "device: {} (sm_{}{}, {} SMs, {:.1} GB)",
        i.name,
        i.compute_capability.0,
        i.compute_capability.1,
        i.sm_count,
        i.total_memory as f64 / 1e9
    );
    Ok(gpu)
}

fn tiny_formats(nvfp4: bool) -> Formats {
    // GDN's NVFP4 input projection reads 512 columns a block: hidden 256 keeps it in bf16.
    if nvfp4 { Formats { gdn_in_proj: false, ..Formats::NVFP4 } } else { Formats::BF16 }
}

/// The tiny model's directory: `arg`, else where the binary was built, else under the working
/// directory.
fn tiny_dir(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = arg {
        return Ok(d.to_owned());
    }
    let candidates = [PathBuf::from(TINY_AT_BUILD), PathBuf::from("tests/data/tiny-step")];
    candidates.iter().find(|d| d.join("model.safetensors").is_file()).cloned().ok_or_else(|| {
        format!(
            "the tiny model is neither at {TINY_AT_BUILD} nor in tests/data/tiny-step under the working directory: run \
             from the repository root, or give --tiny DIR"
        )
        .into()
    })
}

/// The tiny model in `dir` on the device with caches for `context` tokens.
fn tiny_engine(gpu: Gpu, dir: &Path, formats: Formats, context: usize) -> Result<(Engine, ModelConfig)> {
    let weights = ModelWeights::load_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cfg = weights.config.clone();
    let plan = StepPlan::new(&cfg, formats, context)?;
    let model = ModelOnDevice::upload(&gpu, &weights, &plan, &mut |_, _| {})?;
    let e = Engine::new(gpu, plan, model)?;
    eprintln!("{e:?}: {} launches per token, capacity {} tokens", e.launches_per_token(), e.capacity());
    Ok((e, cfg))
}

/// The tiny model's goldens: the prompt and its greedy continuation, and the prompt's length.
struct Goldens {
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Teacher-forced logits at position 0.
    first_logits: Vec<f32>,
}

impl Goldens {
    fn prompt(&self) -> &[u32] {
        &self.tokens[..self.prompt_len]
    }
}

fn tiny_goldens(dir: &Path) -> Result<Goldens> {
    let path = dir.join("goldens.safetensors");
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let i64s = |name: &str| -> Result<Vec<i64>> {
        let t = st.tensor(name)?;
        Ok(t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    };
    let tokens = i64s("tokens")?;
    let prompt_len = i64s("prompt_len")?[0] as usize;
    let logits = st.tensor("logits")?;
    let vocab = logits.shape()[1];
    let first = logits.data()[..4 * vocab].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    Ok(Goldens { tokens: tokens.iter().map(|&t| t as u32).collect(), prompt_len, first_logits: first.collect() })
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    if den > 0.0 { (num / den).sqrt() } else { num.sqrt() }
}

/// `steps` steps teacher-forced over `tokens` from a fresh sequence: each step's token and logits.
fn forced(e: &mut Engine, tokens: &[u32]) -> Result<Vec<(u32, Vec<f32>)>> {
    e.reset()?;
    tokens.iter().map(|&t| Ok((e.step(t)?, e.logits()?))).collect()
}

fn step_once(dir: &Path, steps: usize, nvfp4: bool) -> Result<bool> {
    let g = tiny_goldens(dir)?;
    if steps == 0 || steps > g.tokens.len() {
        return Err(format!("--steps {steps}: between 1 and the goldens' {} tokens", g.tokens.len()).into());
    }
    let gpu = open_gpu()?;
    let device = gpu.info().name.clone();
    let (mut e, _) = tiny_engine(gpu, dir, tiny_formats(nvfp4), steps.max(16))?;
    let tokens = &g.tokens[..steps];
    e.release_graph();
    let eager = forced(&mut e, tokens)?;
    // The eager steps loaded every module: the capture may follow.
    e.capture()?;
    let graph = forced(&mut e, tokens)?;
    let differ = eager
        .iter()
        .zip(&graph)
        .position(|((ta, la), (tb, lb))| ta != tb || la.iter().zip(lb).any(|(a, b)| a.to_bits() != b.to_bits()));
    let finite = eager.iter().all(|(_, l)| l.iter().all(|v| v.is_finite()));
    let err = rel_l2(&eager[0].1, &g.first_logits);
    // The bf16 step is within 1e-2 of transformers (tests/gpu_step.rs); NVFP4 within 0.25.
    let bound = if nvfp4 { 0.25 } else { 0.05 };
    let ok = differ.is_none() && finite && err <= bound;
    println!(
        "step-once: {steps} eager steps and {steps} graph replays; tokens and logits {}; position 0 {err:.2e} from the \
         transformers goldens (bound {bound}){}",
        differ.map_or("identical bit for bit".to_owned(), |p| format!("DIFFERENT from position {p}")),
        if finite { "" } else { "; NON-FINITE logits" }
    );
    emit(&json!({
        "mode": "step-once", "device": device, "unix_s": unix_seconds(), "nvfp4": nvfp4, "steps": steps,
        "tokens": eager.iter().map(|(t, _)| t).collect::<Vec<_>>(), "identical": differ.is_none(),
        "first_difference": differ, "finite": finite, "rel_l2_goldens_position_0": err, "ok": ok,
    }));
    Ok(ok)
}

/// Eager then graph over `req`: the comparison's JSON fields and whether they agree.
fn parity(e: &mut Engine, req: Request<'_>) -> Result<(serde_json::Value, bool)> {
    let eager = greedy(e, Mode::Eager, req, &mut |_, _, _| Ok(()))?;
    report_run("eager", &eager);
    let graph = greedy(e, Mode::Graph, req, &mut |_, _, _| Ok(()))?;
    report_run("graph", &graph);
    let tokens = first_mismatch(&eager.tokens, &graph.tokens);
    let logits = first_mismatch(&eager.logits, &graph.logits);
    match tokens {
        None => println!("tokens: identical over {} new tokens", eager.tokens.len()),
        Some(Mismatch { index, first, second }) => println!(
            "tokens: FIRST MISMATCH at new token {index} (the output of step {}): eager {first:?}, graph {second:?}",
            req.prompt.len() - 1 + index
        ),
    }
    match logits {
        None => println!("logits: identical at all {} steps compared", eager.logits.len()),
        Some(Mismatch { first, second, .. }) => {
            let step = first.or(second).map_or(0, |(s, _)| s);
            println!("logits: FIRST MISMATCH at step {step} (position {step})");
        }
    }
    let per_token = |t: &Trace| t.seconds / t.steps as f64 * 1e3;
    let fields = json!({
        "new_tokens": eager.tokens.len(), "steps": eager.steps, "logits_compared": eager.logits.len(),
        "tokens_identical": tokens.is_none(),
        "first_token_mismatch": tokens.map(|m| json!({
            "index": m.index, "step": req.prompt.len() - 1 + m.index, "eager": m.first, "graph": m.second,
        })),
        "logits_identical": logits.is_none(),
        "first_logits_mismatch_step": logits.map(|m| m.first.or(m.second).map_or(0, |(s, _)| s)),
        "eager_s": eager.seconds, "graph_s": graph.seconds,
        "eager_ms_per_step": per_token(&eager), "graph_ms_per_step": per_token(&graph),
        "token_digest": format!("{:016x}", graph.token_digest),
    });
    Ok((fields, tokens.is_none() && logits.is_none()))
}

fn report_run(name: &str, t: &Trace) {
    println!(
        "{name}: {} steps in {:.2} s ({:.3} ms a step, logits digested at {} steps), {} new tokens, digest {:016x}",
        t.steps,
        t.seconds,
        t.seconds / t.steps as f64 * 1e3,
        t.logits.len(),
        t.generated,
        t.token_digest
    );
}

fn merge(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

fn tiny_parity(dir: &Path, tokens: usize, logits_every: usize, nvfp4: bool) -> Result<bool> {
    if tokens == 0 {
        return Err("--tokens 0: generate at least one token".into());
    }
    let gpu = open_gpu()?;
    let device = gpu.info().name.clone();
    let g = tiny_goldens(dir)?;
    let prompt = g.prompt();
    let steps = steps_for(prompt.len(), tokens);
    let (mut e, cfg) = tiny_engine(gpu, dir, tiny_formats(nvfp4), steps)?;
    let sparse = sparse_positions(steps, cfg.indexer_block, cfg.indexer_top_blocks());
    println!(
        "tiny-parity: prompt {} tokens + {tokens} new = {steps} steps; {sparse} positions past the QSA budget of {} \
         tokens",
        prompt.len(),
        cfg.indexer_budget
    );
    let req = Request { prompt, new_tokens: tokens, logits_every, keep_tokens: true };
    let (fields, ok) = parity(&mut e, req)?;
    emit(&merge(
        json!({
            "mode": "tiny-parity", "device": device, "unix_s": unix_seconds(), "nvfp4": nvfp4,
            "prompt_len": prompt.len(), "capacity": e.capacity(), "sparse_positions": sparse, "ok": ok,
        }),
        fields,
    ));
    Ok(ok)
}

fn synthetic_parity(tokens: usize, prompt_len: usize, seed: u64, logits_every: usize) -> Result<bool> {
    if tokens == 0 || prompt_len == 0 {
        return Err("--tokens and --prompt-len must be at least 1".into());
    }
    let cfg = ModelConfig::published();
    let steps = steps_for(prompt_len, tokens);
    let sparse = sparse_positions(steps, cfg.indexer_block, cfg.indexer_top_blocks());
    if sparse == 0 {
        return Err(format!(
            "--prompt-len {prompt_len} + --tokens {tokens} make {steps} positions; QSA's top-k selects blocks only from \
             position {} on (a budget of {} tokens in blocks of {}): ask for more",
            (cfg.indexer_top_blocks() + 1) * cfg.indexer_block - 1,
            cfg.indexer_budget,
            cfg.indexer_block
        )
        .into());
    }
    let gpu = open_gpu()?;
    let device = gpu.info().name.clone();
    let plan = StepPlan::new(&cfg, Formats::NVFP4, steps)?;
    let t0 = Instant::now();
    let model = ModelOnDevice::synthetic(&gpu, &cfg, &plan, seed, &mut |what, done, total| {
        if done == total {
            eprintln!("  {what}: {done}/{total}");
        }
    })?;
    let made_s = t0.elapsed().as_secs_f64();
    let mut e = Engine::new(gpu, plan, model)?;
    let prompt = synthetic_prompt(prompt_len, cfg.vocab_size, seed);
    println!(
        "synthetic-parity: the published geometry (NVFP4) made in {made_s:.1} s; {} launches per token; prompt \
         {prompt_len} + {tokens} new = {steps} steps, {sparse} positions past the QSA budget of {} tokens",
        e.launches_per_token(),
        cfg.indexer_budget
    );
    let req = Request { prompt: &prompt, new_tokens: tokens, logits_every, keep_tokens: true };
    let (fields, ok) = parity(&mut e, req)?;
    emit(&merge(
        json!({
            "mode": "synthetic-parity", "device": device, "unix_s": unix_seconds(), "seed": seed,
            "prompt_len": prompt_len, "capacity": e.capacity(), "sparse_positions": sparse,
            "qsa_budget": cfg.indexer_budget, "made_s": made_s, "ok": ok,
        }),
        fields,
    ));
    Ok(ok)
}

fn sample(e: &Engine, generated: usize, seconds: f64) -> std::result::Result<Sample, String> {
    let (device_free, device_total) = e.gpu().memory().map_err(|x| x.to_string())?;
    Ok(Sample { generated, device_free, device_total, rss_kb: memory::rss_kb()?, seconds })
}

fn print_sample(s: &Sample) {
    println!(
        "  after {:>7} tokens ({:>7.1} s): device {:>7.1} MB free of {:.1} GB; resident set {:>8} kB",
        s.generated,
        s.seconds,
        s.device_free as f64 / 1e6,
        s.device_total as f64 / 1e9,
        s.rss_kb
    );
}

fn tiny_memory(dir: &Path, tokens: usize, every: usize, limits: Limits, eager: bool) -> Result<bool> {
    if every == 0 || tokens < 2 * every {
        return Err(format!("--tokens {tokens} --every {every}: need every > 0 and at least two samples").into());
    }
    let gpu = open_gpu()?;
    let device = gpu.info().name.clone();
    let g = tiny_goldens(dir)?;
    let prompt = g.prompt();
    let steps = steps_for(prompt.len(), tokens);
    let (mut e, _) = tiny_engine(gpu, dir, tiny_formats(false), steps)?;
    let mode = if eager { Mode::Eager } else { Mode::Graph };
    decode::prepare(&mut e, mode, prompt[0])?;
    // Room for every sample up front: the run itself allocates nothing that lives.
    let mut samples = Vec::with_capacity(tokens / every + 2);
    let first = sample(&e, 0, 0.0)?;
    print_sample(&first);
    samples.push(first);
    let req = Request { prompt, new_tokens: tokens, logits_every: 0, keep_tokens: false };
    let trace = greedy(&mut e, mode, req, &mut |e, generated, seconds| {
        if generated % every == 0 {
            let s = sample(e, generated, seconds)?;
            print_sample(&s);
            samples.push(s);
        }
        Ok(())
    })?;
    report_run(mode.name(), &trace);
    let verdict = memory::check_flat(&samples, limits);
    match &verdict {
        Ok(g) => println!(
            "memory flat after {} tokens: device {} bytes, resident set {} kB at most above the baseline over {} samples",
            samples[g.baseline].generated, g.device_bytes, g.rss_kb, g.checked
        ),
        Err(why) => println!("memory NOT flat: {why}"),
    }
    let ok = verdict.is_ok();
    emit(&json!({
        "mode": "tiny-memory", "device": device, "unix_s": unix_seconds(), "launch": mode.name(),
        "new_tokens": trace.generated, "steps": trace.steps, "capacity": e.capacity(), "seconds": trace.seconds,
        "ms_per_step": trace.seconds / trace.steps as f64 * 1e3, "warmup": limits.warmup,
        "device_tolerance_bytes": limits.device_bytes, "rss_tolerance_kb": limits.rss_kb,
        "samples": samples.iter().map(|s| json!({
            "generated": s.generated, "device_free": s.device_free, "device_total": s.device_total,
            "rss_kb": s.rss_kb, "seconds": s.seconds,
        })).collect::<Vec<_>>(),
        "device_growth_bytes": verdict.as_ref().ok().map(|g| g.device_bytes),
        "rss_growth_kb": verdict.as_ref().ok().map(|g| g.rss_kb),
        "failure": verdict.as_ref().err(),
        "token_digest": format!("{:016x}", trace.token_digest), "ok": ok,
    }));
    Ok(ok)
}

fn run(cli: Cli) -> Result<bool> {
    let tiny = cli.tiny.as_deref();
    match cli.mode {
        Command::StepOnce { steps, nvfp4 } => step_once(&tiny_dir(tiny)?, steps, nvfp4),
        Command::TinyParity { tokens, logits_every, nvfp4 } => {
            tiny_parity(&tiny_dir(tiny)?, tokens, logits_every, nvfp4)
        }
        Command::SyntheticParity { tokens, prompt_len, seed, logits_every } => {
            synthetic_parity(tokens, prompt_len, seed, logits_every)
        }
        Command::TinyMemory { tokens, every, warmup, device_tolerance_bytes, rss_tolerance_kb, eager } => {
            let limits = Limits {
                warmup: warmup.unwrap_or(every),
                device_bytes: device_tolerance_bytes,
                rss_kb: rss_tolerance_kb,
            };
            tiny_memory(&tiny_dir(tiny)?, tokens, every, limits, eager)
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("longrun: the check FAILED");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
