//! The last kernel of the step: the logits of the vocabulary and the greedy token, in one launch.
//!
//! Why fused: the lm_head is the largest single matrix of the step (248,320 × 2,560: 1.27 GB in
//! bf16, 0.36 GB in NVFP4), so its GEMV must spread over every SM; an argmax as a separate launch
//! would read the 1 MB of logits back and add a launch and its latency to every token. Here each
//! block keeps the best of the rows it computed, and the last block to finish picks among the
//! blocks' bests and writes the token where the next step reads it (the embedding and the PLE
//! ids take `token[0]`), so nothing comes back to the host but the token itself.
//!
//! The choice is exact and deterministic: a logit becomes a 32-bit key that orders like the
//! value (`f32::total_cmp` order; a NaN logit gets the lowest key and is never chosen over a
//! number), and the best is the largest key, the lowest row among equal keys. That order is a
//! maximum over (key, −row) pairs, which is associative and commutative, so how the rows are
//! split over blocks and in which order the blocks finish cannot change the token: ties go to
//! the lower id, as `reference::decoder::argmax` has it.
//!
//! Rows: warp w of block b takes row tiles b·WARPS + w, then every `blocks·WARPS` further
//! (`blocks`, the grid, is the caller's: a few waves of the device's SMs); the NVFP4 kernel can
//! hand the last of its rows out at run time instead (its tile DYNAMIC). Partials
//! `best_key`/`best_row` [blocks] and the counters `counter` [2] (blocks done, and the NVFP4
//! kernel's next ticket; zero before the first launch, put back to zero by the last block) make
//! the launch graph-safe.

use kernel_macros::kernel;

/// logits = W·x for a bf16 lm_head W [vocab, hidden] and x [hidden] (f32 sums), and
/// `token[0]` = the lowest row of the largest logit.
///
/// Each warp owns ROWS consecutive rows at a time; its lanes stream them with 16-byte loads that
/// bypass L1, UNROLL steps in flight, and reduce with shuffles.
#[kernel(
    block = 32 * WARPS,
    grid = blocks,
    helpers = "src/kernels/helpers/argmax.rs",
    require(vocab % ROWS == 0, hidden % 256 == 0, blocks >= 1, blocks <= 65535),
)]
pub fn lm_head_argmax_bf16(
    // Defaults: the H200's fastest of the 27 sets in one autotune run (2026-11-30, after the strided
    // loops were emitted counted, so UNROLL steps are really in flight): 294.0 against 316.8 µs; a
    // second run had two sets 0.6% faster, within the noise.
    #[tile(default = 1, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 16, candidates = [4, 8, 16])] WARPS: u32,
    #[tile(default = 2, candidates = [2, 4, 8])] UNROLL: u32,
    w: &[bf16],
    x: &[bf16],
    logits: &mut [f32],
    best_key: &mut [u32],
    best_row: &mut [u32],
    counter: &mut [u32],
    token: &mut [u32],
    vocab: u32,
    hidden: u32,
    blocks: u32,
) {
    let mut key = 0u32;
    let mut row = u32::MAX;
    for tile in (block_idx() * WARPS + warp_id()..vocab / ROWS).step_by(blocks * WARPS) {
        let row0 = tile * ROWS;
        let mut acc = [0.0; ROWS];
        #[unroll(UNROLL)]
        for k in (lane_id() * 8..hidden).step_by(256) {
            let xv = load_vec::<u32x4>(x, k);
            #[unroll]
            for r in 0..ROWS {
                acc[r] += dot_bf16x8(load_stream::<u32x4>(w, (row0 + r) * hidden + k), xv);
            }
        }
        // Rows come in increasing order, so a strict `>` keeps the lower row on a tie.
        #[unroll]
        for r in 0..ROWS {
            let logit = warp_sum(acc[r]);
            if lane_id() == r % 32 {
                logits[row0 + r] = logit;
            }
            let k = logit_key(logit);
            if k > key || row == u32::MAX {
                key = k;
                row = row0 + r;
            }
        }
    }
    // The block's best, counted in; the last block's warp 0 goes on to choose the token.
    let last = count_block_best(key, row, best_key, best_row, counter, blocks);
    if last == 0 || warp_id() != 0 {
        return;
    }
    write_token(best_key, best_row, counter, token, blocks);
}

/// logits = W·x for an NVFP4 lm_head (`packed` [vocab, hidden/2]: ModelOpt's codes in the paired
/// layout of the architecture, `kernel_dsl::e2m1_pairs`, which the upload applies; `scales` e4m3
/// [vocab, hidden/16], the global scale in `scale2[0]`) and a bf16 x [hidden], and `token[0]` =
/// the lowest row of the largest logit. The paired layout took the H200's launch from 130.6 to
/// 119.1 µs (2026-12-02, BENCHMARKS.md, lm_head section): sm_90 decodes a word's four f16 pairs
/// in 9 integer instructions instead of about 16.
///
/// Every block first stages x in shared memory as the sm_90 and sm_121a FP4 dot products read
/// it (f16 pairs, each 16-value chunk divided by its max|x|, as the MoE router stages x), which
/// costs it 5 KB from L2 (hidden 2560) and saves a launch. A group of LANES lanes takes a row; per
/// step a lane streams 16 FP4 values (8 bytes) and their block scale, sums f16 products per
/// 16-value block and scales them in f32. A lane loads all STEPS steps of its row (hidden ≤
/// 16·LANES·STEPS: the published row is 10 steps at 16 lanes) before its first product, so they
/// are in flight together; a loop that loads each step right before its products keeps one or
/// two in flight (NVIDIA H200, `benches/lm_head.rs`: 126.0 against 136.0 µs, 2026-11-30).
///
/// Loading the next row's steps before this row's products, or the first row's before x is
/// staged, was slower in the same run (146 µs): the lane then holds two rows of codes, 96
/// registers at 16 warps, and the SM runs one block instead of several.
///
/// The last DYNAMIC eighths of the rows go out at run time, a warp's groups at a time, from a
/// ticket counter (`counter[1]`) that the last block puts back to zero: SMs stream at different
/// rates, and a grid that splits every row by block index waits for its slowest SM.
#[kernel(
    block = 32 * WARPS,
    grid = blocks,
    helpers = ["src/kernels/helpers/argmax.rs", "src/kernels/helpers/stage_x.rs"],
    require(
        32 % LANES == 0,
        hidden % (16 * LANES) == 0,
        hidden <= 4096,
        hidden <= 16 * LANES * STEPS,
        vocab % (32 / LANES) == 0,
        blocks >= 1,
        blocks <= 65535,
    ),
)]
pub fn lm_head_argmax_nvfp4(
    #[tile(default = 16, candidates = [8, 16, 32])] LANES: u32,
    // Defaults: the H200's fastest of the sweep (2026-11-30, 19:20 UTC call): 4 warps 126.0 µs,
    // 8 warps 129.8, 16 warps 131.3.
    #[tile(default = 4, candidates = [4, 8, 16])] WARPS: u32,
    // Steps of a row a lane holds: 10 is the published row at 16 lanes.
    #[tile(default = 10, candidates = [10, 16])] STEPS: u32,
    // Eighths of the rows handed out at run time, a warp's groups at a time (0: every row
    // assigned by the block's index). One NVIDIA H100, 2026-12-06: 136.99 µs at 0 (p90 154.46),
    // 135.07 at 1 (p90 135.52), 141.09 at 2, 158.27 at 4 (the atomics on one counter cost more
    // than the balance gains once many rows go through it); the step 0.5% / 0.3% faster at 1k /
    // 32k at 1 (three paired rounds), when the first ticket was taken at the start and spilled
    // on sm_121a. Taken at the top of the row before it (no spill), 2026-12-06 16:03 UTC on
    // another H100: 134.85 against 139.84 µs alone, but the step 0.1% / 0.2% slower at 1 (two
    // paired rounds), so the default stays 0 (BENCHMARKS.md, lm_head section).
    #[tile(default = 0, candidates = [0, 1, 2, 4])] DYNAMIC: u32,
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    x: &[bf16],
    logits: &mut [f32],
    best_key: &mut [u32],
    best_row: &mut [u32],
    counter: &mut [u32],
    token: &mut [u32],
    vocab: u32,
    hidden: u32,
    blocks: u32,
) {
    // x staged: eight words (eight f16 pairs) per 16-value chunk, and the chunk's scale.
    let xs = shared::<u32, 2048>();
    let xsc = shared::<f32, 256>();
    for chunk in (thread_idx()..hidden / 16).step_by(32 * WARPS) {
        stage_x_chunk(x, 0, chunk, xs, xsc);
    }
    sync_threads();

    let global_scale = scale2[0];
    let lane = lane_id() % LANES;
    let groups = 32 * WARPS / LANES;
    let mut key = 0u32;
    let mut row = u32::MAX;
    // Rows [0, static_end) go round the grid's groups in turn, each group every `all_groups`-th
    // row from its own index (static_end = vocab with DYNAMIC 0; otherwise whole rounds, so
    // that every group runs the same number). The rest go out at run time, a warp's groups at a
    // time: lane 0 takes the next ticket (`counter[1]`) at the top of the row before it (the
    // last static row, or a ticket row), and a ticket t is the warp's rows
    // static_end + t·(32 / LANES) + its group. A warp whose rows are ahead of time (its SM
    // streams faster, or it drew fewer static rows) takes more tickets; with the whole grid
    // static the last block on the H100 ended 16 µs after the median one (session 43's traced
    // step), and the launch's p90 was 13% above its median (this kernel's bench, 2026-12-06;
    // 0.3% at DYNAMIC 1). The caller holds such a grid to the blocks the device runs at once
    // (`layers::lm_head`). A thread's rows rise,
    // so a strict `>` below keeps the lower row on a tie. Every lane of a warp runs the same
    // rows (vocab, and static_end, are multiples of the warp's groups), so the shuffles below
    // always see the whole warp.
    let all_groups = blocks * groups;
    let static_end = if DYNAMIC == 0 { vocab } else { vocab / all_groups * (8 - DYNAMIC) / 8 * all_groups };
    let warp_rows = 32 / LANES;
    let mut r = block_idx() * groups + thread_idx() / LANES;
    let mut ticket = 0u32;
    if DYNAMIC > 0 && static_end == 0 {
        // Too few rows for a static round: every row goes by ticket.
        if lane_id() == 0 {
            ticket = atomic_add(counter, 1, 1);
        }
        r = shfl(ticket, 0) * warp_rows + lane_id() / LANES;
    }
    while r < vocab {
        // The row after this one comes by ticket: lane 0 takes it now, so that the atomic's
        // round trip hides behind this row's loads.
        let by_ticket = DYNAMIC > 0 && r + all_groups >= static_end;
        if by_ticket && lane_id() == 0 {
            ticket = atomic_add(counter, 1, 1);
        }
        // The row's codes and block scales, every load issued before the first is used. The
        // scales stay e4m3 until they are used: converting one waits for its load, which would
        // hold back the loads behind it (the fill, `scales[0]`, is any e4m3; every entry used is
        // overwritten). Steps past the row load nothing and add nothing.
        let mut codes = [u32x2(0, 0); STEPS];
        let mut block_scale = [scales[0]; STEPS];
        #[unroll]
        for j in 0..STEPS {
            let c = lane * 16 + 16 * LANES * j;
            if c < hidden {
                codes[j] = load_stream::<u32x2>(packed, r * (hidden / 2) + c / 2);
                block_scale[j] = scales[r * (hidden / 16) + c / 16];
            }
        }
        let mut acc = 0.0;
        #[unroll]
        for j in 0..STEPS {
            let c = lane * 16 + 16 * LANES * j;
            if c < hidden {
                let at = c / 2;
                let xa = u32x4(xs[at], xs[at + 1], xs[at + 2], xs[at + 3]);
                let xb = u32x4(xs[at + 4], xs[at + 5], xs[at + 6], xs[at + 7]);
                acc += dot_e2m1x16_paired(codes[j], xa, xb) * ((block_scale[j] as f32) * xsc[c / 16]);
            }
        }
        #[unroll]
        for i in 0..5 {
            let offset = 16 >> i;
            if offset < LANES {
                acc += shfl_xor(acc, offset);
            }
        }
        let logit = acc * global_scale;
        if lane == 0 {
            logits[r] = logit;
        }
        let k = logit_key(logit);
        if k > key || row == u32::MAX {
            key = k;
            row = r;
        }
        r = if by_ticket { static_end + shfl(ticket, 0) * warp_rows + lane_id() / LANES } else { r + all_groups };
    }
    // The block's best, counted in; the last block's warp 0 goes on to choose the token. Every
    // block has taken its last ticket by then, so the last one may put the tickets back too.
    let last = count_block_best(key, row, best_key, best_row, counter, blocks);
    if last == 0 || warp_id() != 0 {
        return;
    }
    if DYNAMIC > 0 && lane_id() == 0 {
        counter[1] = 0;
    }
    write_token(best_key, best_row, counter, token, blocks);
}
