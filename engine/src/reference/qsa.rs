//! QSA, one token: the indexer (its query, the raw key cache, a pooled key per complete block, the
//! top-k blocks), then gated grouped-query attention over the selected blocks plus the tail.

use super::norm::{sigmoid, zc_rms_norm_shared};
use super::rope::Rope;
use crate::model::config::ModelConfig;
use crate::model::weights::QsaWeights;

/// What a QSA layer carries from token to token: its caches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QsaState {
    /// Per token: keys after norm and RoPE [Hkv·D], values [Hkv·D].
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    /// Per token: the indexer's raw key [d_I] (no norm, no RoPE).
    pub index_keys: Vec<Vec<f32>>,
    /// Per complete block: its pooled key, normed and rotated at the block's first position.
    pub block_keys: Vec<Vec<f32>>,
}

/// Each block's score: Σ_j ReLU(q_j · K̄_b) / √d_I over the index queries q_j (normed and rotated)
/// and the blocks' pooled keys K̄_b, summed in f64.
pub fn block_scores(index_q: &[Vec<f32>], block_keys: &[Vec<f32>]) -> Vec<f32> {
    let di = index_q.first().map_or(0, Vec::len);
    block_keys
        .iter()
        .map(|kb| {
            let relu_sum: f64 = index_q
                .iter()
                .map(|q| q.iter().zip(kb).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>().max(0.0))
                .sum();
            (relu_sum / (di as f64).sqrt()) as f32
        })
        .collect()
}

/// The top `k` of `scores`, by score descending and then by lower index; returned ascending.
pub fn top_blocks(scores: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut chosen: Vec<usize> = order.into_iter().take(k).collect();
    chosen.sort_unstable();
    chosen
}

/// The tokens position `pos` attends to: every token while the complete blocks fit the budget,
/// else the top blocks by score; always the tail of the incomplete block (ending at `pos`).
pub fn selection(cfg: &ModelConfig, pos: usize, block_scores: impl FnOnce() -> Vec<f32>) -> Vec<usize> {
    let c = cfg.indexer_block;
    let complete = (pos + 1) / c;
    let top = cfg.indexer_top_blocks();
    let mut tokens = Vec::new();
    if complete <= top {
        tokens.extend(0..c * complete);
    } else {
        for b in top_blocks(&block_scores(), top) {
            tokens.extend(c * b..c * (b + 1));
        }
    }
    tokens.extend(c * complete..=pos);
    tokens
}

/// Gated grouped-query attention of one token: for query head h (key/value head h / (Hq/Hkv)),
/// softmax(q_h · k_t / √D) over `tokens`, times v_t, each output element times σ(gate). `q` and
/// `gate` are [Hq·D] (q normed and rotated), `keys` and `values` per token [Hkv·D]. Sums in f64.
pub fn gated_attention(
    q: &[f32],
    gate: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    tokens: &[usize],
    hkv: usize,
) -> Vec<f32> {
    let dh = keys[tokens[0]].len() / hkv;
    let hq = q.len() / dh;
    let scale = 1.0 / (dh as f64).sqrt();
    let mut o = Vec::with_capacity(hq * dh);
    for h in 0..hq {
        let qh = &q[h * dh..(h + 1) * dh];
        let kvh = h / (hq / hkv);
        let logits: Vec<f64> = tokens
            .iter()
            .map(|&t| {
                qh.iter()
                    .zip(&keys[t][kvh * dh..(kvh + 1) * dh])
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (i, &g) in gate[h * dh..(h + 1) * dh].iter().enumerate() {
            let v: f64 =
                tokens.iter().zip(&weights).map(|(&t, p)| p * f64::from(values[t][kvh * dh + i])).sum::<f64>() / total;
            o.push(v as f32 * sigmoid(g));
        }
    }
    o
}

/// One step of [`qsa`] with what it decided along the way, for tests that look inside.
#[derive(Clone, Debug, PartialEq)]
pub struct QsaTrace {
    /// The layer's output.
    pub y: Vec<f32>,
    /// The index queries after norm and RoPE [H_I][d_I].
    pub index_q: Vec<Vec<f32>>,
    /// The tokens attended to, as [`selection`] gives them.
    pub tokens: Vec<usize>,
}

pub fn qsa(x: &[f32], pos: usize, w: &QsaWeights, cfg: &ModelConfig, rope: &Rope, st: &mut QsaState) -> Vec<f32> {
    qsa_traced(x, pos, w, cfg, rope, st).y
}

/// [`qsa`], returning its index queries and the tokens it attended to besides its output.
pub fn qsa_traced(
    x: &[f32],
    pos: usize,
    w: &QsaWeights,
    cfg: &ModelConfig,
    rope: &Rope,
    st: &mut QsaState,
) -> QsaTrace {
    let eps = cfg.rms_norm_eps;
    let (hq, hkv, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let (hi, di, c) = (cfg.indexer_heads, cfg.indexer_head_dim, cfg.indexer_block);

    // The indexer.
    let qk = w.index_qk.apply(x);
    let index_q: Vec<Vec<f32>> = (0..hi)
        .map(|j| {
            let mut q = zc_rms_norm_shared(&qk[j * di..(j + 1) * di], &w.index_q_norm, eps);
            rope.apply(&mut q, pos);
            q
        })
        .collect();
    st.index_keys.push(qk[hi * di..(hi + 1) * di].to_vec());
    while st.block_keys.len() < (pos + 1) / c {
        let b = st.block_keys.len();
        let mean: Vec<f32> = (0..di)
            .map(|i| (st.index_keys[c * b..c * (b + 1)].iter().map(|k| f64::from(k[i])).sum::<f64>() / c as f64) as f32)
            .collect();
        let mut key = zc_rms_norm_shared(&mean, &w.index_k_norm, eps);
        rope.apply(&mut key, c * b);
        st.block_keys.push(key);
    }
    let block_keys = &st.block_keys;
    let selected = selection(cfg, pos, || block_scores(&index_q, block_keys));

    // Gated attention.
    let qg = w.q.apply(x);
    let k_new = w.k.apply(x);
    let mut keys = Vec::with_capacity(hkv * dh);
    for j in 0..hkv {
        let mut k = zc_rms_norm_shared(&k_new[j * dh..(j + 1) * dh], &w.k_norm, eps);
        rope.apply(&mut k, pos);
        keys.extend(k);
    }
    st.keys.push(keys);
    st.values.push(w.v.apply(x));

    let mut q = Vec::with_capacity(hq * dh);
    let mut gate = Vec::with_capacity(hq * dh);
    for h in 0..hq {
        let base = h * 2 * dh;
        let mut qh = zc_rms_norm_shared(&qg[base..base + dh], &w.q_norm, eps);
        rope.apply(&mut qh, pos);
        q.extend(qh);
        gate.extend_from_slice(&qg[base + dh..base + 2 * dh]);
    }
    let o = gated_attention(&q, &gate, &st.keys, &st.values, &selected, hkv);
    QsaTrace { y: w.o.apply(&o), index_q, tokens: selected }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_block() {
        assert_eq!(top_blocks(&[1.0, 3.0, 3.0, 2.0, 3.0], 2), [1, 2]);
        assert_eq!(top_blocks(&[0.0; 4], 3), [0, 1, 2]);
    }
}
