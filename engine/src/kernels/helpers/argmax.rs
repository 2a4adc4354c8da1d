//! Device functions of the greedy choice fused into the lm_head (`lm_head`): what its bf16 and
//! NVFP4 kernels share. A helpers file, not a Rust module: both kernels name it
//! (`#[kernel(..., helpers = "src/kernels/helpers/argmax.rs")]`) and every call is expanded in
//! place. They read the calling kernel's WARPS tile (a block of 32·WARPS threads).

/// A logit's key: its unsigned order is the float's order (a negative float's bits flipped whole,
/// a positive one's sign bit set), and a NaN is 0, below every number.
fn logit_key(logit: f32) -> u32 {
    let bits = logit.to_bits();
    let k = if logit != logit {
        0
    } else if bits >= 0x80000000 {
        !bits
    } else {
        bits | 0x80000000
    };
    k
}

/// Each warp's best of its threads' (`key`, `row`; a thread that took no row holds key 0 and row
/// u32::MAX, which loses to every row taken), then warp 0's over the warps' into `best_key` /
/// `best_row` at this block, published (a fence) before the block is counted in `counter[0]`.
/// Returns 1 in the last of the `blocks` blocks to count in, 0 in the others (every thread of
/// the block the same, after the barrier).
fn count_block_best(
    key: u32,
    row: u32,
    best_key: &mut [u32],
    best_row: &mut [u32],
    counter: &mut [u32],
    blocks: u32,
) -> u32 {
    let warp_keys = shared::<u32, WARPS>();
    let warp_rows = shared::<u32, WARPS>();
    let wk = warp_max_u32(key);
    let wr = warp_min_u32(if key == wk { row } else { u32::MAX });
    if lane_id() == 0 {
        warp_keys[warp_id()] = wk;
        warp_rows[warp_id()] = wr;
    }
    sync_threads();
    let last = shared::<u32, 1>();
    if warp_id() == 0 {
        let k = if lane_id() < WARPS { warp_keys[lane_id()] } else { 0 };
        let r = if lane_id() < WARPS { warp_rows[lane_id()] } else { u32::MAX };
        let bk = warp_max_u32(k);
        let br = warp_min_u32(if k == bk { r } else { u32::MAX });
        if lane_id() == 0 {
            best_key[block_idx()] = bk;
            best_row[block_idx()] = br;
            thread_fence();
            last[0] = if atomic_add(counter, 0, 1) == blocks - 1 { 1 } else { 0 };
        }
    }
    sync_threads();
    last[0]
}

/// The last block's warp 0: the best over the `blocks` blocks' bests, read past L1, into
/// `token[0]` (the lowest row of the largest key), and the counter back to zero for the next
/// launch.
fn write_token(best_key: &[u32], best_row: &[u32], counter: &mut [u32], token: &mut [u32], blocks: u32) {
    let mut fk = 0u32;
    let mut fr = u32::MAX;
    for b in (lane_id()..blocks).step_by(32) {
        let k = load_cg(best_key, b);
        let r = load_cg(best_row, b);
        if k > fk || (k == fk && r < fr) {
            fk = k;
            fr = r;
        }
    }
    let bk = warp_max_u32(fk);
    let br = warp_min_u32(if fk == bk { fr } else { u32::MAX });
    if lane_id() == 0 {
        token[0] = if br == u32::MAX { 0 } else { br };
        counter[0] = 0;
    }
}
