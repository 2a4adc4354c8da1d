//! One run of the binary, in the order that makes every mistake cheap: the options, the model's
//! config and tokenizer, the ids (vocabulary and context checked), the backend, and only then the
//! weights and the decode.

use std::io::Write;

use engine::cuda::Gpu;
use engine::cuda::timing::copy_bandwidth;
use engine::model::config::ModelConfig;
use engine::step::Formats;

use super::backend::Backend;
use super::cli::Cli;
use super::cpu::CpuBackend;
use super::error::{Result, fail};
use super::generate::{Request, generate};
use super::gpu::GpuBackend;
use super::ids::{check_vocab, parse_list, read_ids};
use super::model::ModelSource;
use super::sampler::Sampler;
use super::score::{score, write};
use super::stats::report;
use super::tokenizer::Tokenizer;

/// GB10's LPDDR5X bandwidth in GB/s: the byte floor's default away from a GPU.
const GB10_GBS: f64 = 273.0;

/// The prompt when neither --prompt nor --prompt-ids is given.
pub const DEFAULT_PROMPT: &str = "Once upon a time";

/// What the run does with the model.
#[derive(Clone, Debug, PartialEq)]
enum Job {
    Generate(Request),
    Score { ids: Vec<u32>, out: std::path::PathBuf },
}

/// Which backend runs the step, and why.
enum Choice {
    /// The GPU engine on this device.
    Gpu(Box<Gpu>),
    /// The CPU reference; the reason is shown on stderr.
    Cpu(String),
}

/// The backend for `cli`: the GPU engine when a device opens and --cpu is not given.
fn choose(cli: &Cli) -> Result<Choice> {
    let choice = if cli.cpu {
        Choice::Cpu("--cpu was given".into())
    } else {
        match Gpu::open(0) {
            Ok(gpu) => Choice::Gpu(Box::new(gpu)),
            Err(e) => Choice::Cpu(e.to_string()),
        }
    };
    match choice {
        Choice::Cpu(_) if cli.synthetic => fail(
            "--synthetic (random weights at the published shapes, no checkpoint) runs on the GPU backend only; \
             the CPU reference needs real weights: give --model DIR, or nothing for the embedded tiny model",
        ),
        c => Ok(c),
    }
}

/// The job `cli` asks for, its ids checked against the vocabulary and the context.
fn job(cli: &Cli, cfg: &ModelConfig, tokenizer: &Tokenizer) -> Result<Job> {
    let vocab = cfg.vocab_size;
    if cli.context == 0 {
        return fail("--context 0: the context must hold at least one token");
    }
    if let Some(arg) = &cli.score {
        let Some(out) = cli.out.clone() else {
            return fail("--score needs --out FILE: where to write the logits");
        };
        let ids = read_ids(arg, "--score")?;
        if ids.is_empty() {
            return fail("--score: no token ids to score");
        }
        check_vocab(&ids, vocab, "--score")?;
        if ids.len() > cli.context {
            return fail(format!("--score: {} ids do not fit --context {}", ids.len(), cli.context));
        }
        return Ok(Job::Score { ids, out });
    }
    let prompt = match (&cli.prompt_ids, &cli.prompt) {
        (Some(list), _) => {
            let ids = parse_list(list, "--prompt-ids")?;
            check_vocab(&ids, vocab, "--prompt-ids")?;
            ids
        }
        (None, Some(text)) => tokenizer.encode(text)?,
        (None, None) => tokenizer.encode(DEFAULT_PROMPT)?,
    };
    if prompt.is_empty() {
        return fail("the prompt is empty: give at least one token");
    }
    // A tokenizer.json with more ids than the model (added tokens) could still produce one.
    check_vocab(&prompt, vocab, "--prompt")?;
    let total = prompt.len() + cli.max_new_tokens;
    if total > cli.context {
        return fail(format!(
            "the prompt ({} tokens) and --max-new-tokens {} make {total} tokens, more than --context {}",
            prompt.len(),
            cli.max_new_tokens,
            cli.context
        ));
    }
    let sampler = Sampler::from_options(cli.temperature, cli.top_p, cli.seed)?;
    let eos = if cli.ignore_eos { None } else { cfg.eos_token_id };
    Ok(Job::Generate(Request { prompt, max_new_tokens: cli.max_new_tokens, sampler, eos }))
}

/// Runs the binary.
pub fn run(cli: &Cli) -> Result<()> {
    let choice = choose(cli)?;
    let source = match (&cli.model, cli.synthetic) {
        (Some(_), true) => return fail("--model and --synthetic: give one (a checkpoint, or random weights)"),
        (Some(dir), false) => ModelSource::Dir(dir.clone()),
        (None, true) => ModelSource::Synthetic { seed: cli.seed },
        (None, false) => ModelSource::Embedded,
    };
    let cfg = source.config()?;
    let tokenizer = Tokenizer::for_model(source.dir(), cfg.vocab_size)?;
    let job = job(cli, &cfg, &tokenizer)?;
    eprintln!("model: {}", source.describe());
    eprintln!("text: {}", tokenizer.describe());

    match choice {
        Choice::Gpu(gpu) => {
            let peak_gbs = match cli.peak_gbs {
                Some(p) => p,
                None => copy_bandwidth(&gpu, 1 << 30)? / 1e9,
            };
            let mut backend = match &source {
                ModelSource::Synthetic { seed } => GpuBackend::synthetic(*gpu, &cfg, cli.context, *seed)?,
                _ => {
                    let weights = source.load_weights(&cfg)?;
                    let formats = if cli.nvfp4 { Formats::NVFP4 } else { Formats::BF16 };
                    GpuBackend::from_weights(*gpu, &weights, formats, cli.context)?
                }
            };
            if let Job::Generate(req) = &job {
                backend.set_sampling(&req.sampler)?;
            }
            backend.set_eager(cli.eager);
            backend.set_profile(cli.profile);
            run_job(&mut backend, job, &tokenizer, cli, peak_gbs)?;
            if let Some((p, steps)) = backend.profile() {
                let total: f64 = p.stages.iter().map(|(_, t, _)| t).sum();
                eprintln!(
                    "profile: {steps} eager steps, {:.3} ms/token summed over the stages (events between launch \
                     groups; a graph replay overlaps what these separate):",
                    total * 1e3 / steps.max(1) as f64
                );
                for (stage, t, n) in &p.stages {
                    eprintln!(
                        "  {:<22} {:>9.3} ms/token {:>6.1}%  ({} groups a token)",
                        stage.name(),
                        t * 1e3 / steps.max(1) as f64,
                        100.0 * t / total,
                        n / steps.max(1)
                    );
                }
            }
            Ok(())
        }
        Choice::Cpu(why) => {
            eprintln!("running the CPU reference ({why})");
            for (flag, given) in [("--eager", cli.eager), ("--profile", cli.profile)] {
                if given {
                    eprintln!("note: {flag} is GPU-only and has no effect on the CPU reference");
                }
            }
            if cli.nvfp4 {
                eprintln!("note: --nvfp4 is GPU-only; the CPU reference runs the checkpoint's weights");
            }
            let weights = source.load_weights(&cfg)?;
            run_job(&mut CpuBackend::new(&weights), job, &tokenizer, cli, cli.peak_gbs.unwrap_or(GB10_GBS))
        }
    }
}

/// The job on a ready backend: everything after the backend is built is the same for every one.
fn run_job(backend: &mut dyn Backend, job: Job, tokenizer: &Tokenizer, cli: &Cli, peak_gbs: f64) -> Result<()> {
    eprintln!("backend: {}", backend.name());
    match job {
        Job::Score { ids, out } => run_score(backend, &ids, &out),
        Job::Generate(req) => run_generate(backend, &req, tokenizer, cli, peak_gbs),
    }
}

fn run_score(backend: &mut dyn Backend, ids: &[u32], out: &std::path::Path) -> Result<()> {
    let (logits, secs) = score(backend, ids)?;
    write(out, ids, &logits)?;
    eprintln!(
        "scored {} positions in {:.2} s ({:.3} ms/token); wrote logits [{}, {}] and tokens to {}",
        ids.len(),
        secs,
        secs * 1e3 / ids.len() as f64,
        ids.len(),
        backend.vocab(),
        out.display()
    );
    Ok(())
}

fn run_generate(
    backend: &mut dyn Backend,
    req: &Request,
    tokenizer: &Tokenizer,
    cli: &Cli,
    peak_gbs: f64,
) -> Result<()> {
    eprintln!(
        "prompt: {} tokens; generating up to {} ({})",
        req.prompt.len(),
        req.max_new_tokens,
        match req.sampler {
            Sampler::Greedy => "greedy".to_owned(),
            Sampler::TopP { temperature, top_p, seed } =>
                format!("temperature {temperature}, top-p {top_p}, seed {seed}"),
        }
    );
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut stream, echo) = tokenizer.stream(&req.prompt)?;
    if !cli.print_ids {
        write!(out, "{echo}")?;
        out.flush()?;
    }
    let generated = generate(backend, req, |id| {
        if !cli.print_ids && req.eos != Some(id) {
            write!(out, "{}", stream.push(id)?)?;
            out.flush()?;
        }
        Ok(())
    })?;
    if cli.print_ids {
        let ids: Vec<String> = generated.tokens.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(","))?;
    } else {
        writeln!(out, "{}", stream.finish())?;
    }
    out.flush()?;
    if generated.stopped_at_eos {
        eprintln!(
            "stopped at the end-of-sequence token {} (--ignore-eos goes on)",
            generated.tokens.last().unwrap_or(&0)
        );
    }
    for line in report(&generated.timing, backend.bytes_per_token(), peak_gbs) {
        eprintln!("{line}");
    }
    Ok(())
}
