//! The QSA indexer's block scores: every complete block's pooled key against the index queries.

use kernel_macros::kernel;

/// score[b] = Σ_j ReLU(q_j · K̄_b) / √dim for every complete block b < n, where
/// n = min((position[0] + 1) / block_tokens, capacity) is read from device memory (so one graph
/// serves every context length) and written to `n_blocks[0]` for the top-k that follows.
///
/// `index_q` [heads, dim] holds the index queries after their norm and RoPE, `block_keys`
/// [capacity, dim] the pooled keys, both f32 (the scores decide the selection: keeping them in
/// f32 keeps the selection the reference's). Scores past n are not written.
///
/// Nor are any while n ≤ `top`: the selection is then every complete block whatever its score
/// (`qsa_top_blocks`' dense path reads none), so the launch only writes `n_blocks` and ends. At
/// the published budget (512 blocks of 4 tokens) that is every position below 2,048, where the
/// step used to wait on the few blocks that had keys (at 1k the last of them ended 3.95 µs after
/// its wait against 0.43 for the median block, H200): one H100, 2026-12-06, the step 1.3% faster
/// at 1k (BENCHMARKS.md, QSA section). `top` = 0 computes every complete block's score.
///
/// Each block stages the queries in shared memory; then LANES consecutive lanes take one block
/// key, each lane 16-byte loads of every (4·LANES)-th group of 4 dimensions, with a partial dot
/// product per head in registers (heads ≤ 8, the loop over them unrolled). The partials are
/// summed over the LANES lanes with xor shuffles in a fixed order: deterministic.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(capacity, WARPS * 32 / LANES),
    require(
        heads >= 1,
        heads <= 8,
        heads * dim <= 1024,
        dim % (4 * LANES) == 0,
        // The first batch of a key's loads is issued unconditionally (clamped to its last piece).
        dim >= 4 * LANES,
        capacity >= 1,
        block_tokens >= 1,
    ),
)]
pub fn qsa_block_scores(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 8, candidates = [4, 8, 16, 32])] LANES: u32,
    index_q: &[f32],
    block_keys: &[f32],
    position: &[u32],
    scores: &mut [f32],
    n_blocks: &mut [u32],
    heads: u32,
    dim: u32,
    block_tokens: u32,
    capacity: u32,
    top: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch). Before the wait only
    // the position, which no kernel writes (the host's copy precedes the step): the blocks with
    // nothing to do leave at once, and after the wait the queries are the first round trip.
    let n = min((load_cg(position, 0) + 1) / block_tokens, capacity);
    let keys_per_block = WARPS * 32 / LANES;
    // No score is read while every block is selected; whole blocks past the last complete block
    // have nothing to do (no barrier follows). Block 0 stays to write n, after the wait.
    let idle = n <= top || block_idx() * keys_per_block >= n;
    if idle && block_idx() != 0 {
        return;
    }
    grid_dependency_wait();
    launch_dependents();
    let q = shared::<f32, 1024>();
    if block_idx() == 0 && thread_idx() == 0 {
        n_blocks[0] = n;
    }
    if idle {
        return;
    }
    let key = block_idx() * keys_per_block + thread_idx() / LANES;
    let sub = thread_idx() % LANES;
    // Lanes of a key past n still shuffle with their group; they read a valid key (block 0's
    // first) and their result is dropped.
    let row = if key < n { key } else { 0 };
    // A lane's key loads in batches of four, each batch issued before any of its products (a
    // rolled loop, or an unrolled one whose per-head branches split it, waited for each load in
    // turn: four dependent round trips at the published 128 dimensions and 8 lanes a key), and
    // the first before the queries are staged, so that both go out together. Past the key's end
    // a load repeats its last chunk and is not used.
    let mut kb = [f32x4(0.0, 0.0, 0.0, 0.0); 4];
    let mut base = sub * 4;
    #[unroll]
    for u in 0..4 {
        kb[u] = load_vec::<f32x4>(block_keys, row * dim + min(base + u * 4 * LANES, dim - 4));
    }
    // The queries, every load issued before the first store: unconditional (a thread past the
    // end reloads the last value and does not store it), so one round trip, where the loop over
    // i < heads·dim waited for each load (or each three) before its store.
    /// The query values a thread copies: heads·dim ≤ 1024 over the block.
    const PER_THREAD: u32 = 1024 / (32 * WARPS);
    let mut staged = [0.0; PER_THREAD];
    #[unroll]
    for t in 0..PER_THREAD {
        staged[t] = index_q[min(thread_idx() + t * 32 * WARPS, heads * dim - 1)];
    }
    #[unroll]
    for t in 0..PER_THREAD {
        let i = thread_idx() + t * 32 * WARPS;
        if i < heads * dim {
            q[i] = staged[t];
        }
    }
    sync_threads();

    let mut acc = [0.0; 8];
    while base < dim {
        #[unroll]
        for u in 0..4 {
            let c = base + u * 4 * LANES;
            if c < dim {
                let k = kb[u];
                #[unroll]
                for j in 0..8 {
                    if j < heads {
                        let qv = load_vec::<f32x4>(q, j * dim + c);
                        acc[j] += k.x * qv.x + k.y * qv.y + k.z * qv.z + k.w * qv.w;
                    }
                }
            }
        }
        base += 16 * LANES;
        if base < dim {
            #[unroll]
            for u in 0..4 {
                kb[u] = load_vec::<f32x4>(block_keys, row * dim + min(base + u * 4 * LANES, dim - 4));
            }
        }
    }
    let mut total = 0.0;
    #[unroll]
    for j in 0..8 {
        let mut d = acc[j];
        let mut offset = LANES / 2;
        while offset > 0 {
            d += shfl_xor(d, offset);
            offset = offset >> 1;
        }
        if j < heads {
            total += max(d, 0.0);
        }
    }
    if sub == 0 && key < n {
        scores[key] = total / sqrt(dim as f32);
    }
}
