//! The QSA top-k on the device: the indexer's block scores in, the chosen blocks and their count
//! out, with no host round trip and one launch shape for every context length.

use kernel_macros::kernel;

/// The `top` blocks of `scores` (score descending, then the lower block index first), written to
/// `selected` [top] in ascending block order, with their number in `count[0]`: exactly
/// `reference::qsa::top_blocks(&scores[..n], min(top, n))`.
///
/// `n = min(n_blocks[0], capacity)` is read from device memory, so one captured graph serves every
/// context length. While `n ≤ top` the selection is every block (the dense path) and the slots
/// past `n` hold `u32::MAX`.
///
/// One block. Each score becomes a 32-bit key that orders as `f32::total_cmp` does (sign bit
/// flipped for positives, every bit flipped for negatives), and a radix select finds the key T of
/// the `top`-th largest in at most three passes over the scores, 11, 11 and 10 bits at a time:
/// each pass counts, in a shared histogram (integer shared atomics: the counts do not depend on
/// the order), the keys that match the bits already fixed; a block-wide scan over the bins in
/// descending order finds the bin that holds the `r`-th largest of those keys. A pass that finds
/// the bin holding exactly the `r` keys still wanted ends the search early. A last pass walks the
/// scores in index order, tiles of 16·THREADS, and compacts with a block-wide scan: every key
/// above T, and the first `r` keys equal to T (the lower indices win the ties). The output is
/// thus in ascending block order, and every step is deterministic.
#[kernel(
    block = THREADS,
    grid = 1,
    helpers = "src/kernels/helpers/radix.rs",
    require(capacity % 4 == 0, top >= 1, 2048 % THREADS == 0),
)]
pub fn qsa_top_blocks(
    #[tile(default = 512, candidates = [512, 1024])] THREADS: u32,
    scores: &[f32],
    n_blocks: &[u32],
    selected: &mut [u32],
    count: &mut [u32],
    capacity: u32,
    top: u32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch): nothing before the
    // wait, so only the launch and the block scheduling overlap the predecessor's tail.
    grid_dependency_wait();
    launch_dependents();
    // Bins per pass (2^11) and the bins each thread scans.
    let hist = shared::<u32, 2048>();
    let warp_totals = shared::<u32, { THREADS / 32 }>();
    // The digit search's result: the key bits fixed so far, the keys still wanted among those
    // that match them, and whether that is all of them.
    let found = shared::<u32, 3>();
    let per_thread = 2048 / THREADS;
    let warps = THREADS / 32;
    let tid = thread_idx();
    let n = min(n_blocks[0], capacity);

    if n <= top {
        for i in (tid..top).step_by(THREADS) {
            selected[i] = if i < n { i } else { u32::MAX };
        }
        if tid == 0 {
            count[0] = n;
        }
        return;
    }

    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut wanted = top;
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
        #[unroll(4)]
        for i in (tid * 4..n).step_by(4 * THREADS) {
            let v = load_vec::<f32x4>(scores, i);
            let (b0, b1, b2, b3) = (v.x.to_bits(), v.y.to_bits(), v.z.to_bits(), v.w.to_bits());
            let k0 = order_key(b0);
            let k1 = order_key(b1);
            let k2 = order_key(b2);
            let k3 = order_key(b3);
            if (k0 & mask) == prefix {
                atomic_add(hist, (k0 >> shift) & digit_mask, 1);
            }
            if i + 1 < n && (k1 & mask) == prefix {
                atomic_add(hist, (k1 >> shift) & digit_mask, 1);
            }
            if i + 2 < n && (k2 & mask) == prefix {
                atomic_add(hist, (k2 >> shift) & digit_mask, 1);
            }
            if i + 3 < n && (k3 & mask) == prefix {
                atomic_add(hist, (k3 >> shift) & digit_mask, 1);
            }
        }
        sync_threads();

        find_digit(hist, warp_totals, found, tid, per_thread, prefix, wanted, shift);
        sync_threads();
        prefix = found[0];
        wanted = found[1];
        mask = mask | (digit_mask << shift);
        let exact = found[2];
        // Nobody reads the histogram, the warp totals or `found` of this pass after this barrier.
        sync_threads();
        if exact == 1 {
            break;
        }
    }

    // Compaction in index order: keys above the prefix, and the first `wanted` equal to it.
    // Tiles of 16·THREADS scores, 16 consecutive ones a thread (four 16-byte loads in flight),
    // so that few tiles pay for the block-wide scan. Per thread and per tile, the count above in
    // the low 16 bits and the ties in the high 16 (at most 16·THREADS ≤ 16,384 each).
    let mut above_before = 0u32;
    let mut ties_before = 0u32;
    for base in (0..n).step_by(16 * THREADS) {
        let i0 = base + tid * 16;
        let mut keys = [0u32; 16];
        #[unroll]
        for v in 0..4 {
            let i = i0 + 4 * v;
            let mut x = f32x4(0.0, 0.0, 0.0, 0.0);
            if i < n {
                x = load_vec::<f32x4>(scores, i);
            }
            let (b0, b1, b2, b3) = (x.x.to_bits(), x.y.to_bits(), x.z.to_bits(), x.w.to_bits());
            keys[4 * v] = order_key(b0) & mask;
            keys[4 * v + 1] = order_key(b1) & mask;
            keys[4 * v + 2] = order_key(b2) & mask;
            keys[4 * v + 3] = order_key(b3) & mask;
        }
        let mut own = 0u32;
        #[unroll]
        for e in 0..16 {
            if i0 + e < n {
                if keys[e] > prefix {
                    own += 1;
                } else if keys[e] == prefix {
                    own += 0x10000;
                }
            }
        }
        let mut inclusive = warp_inclusive_sum(own);
        if lane_id() == 31 {
            warp_totals[warp_id()] = inclusive;
        }
        sync_threads();
        let mut tile_total = 0u32;
        for w in 0..warps {
            let t = warp_totals[w];
            if w < warp_id() {
                inclusive += t;
            }
            tile_total += t;
        }
        let exclusive = inclusive - own;
        // Element e's slot: the keys above before it, plus the ties before it that are taken.
        let mut a = above_before + (exclusive & 0xffff);
        let mut t = ties_before + (exclusive >> 16);
        #[unroll]
        for e in 0..16 {
            if i0 + e < n {
                if keys[e] > prefix {
                    selected[a + min(t, wanted)] = i0 + e;
                    a += 1;
                } else if keys[e] == prefix {
                    if t < wanted {
                        selected[a + t] = i0 + e;
                    }
                    t += 1;
                }
            }
        }
        above_before += tile_total & 0xffff;
        ties_before += tile_total >> 16;
        // The next tile rewrites the warp totals.
        sync_threads();
    }
    if tid == 0 {
        count[0] = top;
    }
}
