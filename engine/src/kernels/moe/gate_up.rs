//! The MoE gate and up projections of the routed experts and the shared expert, in one launch,
//! with the `SiLU(gate) ⊙ up` epilogue.
//!
//! Weights of every expert are stacked: expert e's gate rows are rows `e·2I .. e·2I + I` of one
//! [(E + 1)·2I-ish, hidden] matrix, its up rows follow, and the shared expert comes last (expert
//! index E, its own intermediate size). The grid is (row tiles, top_k + 1 slots): slot k < top_k is
//! the expert the router chose k-th, slot top_k the shared expert.

use kernel_macros::kernel;

/// h[slot, r] = SiLU(gate_r·x) · (up_r·x) for NVFP4 weights (stacked as above; `scale2` [E + 1,
/// 2] holds each expert's gate and up global scales). The codes are in the architecture's paired
/// layout (`kernel_dsl::e2m1_pairs`, which the weights' upload applies): on sm_90 a word's four
/// f16 pairs cost nine integer instructions instead of about sixteen. NVIDIA H200, 2026-12-02:
/// 1,833 → 1,594 SASS instructions at the defaults, the kernel alone 9.64 → 8.96 µs
/// (BENCHMARKS.md, MoE section). On sm_121a the layout is ModelOpt's.
///
/// x comes staged by the router: f16 pairs in this architecture's decode order, each 16-value
/// chunk divided by its max|x| (`x_scale` [hidden/16]). A group of LANES lanes takes ROWS rows;
/// per lane and chunk it streams 16 FP4 values (8 bytes) of a gate row and of the matching up row
/// and sums f16 products per 16-value block before scaling by the block's e4m3 scale and x's
/// chunk scale in f32. A lane loads BATCH chunks of codes and scales before it uses the first, so
/// they are in flight together (the published row is 10 chunks a lane at LANES 16, two rounds at
/// the default BATCH 5), and is compiled for MIN_BLOCKS blocks an SM (`__launch_bounds__`): with
/// no bound ptxas budgets 48 registers and moves each load next to its use (17.5 against 9.8 µs
/// at the defaults on the H200); bounded to 2 blocks of 256 threads it takes 108 and keeps the
/// loads ahead of the products. A block owns TILE = WARPS·(32/LANES)·ROWS consecutive rows of one
/// slot, a multiple of 16, so it stages its own h for the down projection with no grid-wide step:
/// f16 pairs per 16-row chunk divided by the chunk's max|h| (`h_staged` [(top_k +
/// 1)·h_stride/8], `h_scale` [(top_k + 1)·h_stride/16]), and after them each chunk in int8,
/// times 127 over that max (`h_staged` [(top_k + 1)·h_stride/8 ..][(top_k + 1)·h_stride/16]),
/// for the down kernel's I8 products; h also goes out in f32 (`h`, for tests and tools).
///
/// The kernel overlaps the router (programmatic dependent launch): before the wait only the
/// shared expert's blocks run, asking L2 for their rows, which do not depend on the route; with
/// PREFETCH the routed blocks do the same for theirs once the route is known.
///
/// BULK > 0 (the longest row it takes, `hidden ≤ BULK`; whole warps a row group, 16 rows a
/// block) streams the weights by the copy engine instead of by the lanes: lane 0 of each warp
/// asks for its rows' codes and scales in four bulk copies into shared memory (46 KB a block at
/// the published shape) as soon as it knows the expert, counted by the warp's own mbarrier, and
/// the warp's lanes read them from there once they have landed. A block then has all its bytes in
/// flight at once (the lanes' loads, held in registers, come in rounds of BATCH chunks), four
/// blocks an SM fit, and the shared expert's blocks fill their shared memory before the wait.
/// Correct, and slower: on the H200 12.4 µs alone against 8.9 for the lanes' rounds, the step
/// 1.7% to 2.7% slower (2026-12-02, BENCHMARKS.md, MoE section). Without their products the
/// two take about as long (7.5 against 7.2 µs), but with every byte in flight at once the rows
/// land near the end, so the products come after the transfer (4.9 µs more), where the rounds
/// overlap one round's products with the next one's loads (1.8 µs more). So it is off by
/// default, a candidate for the autotuner.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(inter.max(shared_inter), WARPS * (32 / LANES) * ROWS), top_k + 1),
    min_blocks = MIN_BLOCKS,
    require(
        32 % LANES == 0,
        (WARPS * (32 / LANES) * ROWS) % 16 == 0,
        hidden % (16 * LANES) == 0,
        inter % 16 == 0,
        shared_inter % 16 == 0,
        h_stride >= inter.max(shared_inter),
        h_stride % 16 == 0,
        // Bulk copies move 16-byte multiples between 16-byte aligned addresses: a row's scales
        // (hidden/16 bytes) must be one.
        BULK == 0 || (LANES == 32 && WARPS * ROWS == 16 && hidden <= BULK && hidden % 256 == 0),
    ),
)]
pub fn moe_gate_up_nvfp4(
    #[tile(default = 2, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 16, candidates = [16, 32])] LANES: u32,
    #[tile(default = 8, candidates = [4, 8])] WARPS: u32,
    #[tile(default = 5, candidates = [5, 10])] BATCH: u32,
    #[tile(default = 2, candidates = [0, 2, 3, 4])] MIN_BLOCKS: u32,
    #[tile(default = false, candidates = [false, true])] PREFETCH: bool,
    #[tile(default = 0, candidates = [0, 2560])] BULK: u32,
    x_staged: &[u32x4],
    x_scale: &[f32],
    ids: &[u32],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    h: &mut [f32],
    h_staged: &mut [u32x4],
    h_scale: &mut [f32],
    experts: u32,
    hidden: u32,
    inter: u32,
    shared_inter: u32,
    h_stride: u32,
    top_k: u32,
) {
    let slot = block_idx_y();
    let routed = slot < top_k;
    let rows = if routed { inter } else { shared_inter };
    let tile_rows = WARPS * (32 / LANES) * ROWS;
    let tile0 = block_idx() * tile_rows;
    // This block's rows that exist (the grid covers the larger of the two sizes).
    let tile_len = if tile0 < rows { min(tile_rows, rows - tile0) } else { 0 };
    let lane = lane_id() % LANES;
    let local0 = ((warp_id() * (32 / LANES)) + lane_id() / LANES) * ROWS;
    let row0 = tile0 + local0;
    let active = row0 < rows;
    // BULK: warp w's rows in shared memory, its ROWS gate rows then its ROWS up rows, codes (16
    // values a u32x2) and scales (four a word) each compact at the row's length; slot w of
    // `landed` counts their bytes. (One element each when BULK is 0: no zero-length arrays.)
    let row_codes = hidden / 16;
    let row_scale_words = hidden / 64;
    let codes_s = shared::<u32x2, { 1 + WARPS * 2 * ROWS * (BULK / 16) }>();
    let scales_s = shared::<u32, { 1 + WARPS * 2 * ROWS * (BULK / 64) }>();
    let landed = shared::<u64, WARPS>();
    let mine = warp_id() * 2 * ROWS;
    let issues = lane_id() == 0 && active;
    if BULK > 0 {
        if issues {
            bulk_barrier_init(landed, warp_id(), 1);
        }
        sync_warp();
    }
    if BULK > 0 && issues && !routed {
        // The shared expert's rows do not depend on the route: they stream during the router.
        let gate = experts * 2 * inter + row0;
        #[unroll]
        for m in 0..2 {
            let src = gate + m * rows;
            let (c, w) = ((mine + m * ROWS) * row_codes, (mine + m * ROWS) * row_scale_words);
            bulk_load(codes_s, c, packed, src * (hidden / 2), ROWS * (hidden / 2), landed, warp_id());
            bulk_load(scales_s, w, scales, src * (hidden / 16), ROWS * (hidden / 16), landed, warp_id());
        }
        bulk_barrier_arrive(landed, warp_id());
    }
    if BULK == 0 && !routed && thread_idx() < 2 && tile_len > 0 {
        // Gate rows, then up rows `rows` further on.
        let first = experts * 2 * inter + tile0 + thread_idx() * rows;
        prefetch_l2(packed, first * (hidden / 2), tile_len * (hidden / 2));
        prefetch_l2(scales, first * (hidden / 16), tile_len * (hidden / 16));
    }
    // The shared expert's blocks wait too, though only x_staged ties them to the router: streaming
    // their weights during the router's tail made the H200 step 1.3% slower (session 25).
    grid_dependency_wait();
    launch_dependents();

    let expert = if routed { ids[slot] } else { experts };
    if PREFETCH && BULK == 0 && routed && thread_idx() < 2 && tile_len > 0 {
        let first = expert * 2 * inter + tile0 + thread_idx() * rows;
        prefetch_l2(packed, first * (hidden / 2), tile_len * (hidden / 2));
        prefetch_l2(scales, first * (hidden / 16), tile_len * (hidden / 16));
    }
    // The gate row r of this expert, as a row of the stacked matrix; its up row is `rows` further.
    let gate0 = expert * 2 * inter + row0;
    if BULK > 0 && issues && routed {
        // The warp's gate rows, then its up rows: one copy each of codes and of scales.
        #[unroll]
        for m in 0..2 {
            let src = gate0 + m * rows;
            let (c, w) = ((mine + m * ROWS) * row_codes, (mine + m * ROWS) * row_scale_words);
            bulk_load(codes_s, c, packed, src * (hidden / 2), ROWS * (hidden / 2), landed, warp_id());
            bulk_load(scales_s, w, scales, src * (hidden / 16), ROWS * (hidden / 16), landed, warp_id());
        }
        bulk_barrier_arrive(landed, warp_id());
    }

    let mut g_acc = [0.0; ROWS];
    let mut u_acc = [0.0; ROWS];
    if BULK > 0 && active {
        bulk_barrier_wait(landed, warp_id(), 0);
        // Lane l takes the 16-value chunks l, l + 32, ... of each row, 8 bytes apart in shared
        // memory across the warp (no bank conflicts); its scale is byte k % 4 of a word.
        #[unroll(BATCH)]
        for k in (lane_id()..hidden / 16).step_by(32) {
            let xa = load_vec::<u32x4>(x_staged, 2 * k);
            let xb = load_vec::<u32x4>(x_staged, 2 * k + 1);
            let xs = x_scale[k];
            let byte = 8 * (k % 4);
            #[unroll]
            for r in 0..ROWS {
                let gw = load_vec::<u32x2>(codes_s, (mine + r) * row_codes + k);
                let uw = load_vec::<u32x2>(codes_s, (mine + ROWS + r) * row_codes + k);
                let gs = e4m3x4_to_f32x4((scales_s[(mine + r) * row_scale_words + k / 4] >> byte) & 255).x;
                let us = e4m3x4_to_f32x4((scales_s[(mine + ROWS + r) * row_scale_words + k / 4] >> byte) & 255).x;
                g_acc[r] += dot_e2m1x16_paired(gw, xa, xb) * (gs * xs);
                u_acc[r] += dot_e2m1x16_paired(uw, xa, xb) * (us * xs);
            }
        }
    }
    if BULK == 0 && active {
        // Rounds of BATCH chunks a lane: the round's codes and scales are all loaded before the
        // first is used (a loop that uses each load right after issuing it keeps one or two in
        // flight). Past the end of the row a lane repeats its last chunk with a zero factor.
        let last = hidden - 16 * LANES + lane * 16;
        #[unroll(1)]
        for base in (lane * 16..hidden).step_by(16 * LANES * BATCH) {
            // The scales stay e4m3 until they are used: converting one waits for its load, which
            // would hold back the loads behind it (the fill, `scales[0]`, is any e4m3; every
            // entry is overwritten).
            let mut gw = [u32x2(0, 0); BATCH * ROWS];
            let mut uw = [u32x2(0, 0); BATCH * ROWS];
            let mut gs = [scales[0]; BATCH * ROWS];
            let mut us = [scales[0]; BATCH * ROWS];
            #[unroll]
            for j in 0..BATCH {
                let c = min(base + 16 * LANES * j, last);
                #[unroll]
                for r in 0..ROWS {
                    let g_row = gate0 + r;
                    let u_row = g_row + rows;
                    gw[j * ROWS + r] = load_stream::<u32x2>(packed, g_row * (hidden / 2) + c / 2);
                    uw[j * ROWS + r] = load_stream::<u32x2>(packed, u_row * (hidden / 2) + c / 2);
                    gs[j * ROWS + r] = scales[g_row * (hidden / 16) + c / 16];
                    us[j * ROWS + r] = scales[u_row * (hidden / 16) + c / 16];
                }
            }
            #[unroll]
            for j in 0..BATCH {
                let c = min(base + 16 * LANES * j, last);
                let xa = load_vec::<u32x4>(x_staged, c / 8);
                let xb = load_vec::<u32x4>(x_staged, c / 8 + 1);
                let xs = if base + 16 * LANES * j < hidden { x_scale[c / 16] } else { 0.0 };
                #[unroll]
                for r in 0..ROWS {
                    g_acc[r] += dot_e2m1x16_paired(gw[j * ROWS + r], xa, xb) * ((gs[j * ROWS + r] as f32) * xs);
                    u_acc[r] += dot_e2m1x16_paired(uw[j * ROWS + r], xa, xb) * ((us[j * ROWS + r] as f32) * xs);
                }
            }
        }
    }
    // Sum each row over its LANES lanes (offsets below LANES stay inside the group).
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < LANES {
            #[unroll]
            for r in 0..ROWS {
                g_acc[r] += shfl_xor(g_acc[r], offset);
                u_acc[r] += shfl_xor(u_acc[r], offset);
            }
        }
    }
    let tile_h = shared::<f32, { WARPS * (32 / LANES) * ROWS }>();
    if lane == 0 {
        let g_scale = scale2[expert * 2];
        let u_scale = scale2[expert * 2 + 1];
        #[unroll]
        for r in 0..ROWS {
            let v = if active { silu(g_acc[r] * g_scale) * (u_acc[r] * u_scale) } else { 0.0 };
            tile_h[local0 + r] = v;
            if active {
                h[slot * h_stride + row0 + r] = v;
            }
        }
    }
    sync_threads();
    // One thread a 16-row chunk: its largest |h|, then the chunk staged as the down kernel reads it.
    let chunk = thread_idx();
    if chunk * 16 < tile_len {
        let mut v = [0.0; 16];
        let mut m = 0.0;
        #[unroll]
        for j in 0..16 {
            v[j] = tile_h[chunk * 16 + j];
            m = max(m, abs(v[j]));
        }
        let inv = if m > 0.0 { 1.0 / m } else { 0.0 };
        let at = (slot * h_stride + tile0) / 8 + chunk * 2;
        h_staged[at] = stage_e2m1_x8(
            f32x4(v[0] * inv, v[1] * inv, v[2] * inv, v[3] * inv),
            f32x4(v[4] * inv, v[5] * inv, v[6] * inv, v[7] * inv),
        );
        h_staged[at + 1] = stage_e2m1_x8(
            f32x4(v[8] * inv, v[9] * inv, v[10] * inv, v[11] * inv),
            f32x4(v[12] * inv, v[13] * inv, v[14] * inv, v[15] * inv),
        );
        h_scale[(slot * h_stride + tile0) / 16 + chunk] = m;
        // The chunk in int8 too, times 127 over m, after all the f16 pairs (for the down kernel's
        // I8 products).
        let q = if m > 0.0 { 127.0 / m } else { 0.0 };
        h_staged[(top_k + 1) * (h_stride / 8) + (slot * h_stride + tile0) / 16 + chunk] = u32x4(
            pack_i8x4(f32x4(v[0] * q, v[1] * q, v[2] * q, v[3] * q)),
            pack_i8x4(f32x4(v[4] * q, v[5] * q, v[6] * q, v[7] * q)),
            pack_i8x4(f32x4(v[8] * q, v[9] * q, v[10] * q, v[11] * q)),
            pack_i8x4(f32x4(v[12] * q, v[13] * q, v[14] * q, v[15] * q)),
        );
    }
}

/// h[slot, r] = SiLU(gate_r·x) · (up_r·x) for bf16 weights, stacked as for the NVFP4 kernel,
/// written in bf16 (as the down kernel reads it). Lanes stream 8 weights (16 bytes) of a gate row
/// and of its up row per step; x comes from L1.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(inter.max(shared_inter), WARPS * (32 / LANES) * ROWS), top_k + 1),
    require(
        32 % LANES == 0,
        hidden % (8 * LANES) == 0,
        inter % ROWS == 0,
        shared_inter % ROWS == 0,
        h_stride >= inter.max(shared_inter),
    ),
)]
pub fn moe_gate_up_bf16(
    #[tile(default = 1, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 32, candidates = [8, 16, 32])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] UNROLL: u32,
    x: &[bf16],
    ids: &[u32],
    weights: &[bf16],
    h: &mut [bf16],
    experts: u32,
    hidden: u32,
    inter: u32,
    shared_inter: u32,
    h_stride: u32,
    top_k: u32,
) {
    // Overlaps the router: nothing it writes is read before the wait.
    grid_dependency_wait();
    launch_dependents();
    let slot = block_idx_y();
    let routed = slot < top_k;
    let expert = if routed { ids[slot] } else { experts };
    let rows = if routed { inter } else { shared_inter };
    let lane = lane_id() % LANES;
    let row0 = ((block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES) * ROWS;
    let active = row0 < rows;
    let gate0 = expert * 2 * inter + row0;

    let mut g_acc = [0.0; ROWS];
    let mut u_acc = [0.0; ROWS];
    if active {
        #[unroll(UNROLL)]
        for c in (lane * 8..hidden).step_by(8 * LANES) {
            let xv = load_vec::<u32x4>(x, c);
            #[unroll]
            for r in 0..ROWS {
                let g_row = gate0 + r;
                g_acc[r] += dot_bf16x8(load_stream::<u32x4>(weights, g_row * hidden + c), xv);
                u_acc[r] += dot_bf16x8(load_stream::<u32x4>(weights, (g_row + rows) * hidden + c), xv);
            }
        }
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < LANES {
            #[unroll]
            for r in 0..ROWS {
                g_acc[r] += shfl_xor(g_acc[r], offset);
                u_acc[r] += shfl_xor(u_acc[r], offset);
            }
        }
    }
    if active && lane == 0 {
        #[unroll]
        for r in 0..ROWS {
            h[slot * h_stride + row0 + r] = (silu(g_acc[r]) * u_acc[r]) as bf16;
        }
    }
}
