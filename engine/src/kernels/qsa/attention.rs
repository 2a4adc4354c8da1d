//! QSA's gated grouped-query decode attention, read through the indexer's selection.

use kernel_macros::kernel;

/// One token's attention over the selected blocks plus the tail, split over tokens
/// (flash-decoding): each split writes its unnormalised partial result, and
/// [`qsa_attention_combine`](super::combine::qsa_attention_combine) combines the splits in a
/// fixed order and applies σ(gate):
///
/// ```text
/// tokens = [c·b + i for b in selected[..count[0]], i < c] ++ [c·complete ..= position[0]]
/// o_h = σ(gate_h) ⊙ Σ_t softmax_t(q_h · k_t · scale) v_t      (k, v of key/value head h / group)
/// ```
///
/// with c = `block_tokens`, complete = (position + 1) / c. `q` [q_heads, head_dim] holds the
/// queries after their norm and RoPE; the caches [tokens, kv_heads, head_dim] are bf16, read in
/// place through the selection (no copy of the chosen tokens). Everything that varies per token
/// is read from device memory; the grid is sized for the largest selection (`top` blocks plus a
/// tail), so one graph serves every length.
///
/// Grid (kv_heads, splits of CHUNK tokens); splits = ⌈(top + 1)·c / CHUNK⌉ (the launch dims'
/// `grid[1]`, which the combine takes). A block serves the `group` = q_heads / kv_heads query
/// heads of its key/value head, so each K and V row is read once: the queries are staged in
/// shared memory; each warp takes a token, its lanes 16-byte (or 8-byte) loads of the key row,
/// and a warp sum per query head gives the logits; then one thread per head turns its logits
/// into exp(l − m) and keeps (m, Σ) for the chunk; then thread t accumulates dimensions 2t and
/// 2t+1 of every head over the chunk's values. The split's unnormalised output and (m, Σ) go to
/// `partial_acc` [q_heads, splits, head_dim] and `partial_ml` [q_heads, splits, 2], and the
/// block ends there: the combine is a separate launch spread over many blocks (one block per
/// key/value head combining every split serialised the whole kernel on its L2 loads). Splits
/// past the selection's end write an empty partial (m = −∞, Σ = 0); split 0 always holds the
/// current token.
#[kernel(
    block = 32 * WARPS,
    grid = (kv_heads, div_ceil(top * block_tokens + block_tokens, CHUNK)),
    require(
        head_dim == 64 * WARPS,
        kv_heads >= 1,
        q_heads % kv_heads == 0,
        q_heads / kv_heads <= 16,
        block_tokens >= 1,
        top >= 1,
    ),
)]
pub fn qsa_attention(
    #[tile(default = 4, candidates = [2, 4])] WARPS: u32,
    #[tile(default = 16, candidates = [16, 32, 64])] CHUNK: u32,
    q: &[f32],
    k_cache: &[bf16],
    v_cache: &[bf16],
    selected: &[u32],
    count: &[u32],
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
    let qs = shared::<f32, { 16 * 64 * WARPS }>();
    let p = shared::<f32, { 16 * CHUNK }>();
    let rows = shared::<u32, CHUNK>();
    // Dimensions per lane in the key pass: head_dim / 32.
    let per_lane = 2 * WARPS;
    let kvh = block_idx();
    let split = block_idx_y();
    let splits = grid_dim_y();
    let group = q_heads / kv_heads;
    let c = block_tokens;
    let pos = position[0];
    let complete = (pos + 1) / c;
    let chosen = min(count[0], top) * c;
    let total = chosen + (pos + 1 - complete * c);
    let t0 = split * CHUNK;
    let len = if t0 < total { min(CHUNK, total - t0) } else { 0 };
    let row_stride = kv_heads * head_dim;

    for i in (thread_idx()..group * head_dim).step_by(32 * WARPS) {
        qs[i] = q[kvh * group * head_dim + i];
    }
    for i in (thread_idx()..len).step_by(32 * WARPS) {
        let j = t0 + i;
        let token = if j < chosen { selected[j / c] * c + j % c } else { complete * c + (j - chosen) };
        rows[i] = token * row_stride + kvh * head_dim;
    }
    sync_threads();

    // Logits: a warp per token, a warp sum per query head.
    for i in (warp_id()..len).step_by(WARPS) {
        let d0 = lane_id() * per_lane;
        let mut k = [0.0; 2 * WARPS];
        if per_lane == 8 {
            let v = load_vec::<u32x4>(k_cache, rows[i] + d0);
            let (a, b, e, f) = (bf16x2_to_f32x2(v.x), bf16x2_to_f32x2(v.y), bf16x2_to_f32x2(v.z), bf16x2_to_f32x2(v.w));
            k[0] = a.x;
            k[1] = a.y;
            k[2] = b.x;
            k[3] = b.y;
            k[4] = e.x;
            k[5] = e.y;
            k[6] = f.x;
            k[7] = f.y;
        } else {
            let v = load_vec::<u32x2>(k_cache, rows[i] + d0);
            let (a, b) = (bf16x2_to_f32x2(v.x), bf16x2_to_f32x2(v.y));
            k[0] = a.x;
            k[1] = a.y;
            k[2] = b.x;
            k[3] = b.y;
        }
        #[unroll]
        for h in 0..16 {
            if h < group {
                let mut dot = 0.0;
                #[unroll]
                for d in 0..2 * WARPS {
                    dot += k[d] * qs[h * head_dim + d0 + d];
                }
                let s = warp_sum(dot);
                if lane_id() == 0 {
                    p[h * CHUNK + i] = s * scale;
                }
            }
        }
    }
    sync_threads();

    // The chunk's softmax numerators, one thread per head, and its (m, Σ).
    if thread_idx() < group {
        let h = thread_idx();
        let mut m = f32::NEG_INFINITY;
        for i in 0..len {
            m = max(m, p[h * CHUNK + i]);
        }
        let mut sum = 0.0;
        for i in 0..len {
            let e = exp(p[h * CHUNK + i] - m);
            p[h * CHUNK + i] = e;
            sum += e;
        }
        let slot = (kvh * group + h) * splits + split;
        partial_ml[2 * slot] = m;
        partial_ml[2 * slot + 1] = sum;
    }
    sync_threads();

    // Values: thread t owns dimensions 2t and 2t + 1 of every head.
    let d = 2 * thread_idx();
    let mut acc0 = [0.0; 16];
    let mut acc1 = [0.0; 16];
    for i in 0..len {
        let v0 = v_cache[rows[i] + d] as f32;
        let v1 = v_cache[rows[i] + d + 1] as f32;
        #[unroll]
        for h in 0..16 {
            if h < group {
                let w = p[h * CHUNK + i];
                acc0[h] += w * v0;
                acc1[h] += w * v1;
            }
        }
    }
    #[unroll]
    for h in 0..16 {
        if h < group {
            let at = ((kvh * group + h) * splits + split) * head_dim + d;
            partial_acc[at] = acc0[h];
            partial_acc[at + 1] = acc1[h];
        }
    }
}
