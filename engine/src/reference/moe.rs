//! The MoE block, one token: softmax router, top-k, renormalisation, the routed experts and the
//! sigmoid-gated shared expert.

use super::norm::{sigmoid, silu};
use crate::model::config::ModelConfig;
use crate::model::weights::{ExpertWeights, Linear, MoeWeights};

/// `down(SiLU(gate·x) ⊙ up·x)`.
pub fn expert(x: &[f32], w: &ExpertWeights) -> Vec<f32> {
    let g = w.gate.apply(x);
    let u = w.up.apply(x);
    let h: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
    w.down.apply(&h)
}

/// The routed experts and their weights: softmax over all experts, the top k by probability (ties
/// to the lower expert), renormalised when asked.
pub fn route(x: &[f32], router: &Linear, top_k: usize, renormalise: bool) -> Vec<(usize, f32)> {
    let logits = router.apply(x);
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    let probs: Vec<f32> = exp.iter().map(|e| (e / total) as f32).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let chosen: Vec<usize> = order.into_iter().take(top_k).collect();
    let sum: f64 = chosen.iter().map(|&e| f64::from(probs[e])).sum();
    chosen.into_iter().map(|e| (e, if renormalise { (f64::from(probs[e]) / sum) as f32 } else { probs[e] })).collect()
}

pub fn moe(x: &[f32], w: &MoeWeights, cfg: &ModelConfig) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    for (e, weight) in route(x, &w.router, cfg.experts_per_token, cfg.norm_topk_prob) {
        for (acc, v) in y.iter_mut().zip(expert(x, &w.experts[e])) {
            *acc += weight * v;
        }
    }
    let gate = sigmoid(w.shared_gate.apply(x)[0]);
    for (acc, v) in y.iter_mut().zip(expert(x, &w.shared)) {
        *acc += gate * v;
    }
    y
}
