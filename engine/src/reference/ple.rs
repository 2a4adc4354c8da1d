//! PLE, the per-layer n-gram embedding, one token: hashed table rows, key and value projections,
//! a per-stream gate from the residual streams, a dilated causal conv, added to every stream.

use super::norm::{sigmoid, silu, zc_rms_norm};
use crate::model::config::ModelConfig;
use crate::model::weights::PleWeights;

/// What a PLE layer carries from token to token.
#[derive(Clone, Debug, PartialEq)]
pub struct PleState {
    /// The previous ngram_size − 1 tokens, oldest first (eos before the sequence starts).
    pub history: Vec<u32>,
    /// The previous (kernel − 1)·dilation conv inputs [N], oldest first.
    pub conv_inputs: Vec<Vec<f32>>,
}

impl PleState {
    pub fn new(cfg: &ModelConfig, w: &PleWeights) -> PleState {
        PleState {
            history: w.hash.initial_history(),
            conv_inputs: vec![vec![0.0; cfg.residual_width()]; (cfg.ple_conv_kernel - 1) * cfg.ngram_size],
        }
    }
}

/// The n-gram embedding of `token`: the table rows its ids address, head after head.
pub fn embedding(token: u32, w: &PleWeights, st: &PleState) -> Vec<f32> {
    let ids = w.hash.ids(&st.history, token);
    ids.iter().flat_map(|&id| w.table[id as usize * w.width..(id as usize + 1) * w.width].iter().copied()).collect()
}

/// What PLE adds to the streams for `token`: `gv + SiLU(conv(ZC(gv)))` with `gv_s = σ(a_s)·value`.
pub fn ple(streams: &[f32], token: u32, w: &PleWeights, cfg: &ModelConfig, st: &mut PleState) -> Vec<f32> {
    let (n, d, eps) = (cfg.hc_streams, cfg.hidden_size, cfg.rms_norm_eps);
    let e = embedding(token, w, st);
    w.hash.push(&mut st.history, token);
    let key = zc_rms_norm(&w.key.apply(&e), &w.norm_key, d, eps);
    let value = w.value.apply(&e);
    let query = zc_rms_norm(streams, &w.norm_query, d, eps);
    let mut gated = Vec::with_capacity(n * d);
    for s in 0..n {
        let dot: f64 = (0..d).map(|i| f64::from(key[s * d + i]) * f64::from(query[s * d + i])).sum();
        let a = (dot / (d as f64).sqrt()) as f32;
        // sign(a)·√max(|a|, 1e-6), and 0 stays 0 (Rust's signum(0.0) is 1).
        let a = if a == 0.0 { 0.0 } else { a.signum() * a.abs().max(1e-6).sqrt() };
        let g = sigmoid(a);
        gated.extend(value.iter().map(|&v| g * v));
    }
    let normed = zc_rms_norm(&gated, &w.norm_conv, d, eps);
    // Dilated causal depthwise conv: tap kernel−1 meets the current input, tap j the input
    // dilation·(kernel−1−j) steps back.
    let (kernel, dilation) = (cfg.ple_conv_kernel, cfg.ngram_size);
    let depth = st.conv_inputs.len();
    let out: Vec<f32> = (0..n * d)
        .map(|c| {
            let mut s = f64::from(w.conv[c * kernel + kernel - 1]) * f64::from(normed[c]);
            for j in 0..kernel - 1 {
                let back = dilation * (kernel - 1 - j);
                s += f64::from(w.conv[c * kernel + j]) * f64::from(st.conv_inputs[depth - back][c]);
            }
            gated[c] + silu(s as f32)
        })
        .collect();
    if depth > 0 {
        st.conv_inputs.remove(0);
        st.conv_inputs.push(normed);
    }
    out
}
