//! The NVFP4 matrix-vector product, with split-K: the plain projections of the step (GDN's
//! out_proj, QSA's stacked input projection and o_proj) in the format the MoE, the mix and the
//! lm_head already stream.
//!
//! Why a kernel of its own: those three projections were the step's last large bf16 matrices
//! (1.13 GB a token for GDN's out_proj alone at the published shape); in NVFP4 they move 0.5625
//! bytes a value instead of 2, which is what decides the time on a device bound by bytes (the
//! GB10). The products follow the lm_head's: x is staged once per block in shared memory as f16
//! pairs with one scale per 16-value chunk (lined up with the weights' 16-value blocks), and each
//! chunk's 16 products are an f16x2 dot (`dot_e2m1x16`: the hardware conversion on sm_121a, the
//! software decode on sm_90) scaled into an f32 sum.

use kernel_dsl::{KernelDef, LaunchDims};
use kernel_macros::kernel;

/// The row path at the tiles the step runs GDN's out_proj and QSA's o_proj (2560 × 6144) with:
/// two rows a block of four warps, three steps of 512 values a warp, the weights loaded before
/// the wait. NVIDIA H200, 2026-12-01 (BENCHMARKS.md, gemv_nvfp4 section): 5.63 µs a launch alone
/// against 6.73 split four ways, the step 1.7% faster at 1k and 32k, ahead of four rows a block,
/// eight warps, or the loads after the wait. The next kernel (a mix site's down-projection,
/// which keeps to one block an SM) launches after this one's wait (TRIGGER 0; the kernel's docs).
pub const ROW_PATH: gemv_nvfp4::Tiles = gemv_nvfp4::Tiles {
    lanes: 16,
    warps: 4,
    k_split: 1,
    unroll: 4,
    mma: 0,
    early: 8,
    rows: 2,
    steps: 3,
    trigger: 0,
    xbulk: 0,
};

/// The split path's tiles for a wide matrix the row path does not fit: 16 lanes a row, K split
/// four ways so that 2560 rows fill the SMs (H200: 6.83 µs against 14.48 unsplit).
pub const SPLIT_PATH: gemv_nvfp4::Tiles = gemv_nvfp4::Tiles {
    lanes: 16,
    warps: 4,
    k_split: 4,
    unroll: 4,
    mma: 0,
    early: 0,
    rows: 0,
    steps: 3,
    trigger: 1,
    xbulk: 0,
};

/// Tiles that run `args`, starting from `tiles`: those when the launch fits and `ok` accepts
/// it; else the split path (`SPLIT_PATH` in place of a row-path set, whose columns must fit its
/// steps), the split halved and then the lanes a row (16 values each, down to 8) until it fits.
/// None when nothing on that way fits. The layers' plans take their wide projections' tiles
/// through this one fallback.
pub fn fitting(
    tiles: gemv_nvfp4::Tiles,
    args: &gemv_nvfp4::Args,
    ok: impl Fn(&LaunchDims) -> bool,
) -> Option<gemv_nvfp4::Tiles> {
    let fits = |t: &gemv_nvfp4::Tiles| gemv_nvfp4::Kernel::launch_dims(t, args).is_ok_and(|d| ok(&d));
    if fits(&tiles) {
        return Some(tiles);
    }
    let mut v = if tiles.rows > 0 { SPLIT_PATH } else { tiles };
    while !fits(&v) && (v.k_split > 1 || v.lanes > 8) {
        if v.k_split > 1 { v.k_split /= 2 } else { v.lanes /= 2 }
    }
    fits(&v).then_some(v)
}

/// y = W·x for W in ModelOpt's NVFP4 layout (`packed` [rows, cols / 2], the even column in the
/// low nibble; `scales` e4m3 [rows, cols / 16]) and a bf16 vector x [cols]; f32 sums, y rounded
/// to bf16. W may be up to four matrices of `cols` columns stacked, each quantised with its own
/// global scale: rows below `seg1` take `scale2[0]`, below `seg2` `scale2[1]`, below `seg3`
/// `scale2[2]`, the rest `scale2[3]` (one matrix: every `seg` = rows, `scale2` [1]).
///
/// A group of LANES lanes owns one row; a block's 32·WARPS / LANES groups own consecutive rows.
/// Each lane takes 16 columns (8 bytes of codes and one block scale) per step, 16·LANES columns
/// apart, UNROLL steps in flight, loads that bypass L1. With K_SPLIT > 1, blockIdx.y takes one of
/// K_SPLIT column slices (so that a short matrix still fills every SM), each block stages only its
/// slice of x, writes its partial sums to `partial` [K_SPLIT, rows], and the last block of a row
/// tile to arrive (a counter per tile in `counters` [grid.x], zero before the first launch) adds
/// the partials in split order, writes y and puts the counter back to zero: deterministic, and
/// graph replays find the counters as the first launch did.
///
/// MMA = 1 (LANES must be 2, so that a warp owns 16 rows) takes the products to the tensor cores,
/// as `gdn_in_proj_nvfp4`'s MMA path does: x staged as f16 pairs with a power-of-two scale per
/// 128-value segment (exact for bf16 x), the weights decoded to f16 pairs, `mma.m16n8k16` with
/// f32 sums over a warp's 16 rows. Lane l streams 16 bytes (32 values, two block scales) of rows
/// l/4 and l/4 + 8 per segment; B holds lane q's x in column 2q alone, so C's column 2q is lane
/// q's block sum, which it scales by its block scale. The f16x2 dot path issues about 4.2
/// instructions a weight on sm_90 (SASS of the default tiles), this one about 2.8.
///
/// ROWS > 0 takes the row path, for wide matrices (GDN's out_proj and QSA's o_proj, 2560 ×
/// 6144): a block's WARPS warps share its ROWS rows and split their columns, lane t of the block
/// taking values 16t + 512·WARPS·j in step j of STEPS (cols ≤ 512·WARPS·STEPS). Every code and
/// block scale of a lane is loaded at once (before the grid dependency wait with EARLY > 0), x
/// is read as bf16 where it is (L1 after the first warp) or from the block's copy (XBULK, below),
/// the products are f32 on the raw decode (`dot_e2m1x16_raw`, as `gdn_in_proj_nvfp4`'s), and the
/// warps' sums meet in shared memory in warp order: no staging pass, no split-K tail. The split
/// path's block is a chain of round trips (x staged, its weights in UNROLL batches, the partials
/// and the counter); this one has one. H200, 2026-12-01: 5.5 to 5.7 µs a launch against 6.7 for
/// the split path (BENCHMARKS.md), bound by instruction issue now (about seven a weight).
///
/// The row path once had a tensor-core form (ROWS = 16, MMA = 1: one `mma.m16n8k16` tile of 16
/// rows a block, about three sm_90 instructions a weight after the wait against six), built like
/// `gdn_in_proj_nvfp4`'s. It was correct and slower at every shape the step runs (one H100,
/// 2026-12-06: 8.68 to 8.78 µs against 5.63 for 2560 × 6144, 11.54 to 11.90 against 10.32 for
/// QSA's input projection; BENCHMARKS.md, gemv_nvfp4 section), so it was removed.
///
/// EARLY = 8 (the f32-sum path) issues a lane's first eight steps of codes and block scales
/// before the grid dependency wait: the weights do not depend on the predecessor, so while it
/// ends they are on their way. In the H200 step's timeline (BENCHMARKS.md, step section, session
/// 26) that took QSA's input projection, behind a short mix kernel, from 14.8 to 10.4 µs a
/// launch; behind GDN's state update and QSA's combine it gained nothing and slowed those (their
/// own loads met these), so the default stays 0 and the QSA plan asks for 8.
///
/// XBULK = 1 (the row path) has x copied into shared memory by the copy engine: thread 0 issues one
/// bulk copy of all `cols` values the moment the wait returns, counted by an mbarrier it readied
/// before the wait, and the lanes read their pieces from there once it has landed. The lanes' own
/// loads of x (XBULK = 0) come in three dependent round trips after the wait, one a step
/// (`kernel-inspect --sass`: ptxas issues a step's pieces, uses them, then issues the next step's,
/// whatever order the source gives), where the copy is one; it costs 12 KB of shared memory a block
/// at 6,144 columns (512·WARPS·STEPS values). Correct, and slower in the H200's step (2026-12-07:
/// +0.7% / +0.5% at 1k / 32k against XBULK = 0; BENCHMARKS.md, gemv_nvfp4 section), so `ROW_PATH`
/// keeps 0 and the autotuner may choose it where round trips cost more.
///
/// TRIGGER says when the next kernel may launch: 1 (the default, and the first candidate, so that
/// the autotuner keeps it on a tie) not before this grid ends, 0 once past the wait (on the row
/// path without EARLY, past its weight loads too). Where the next kernel is a mix site's
/// down-projection, 0 lets its blocks load their weights during this grid's tail. On the H200
/// that made the step 9% slower (2026-12-01) while those blocks piled onto the few SMs with room;
/// since they keep to one an SM (`mix_down_nvfp4`'s MAX_BLOCKS) it makes the step 3.7% to 4.4%
/// faster (one NVIDIA H100, 2026-12-06, with the MoE's down projection doing the same), so
/// `ROW_PATH` takes 0.
#[kernel(
    block = 32 * WARPS,
    // A block owns 32·WARPS / LANES rows, or ROWS on the row path.
    grid = (div_ceil(rows, if ROWS == 0 { 32 * WARPS / LANES } else { ROWS }), K_SPLIT),
    helpers = "src/kernels/helpers/stage_x.rs",
    require(
        32 % LANES == 0,
        cols % (K_SPLIT * 16 * LANES) == 0,
        cols / K_SPLIT <= 8192,
        seg1 <= seg2,
        seg2 <= seg3,
        seg3 <= rows,
        // The split path's tensor-core form: a warp's 16 rows are two lanes each.
        MMA == 0 || LANES == 2,
        MMA == 1 || LANES >= 8,
        MMA == 0 || cols % (K_SPLIT * 128 * UNROLL) == 0,
        // The split path's early steps are its f32-sum form's; its tensor-core form has none.
        MMA == 0 || EARLY == 0,
        // The row path takes only ROWS, WARPS, STEPS and EARLY; the others keep their defaults
        // (one tile set each), and STEPS is only its.
        ROWS == 0 || (K_SPLIT == 1 && LANES == 16 && UNROLL == 4 && MMA == 0),
        ROWS > 0 || STEPS == 3,
        // A block's lanes cover the columns in STEPS steps of 512 a warp, none wholly past the end.
        ROWS == 0 || cols <= 512 * WARPS * STEPS,
        ROWS == 0 || cols > 512 * WARPS * (STEPS - 1),
        // (the row path's block scales wait in one word a row, a byte a step)
        ROWS == 0 || STEPS <= 3,
        // x by the copy engine is the row path's alone.
        XBULK == 0 || ROWS > 0,
    ),
)]
pub fn gemv_nvfp4(
    #[tile(default = 16, candidates = [2, 8, 16, 32])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 1, candidates = [1, 2, 4, 8])] K_SPLIT: u32,
    #[tile(default = 4, candidates = [1, 2, 4])] UNROLL: u32,
    #[tile(default = 0, candidates = [0, 1])] MMA: u32,
    #[tile(default = 0, candidates = [0, 8])] EARLY: u32,
    #[tile(default = 0, candidates = [0, 2, 4])] ROWS: u32,
    #[tile(default = 3, candidates = [1, 2, 3])] STEPS: u32,
    #[tile(default = 1, candidates = [1, 0], step)] TRIGGER: u32,
    #[tile(default = 0, candidates = [0, 1])] XBULK: u32,
    packed: &[e2m1x2],
    // e4m3 block scales, read as their bits (widened by `e4m3x4_to_f32x4`).
    scales: &[u8],
    scale2: &[f32],
    x: &[bf16],
    y: &mut [bf16],
    partial: &mut [f32],
    counters: &mut [u32],
    rows: u32,
    cols: u32,
    seg1: u32,
    seg2: u32,
    seg3: u32,
) {
    // Launched as soon as its predecessor lets it (programmatic dependent launch), with only
    // the EARLY weight loads before the wait. Its own successor launches after its wait with
    // TRIGGER 0, at its end otherwise (the docs above).
    let split = block_idx_y();
    let k_len = cols / K_SPLIT;
    let k_begin = split * k_len;
    let lane = lane_id() % LANES;
    let groups = 32 * WARPS / LANES;
    let row = block_idx() * groups + thread_idx() / LANES;
    // The weights do not depend on the predecessor: a lane's first EARLY steps of codes and
    // block scales go out before the wait (clamped to the slice and to the last row, so no load
    // sits under a branch; the products below skip what lies past the slice).
    let early_row = min(row, rows - 1);
    let mut early_codes = [u32x2(0, 0); EARLY + 1];
    let mut early_scales = [scales[0]; EARLY + 1];
    if MMA == 0 && ROWS == 0 {
        #[unroll]
        for j in 0..EARLY {
            let c = k_begin + min(lane * 16 + j * 16 * LANES, k_len - 16);
            early_codes[j] = load_early::<u32x2>(packed, early_row * (cols / 2) + c / 2);
            early_scales[j] = scales[early_row * (cols / 16) + c / 16];
        }
    }
    // The row path's weights: lane t of the block takes values 16t + 512·WARPS·j of each of the
    // block's ROWS rows in step j, all loaded at once (columns past the end load the last block
    // and weigh zero below, rows past the end load the last row and write nothing), before the
    // wait with EARLY > 0, after it otherwise. The block scales wait as their bits, a row's STEPS
    // in one word (step j in byte j).
    let row_base = block_idx() * ROWS;
    let mut row_codes = [u32x2(0, 0); ROWS * STEPS + 1];
    let mut row_scales = [0u32; ROWS + 1];
    // XBULK: the block's copy of x [cols] in shared memory (eight values an element; one element
    // when XBULK is 0), landed by one bulk copy that slot 0 of `landed` counts. Thread 0 readies
    // the barrier before the wait, where the meeting costs nothing.
    let x_row = shared::<u32x4, { if XBULK == 1 { 64 * WARPS * STEPS } else { 1 } }>();
    let landed = shared::<u64, 1>();
    if XBULK == 1 {
        if thread_idx() == 0 {
            bulk_barrier_init(landed, 0, 1);
        }
        sync_threads();
    }
    if ROWS > 0 && EARLY == 0 {
        grid_dependency_wait();
    }
    if ROWS > 0 {
        // Two passes over the same steps: every code load issues before the first OR below
        // waits on its scale byte.
        #[unroll]
        for j in 0..STEPS {
            let c = min(thread_idx() * 16 + 512 * WARPS * j, cols - 16);
            #[unroll]
            for r in 0..ROWS {
                let at = min(row_base + r, rows - 1);
                row_codes[j * ROWS + r] = load_early::<u32x2>(packed, at * (cols / 2) + c / 2);
            }
        }
        #[unroll]
        for j in 0..STEPS {
            let c = min(thread_idx() * 16 + 512 * WARPS * j, cols - 16);
            #[unroll]
            for r in 0..ROWS {
                let at = min(row_base + r, rows - 1);
                row_scales[r] |= (scales[at * (cols / 16) + c / 16] as u32) << (8 * j);
            }
        }
    }
    if ROWS == 0 || EARLY > 0 {
        grid_dependency_wait();
    }
    if XBULK == 1 && thread_idx() == 0 {
        // One copy of all of x, issued the moment it is the predecessor's (the docs above).
        bulk_load(x_row, 0, x, 0, cols * 2, landed, 0);
        bulk_barrier_arrive(landed, 0);
    }
    if TRIGGER == 0 {
        // Only now may the next kernel launch: before the wait it could take SM room ahead of
        // this grid's own blocks.
        launch_dependents();
    }

    // The block's slice of x: eight words (eight f16 pairs) per 16-value chunk, divided by the
    // chunk's largest magnitude so that the f16 products cannot overflow, and that magnitude.
    // MMA: [segment][word j][lane q] four words each (the f16 pairs of lane q's word j in the
    // decode's order), and each segment's scale back.
    // The row path stages none (one element each, so that it keeps its occupancy).
    let xs = shared::<u32, { if ROWS == 0 { 4096 } else { 1 } }>();
    let xsc = shared::<f32, { if ROWS == 0 { 512 } else { 1 } }>();
    // The row path's per-warp sums of its rows, [warp][row].
    let red = shared::<f32, { ROWS * WARPS + 1 }>();
    if MMA == 1 {
        // Eight values a thread; a segment's 16 threads are one half of a warp (k_len / 8 is a
        // multiple of 16, the stride of 32), whose lanes all take part in the shuffles.
        let n = k_len / 8;
        for base in (0..n).step_by(32 * WARPS) {
            let i = base + thread_idx();
            let valid = i < n;
            nvfp4_mma_stage(load_vec::<u32x4>(x, k_begin + (if valid { i } else { 0 }) * 8), xs, xsc, i, valid);
        }
    }
    if MMA == 0 && ROWS == 0 {
        for chunk in (thread_idx()..k_len / 16).step_by(32 * WARPS) {
            stage_x_chunk(x, k_begin, chunk, xs, xsc);
        }
    }
    if ROWS == 0 {
        sync_threads();
    }

    if ROWS > 0 {
        // f32 products of the raw decode (no multiply a value to put it at scale) with x lifted,
        // so that they stay normal f32; each block scale carries the rest of the gap. All powers
        // of two: the sums round as the exact decode's would. x comes straight from global
        // memory (L1 after the first warp), a lane's 16 values a step for all its rows.
        let lift = e2m1_raw_lift();
        let drop = e2m1_raw_gap() / lift;
        let mut acc = [0.0; ROWS + 1];
        if XBULK == 1 {
            bulk_barrier_wait(landed, 0, 0);
        }
        #[unroll]
        for j in 0..STEPS {
            let c = thread_idx() * 16 + 512 * WARPS * j;
            let at = min(c, cols - 16);
            let lo = if XBULK == 1 { x_row[at / 8] } else { load_vec::<u32x4>(x, at) };
            let hi = if XBULK == 1 { x_row[at / 8 + 1] } else { load_vec::<u32x4>(x, at + 8) };
            let (a, b, e, f) =
                (bf16x2_to_f32x2(lo.x), bf16x2_to_f32x2(lo.y), bf16x2_to_f32x2(lo.z), bf16x2_to_f32x2(lo.w));
            let x0 = f32x4(a.x * lift, a.y * lift, b.x * lift, b.y * lift);
            let x1 = f32x4(e.x * lift, e.y * lift, f.x * lift, f.y * lift);
            let (a, b, e, f) =
                (bf16x2_to_f32x2(hi.x), bf16x2_to_f32x2(hi.y), bf16x2_to_f32x2(hi.z), bf16x2_to_f32x2(hi.w));
            let x2 = f32x4(a.x * lift, a.y * lift, b.x * lift, b.y * lift);
            let x3 = f32x4(e.x * lift, e.y * lift, f.x * lift, f.y * lift);
            #[unroll]
            for r in 0..ROWS {
                let four = e4m3x4_to_f32x4(row_scales[r]);
                let scale = if j == 0 {
                    four.x
                } else if j == 1 {
                    four.y
                } else {
                    four.z
                };
                let wscale = if c < cols { scale * drop } else { 0.0 };
                acc[r] += dot_e2m1x16_raw(row_codes[j * ROWS + r], x0, x1, x2, x3) * wscale;
            }
        }
        // Each row's sum over the warp, then over the block's warps in warp order.
        #[unroll]
        for r in 0..ROWS {
            acc[r] = warp_sum(acc[r]);
            if lane_id() == 0 {
                red[warp_id() * ROWS + r] = acc[r];
            }
        }
        sync_threads();
    }
    // The row path: a row's sum over the block's warps, in warp order.
    if ROWS > 0 {
        let mine = row_base + thread_idx();
        if thread_idx() < ROWS && mine < rows {
            let mut sum = 0.0;
            for w in 0..WARPS {
                sum += red[w * ROWS + thread_idx()];
            }
            let m = if mine < seg1 {
                0
            } else if mine < seg2 {
                1
            } else if mine < seg3 {
                2
            } else {
                3
            };
            y[mine] = (sum * scale2[m]) as bf16;
        }
    }

    if MMA == 1 && ROWS == 0 {
        // Rows g and g + 8 of the warp's 16; lane q of the row's four. Rows past the end read the
        // last row and write nothing.
        let (g, q) = (lane_id() / 4, lane_id() % 4);
        let r0 = (block_idx() * WARPS + warp_id()) * 16 + g;
        let r1 = r0 + 8;
        let (l0, l1) = (min(r0, rows - 1), min(r1, rows - 1));
        // Lane (q, g) holds B's column g: x of lane q's values when g = 2q, zeros otherwise.
        let own = g == 2 * q;
        let mut acc0 = 0.0;
        let mut acc1 = 0.0;
        // UNROLL segments a step with no exit test between them (the segment count is a multiple
        // of UNROLL), so their loads can all be in flight before the first product.
        for s0 in (0..k_len / 128).step_by(UNROLL) {
            // Every load of the step first, then the products.
            let mut wa_u = [u32x4(0, 0, 0, 0); UNROLL];
            let mut wb_u = [u32x4(0, 0, 0, 0); UNROLL];
            let mut sc_u = [0.0; 4 * UNROLL];
            #[unroll]
            for u in 0..UNROLL {
                let col = k_begin + (s0 + u) * 128 + 32 * q;
                wa_u[u] = load_stream::<u32x4>(packed, l0 * (cols / 2) + col / 2);
                wb_u[u] = load_stream::<u32x4>(packed, l1 * (cols / 2) + col / 2);
                sc_u[4 * u] = e4m3x4_to_f32x4(scales[l0 * (cols / 16) + col / 16] as u32).x;
                sc_u[4 * u + 1] = e4m3x4_to_f32x4(scales[l0 * (cols / 16) + col / 16 + 1] as u32).x;
                sc_u[4 * u + 2] = e4m3x4_to_f32x4(scales[l1 * (cols / 16) + col / 16] as u32).x;
                sc_u[4 * u + 3] = e4m3x4_to_f32x4(scales[l1 * (cols / 16) + col / 16 + 1] as u32).x;
            }
            #[unroll]
            for u in 0..UNROLL {
                let seg = s0 + u;
                let (wa, wb) = (wa_u[u], wb_u[u]);
                let (sa0, sa1, sb0, sb1) = (sc_u[4 * u], sc_u[4 * u + 1], sc_u[4 * u + 2], sc_u[4 * u + 3]);
                // x of lane q's word j: words ((seg·4 + j)·4 + q)·4 .. + 3.
                let sums = nvfp4_mma_segment(wa, wb, xs, (seg * 16 + q) * 4, own);
                // The lane's two block sums of each row by their scales; the segment's scale undoes x's.
                let down = xsc[seg];
                acc0 += (sums.x * sa0 + sums.y * sa1) * down;
                acc1 += (sums.z * sb0 + sums.w * sb1) * down;
            }
        }
        // Each row's sum over its four lanes, then its matrix's global scale.
        acc0 += shfl_xor(acc0, 1);
        acc0 += shfl_xor(acc0, 2);
        acc1 += shfl_xor(acc1, 1);
        acc1 += shfl_xor(acc1, 2);
        if q == 0 {
            #[unroll]
            for k in 0..2 {
                let r = r0 + 8 * k;
                if r < rows {
                    let m = if r < seg1 {
                        0
                    } else if r < seg2 {
                        1
                    } else if r < seg3 {
                        2
                    } else {
                        3
                    };
                    let v = (if k == 0 { acc0 } else { acc1 }) * scale2[m];
                    if K_SPLIT == 1 {
                        y[r] = v as bf16;
                    } else {
                        partial[split * rows + r] = v;
                    }
                }
            }
        }
    }
    // A group past the last row sums nothing but still takes part in the warp's shuffles (with
    // MMA or ROWS every row is written above).
    let active = row < rows && MMA == 0 && ROWS == 0;
    let mut acc = 0.0;
    // The tiles first, so that the row path's specialisation drops these reads of the staging.
    if MMA == 0 && ROWS == 0 && active {
        // The early steps, then the rest streamed: the same steps in the same order.
        #[unroll]
        for j in 0..EARLY {
            let c = lane * 16 + j * 16 * LANES;
            if c < k_len {
                let at = c / 2;
                let xa = u32x4(xs[at], xs[at + 1], xs[at + 2], xs[at + 3]);
                let xb = u32x4(xs[at + 4], xs[at + 5], xs[at + 6], xs[at + 7]);
                let ws = e4m3x4_to_f32x4(early_scales[j] as u32).x;
                acc += dot_e2m1x16(early_codes[j], xa, xb) * (ws * xsc[c / 16]);
            }
        }
        #[unroll(UNROLL)]
        for c in (lane * 16 + EARLY * 16 * LANES..k_len).step_by(16 * LANES) {
            let at = c / 2;
            let xa = u32x4(xs[at], xs[at + 1], xs[at + 2], xs[at + 3]);
            let xb = u32x4(xs[at + 4], xs[at + 5], xs[at + 6], xs[at + 7]);
            let col = k_begin + c;
            let wv = load_stream::<u32x2>(packed, row * (cols / 2) + col / 2);
            let ws = e4m3x4_to_f32x4(scales[row * (cols / 16) + col / 16] as u32).x;
            acc += dot_e2m1x16(wv, xa, xb) * (ws * xsc[c / 16]);
        }
    }
    // The group's sum: offsets below LANES stay inside the group.
    if ROWS == 0 {
        #[unroll]
        for i in 0..5 {
            let offset = 16 >> i;
            if offset < LANES {
                acc += shfl_xor(acc, offset);
            }
        }
    }
    // The row's matrix's global scale (a row past the end reads none).
    if active {
        let m = if row < seg1 {
            0
        } else if row < seg2 {
            1
        } else if row < seg3 {
            2
        } else {
            3
        };
        acc = acc * scale2[m];
    }

    if K_SPLIT == 1 {
        if active && lane == 0 {
            y[row] = acc as bf16;
        }
    } else {
        if active && lane == 0 {
            partial[split * rows + row] = acc;
        }
        // Publish the partials before counting this block in.
        thread_fence();
        sync_threads();
        let last = shared::<u32, 1>();
        if thread_idx() == 0 {
            let arrived = atomic_add(counters, block_idx(), 1);
            last[0] = if arrived == K_SPLIT - 1 { 1 } else { 0 };
        }
        sync_threads();
        if last[0] == 1 {
            let r = block_idx() * groups + thread_idx();
            if thread_idx() < groups && r < rows {
                let mut sum = 0.0;
                for s in 0..K_SPLIT {
                    sum += load_cg(partial, s * rows + r);
                }
                y[r] = sum as bf16;
            }
            if thread_idx() == 0 {
                counters[block_idx()] = 0;
            }
        }
    }
}
