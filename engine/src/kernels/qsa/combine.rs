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
/// (its launch dims' `grid[1]`), which sets the partials' layout. The attention fills its splits
/// in order, so the non-empty ones (m_s > −∞) are a prefix, `live` of them; split 0 always holds
/// the current token, so m is finite; of the empty ones only m_s is read, to count them.
///
/// Grid (q_heads, head_dim / (2·THREADS)): one query head and a slice of 2·THREADS dimensions a
/// block, so the work spreads over many SMs (96 blocks at 24 heads of 256 and the default tiles).
/// Each warp first finds its head's m and `live` on its own (lane i takes splits i, i + 32, …,
/// then warp reductions: a fixed order, the same in every warp, no shared memory or barrier).
/// Then the block's WAYS groups of THREADS threads share the live splits (way w takes splits w,
/// w + WAYS, …; thread t of a way holds dimensions 2t and 2t + 1 of the slice and its own copy of
/// Σ), each with its loop unrolled UNROLL times so that many L2 loads are in flight at once, and
/// way 0 adds the ways' sums in order through shared memory: two round trips to L2 a block.
#[kernel(
    block = THREADS * WAYS,
    grid = (q_heads, head_dim / (2 * THREADS)),
    require(head_dim % (2 * THREADS) == 0, THREADS * WAYS <= 1024, q_heads >= 1, splits >= 1),
)]
pub fn qsa_attention_combine(
    #[tile(default = 32, candidates = [32, 64, 128])] THREADS: u32,
    #[tile(default = 16, candidates = [1, 4, 8, 16])] WAYS: u32,
    #[tile(default = 4, candidates = [4, 8])] UNROLL: u32,
    partial_acc: &[f32],
    partial_ml: &[f32],
    gate: &[f32],
    o: &mut [bf16],
    q_heads: u32,
    head_dim: u32,
    splits: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch): nothing before the
    // wait, so only the launch and the block scheduling overlap the predecessor's tail.
    grid_dependency_wait();
    launch_dependents();
    let head = block_idx();
    let way = thread_idx() / THREADS;
    let t = thread_idx() % THREADS;
    let d = 2 * (block_idx_y() * THREADS + t);
    let base = head * splits;
    // The gate does not depend on the partials: its load goes out with the first round.
    let g = head * head_dim + d;
    let gv = load_vec::<f32x2>(gate, g);

    // The head's m and live splits, each warp on its own, in a fixed order.
    let mut m = f32::NEG_INFINITY;
    let mut live = 0.0;
    for s in (lane_id()..splits).step_by(32) {
        let ms = partial_ml[2 * (base + s)];
        m = max(m, ms);
        if ms != f32::NEG_INFINITY {
            live += 1.0;
        }
    }
    m = warp_max(m);
    let live_splits = warp_sum(live) as u32;

    // This way's share of the live splits, two dimensions a thread and Σ, in order.
    let mut o0 = 0.0;
    let mut o1 = 0.0;
    let mut sum = 0.0;
    #[unroll(UNROLL)]
    for s in (way..live_splits).step_by(WAYS) {
        let ml = load_vec::<f32x2>(partial_ml, 2 * (base + s));
        let a = load_vec::<f32x2>(partial_acc, (base + s) * head_dim + d);
        let w = exp(ml.x - m);
        o0 += w * a.x;
        o1 += w * a.y;
        sum += w * ml.y;
    }
    let ways = shared::<f32x4, { THREADS * WAYS }>();
    if WAYS > 1 {
        ways[thread_idx()] = f32x4(o0, o1, sum, 0.0);
        sync_threads();
    }
    if way == 0 {
        #[unroll]
        for w in 1..WAYS {
            let other = ways[w * THREADS + t];
            o0 += other.x;
            o1 += other.y;
            sum += other.z;
        }
        o[g] = (o0 / sum * sigmoid(gv.x)) as bf16;
        o[g + 1] = (o1 / sum * sigmoid(gv.y)) as bf16;
    }
}
