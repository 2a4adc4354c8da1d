//! QSA's gated grouped-query decode attention, read through the indexer's selection.

use kernel_macros::kernel;

/// One token's attention over the selected blocks plus the tail, split over tokens
/// (flash-decoding): each split writes its unnormalised partial result, and
/// [`qsa_attention_combine`](super::combine::qsa_attention_combine) combines the splits in a
/// fixed order and applies σ(gate):
///
/// ```text
/// tokens = [c·b + i for b in selected[..count], i < c] ++ [c·complete ..= position[0]]
/// o_h = σ(gate_h) ⊙ Σ_t softmax_t(q_h · k_t · scale) v_t      (k, v of key/value head h / group)
/// ```
///
/// with c = `block_tokens`, complete = (position + 1) / c and count = min(complete, top), the
/// number of blocks `qsa_top_blocks` chose (its `count[0]`; the position lies inside the context,
/// so the cache's capacity never binds). `q` [q_heads, head_dim] holds the
/// queries after their norm and RoPE; the caches [tokens, kv_heads, head_dim] are bf16, read in
/// place through the selection (no copy of the chosen tokens). Everything that varies per token
/// is read from device memory; the grid is sized for the largest selection (`top` blocks plus a
/// tail), so one graph serves every length.
///
/// Grid (kv_heads·HEAD_BLOCKS, splits of CHUNK tokens); splits = ⌈(top + 1)·c / CHUNK⌉ (the
/// launch dims' `grid[1]`, which the combine takes). With HEAD_BLOCKS = 1 a block serves the
/// q_heads / kv_heads query heads of its key/value head, so each K and V row is read once; with
/// more, those heads are shared among HEAD_BLOCKS blocks, each reading the same rows (the later
/// ones from L2) for fewer heads: the per-head steps after the loads (a head's products, its
/// shuffles, its softmax) are a chain a block walks head after head, and at short contexts only
/// the splits that hold tokens work, one block an SM or fewer, so more blocks a split shorten the
/// chain each walks. One NVIDIA H100, 2026-12-06 (BENCHMARKS.md, QSA section): at the published
/// shape (12 heads a key/value head) 3 blocks of 4 heads took the step 1.2% / 0.6% faster at 1k
/// / 32k in two calls and 1.5% / 1.4% in a third, 2 blocks 0.9% / 0.7%, 4 blocks 0.7% faster at
/// 1k and 1.1% slower at 32k; the attention and its combine alone at 32k 17.23 → 15.24 µs. So 3
/// is the default, lowered where it does not divide the heads
/// ([`QsaTiles::fitting`](crate::layers::qsa::QsaTiles::fitting)). The split's unnormalised output
/// and (m, Σ) go to `partial_acc` [q_heads, splits, head_dim] and `partial_ml` [q_heads, splits,
/// 2]; splits past the selection's end write nothing (the combine reads the first ⌈total /
/// CHUNK⌉, which it counts from the position as this kernel does); split 0 always holds the
/// current token.
///
/// The block is one chain of memory round trips (the selection, then K and V), so every load of a
/// round is issued before the first use of any: once the chunk's rows are known, each thread loads
/// its V values (dimensions 2t and 2t + 1 of every token of the chunk) and each warp its K rows
/// (tokens w, w + WARPS, …; lanes 16- or 8-byte pieces), all in flight together. Tokens past the
/// chunk's end read the chunk's last row and weigh 0. The logits of a head are T = CHUNK / WARPS
/// per-lane partial dots a warp; a reduce-scatter butterfly (halve the set at each of the first
/// log2 T steps, then plain) leaves token t's sum on lanes t·32/T …, in T − 1 + 5 − log2 T
/// shuffles a head (6 at T = 4) instead of 5·T. A warp per head then takes the chunk's softmax
/// numerators (a lane a token) and its (m, Σ), and thread t sums dimensions 2t and 2t + 1 of every
/// head over the chunk. Every sum has a fixed order, so a launch's bits repeat.
#[kernel(
    block = 32 * WARPS,
    grid = (kv_heads * HEAD_BLOCKS, div_ceil(top * block_tokens + block_tokens, CHUNK)),
    helpers = "src/kernels/helpers/qsa.rs",
    require(
        head_dim == 64 * WARPS,
        (q_heads / kv_heads) % HEAD_BLOCKS == 0,
        CHUNK % WARPS == 0,
        CHUNK <= 32,
        kv_heads >= 1,
        q_heads % kv_heads == 0,
        q_heads / kv_heads <= 16,
        block_tokens >= 1,
        top >= 1,
    ),
)]
pub fn qsa_attention(
    #[tile(default = 4, candidates = [2, 4])] WARPS: u32,
    #[tile(default = 16, candidates = [16, 32])] CHUNK: u32,
    #[tile(default = 3, candidates = [1, 2, 3, 4])] HEAD_BLOCKS: u32,
    q: &[f32],
    k_cache: &[bf16],
    v_cache: &[bf16],
    selected: &[u32],
    position: &[u32],
    partial_acc: &mut [f32],
    partial_ml: &mut [f32],
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_tokens: u32,
    top: u32,
    scale: f32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch). Before the wait only
    // the position, which no kernel writes (the host's copy precedes the step): it says how many
    // tokens the selection holds, so a split past them leaves at once, and after the wait the
    // selection's entries are the first round trip, not the count's.
    let c = block_tokens;
    let pos = load_cg(position, 0);
    let complete = (pos + 1) / c;
    let chosen = min(complete, top) * c;
    let total = attended_tokens(pos, c, top);
    let t0 = block_idx_y() * CHUNK;
    if t0 >= total {
        // An empty split (the whole block agrees): the combine counts the live splits from the
        // position as this does, and reads none past them.
        return;
    }
    grid_dependency_wait();
    launch_dependents();
    let qs = shared::<f32, { 16 * 64 * WARPS }>();
    let p = shared::<f32, { 16 * CHUNK }>();
    let rows = shared::<u32, CHUNK>();
    // Dimensions per lane in the key pass: head_dim / 32.
    let per_lane = 2 * WARPS;
    let kvh = block_idx() / HEAD_BLOCKS;
    let split = block_idx_y();
    let splits = grid_dim_y();
    // This block's query heads: `group` of its key/value head's, from head0 (a share of them with
    // HEAD_BLOCKS > 1, each share's block reading the same K and V rows).
    let group = q_heads / kv_heads / HEAD_BLOCKS;
    let head0 = kvh * (q_heads / kv_heads) + (block_idx() % HEAD_BLOCKS) * group;
    let d = 2 * thread_idx();
    let len = min(CHUNK, total - t0);

    // The chunk's cache rows (token i ≥ len takes the last token's row) and the queries, every
    // load before its store (at most 16·64·WARPS query values, eight 16-byte pieces a thread): one
    // round trip. A loop storing each piece as it came took one a piece, and the selection's
    // after them.
    // The selection's entry is only loaded here (a predicated load, its use after the queries'
    // loads): a use in this branch would close the round before them.
    let j = t0 + min(thread_idx(), len - 1);
    let mut pick = 0;
    if thread_idx() < CHUNK && j < chosen {
        pick = selected[j / c];
    }
    // Unconditional loads (a piece past the queries reloads the last one), which ptxas issues
    // together; under a branch each it stored the first pieces before loading the rest.
    /// A thread's 16-byte pieces of the queries: group·head_dim ≤ 16·64·WARPS values over the
    /// block's 4·32·WARPS values a round.
    const PIECES: u32 = (16 * 64 * WARPS) / (4 * 32 * WARPS);
    let mut qv = [f32x4(0.0, 0.0, 0.0, 0.0); PIECES];
    #[unroll]
    for e in 0..PIECES {
        let i = min(4 * thread_idx() + e * 4 * 32 * WARPS, group * head_dim - 4);
        qv[e] = load_vec::<f32x4>(q, head0 * head_dim + i);
    }
    #[unroll]
    for e in 0..PIECES {
        let i = 4 * thread_idx() + e * 4 * 32 * WARPS;
        if i < group * head_dim {
            store_vec(qs, i, qv[e]);
        }
    }
    if thread_idx() < CHUNK {
        let token = if j < chosen { pick * c + j % c } else { complete * c + (j - chosen) };
        rows[thread_idx()] = token * kv_heads * head_dim + kvh * head_dim;
    }
    sync_threads();

    // Every K and V load of the chunk in flight before the first product.
    let mut v0 = [0.0; CHUNK];
    let mut v1 = [0.0; CHUNK];
    #[unroll]
    for i in 0..CHUNK {
        v0[i] = v_cache[rows[i] + d] as f32;
        v1[i] = v_cache[rows[i] + d + 1] as f32;
    }
    let d0 = lane_id() * per_lane;
    let mut keys = [u32x4(0, 0, 0, 0); CHUNK / WARPS];
    #[unroll]
    for t in 0..CHUNK / WARPS {
        let row = rows[warp_id() + t * WARPS];
        if per_lane == 8 {
            keys[t] = load_vec::<u32x4>(k_cache, row + d0);
        } else {
            let v = load_vec::<u32x2>(k_cache, row + d0);
            keys[t] = u32x4(v.x, v.y, 0, 0);
        }
    }

    // Logits: per head, the lane's partial dot with each of the warp's T tokens, then the
    // reduce-scatter butterfly; token t's sum ends on lanes t·32/T … t·32/T + 32/T − 1.
    let tokens_per_warp = CHUNK / WARPS;
    let spread = 32 / tokens_per_warp;
    #[unroll]
    for h in 0..16 {
        if h < group {
            let qa = load_vec::<f32x4>(qs, h * head_dim + d0);
            let mut qb = f32x4(0.0, 0.0, 0.0, 0.0);
            if per_lane == 8 {
                qb = load_vec::<f32x4>(qs, h * head_dim + d0 + 4);
            }
            let mut part = [0.0; CHUNK / WARPS];
            #[unroll]
            for t in 0..CHUNK / WARPS {
                let kv = keys[t];
                let (a, b) = (bf16x2_to_f32x2(kv.x), bf16x2_to_f32x2(kv.y));
                let mut s = a.x * qa.x;
                s = fma(a.y, qa.y, s);
                s = fma(b.x, qa.z, s);
                s = fma(b.y, qa.w, s);
                if per_lane == 8 {
                    let (e, f) = (bf16x2_to_f32x2(kv.z), bf16x2_to_f32x2(kv.w));
                    s = fma(e.x, qb.x, s);
                    s = fma(e.y, qb.y, s);
                    s = fma(f.x, qb.z, s);
                    s = fma(f.y, qb.w, s);
                }
                part[t] = s;
            }
            #[unroll]
            for step in 0..5 {
                let offset = 16 >> step;
                let half = tokens_per_warp >> (step + 1);
                if half >= 1 {
                    // Lanes with this offset's bit keep the upper half of the set.
                    let upper = (lane_id() & offset) != 0;
                    #[unroll]
                    for t in 0..CHUNK / WARPS / 2 {
                        if t < half {
                            let send = if upper { part[t] } else { part[t + half] };
                            let keep = if upper { part[t + half] } else { part[t] };
                            part[t] = keep + shfl_xor(send, offset);
                        }
                    }
                } else {
                    part[0] += shfl_xor(part[0], offset);
                }
            }
            if lane_id() % spread == 0 {
                p[h * CHUNK + warp_id() + (lane_id() / spread) * WARPS] = part[0] * scale;
            }
        }
    }
    sync_threads();

    // The chunk's softmax numerators and (m, Σ): a warp per head, a lane per token.
    for h in (warp_id()..group).step_by(WARPS) {
        let live = lane_id() < len;
        let logit = if live { p[h * CHUNK + lane_id()] } else { f32::NEG_INFINITY };
        let m = warp_max(logit);
        let e = if live { exp(logit - m) } else { 0.0 };
        if lane_id() < CHUNK {
            p[h * CHUNK + lane_id()] = e;
        }
        let sum = warp_sum(e);
        if lane_id() == 0 {
            let slot = (head0 + h) * splits + split;
            partial_ml[2 * slot] = m;
            partial_ml[2 * slot + 1] = sum;
        }
    }
    sync_threads();

    // Values: thread t owns dimensions 2t and 2t + 1 of every head.
    let mut acc0 = [0.0; 16];
    let mut acc1 = [0.0; 16];
    #[unroll]
    for i in (0..CHUNK).step_by(4) {
        #[unroll]
        for h in 0..16 {
            if h < group {
                let w = load_vec::<f32x4>(p, h * CHUNK + i);
                let mut a = fma(w.x, v0[i], acc0[h]);
                let mut b = fma(w.x, v1[i], acc1[h]);
                a = fma(w.y, v0[i + 1], a);
                b = fma(w.y, v1[i + 1], b);
                a = fma(w.z, v0[i + 2], a);
                b = fma(w.z, v1[i + 2], b);
                acc0[h] = fma(w.w, v0[i + 3], a);
                acc1[h] = fma(w.w, v1[i + 3], b);
            }
        }
    }
    #[unroll]
    for h in 0..16 {
        if h < group {
            let at = ((head0 + h) * splits + split) * head_dim + d;
            partial_acc[at] = acc0[h];
            partial_acc[at + 1] = acc1[h];
        }
    }
}
