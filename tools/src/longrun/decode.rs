//! Greedy decoding on the engine for a long run: the prompt, then each greedy token fed back,
//! eagerly or through the graph, keeping what the comparison needs (the tokens, a digest of the
//! logits every so many steps) and calling back after every new token (for memory samples).

use std::time::Instant;

use engine::step::Engine;

use super::digest;

/// How the step's launches are enqueued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every launch enqueued one by one, every step.
    Eager,
    /// One CUDA graph replayed per step, captured after a warm-up step.
    Graph,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }
}

/// What one run asks.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub prompt: &'a [u32],
    /// New tokens: the first comes from the prompt's last step, each later one from a step of its
    /// predecessor, so the run takes prompt + new − 1 steps.
    pub new_tokens: usize,
    /// Digest the logits at every this many steps (0: never; the digests are compared across runs).
    pub logits_every: usize,
    /// Keep every new token (for a comparison); else only their running digest and count.
    pub keep_tokens: bool,
}

/// What one run produced.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The new tokens (when kept).
    pub tokens: Vec<u32>,
    /// FNV-1a over every new token, in order.
    pub token_digest: u64,
    pub generated: usize,
    /// (step, digest of that step's logits), steps counted from 0 at the prompt's first token.
    pub logits: Vec<(usize, u64)>,
    pub steps: usize,
    /// Wall time of the steps (the warm-up and capture excluded).
    pub seconds: f64,
}

/// Steps a run of `prompt` tokens and `new_tokens` new ones takes, and so the context it needs.
pub fn steps_for(prompt: usize, new_tokens: usize) -> usize {
    prompt + new_tokens.saturating_sub(1)
}

/// Sets the engine up for `mode` and forgets the sequence: eager drops the graph; graph captures
/// one after a warm-up step of `prompt[0]` when none is held.
pub fn prepare(e: &mut Engine, mode: Mode, warm_up: u32) -> engine::Result<()> {
    match mode {
        Mode::Eager => e.release_graph(),
        Mode::Graph if !e.is_captured() => {
            e.reset()?;
            // Modules load at their first launch, which a capture cannot do.
            e.step(warm_up)?;
            e.capture()?;
        }
        Mode::Graph => {}
    }
    e.reset()
}

/// Runs `req` in `mode` from a fresh sequence, calling `after(engine, generated, seconds)` after
/// each new token, and printing progress on stderr about ten times.
pub fn greedy(
    e: &mut Engine,
    mode: Mode,
    req: Request<'_>,
    after: &mut dyn FnMut(&Engine, usize, f64) -> Result<(), String>,
) -> Result<Trace, String> {
    let Request { prompt, new_tokens, logits_every, keep_tokens } = req;
    if prompt.is_empty() || new_tokens == 0 {
        return Err("a run needs at least one prompt token and one new token".into());
    }
    let err = |what: &str, step: usize, e: engine::Error| format!("{} run, step {step} ({what}): {e}", mode.name());
    prepare(e, mode, prompt[0]).map_err(|x| err("preparing", 0, x))?;
    let total = steps_for(prompt.len(), new_tokens);
    let progress_every = (total / 10).max(1000);
    let mut trace = Trace {
        tokens: Vec::with_capacity(if keep_tokens { new_tokens } else { 0 }),
        token_digest: 0xcbf2_9ce4_8422_2325,
        logits: Vec::with_capacity(total.checked_div(logits_every).map_or(0, |n| n + 1)),
        ..Trace::default()
    };
    let start = Instant::now();
    let mut input = prompt[0];
    for step in 0..total {
        let next = e.step(input).map_err(|x| err("decoding", step, x))?;
        if logits_every > 0 && step % logits_every == 0 {
            let logits = e.logits().map_err(|x| err("reading the logits", step, x))?;
            trace.logits.push((step, digest(&logits)));
        }
        input = if step + 1 < prompt.len() {
            prompt[step + 1]
        } else {
            if keep_tokens {
                trace.tokens.push(next);
            }
            trace.token_digest = (trace.token_digest ^ u64::from(next)).wrapping_mul(0x0000_0100_0000_01b3);
            trace.generated += 1;
            after(e, trace.generated, start.elapsed().as_secs_f64())?;
            next
        };
        if (step + 1) % progress_every == 0 {
            let s = start.elapsed().as_secs_f64();
            eprintln!("  {} {}/{total} steps, {:.1} s, {:.0} steps/s", mode.name(), step + 1, s, (step + 1) as f64 / s);
        }
    }
    // The last step's token is the last new one: it is never fed back.
    trace.steps = total;
    trace.seconds = start.elapsed().as_secs_f64();
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_takes_prompt_plus_new_minus_one_steps() {
        assert_eq!(steps_for(48, 1), 48);
        assert_eq!(steps_for(48, 10_000), 10_047);
        assert_eq!(steps_for(1, 1), 1);
    }
}
