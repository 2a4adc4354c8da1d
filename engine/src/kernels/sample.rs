//! Temperature and top-p (nucleus) sampling on the device: the lm_head's f32 logits in, the
//! sampled token out where the next step reads it (`token[0]`), with no host round trip.
//!
//! Why one multi-block kernel: the published vocabulary is 248,320 logits (1 MB), which one SM
//! reads from L2 at best in several µs per pass, and a nucleus needs several passes (the maximum,
//! the mass above a threshold, the pick). Spread over 128 blocks, each thread holds 8 logits in
//! registers for the whole launch, and the passes meet at software grid barriers as in
//! [`crate::kernels::qsa::top_blocks_grid`].
//!
//! The probabilities are integers: a logit's mass is `exp((l − max)/T)` scaled by 2⁴⁰, truncated
//! and capped at 2⁴⁰ − 1 (f32 arithmetic, then u64; the cap keeps both halves of a block's shared
//! bins below 2³², so that they add with native 32-bit atomics), so every sum is exact and
//! independent of the order in which blocks and threads add it: the token depends on the logits, T,
//! top_p, the seed and the position only, not on the schedule. `reference::sample` is the same
//! choice in f64 over a sorted copy; the two differ only through rounding (about 1e-7 of the mass,
//! and tokens whose mass is below 2⁻⁴⁰ of the largest, which the kernel drops).

use kernel_macros::kernel;

/// Histogram regions: select 1's three passes, then select 2's second and third (its first
/// reuses region 0).
pub const REGIONS: usize = 5;
/// u64 words of the `mass` scratch: one 2,048-bin mass histogram per region.
pub const MASS_WORDS: usize = REGIONS * 2048;
/// The grid barrier's arrival counter in `scratch` (after the count histograms, alone in its line).
pub const SCRATCH_BARRIER: usize = REGIONS * 2048;
/// The first of the per-block largest keys (one word per block).
pub const SCRATCH_BLOCK_MAX: usize = SCRATCH_BARRIER + 32;
/// The first of the per-block counts of tied keys at the pick (one word per block).
pub const SCRATCH_BLOCK_TIES: usize = SCRATCH_BLOCK_MAX + MAX_BLOCKS;
/// The most blocks a launch may have: the barrier counts 128 per barrier, whatever the grid.
pub const MAX_BLOCKS: usize = 128;
/// u32 words of the `scratch` buffer: the count histograms, the barrier, the per-block words.
pub const SCRATCH_WORDS: usize = SCRATCH_BLOCK_TIES + MAX_BLOCKS;
/// A probability of 1 in the kernel's fixed point (the largest logit's mass is capped one below it).
pub const MASS_ONE: f64 = 1_099_511_627_776.0;

/// `token[0]` = a token sampled from the logits [vocab] with temperature `temperature` (> 0) and
/// nucleus `top_p` (in (0, 1]), from the uniform of `seed` and `position[0]`.
///
/// Semantics (`reference::sample` has them in f64):
/// - order: the tokens by logit descending, then by id ascending (a total order; a NaN logit is
///   last and has probability 0);
/// - mass: w_i = exp((l_i − l_max)/T), Z = Σ w_i;
/// - nucleus: the smallest prefix of the order whose mass reaches top_p·Z (at least one token;
///   ties at the boundary go to the lower ids first, as the order has it); S its mass;
/// - uniform: r = the high 32 bits of splitmix64 of `seed` + (position + 1)·γ (γ =
///   0x9E3779B97F4A7C15), u = r / 2³²;
/// - pick: the first token of the order whose cumulative mass exceeds u·S.
///
/// `position` is read from device memory, so one captured graph serves every step. In the
/// kernel's fixed point: the cut is ⌈Z·P/2³²⌉ (P = top_p·2³², 2³² at top_p ≥ 1) and at least
/// 1, and the pick is the first token whose cumulative mass reaches ⌊S·r/2³²⌋ + 1. Both are the
/// same question, "where does the cumulative mass in the order first reach X", answered by a
/// radix select over 32-bit keys that order like the logits (11, 11 and 10 bits): each pass
/// builds, per block, a histogram of the mass and the count of the keys that match the bits
/// fixed so far (shared u64/u32 atomics: exact), adds it into the pass's global histogram, and
/// waits at a grid barrier; then every thread of every block scans the global bins from the top
/// and finds the same bin where the cumulative mass reaches X. A bin holding one key ends the
/// search early; after the third pass the bin is one key value, and the mass still wanted picks
/// the j-th of its tied tokens, by id. Select 1 (the nucleus) gives S; select 2 (the pick) reuses
/// select 1's first histogram, and its token's owner writes it (ties: a last barrier shares
/// each block's count of them). Two to seven barriers: the maximum, one to three for select 1,
/// none to two for select 2, and one for ties at the pick. At top_p ≥ 1 the nucleus is every
/// token (S = Z), so select 1 stops at its first pass's scan and select 2 goes on from there.
///
/// If every mass is zero (only with non-finite logits: all NaN or −∞, or a +∞) the token is 0.
///
/// BLOCKS blocks, each a contiguous slice of ⌈vocab / BLOCKS⌉ logits, each thread a run of at
/// most 8 (so `vocab ≤ BLOCKS·THREADS·8`: 262,144 at the defaults).
///
/// `min_blocks = 768 / THREADS`: at 256 threads, three blocks an SM, which 128 co-resident blocks
/// need on the GB10's 48 SMs, so that ptxas keeps every build within 85 registers (the traced one
/// took 106 on sm_121a without the bound). 512 threads a block cannot be co-resident there.
///
/// Scratch: `mass` [[`MASS_WORDS`]] and `scratch` [[`SCRATCH_WORDS`]]. Every launch zeroes the
/// histograms before its first barrier (no block adds to them before it), the per-block words
/// are rewritten by every launch, and the barrier counter only grows, by 128 per barrier (each
/// block adds 128 / BLOCKS), so that at rest it is a multiple of 128 and a barrier ends when it
/// reaches the next one (u32 wrap-around included). Graph replays and launches back to back need
/// no reset; two launches that may run at the same time need a scratch each. All BLOCKS blocks
/// must be resident at once: the kernel is `cooperative`, so every launch is a cooperative one
/// and the driver guarantees it (or refuses the launch), under compute-sanitizer too, where an
/// ordinary launch's blocks need not all start (racecheck stalled at the first barrier); the
/// caller also checks `LoadedKernel::co_resident_blocks` when it loads the kernel.
///
/// Overlaps its predecessor (programmatic dependent launch): nothing is read or written before
/// the grid dependency wait.
#[kernel(
    block = THREADS,
    grid = BLOCKS,
    helpers = "src/kernels/helpers/radix.rs",
    require(vocab >= 1, vocab <= BLOCKS * THREADS * 8, 2048 % THREADS == 0, 128 % BLOCKS == 0, THREADS * 8 <= 4096),
    cooperative,
    min_blocks = 768 / THREADS,
)]
pub fn sample_top_p(
    #[tile(default = 128, candidates = [64, 128])] BLOCKS: u32,
    #[tile(default = 256, candidates = [256, 512])] THREADS: u32,
    logits: &[f32],
    position: &[u32],
    token: &mut [u32],
    mass: &mut [u64],
    scratch: &mut [u32],
    vocab: u32,
    temperature: f32,
    top_p: f32,
    seed: u64,
) {
    // The block's mass histogram, each bin as its low and high halves (bits 0–19 and 20–39).
    let hist_lo = shared::<u32, 2048>();
    let hist_hi = shared::<u32, 2048>();
    let hist_count = shared::<u32, 2048>();
    let warp_mass = shared::<u64, { THREADS / 32 }>();
    let warp_count = shared::<u32, { THREADS / 32 }>();
    // A step's result: the key bits fixed, the bin's count, the block's first tie; the mass
    // still wanted within the bin, the bin's mass.
    let found = shared::<u32, 3>();
    let found_mass = shared::<u64, 2>();
    let per_thread = 2048 / THREADS;
    let warps = THREADS / 32;
    let tid = thread_idx();
    let block = block_idx();

    grid_dependency_wait();

    // This block's share of the histograms, zeroed before the first barrier.
    for i in (tid..10240 / BLOCKS).step_by(THREADS) {
        mass[block * (10240 / BLOCKS) + i] = 0;
        scratch[block * (10240 / BLOCKS) + i] = 0;
    }

    // The uniform's 32 bits: splitmix64 of the seed and the position.
    let mut z = seed + (position[0] as u64 + 1) * 0x9E3779B97F4A7C15;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
    let r = (z ^ (z >> 31)) >> 32;

    // This block's slice and this thread's run in it, as keys that order like the logits (NaN
    // lowest), and the block's largest.
    let slice = (vocab + BLOCKS - 1) / BLOCKS;
    let run = (slice + THREADS - 1) / THREADS;
    let slice_end = min(block * slice + slice, vocab);
    let begin = min(block * slice + tid * run, slice_end);
    let end = min(begin + run, slice_end);
    let mut keys = [0u32; 8];
    let mut best = 0u32;
    #[unroll]
    for e in 0..8 {
        if begin + e < end {
            let l = logits[begin + e];
            let b = l.to_bits();
            keys[e] = if l != l {
                0
            } else if b >= 0x80000000 {
                !b
            } else {
                b | 0x80000000
            };
            best = max(best, keys[e]);
        }
    }
    let wm = warp_max_u32(best);
    if lane_id() == 0 {
        warp_count[warp_id()] = wm;
    }
    sync_threads();
    if tid == 0 {
        let mut m = 0u32;
        for w in 0..warps {
            m = max(m, warp_count[w]);
        }
        scratch[10272 + block] = m;
    }

    // Grid barrier: the zeroed histograms and the blocks' largest keys are published past it.
    grid_barrier(scratch, 10240, 128 / BLOCKS);
    if warp_id() == 0 {
        let mut m = 0u32;
        #[unroll]
        for j in 0..4 {
            let b = lane_id() + 32 * j;
            if b < BLOCKS {
                m = max(m, load_cg(scratch, 10272 + b));
            }
        }
        let gm = warp_max_u32(m);
        if lane_id() == 0 {
            found[0] = gm;
        }
    }
    sync_threads();
    let max_key = found[0];
    let max_logit = f32_from_bits(if max_key >= 0x80000000 { max_key ^ 0x80000000 } else { !max_key });
    let inv_t = 1.0 / temperature;
    let top_bin = 2047 - tid * per_thread;

    // The search: select 1 (`sel` 0: the nucleus, X = the cut) then select 2 (`sel` 1: the pick,
    // X = ⌊S·r/2³²⌋ + 1), each up to three passes. `want`: the mass still wanted among the keys
    // that match the bits fixed so far.
    let mut sel = 0u32;
    let mut pass = 0u32;
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut want = 0u64;
    let mut want0 = 0u64;
    let mut kept = 0u64;
    let mut count = 0u32;
    let mut tie = 0u64;
    while sel < 2 {
        let shift = if pass == 0 {
            21
        } else if pass == 1 {
            10
        } else {
            0
        };
        let digit_mask = if pass == 2 { 1023u32 } else { 2047u32 };
        let region = if pass == 0 { 0 } else { sel * 2 + pass };
        if sel == 0 || pass != 0 {
            // The two bin loops stay rolled: unrolled (their trip count is known since the loops
            // are emitted counted), they cost the registers that made this kernel spill on sm_90.
            #[unroll(1)]
            for b in (tid..2048).step_by(THREADS) {
                hist_lo[b] = 0;
                hist_hi[b] = 0;
                hist_count[b] = 0;
            }
            sync_threads();
            #[unroll]
            for e in 0..8 {
                let k = keys[e];
                if begin + e < end && (k & mask) == prefix {
                    let l = f32_from_bits(if k >= 0x80000000 { k ^ 0x80000000 } else { !k });
                    let q = if k == 0 {
                        0u64
                    } else {
                        min((exp((l - max_logit) * inv_t) * 1099511627776.0) as u64, 0xffffffffff)
                    };
                    let d = (k >> shift) & digit_mask;
                    if q != 0 {
                        // Shared memory has no 64-bit add: a u64 atomic is a compare-and-swap loop
                        // (ATOMS.CAST.SPIN.64 on sm_90), which retries for as long as other lanes
                        // and warps hit the same bin, and most keys share a few bins (the first
                        // pass's bins are exponents; the later passes', for tied logits, one bin).
                        // The mass's bits below and above bit 20 go to two u32 bins with native
                        // adds instead, no carry between them: each part is below 2²⁰ (q < 2⁴⁰),
                        // and a block's keys (at most THREADS·8 ≤ 4096) sum each below 2³², so the
                        // bin's mass is exact, whatever the order.
                        atomic_add(hist_lo, d, (q & 0xfffff) as u32);
                        atomic_add(hist_hi, d, (q >> 20) as u32);
                    }
                    atomic_add(hist_count, d, 1);
                }
            }
            sync_threads();
            #[unroll(1)]
            for b in (tid..2048).step_by(THREADS) {
                let c = hist_count[b];
                if c != 0 {
                    atomic_add(scratch, region * 2048 + b, c);
                    let m = ((hist_hi[b] as u64) << 20) + (hist_lo[b] as u64);
                    if m != 0 {
                        atomic_add(mass, region * 2048 + b, m);
                    }
                }
            }
            // Grid barrier: every block's histogram is in the global one past it.
            grid_barrier(scratch, 10240, 128 / BLOCKS);
        }

        // Thread t owns bins 2047 − t·per_thread downwards; an inclusive scan over the threads
        // (u64 shuffled as two halves) sums the mass in every bin from the top to t's last. The
        // owned bins' masses are kept from the one load, so that the thread which holds the
        // target's bin loads only the bin's count after the scan (it loaded its masses again
        // first: two dependent round trips to L2, behind which every other thread waited). The
        // counts are not loaded with the masses: all 128 blocks read the same bins after each
        // barrier, and reading the counts too (24 KB a block where the masses are 16 KB) made
        // the launch ~2 µs slower in session 56. At eight bins a thread (256 threads, the GB10's
        // tiles) the masses are not kept: in the 85 registers that three blocks an SM leave there,
        // the traced sm_121a build spilled.
        let mut own_mass = [0u64; 8];
        let mut own = 0u64;
        #[unroll]
        for j in 0..per_thread {
            let m = load_cg(mass, region * 2048 + top_bin - j);
            if per_thread <= 4 {
                own_mass[j] = m;
            }
            own += m;
        }
        let mut inclusive = own;
        let mut offset = 1u32;
        while offset < 32 {
            let from = (lane_id() + 32 - offset) & 31;
            let lo = shfl(inclusive as u32, from);
            let hi = shfl((inclusive >> 32) as u32, from);
            if lane_id() >= offset {
                inclusive += ((hi as u64) << 32) | (lo as u64);
            }
            offset = offset << 1;
        }
        if lane_id() == 31 {
            warp_mass[warp_id()] = inclusive;
        }
        sync_threads();
        let mut total = 0u64;
        for w in 0..warps {
            let t = warp_mass[w];
            if w < warp_id() {
                inclusive += t;
            }
            total += t;
        }
        let exclusive = inclusive - own;
        if pass == 0 {
            if sel == 0 {
                if total == 0 {
                    if block == 0 && tid == 0 {
                        token[0] = 0;
                    }
                    return;
                }
                if top_p >= 1.0 {
                    // The nucleus is every token of nonzero mass, S = Z exactly (what select 1
                    // would find: the cumulative mass reaches the cut Z at the last of them), so
                    // select 2 starts now, on this same histogram, and select 1's passes and
                    // barriers are skipped.
                    kept = total;
                    sel = 1;
                }
            }
            if sel == 0 {
                // The cut ⌈Z·P/2³²⌉ in 64-bit halves (Z < 2⁵⁸, P < 2³²), at least 1.
                let p = (top_p * 4294967296.0) as u64;
                let cut = (total >> 32) * p + (((total & 0xffffffff) * p + 0xffffffff) >> 32);
                want = max(cut, 1);
            } else {
                // ⌊S·r/2³²⌋ + 1 ≤ S: the pick lies in the nucleus.
                want = (kept >> 32) * r + (((kept & 0xffffffff) * r) >> 32) + 1;
            }
            want0 = want;
        }
        if exclusive < want && want <= inclusive {
            let mut above = exclusive;
            let mut hit = 0u32;
            #[unroll]
            for j in 0..per_thread {
                let bin = top_bin - j;
                let m = if per_thread <= 4 { own_mass[j] } else { load_cg(mass, region * 2048 + bin) };
                if hit == 0 && above + m >= want {
                    found[0] = prefix | (bin << shift);
                    found[1] = load_cg(scratch, region * 2048 + bin);
                    found_mass[0] = want - above;
                    found_mass[1] = m;
                    hit = 1;
                }
                above += m;
            }
        }
        sync_threads();
        prefix = found[0];
        count = found[1];
        want = found_mass[0];
        let bin_mass = found_mass[1];
        mask = mask | (digit_mask << shift);
        // Nobody reads the warp totals or `found` of this step after this barrier.
        sync_threads();
        if count == 1 || pass == 2 {
            // One key value is left: `count` tokens of equal mass q; the j-th of them (by id)
            // is where the cumulative mass reaches X.
            let q = bin_mass / (count as u64);
            tie = (want + q - 1) / q;
            if sel == 0 {
                kept = want0 - want + tie * q;
                prefix = 0;
                mask = 0;
            }
            sel += 1;
            pass = 0;
        } else {
            pass += 1;
        }
    }

    // The pick: the keys that match `prefix` under `mask` are `count` tokens; the `tie`-th of
    // them by id is the token, and its owner writes it.
    if count == 1 {
        #[unroll]
        for e in 0..8 {
            if begin + e < end && (keys[e] & mask) == prefix {
                token[0] = begin + e;
            }
        }
        return;
    }
    // Tied keys (one value, all bits fixed): count this block's, in id order over the block.
    let mut own = 0u32;
    #[unroll]
    for e in 0..8 {
        if begin + e < end && (keys[e] & mask) == prefix {
            own += 1;
        }
    }
    let mut inclusive = warp_inclusive_sum(own);
    if lane_id() == 31 {
        warp_count[warp_id()] = inclusive;
    }
    sync_threads();
    let mut block_total = 0u32;
    for w in 0..warps {
        let t = warp_count[w];
        if w < warp_id() {
            inclusive += t;
        }
        block_total += t;
    }
    if tid == 0 {
        scratch[10400 + block] = block_total;
    }
    // Grid barrier: every block's count of ties is published past it.
    grid_barrier(scratch, 10240, 128 / BLOCKS);
    // The ties in the blocks before this one: warp 0, each lane up to four blocks.
    if warp_id() == 0 {
        let mut before = 0u32;
        #[unroll]
        for j in 0..4 {
            let b = lane_id() + 32 * j;
            if b < block {
                before += load_cg(scratch, 10400 + b);
            }
        }
        let mut lanes = 16u32;
        while lanes > 0 {
            before += shfl_xor(before, lanes);
            lanes = lanes >> 1;
        }
        if lane_id() == 0 {
            found[2] = before;
        }
    }
    sync_threads();
    let mut t = (found[2] + inclusive - own) as u64;
    #[unroll]
    for e in 0..8 {
        if begin + e < end && (keys[e] & mask) == prefix {
            t += 1;
            if t == tie {
                token[0] = begin + e;
            }
        }
    }
}
