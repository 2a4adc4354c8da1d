//! Device functions of the radix selections: the QSA top-k (`qsa::top_blocks`,
//! `qsa::top_blocks_grid`) and the sampler (`sample`). A helpers file, not a Rust module: each
//! kernel names it (`#[kernel(..., helpers = "src/kernels/helpers/radix.rs")]`) and every call is
//! expanded in place when the kernel is lowered (kernel_macros' crate docs say how).

/// The key of an f32 (its bits) whose unsigned order is the float's order: a negative float's
/// bits flipped whole, a positive one's sign bit set.
fn order_key(bits: u32) -> u32 {
    bits ^ (if bits >= 0x80000000 { u32::MAX } else { 0x80000000 })
}

/// The sum of `v` over the lanes of the warp up to this one, this one included (five rounds of
/// shuffles).
fn warp_inclusive_sum(v: u32) -> u32 {
    let mut inclusive = v;
    let mut offset = 1u32;
    while offset < 32 {
        let y = shfl(inclusive, (lane_id() + 32 - offset) & 31);
        if lane_id() >= offset {
            inclusive += y;
        }
        offset = offset << 1;
    }
    inclusive
}

/// A software grid barrier of a cooperative launch. The block's writes, then (after the block
/// barrier) thread 0's fence and its arrival at `scratch[counter]` (`arrival` a block, 128 in
/// all a round) release them; its acquire load of the counter, then the block barrier, order
/// every thread's reads after the other blocks' releases. The counter only grows: a round ends
/// at the next multiple of 128 (a wrapping difference, so u32 wrap-around is fine), and nothing
/// is reset between launches.
fn grid_barrier(scratch: &mut [u32], counter: u32, arrival: u32) {
    sync_threads();
    if thread_idx() == 0 {
        thread_fence();
        let arrived = atomic_add(scratch, counter, arrival);
        let goal = arrived - arrived % 128 + 128;
        while load_acquire(scratch, counter) - goal >= 0x80000000 {}
    }
    sync_threads();
}

/// One pass of the digit search over a 2048-bin histogram of the keys that match the bits fixed
/// so far (`prefix`): thread `tid` owns bins 2047 − tid·per_thread downwards, and an inclusive
/// scan over the threads counts the matching keys in every bin from the top down to the end of
/// its bins. The thread whose bins hold the `wanted`-th key writes `found`: the prefix with this
/// pass's digit (at `shift`) added, how many keys are still wanted among those that match it, and
/// 1 when that is all of them. `warp_totals` holds a u32 a warp; the caller's barrier follows.
fn find_digit(
    hist: &[u32],
    warp_totals: &mut [u32],
    found: &mut [u32],
    tid: u32,
    per_thread: u32,
    prefix: u32,
    wanted: u32,
    shift: u32,
) {
    let top_bin = 2047 - tid * per_thread;
    let mut own = 0u32;
    #[unroll]
    for j in 0..per_thread {
        own += hist[top_bin - j];
    }
    let mut inclusive = warp_inclusive_sum(own);
    if lane_id() == 31 {
        warp_totals[warp_id()] = inclusive;
    }
    sync_threads();
    for w in 0..warp_id() {
        inclusive += warp_totals[w];
    }
    let exclusive = inclusive - own;
    if exclusive < wanted && wanted <= inclusive {
        let mut above = exclusive;
        let mut done = 0u32;
        #[unroll]
        for j in 0..per_thread {
            let bin = top_bin - j;
            let h = hist[bin];
            if done == 0 && above + h >= wanted {
                found[0] = prefix | (bin << shift);
                found[1] = wanted - above;
                found[2] = if h == wanted - above { 1 } else { 0 };
                done = 1;
            }
            above += h;
        }
    }
}
