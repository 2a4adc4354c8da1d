//! The whole decode step on the CPU, one token at a time, with all of its state: the reference
//! every GPU kernel and the engine's step are tested against. Plain and obviously right, not fast.

use std::fmt;

use super::gdn::{GdnState, gdn};
use super::mix::{mix, write};
use super::moe::moe;
use super::ple::{PleState, ple};
use super::qsa::{QsaState, qsa};
use super::rope::Rope;
use crate::model::config::ModelConfig;
use crate::model::weights::{MixerWeights, ModelWeights};

/// The state of one layer's token mixer.
#[derive(Clone, Debug, PartialEq)]
pub enum MixerState {
    Gdn(GdnState),
    Qsa(QsaState),
}

/// A token the model cannot take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenOutOfRange {
    pub token: u32,
    pub vocab_size: usize,
}

impl fmt::Display for TokenOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "token id {} is out of range: the vocabulary has {} tokens", self.token, self.vocab_size)
    }
}

impl std::error::Error for TokenOutOfRange {}

/// A sequence being decoded by the reference.
#[derive(Clone, Debug)]
pub struct Decoder<'w> {
    weights: &'w ModelWeights,
    rope: Rope,
    mixers: Vec<MixerState>,
    ples: Vec<Option<PleState>>,
    position: usize,
    /// Per layer, the last step's router margin: the gap between the k-th and the (k+1)-th
    /// largest router logit. Where it is tiny, an implementation computing in lower precision may
    /// route to another expert, a discrete change the logits cannot be expected to absorb.
    router_margins: Vec<f32>,
}

impl<'w> Decoder<'w> {
    pub fn new(weights: &'w ModelWeights) -> Decoder<'w> {
        let cfg = &weights.config;
        let mut d = Decoder {
            weights,
            rope: Rope::new(cfg.rope_theta, cfg.rotary_dim),
            mixers: vec![],
            ples: vec![],
            position: 0,
            router_margins: vec![],
        };
        d.reset();
        d
    }

    /// Forgets the sequence: every state back to its start.
    pub fn reset(&mut self) {
        let cfg = &self.weights.config;
        self.mixers = self
            .weights
            .layers
            .iter()
            .map(|l| match l.mixer {
                MixerWeights::Gdn(_) => MixerState::Gdn(GdnState::new(cfg)),
                MixerWeights::Qsa(_) => MixerState::Qsa(QsaState::default()),
            })
            .collect();
        self.ples = self.weights.layers.iter().map(|l| l.ple.as_ref().map(|w| PleState::new(cfg, w))).collect();
        self.position = 0;
    }

    pub fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    /// Tokens decoded so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Per layer, the last step's router margin (see the field).
    pub fn router_margins(&self) -> &[f32] {
        &self.router_margins
    }

    /// The state of each layer's token mixer.
    pub fn mixer_states(&self) -> &[MixerState] {
        &self.mixers
    }

    /// Decodes `token` at the next position: the logits [V] for the token after it.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>, TokenOutOfRange> {
        self.step_observed(token, |_, _| {})
    }

    /// [`Decoder::step`], calling `after_layer(l, streams)` with the residual streams [n·d] after
    /// each layer (for locating a disagreement).
    pub fn step_observed(
        &mut self,
        token: u32,
        mut after_layer: impl FnMut(usize, &[f32]),
    ) -> Result<Vec<f32>, TokenOutOfRange> {
        let w = self.weights;
        let cfg = &w.config;
        if token as usize >= cfg.vocab_size {
            return Err(TokenOutOfRange { token, vocab_size: cfg.vocab_size });
        }
        let (n, d, eps, pos) = (cfg.hc_streams, cfg.hidden_size, cfg.rms_norm_eps, self.position);
        let e = &w.embed[token as usize * d..(token as usize + 1) * d];
        let mut streams: Vec<f32> = (0..n).flat_map(|_| e.iter().copied()).collect();
        self.router_margins.clear();
        for (l, layer) in w.layers.iter().enumerate() {
            if let (Some(pw), Some(ps)) = (&layer.ple, &mut self.ples[l]) {
                let add = ple(&streams, token, pw, cfg, ps);
                streams.iter_mut().zip(add).for_each(|(x, a)| *x += a);
            }
            let m = mix(&streams, &layer.attn_mix, n, eps);
            let y = match (&layer.mixer, &mut self.mixers[l]) {
                (MixerWeights::Gdn(gw), MixerState::Gdn(gs)) => gdn(&m.x, gw, cfg, gs),
                (MixerWeights::Qsa(qw), MixerState::Qsa(qs)) => qsa(&m.x, pos, qw, cfg, &self.rope, qs),
                _ => unreachable!("states are made from the weights' layer kinds"),
            };
            write(&mut streams, m.gains.as_deref().unwrap_or(&[]), &y);
            let m = mix(&streams, &layer.mlp_mix, n, eps);
            self.router_margins.push(router_margin(&layer.moe.router.apply(&m.x), cfg.experts_per_token));
            let y = moe(&m.x, &layer.moe, cfg);
            write(&mut streams, m.gains.as_deref().unwrap_or(&[]), &y);
            after_layer(l, &streams);
        }
        let h = mix(&streams, &w.final_mix, n, eps).x;
        self.position += 1;
        Ok(w.lm_head.apply(&h))
    }

    /// Greedy decoding: feeds `prompt`, then `new_tokens` argmax tokens (ties to the lower id).
    pub fn greedy(&mut self, prompt: &[u32], new_tokens: usize) -> Result<Vec<u32>, TokenOutOfRange> {
        let mut logits = Vec::new();
        for &t in prompt {
            logits = self.step(t)?;
        }
        let mut out = Vec::with_capacity(new_tokens);
        for _ in 0..new_tokens {
            let next = argmax(&logits);
            out.push(next);
            logits = self.step(next)?;
        }
        Ok(out)
    }
}

/// The gap between the k-th and the (k+1)-th largest of `logits` (infinite with k or fewer).
fn router_margin(logits: &[f32], k: usize) -> f32 {
    let mut v = logits.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    if v.len() > k { v[k - 1] - v[k] } else { f32::INFINITY }
}

/// The index of the largest value, the lower index on ties.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
