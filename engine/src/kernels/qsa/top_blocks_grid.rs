//! The QSA top-k spread over many SMs: the same selection as [`super::top_blocks`], with the
//! scores split into contiguous slices, one per block, and the blocks meeting at software grid
//! barriers between the passes of the radix select.

use kernel_macros::kernel;

/// Words of the global histograms in the scratch buffer: one of 2048 bins per pass.
pub const SCRATCH_HISTOGRAMS: usize = 3 * 2048;
/// The grid barrier's arrival counter (alone in its 128-byte line).
pub const SCRATCH_BARRIER: usize = SCRATCH_HISTOGRAMS;
/// The first of the per-block counts that the compaction publishes (one word per block).
pub const SCRATCH_BLOCK_COUNTS: usize = SCRATCH_HISTOGRAMS + 32;
/// The most blocks a launch may have: the barrier counts 128 per barrier, whatever the grid.
pub const MAX_BLOCKS: usize = 128;
/// The scratch buffer's length in u32 words, for every tile set. It is zeroed once, before the
/// first launch; every launch leaves it as the next one needs it.
pub const SCRATCH_WORDS: usize = SCRATCH_BLOCK_COUNTS + MAX_BLOCKS;

/// The `top` blocks of `scores` (score descending, then the lower block index first), written to
/// `selected` [top] in ascending block order, with their number in `count[0]`: exactly
/// `reference::qsa::top_blocks(&scores[..n], min(top, n))`, as [`super::top_blocks::qsa_top_blocks`]
/// gives it.
///
/// `n = min(n_blocks[0], capacity)` is read from device memory, so one captured graph serves every
/// context length. While `n ≤ top` the selection is every block (the dense path) and the slots
/// past `n` hold `u32::MAX`; the scratch is not touched then.
///
/// BLOCKS blocks, each a contiguous slice of ⌈n / BLOCKS⌉ scores, each thread a run of at most 8
/// consecutive ones (so `capacity ≤ BLOCKS·THREADS·8`: 131,072 at the defaults), loaded once into
/// registers as 32-bit keys that order as `f32::total_cmp` does.
/// A radix select (11, 11 and 10 bits) finds the key T of the `top`-th largest: in each pass every
/// block counts its keys that match the bits fixed so far in a shared histogram, adds its nonzero
/// bins into the pass's global histogram in `scratch` (integer atomics: the sums do not depend on
/// the order), and waits at a grid barrier; then every block reads the whole global histogram and
/// finds, by the same scan, the same digit and the keys still wanted. A pass whose bin holds
/// exactly the keys still wanted ends the search early. The compaction: each block counts its keys
/// above T and equal to T, publishes the two counts, waits at one more barrier, adds the counts of
/// the blocks before it (the ties go to the lowest indices, so to the earlier blocks first) and
/// places its keys with a block-wide scan in index order. Every step is deterministic.
///
/// `scratch` [[`SCRATCH_WORDS`]]: the three global histograms, the barrier counter, the per-block
/// counts. Zero before the first launch; each launch zeroes the histograms it used once no block
/// reads them any more (after its last barrier), and the barrier counter only grows, by 128 per
/// barrier whatever the grid (each block adds 128 / BLOCKS), so that at rest it is a multiple of
/// 128 and a barrier ends when it reaches the next one (u32 wrap-around included: 2³² is a multiple
/// of 128). Graph replays and launches back to back therefore need no reset, with any tile set; but
/// two launches that may run at the same time (on two streams) need a scratch each.
///
/// The grid barrier waits for every block of the launch, so all BLOCKS blocks must be resident at
/// once, or the first ones spin forever waiting for the ones that cannot start. The kernel is
/// `cooperative`: every launch is a cooperative one, which the driver starts only with every block
/// resident (or refuses), under compute-sanitizer too. The caller also checks `BLOCKS ≤
/// LoadedKernel::co_resident_blocks()` when it loads the kernel (occupancy × SMs; a block needs
/// 8.2 KB of shared memory and THREADS threads, so an H200 holds several per SM and a GB10 with 48
/// SMs still ≥ 128).
/// Kernels running beside it on other streams may delay its blocks, not block them for good: they
/// end without waiting for this one.
#[kernel(
    block = THREADS,
    grid = BLOCKS,
    helpers = "src/kernels/helpers/radix.rs",
    require(
        top >= 1,
        2048 % THREADS == 0,
        128 % BLOCKS == 0,
        capacity <= BLOCKS * THREADS * 8,
    ),
    cooperative,
)]
pub fn qsa_top_blocks_grid(
    #[tile(default = 64, candidates = [32, 64, 128])] BLOCKS: u32,
    #[tile(default = 256, candidates = [256, 512])] THREADS: u32,
    scores: &[f32],
    n_blocks: &[u32],
    selected: &mut [u32],
    count: &mut [u32],
    scratch: &mut [u32],
    capacity: u32,
    top: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch): nothing before the
    // wait, so only the launch and the block scheduling overlap the predecessor's tail.
    grid_dependency_wait();
    launch_dependents();
    // Bins per pass (2^11): this block's counts, then a copy of the global histogram.
    let hist = shared::<u32, 2048>();
    let warp_totals = shared::<u32, { THREADS / 32 }>();
    // The digit search's result: the key bits fixed so far, the keys still wanted among those
    // that match them, and whether that is all of them. Later the counts of the blocks before.
    let found = shared::<u32, 3>();
    let per_thread = 2048 / THREADS;
    let warps = THREADS / 32;
    let tid = thread_idx();
    let block = block_idx();
    let n = min(n_blocks[0], capacity);

    if n <= top {
        for i in (block * THREADS + tid..top).step_by(BLOCKS * THREADS) {
            selected[i] = if i < n { i } else { u32::MAX };
        }
        if block == 0 && tid == 0 {
            count[0] = n;
        }
        return;
    }

    // This block's slice and this thread's run in it: at most `keys_max` scores (`require`), in
    // registers (16 spill on sm_121a at 256 threads).
    let keys_max = 8;
    let slice = (n + BLOCKS - 1) / BLOCKS;
    let run = (slice + THREADS - 1) / THREADS;
    let slice_end = min(block * slice + slice, n);
    let begin = min(block * slice + tid * run, slice_end);
    let end = min(begin + run, slice_end);
    let mut keys = [0u32; 8];
    #[unroll]
    for e in 0..keys_max {
        if begin + e < end {
            let b = scores[begin + e].to_bits();
            keys[e] = order_key(b);
        }
    }

    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut wanted = top;
    let mut passes = 0u32;
    for pass in 0..3 {
        let shift = if pass == 0 {
            21
        } else if pass == 1 {
            10
        } else {
            0
        };
        let digit_mask = if pass == 2 { 1023u32 } else { 2047u32 };
        for b in (tid..2048).step_by(THREADS) {
            hist[b] = 0;
        }
        sync_threads();
        #[unroll]
        for e in 0..keys_max {
            if begin + e < end && (keys[e] & mask) == prefix {
                atomic_add(hist, (keys[e] >> shift) & digit_mask, 1);
            }
        }
        sync_threads();
        for b in (tid..2048).step_by(THREADS) {
            let h = hist[b];
            if h != 0 {
                atomic_add(scratch, pass * 2048 + b, h);
            }
        }

        // Grid barrier: every block's counts are in the global histogram past it.
        grid_barrier(scratch, 6144, 128 / BLOCKS);
        #[unroll]
        for j in 0..per_thread {
            hist[tid + j * THREADS] = load_cg(scratch, pass * 2048 + tid + j * THREADS);
        }
        sync_threads();

        find_digit(hist, warp_totals, found, tid, per_thread, prefix, wanted, shift);
        sync_threads();
        prefix = found[0];
        wanted = found[1];
        mask = mask | (digit_mask << shift);
        passes = pass + 1;
        let exact = found[2];
        // Nobody reads the histogram, the warp totals or `found` of this pass after this barrier.
        sync_threads();
        if exact == 1 {
            break;
        }
    }

    // Compaction: this block's keys above the prefix (low 16 bits) and equal to it (high 16; at
    // most 8·THREADS ≤ 4096 each), scanned over the block in index order.
    let mut own = 0u32;
    #[unroll]
    for e in 0..keys_max {
        if begin + e < end {
            let k = keys[e] & mask;
            if k > prefix {
                own += 1;
            } else if k == prefix {
                own += 0x10000;
            }
        }
    }
    let mut inclusive = warp_inclusive_sum(own);
    if lane_id() == 31 {
        warp_totals[warp_id()] = inclusive;
    }
    sync_threads();
    let mut block_total = 0u32;
    for w in 0..warps {
        let t = warp_totals[w];
        if w < warp_id() {
            inclusive += t;
        }
        block_total += t;
    }
    let exclusive = inclusive - own;
    if tid == 0 {
        scratch[6176 + block] = block_total;
    }

    // Grid barrier: every block's counts are published past it.
    grid_barrier(scratch, 6144, 128 / BLOCKS);

    // The keys above and the ties in the blocks before this one: warp 0, each lane up to four
    // blocks (BLOCKS ≤ 128), then a butterfly over the lanes.
    if warp_id() == 0 {
        let mut above = 0u32;
        let mut ties = 0u32;
        #[unroll]
        for j in 0..4 {
            let b = tid + 32 * j;
            if b < block {
                let c = load_cg(scratch, 6176 + b);
                above += c & 0xffff;
                ties += c >> 16;
            }
        }
        let mut lanes = 16u32;
        while lanes > 0 {
            above += shfl_xor(above, lanes);
            ties += shfl_xor(ties, lanes);
            lanes = lanes >> 1;
        }
        if tid == 0 {
            found[0] = above;
            found[1] = ties;
        }
    }
    sync_threads();

    // Element e's slot: the keys above before it, plus the ties before it that are taken.
    let mut a = found[0] + (exclusive & 0xffff);
    let mut t = found[1] + (exclusive >> 16);
    #[unroll]
    for e in 0..keys_max {
        if begin + e < end {
            let k = keys[e] & mask;
            if k > prefix {
                selected[a + min(t, wanted)] = begin + e;
                a += 1;
            } else if k == prefix {
                if t < wanted {
                    selected[a + t] = begin + e;
                }
                t += 1;
            }
        }
    }
    if block == 0 && tid == 0 {
        count[0] = top;
    }
    // Past the last barrier no block reads the histograms: this block zeroes its share of those
    // this launch used, for the next launch.
    for p in 0..passes {
        for i in (tid..2048 / BLOCKS).step_by(THREADS) {
            scratch[p * 2048 + block * (2048 / BLOCKS) + i] = 0;
        }
    }
}
