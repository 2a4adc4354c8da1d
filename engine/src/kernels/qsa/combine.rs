//! The combine of QSA's split attention: the splits' partials to the gated output.

use kernel_macros::kernel;

/// Combines the `splits` partial results of [`qsa_attention`](super::attention::qsa_attention)
/// in a fixed order and gates them (the flash-decoding combine):
///
/// ```text
/// m   = max_s m_s,   Σ = Σ_s e^(m_s − m)·l_s
/// o_h = σ(gate_h) ⊙ (Σ_s e^(m_s − m)·acc_s) / Σ
/// ```
///
/// over `partial_acc` [q_heads, splits, head_dim] (each split's unnormalised output) and
/// `partial_ml` [q_heads, splits, 2] (its max logit m_s and Σ l_s), `gate` [q_heads, head_dim]
/// the raw gate, `o` [q_heads, head_dim] in bf16. `splits` must be the attention's grid height
/// (its launch dims' `grid[1]`), which sets the partials' layout. An empty split (m_s = −∞) weighs
/// 0; split 0 always holds the current token, so m is finite.
///
/// Grid (q_heads, head_dim / (2·THREADS)): one query head and a slice of 2·THREADS dimensions a
/// block, so the work spreads over many SMs (96 blocks at 24 heads of 256 and the default tiles)
/// instead of one block per key/value head. Each warp first finds its head's m and Σ on its own
/// (lane i takes splits i, i + 32, …, then a warp max and a warp sum: a fixed order, the same in
/// every warp, no shared memory or barrier); then thread t holds dimensions 2t and 2t + 1 of its
/// slice and sums the splits in order, with 8-byte loads of the partials and the weight e^(m_s − m)
/// recomputed from the (warp-uniform) m_s. The split loop has no branch around its loads (the
/// empty-split weight is a select) and is unrolled UNROLL times, so that many L2 loads are in
/// flight at once.
#[kernel(
    block = THREADS,
    grid = (q_heads, head_dim / (2 * THREADS)),
    require(head_dim % (2 * THREADS) == 0, q_heads >= 1, splits >= 1),
)]
pub fn qsa_attention_combine(
    #[tile(default = 32, candidates = [32, 64, 128])] THREADS: u32,
    #[tile(default = 8, candidates = [4, 8, 16])] UNROLL: u32,
    partial_acc: &[f32],
    partial_ml: &[f32],
    gate: &[f32],
    o: &mut [bf16],
    q_heads: u32,
    head_dim: u32,
    splits: u32,
) {
    let head = block_idx();
    let d = 2 * (block_idx_y() * THREADS + thread_idx());
    let base = head * splits;

    // The head's m and Σ, each warp on its own, in a fixed order.
    let mut m = f32::NEG_INFINITY;
    for s in (lane_id()..splits).step_by(32) {
        m = max(m, partial_ml[2 * (base + s)]);
    }
    m = warp_max(m);
    let mut sum = 0.0;
    for s in (lane_id()..splits).step_by(32) {
        let ml = load_vec::<f32x2>(partial_ml, 2 * (base + s));
        let w = if ml.x == f32::NEG_INFINITY { 0.0 } else { exp(ml.x - m) };
        sum += w * ml.y;
    }
    sum = warp_sum(sum);

    // This thread's two dimensions over every split, in order.
    let mut o0 = 0.0;
    let mut o1 = 0.0;
    #[unroll(UNROLL)]
    for s in 0..splits {
        let ml = load_vec::<f32x2>(partial_ml, 2 * (base + s));
        let a = load_vec::<f32x2>(partial_acc, (base + s) * head_dim + d);
        let w = if ml.x == f32::NEG_INFINITY { 0.0 } else { exp(ml.x - m) };
        o0 += w * a.x;
        o1 += w * a.y;
    }
    let g = head * head_dim + d;
    let gv = load_vec::<f32x2>(gate, g);
    o[g] = (o0 / sum * sigmoid(gv.x)) as bf16;
    o[g + 1] = (o1 / sum * sigmoid(gv.y)) as bf16;
}
