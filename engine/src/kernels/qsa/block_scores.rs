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
/// Each block stages the queries in shared memory; then LANES consecutive lanes take one block
/// key, each lane 16-byte loads of every (4·LANES)-th group of 4 dimensions, with a partial dot
/// product per head in registers (heads ≤ 8, the loop over them unrolled). The partials are
/// summed over the LANES lanes with xor shuffles in a fixed order: deterministic.
///
/// BATCH = 1 loads a lane's pieces in a loop whose load sits behind the heads' branches, so on
/// sm_90 each piece is a round trip of its own (`kernel-inspect qsa_block_scores --sass`: four
/// `G` apart at the published index_dim 128 and LANES 8); at 1k only 16 blocks have keys, and
/// the step waits on the slowest (BENCHMARKS.md, QSA section). BATCH = 4 loads a round of 4
/// pieces into registers before the products (the four loads together in the SASS): built in
/// session 39 and not yet run on a device, so 1 stays the default.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(capacity, WARPS * 32 / LANES),
    require(
        heads >= 1,
        heads <= 8,
        heads * dim <= 1024,
        dim % (4 * LANES) == 0,
        capacity >= 1,
        block_tokens >= 1,
    ),
)]
pub fn qsa_block_scores(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 8, candidates = [4, 8, 16, 32])] LANES: u32,
    #[tile(default = 1, candidates = [1, 4])] BATCH: u32,
    index_q: &[f32],
    block_keys: &[f32],
    position: &[u32],
    scores: &mut [f32],
    n_blocks: &mut [u32],
    heads: u32,
    dim: u32,
    block_tokens: u32,
    capacity: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch): nothing before the
    // wait, so only the launch and the block scheduling overlap the predecessor's tail.
    grid_dependency_wait();
    launch_dependents();
    let q = shared::<f32, 1024>();
    let n = min((position[0] + 1) / block_tokens, capacity);
    if block_idx() == 0 && thread_idx() == 0 {
        n_blocks[0] = n;
    }
    let keys_per_block = WARPS * 32 / LANES;
    // Whole blocks past the last complete block have nothing to do (no barrier follows).
    if block_idx() * keys_per_block >= n {
        return;
    }
    for i in (thread_idx()..heads * dim).step_by(32 * WARPS) {
        q[i] = index_q[i];
    }
    sync_threads();

    let key = block_idx() * keys_per_block + thread_idx() / LANES;
    let sub = thread_idx() % LANES;
    // Lanes of a key past n still shuffle with their group; they read a valid key (block 0's
    // first) and their result is dropped.
    let row = if key < n { key } else { 0 };
    let mut acc = [0.0; 8];
    if BATCH == 1 {
        for c in (sub * 4..dim).step_by(4 * LANES) {
            let k = load_vec::<f32x4>(block_keys, row * dim + c);
            #[unroll]
            for j in 0..8 {
                if j < heads {
                    let qv = load_vec::<f32x4>(q, j * dim + c);
                    acc[j] += k.x * qv.x + k.y * qv.y + k.z * qv.z + k.w * qv.w;
                }
            }
        }
    }
    // BATCH > 1: the lane's pieces of its key (4 dimensions each, every (4·LANES)-th) in rounds
    // of BATCH whose loads are all issued before the first product. A piece past the key's end
    // reloads the lane's first and weighs nothing.
    let pieces = if BATCH > 1 { dim / (4 * LANES) } else { 0 };
    for round in (0..pieces).step_by(BATCH) {
        let mut k = [f32x4(0.0, 0.0, 0.0, 0.0); BATCH];
        #[unroll]
        for p in 0..BATCH {
            let c = if round + p < pieces { (sub + (round + p) * LANES) * 4 } else { sub * 4 };
            k[p] = load_vec::<f32x4>(block_keys, row * dim + c);
        }
        #[unroll]
        for p in 0..BATCH {
            if round + p < pieces {
                let c = (sub + (round + p) * LANES) * 4;
                #[unroll]
                for j in 0..8 {
                    if j < heads {
                        let qv = load_vec::<f32x4>(q, j * dim + c);
                        acc[j] += k[p].x * qv.x + k[p].y * qv.y + k[p].z * qv.z + k[p].w * qv.w;
                    }
                }
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
