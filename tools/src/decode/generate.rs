//! The generation loop: the prompt decoded token by token, then each new token chosen (the
//! backend's greedy choice, or the host sampler over its logits) and decoded, until
//! --max-new-tokens or the end-of-sequence token.

use std::time::Instant;

use super::backend::Backend;
use super::error::{Result, fail};
use super::sampler::Sampler;
use super::stats::Timing;

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampler: Sampler,
    /// Stop after this token (it is emitted, not decoded); None generates all max_new_tokens.
    pub eos: Option<u32>,
}

/// What came out.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<u32>,
    /// Whether the last token is the end-of-sequence token.
    pub stopped_at_eos: bool,
    pub timing: Timing,
}

/// Runs `req` on `backend` from position 0, calling `on_token` with each new token as it is chosen.
pub fn generate(
    backend: &mut dyn Backend,
    req: &Request,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<Generated> {
    if req.prompt.is_empty() {
        return fail("the prompt is empty: give at least one token");
    }
    backend.reset()?;
    let start = Instant::now();
    for &t in &req.prompt {
        backend.step(t)?;
    }
    let mut timing = Timing { prompt_tokens: req.prompt.len(), prompt: start.elapsed(), ..Timing::default() };

    let mut tokens = Vec::with_capacity(req.max_new_tokens);
    let mut stopped_at_eos = false;
    let start = Instant::now();
    for i in 0..req.max_new_tokens {
        let position = (req.prompt.len() + i) as u64;
        let next = match req.sampler {
            Sampler::Greedy => backend.greedy()?,
            s => backend.sample(&s, position)?,
        };
        tokens.push(next);
        on_token(next)?;
        if req.eos == Some(next) {
            stopped_at_eos = true;
            break;
        }
        if i + 1 < req.max_new_tokens {
            backend.step(next)?;
            timing.steps += 1;
        }
    }
    timing.decode = start.elapsed();
    Ok(Generated { tokens, stopped_at_eos, timing })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend whose logits favour (last token + 1) mod V: greedy counts upwards.
    struct Counter {
        vocab: usize,
        last: Option<u32>,
        steps: Vec<u32>,
    }

    impl Backend for Counter {
        fn name(&self) -> String {
            "counter".into()
        }
        fn vocab(&self) -> usize {
            self.vocab
        }
        fn reset(&mut self) -> Result<()> {
            self.last = None;
            self.steps.clear();
            Ok(())
        }
        fn step(&mut self, token: u32) -> Result<()> {
            if token as usize >= self.vocab {
                return fail("past the vocabulary");
            }
            self.last = Some(token);
            self.steps.push(token);
            Ok(())
        }
        fn logits(&mut self) -> Result<Vec<f32>> {
            let next = (self.last.ok_or("no step")? as usize + 1) % self.vocab;
            Ok((0..self.vocab).map(|i| if i == next { 10.0 } else { 0.0 }).collect())
        }
        fn greedy(&mut self) -> Result<u32> {
            Ok(engine::reference::decoder::argmax(&self.logits()?))
        }
        fn bytes_per_token(&self) -> Option<u64> {
            None
        }
    }

    fn counter() -> Counter {
        Counter { vocab: 16, last: None, steps: vec![] }
    }

    fn req(prompt: &[u32], n: usize, eos: Option<u32>) -> Request {
        Request { prompt: prompt.to_vec(), max_new_tokens: n, sampler: Sampler::Greedy, eos }
    }

    #[test]
    fn greedy_generates_and_decodes_all_but_the_last_token() {
        let mut b = counter();
        let mut seen = vec![];
        let g = generate(&mut b, &req(&[3, 4], 5, None), |t| {
            seen.push(t);
            Ok(())
        })
        .expect("generate");
        assert_eq!(g.tokens, vec![5, 6, 7, 8, 9]);
        assert_eq!(seen, g.tokens);
        assert_eq!(b.steps, vec![3, 4, 5, 6, 7, 8]);
        assert_eq!((g.timing.prompt_tokens, g.timing.steps), (2, 4));
    }

    #[test]
    fn eos_stops_unless_ignored() {
        let g = generate(&mut counter(), &req(&[3], 10, Some(6)), |_| Ok(())).expect("generate");
        assert_eq!((g.tokens, g.stopped_at_eos), (vec![4, 5, 6], true));
        let g = generate(&mut counter(), &req(&[3], 10, None), |_| Ok(())).expect("generate");
        assert_eq!(g.tokens.len(), 10);
    }

    #[test]
    fn zero_new_tokens_runs_only_the_prompt_and_an_empty_prompt_is_refused() {
        let mut b = counter();
        let g = generate(&mut b, &req(&[1, 2], 0, None), |_| Ok(())).expect("generate");
        assert!(g.tokens.is_empty());
        assert_eq!(b.steps, vec![1, 2]);
        assert!(generate(&mut b, &req(&[], 3, None), |_| Ok(())).expect_err("empty").to_string().contains("empty"));
    }

    #[test]
    fn sampling_with_a_dominant_logit_follows_it() {
        let r = Request {
            prompt: vec![0],
            max_new_tokens: 4,
            sampler: Sampler::from_options(Some(0.5), 0.9, 1).expect("sampler"),
            eos: None,
        };
        let g = generate(&mut counter(), &r, |_| Ok(())).expect("generate");
        assert_eq!(g.tokens, vec![1, 2, 3, 4]);
    }
}
