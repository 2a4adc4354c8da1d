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
/// (its launch dims' `grid[1]`), which sets the partials' layout, and `chunk` its CHUNK tile (the
/// tokens a split holds). The attention fills its splits in order, so the non-empty ones are a
/// prefix, `live` of them; split 0 always holds the current token, so m is finite.
///
/// `live` comes from the position: the attention attends to `min((position + 1) / block_tokens,
/// top)` whole blocks (the count `qsa_top_blocks` writes: the position lies inside the context, so
/// the cache's capacity never binds) and the tail of the block being filled, so live = ⌈total /
/// chunk⌉, total from the same `attended_tokens` (helpers/qsa.rs) as the attention's split test,
/// and the splits past it are neither written nor read.
/// The position is the step's metadata, copied from the host before the step's first kernel, so
/// it is read (from L2) before the grid dependency wait, and after the wait the live splits'
/// partials are the only round trip to L2: each way folds its splits into a running (m, Σ, o),
/// rescaling by e^(m_old − m_new) as the online softmax does, and way 0 rescales the ways' sums to
/// the largest m. The kernel used to scan every split's m_s first (a warp each: m and the live
/// count), a dependent round trip of its own while the next kernel's weights streamed; without it,
/// one NVIDIA H100, 2026-12-06 (BENCHMARKS.md, QSA section): the attention and combine alone at 32k
/// 15.41 → 13.71 µs, the step 0.7% faster at 32k and unchanged at 1k.
///
/// Grid (q_heads, head_dim / (2·THREADS)): one query head and a slice of 2·THREADS dimensions a
/// block, so the work spreads over many SMs (96 blocks at 24 heads of 256 and the default tiles).
/// The block's WAYS groups of THREADS threads share the live splits (way w takes splits w, w +
/// WAYS, …; thread t of a way holds dimensions 2t and 2t + 1 of the slice and its own copy of Σ),
/// each with its loop unrolled UNROLL times so that many L2 loads are in flight at once, and way 0
/// adds the ways' sums in order through shared memory. Every order is fixed: a launch's bits
/// repeat.
#[kernel(
    block = THREADS * WAYS,
    grid = (q_heads, head_dim / (2 * THREADS)),
    helpers = "src/kernels/helpers/qsa.rs",
    require(head_dim % (2 * THREADS) == 0, THREADS * WAYS <= 1024, q_heads >= 1, splits >= 1),
)]
pub fn qsa_attention_combine(
    #[tile(default = 32, candidates = [32, 64, 128])] THREADS: u32,
    #[tile(default = 16, candidates = [1, 4, 8, 16])] WAYS: u32,
    #[tile(default = 4, candidates = [4, 8])] UNROLL: u32,
    partial_acc: &[f32],
    partial_ml: &[f32],
    gate: &[f32],
    position: &[u32],
    o: &mut [bf16],
    q_heads: u32,
    head_dim: u32,
    splits: u32,
    chunk: u32,
    block_tokens: u32,
    top: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch). Before the wait only
    // the position, which no kernel writes (the host's copy precedes the step).
    let total = attended_tokens(load_cg(position, 0), block_tokens, top);
    let live_splits = min((total + chunk - 1) / chunk, splits);
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

    // This way's share of the live splits, two dimensions a thread and Σ, in order.
    let mut o0 = 0.0;
    let mut o1 = 0.0;
    let mut sum = 0.0;
    let mut m = f32::NEG_INFINITY;
    // A running max: each live split's m_s is finite, so the first rescale is e^(−∞) = 0 times
    // sums of 0, and never e^(−∞ + ∞).
    #[unroll(UNROLL)]
    for s in (way..live_splits).step_by(WAYS) {
        let ml = load_vec::<f32x2>(partial_ml, 2 * (base + s));
        let a = load_vec::<f32x2>(partial_acc, (base + s) * head_dim + d);
        let m_new = max(m, ml.x);
        let old = exp(m - m_new);
        let w = exp(ml.x - m_new);
        o0 = fma(w, a.x, o0 * old);
        o1 = fma(w, a.y, o1 * old);
        sum = fma(w, ml.y, sum * old);
        m = m_new;
    }
    let ways = shared::<f32x4, { THREADS * WAYS }>();
    if WAYS > 1 {
        ways[thread_idx()] = f32x4(o0, o1, sum, m);
        sync_threads();
    }
    if way == 0 {
        // Each way's sums are relative to its own max: rescale them to the largest (way 0 holds
        // split 0, so it is finite; a way with no split weighs e^(−∞) = 0).
        let mut top_m = m;
        #[unroll]
        for w in 1..WAYS {
            top_m = max(top_m, ways[w * THREADS + t].w);
        }
        let own = exp(m - top_m);
        o0 = o0 * own;
        o1 = o1 * own;
        sum = sum * own;
        #[unroll]
        for w in 1..WAYS {
            let other = ways[w * THREADS + t];
            let f = exp(other.w - top_m);
            o0 = fma(f, other.x, o0);
            o1 = fma(f, other.y, o1);
            sum = fma(f, other.z, sum);
        }
        o[g] = (o0 / sum * sigmoid(gv.x)) as bf16;
        o[g + 1] = (o1 / sum * sigmoid(gv.y)) as bf16;
    }
}
