//! The four GDN input projections in one grouped GEMV over one read of x, with the causal conv,
//! SiLU and the gates in the epilogue.

use kernel_dsl::Arch;
use kernel_dsl::e2m1_pairs::Layout;
use kernel_macros::kernel;

/// The f32 path's best tiles (four rows a warp, x read where it is), the default until session 38
/// made the tensor-core path one: 13.37 µs at the published shape against 12.49 on an H100, the
/// step 1.2% to 2.1% slower (BENCHMARKS.md, GDN section). Kept for the tests and comparisons
/// that run both paths.
pub const F32_PATH: gdn_in_proj_nvfp4::Tiles =
    gdn_in_proj_nvfp4::Tiles { rows: 4, warps: 4, mma: 0, direct: 1, steps: 5, min_blocks: 0 };

/// The layout [`gdn_in_proj_nvfp4`] at `tiles` reads its codes in on `arch`: the tensor-core path
/// (MMA = 1) the paired layout of the architecture, the f32 path (whose raw decode is one
/// multiply and one mask a value in ModelOpt's layout already) ModelOpt's. The layer uploads its
/// codes in this layout and refuses a launch whose kernel reads another.
pub fn nvfp4_codes_layout(tiles: &gdn_in_proj_nvfp4::Tiles, arch: Arch) -> Layout {
    if tiles.mma == 1 { Layout::for_arch(arch) } else { Layout::Nibbles }
}

/// `proj = epilogue(W·x)` for the stacked bf16 matrix W = [in_proj_qkv; in_proj_z; in_proj_b;
/// in_proj_a] ([conv_dim + z_dim + 2·heads, hidden]), summed in f32. Row r's epilogue depends on
/// the segment it falls in:
/// - qkv (r < conv_dim), channel c = r: the depthwise causal conv of kernel 4 over the three
///   previous inputs in `conv_hist` [3, conv_dim] (oldest first) and this one u, then SiLU; the
///   history shifts by one (u becomes the newest). Only the thread of row c touches channel c.
/// - z: the projection itself (the output gate's input).
/// - b: β = σ(b).
/// - a: α = exp(−exp(A_log)·softplus(a + dt_bias)), the state's decay.
///
/// `proj` stays f32: q, k and v go on into the fp32 state, whose tolerance bf16 would not meet.
///
/// Each warp owns ROWS consecutive rows (they may straddle segments: the epilogue looks at each
/// row's index); lanes stream them with 16-byte loads that bypass L1, UNROLL steps in flight, and
/// reduce with shuffles. No split-K: the ~16 k rows of the published shape give thousands of
/// warps, every SM streams.
///
/// The weights are immutable, so the first EARLY steps of each lane's loads (ROWS·EARLY 16-byte
/// loads) may go out before `grid_dependency_wait()`: with the whole grid nearly resident at once
/// at the published shape, that streams up to EARLY/10 of the matrix while the predecessor (the
/// previous layer's out_proj) finishes. 0 (the default until measured) waits first.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(conv_dim + z_dim + 2 * heads, WARPS * ROWS),
    require((conv_dim + z_dim + 2 * heads) % ROWS == 0, hidden % (32 * 8) == 0, hidden >= 256 * EARLY),
)]
pub fn gdn_in_proj_bf16(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 2, candidates = [2, 4])] UNROLL: u32,
    #[tile(default = 0, candidates = [0, 1, 2, 4])] EARLY: u32,
    w: &[bf16],
    x: &[bf16],
    conv_w: &[bf16],
    a_log: &[f32],
    dt_bias: &[f32],
    conv_hist: &mut [f32],
    proj: &mut [f32],
    conv_dim: u32,
    z_dim: u32,
    heads: u32,
    hidden: u32,
) {
    let rows = conv_dim + z_dim + 2 * heads;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    // The first EARLY steps' weights, before the wait (nothing is written before it). One slot
    // more than used: the DSL has no zero-length arrays (EARLY = 0), and ptxas drops the unused.
    let mut early = [u32x4(0, 0, 0, 0); ROWS * EARLY + 1];
    if row0 < rows {
        #[unroll]
        for t in 0..EARLY {
            #[unroll]
            for r in 0..ROWS {
                early[t * ROWS + r] = load_stream::<u32x4>(w, (row0 + r) * hidden + t * 256 + lane_id() * 8);
            }
        }
    }
    // Overlaps its predecessor (x is its output), and lets the state update start early.
    grid_dependency_wait();
    launch_dependents();
    // The whole warp agrees on this test, so its shuffles below see every lane.
    if row0 < rows {
        let mut acc = [0.0; ROWS];
        #[unroll]
        for t in 0..EARLY {
            let xv = load_vec::<u32x4>(x, t * 256 + lane_id() * 8);
            #[unroll]
            for r in 0..ROWS {
                acc[r] += dot_bf16x8(early[t * ROWS + r], xv);
            }
        }
        #[unroll(UNROLL)]
        for k in (EARLY * 256 + lane_id() * 8..hidden).step_by(32 * 8) {
            let xv = load_vec::<u32x4>(x, k);
            #[unroll]
            for r in 0..ROWS {
                acc[r] += dot_bf16x8(load_stream::<u32x4>(w, (row0 + r) * hidden + k), xv);
            }
        }
        #[unroll]
        for r in 0..ROWS {
            acc[r] = warp_sum(acc[r]);
        }
        if lane_id() == 0 {
            #[unroll]
            for r in 0..ROWS {
                let row = row0 + r;
                let u = acc[r];
                if row < conv_dim {
                    // Tap 3 meets the current input, tap 0 the oldest.
                    let h0 = conv_hist[row];
                    let h1 = conv_hist[conv_dim + row];
                    let h2 = conv_hist[2 * conv_dim + row];
                    let mut s = (conv_w[4 * row + 3] as f32) * u;
                    s += (conv_w[4 * row] as f32) * h0;
                    s += (conv_w[4 * row + 1] as f32) * h1;
                    s += (conv_w[4 * row + 2] as f32) * h2;
                    conv_hist[row] = h1;
                    conv_hist[conv_dim + row] = h2;
                    conv_hist[2 * conv_dim + row] = u;
                    proj[row] = silu(s);
                } else if row < conv_dim + z_dim {
                    proj[row] = u;
                } else if row < conv_dim + z_dim + heads {
                    proj[row] = sigmoid(u);
                } else {
                    let h = row - conv_dim - z_dim - heads;
                    proj[row] = exp(-exp(a_log[h]) * softplus(u + dt_bias[h]));
                }
            }
        }
    }
}

/// [`gdn_in_proj_bf16`] for NVFP4 weights: the same stacked rows and epilogue, the matrix in the
/// ModelOpt layout (`packed` [rows, hidden/2], low nibble first; `scales` e4m3 [rows, hidden/16])
/// with one global scale per projection (`scale2` [4]: qkv, z, b, a).
///
/// The products are f32 (x read as bf16 and widened, or with DIRECT = 0 staged in shared memory
/// as f32 by every block, 10 KB at the published shape): q, k and v feed the fp32 state, whose 1e-4 tolerance the f16 activations of
/// the MoE's NVFP4 kernels would not meet. Each warp owns ROWS rows; per step a lane streams 16
/// FP4 values (8 bytes) of each, decodes them to f32, sums the 16 products and scales the sum by
/// the block's e4m3 scale. The weights do not depend on the predecessor, so a lane loads all of
/// its codes and block scales (STEPS steps of 512 values, `hidden ≤ 512·STEPS`) before the grid
/// dependency wait, with `load_early` (which ptxas keeps before the wait): they stream while the
/// predecessor runs, all in flight together, where the loop used to load each step's codes right
/// before using them. So are the epilogue's operands (conv taps and history, A_log, dt_bias, the
/// global scale), one a lane, gathered by shuffles after the sums: the epilogue's loads were a
/// round trip at the end of every block. The block scales wait packed, four a register. What is
/// resident before the wait is what streams early: at ROWS = 4 (the f32 path's best) a thread holds 80
/// registers on sm_90, six blocks an SM, 12,672 of the published shape's 16,480 rows (ROWS = 2 held
/// 64 registers, eight blocks, 8,448 rows); the rest of the grid starts as those blocks finish.
/// MIN_BLOCKS is the residency ptxas budgets registers to (0: none).
///
/// DIRECT = 1 reads each lane's 16 values of x from global memory beside its weights (bf16, L1
/// after the first warp) instead of staging x in shared memory first: no barrier and no staging
/// pass stand before a block's first weight load, which matters because the grid is about one
/// wave of short blocks (5 steps of 512 values at the published shape), each a chain of a few
/// memory round trips. The f32 path's best: on the H200 it took the input projection from 20.6 to
/// 17.1 µs at the published shape (BENCHMARKS.md, GDN section).
///
/// MMA = 1 (with ROWS = 16; the default since session 38) takes the products to the tensor
/// cores, at the same accuracy: f16
/// operands and f32 sums (`mma.m16n8k16`). It reads its codes in the paired layout of the
/// architecture ([`nvfp4_codes_layout`], `kernel_dsl::e2m1_pairs`: nine integer instructions a
/// word on sm_90 instead of about sixteen; ModelOpt's on sm_121a, which converts in hardware),
/// which the layer uploads when its tiles say MMA. x is staged as f16 with a power-of-two scale
/// per 128-value segment (exact for bf16 x down to 2^-14 of the segment's largest value), the
/// weights are decoded to f16 pairs (exact), so every product is exact and only the f32 sums
/// round, as in the f32 path. A block's WARPS warps share 16 rows and split the columns: warp w
/// takes segments w, w + WARPS, ... (`hidden / (128·WARPS) ≤ STEPS` of them), and lane l holds 16
/// bytes (32 values, two block scales) of rows l/4 and l/4 + 8 of each, all loaded before the
/// wait as the f32 path's are, with the epilogue's operands (one a thread of the first four
/// warps, eight a row). In each product the four lanes of a row hold four different 16-value
/// blocks, so B holds lane q's x in column 2q alone (zeros elsewhere) and C's column 2q is
/// exactly lane q's block sum, which it scales by its block scale; the warps' partial sums meet
/// in shared memory, in warp order.
///
/// Why: the f32 path is bound by instruction issue after its wait (BENCHMARKS.md, GDN and step
/// sections). At the published shape (d 2560, WARPS 4: five segments a warp, 1,030 blocks of 128
/// threads) a thread of this path issues 955 sm_90 SASS instructions after the wait for its 320
/// weights (3.0 a weight: 40 `HMMA`, the decode's masks and multiplies, the staging of x and the
/// epilogue), where the f32 path issues 2,254 for its 320 (7.0). Its codes take 40 registers a
/// lane: 94 registers in all, five blocks an SM (MIN_BLOCKS 8 fits eight, the whole grid, in 64
/// registers by spilling 76 bytes). Measured on an H100 (BENCHMARKS.md, GDN section): 12.49 µs
/// alone against the f32 path's 13.37, and the step 1.2% / 1.5% faster at 1k / 32k.
#[kernel(
    block = 32 * WARPS,
    // A warp's ROWS rows, or with MMA a block's 16.
    grid = div_ceil(conv_dim + z_dim + 2 * heads, WARPS * ROWS / (1 + (WARPS - 1) * MMA)),
    require(
        MMA == 1 || (conv_dim + z_dim + 2 * heads) % ROWS == 0,
        MMA == 0 || ROWS == 16,
        MMA == 1 || ROWS <= 4,
        MMA == 0 || DIRECT == 0,
        // The epilogue's operands take the first 128 threads (16 rows of eight).
        MMA == 0 || WARPS >= 4,
        MMA == 0 || hidden % (128 * WARPS) == 0,
        MMA == 0 || hidden <= 128 * WARPS * STEPS,
        hidden % (32 * 16) == 0,
        hidden >= 512,
        hidden <= 4096,
        MMA == 1 || hidden <= 512 * STEPS,
    ),
    min_blocks = MIN_BLOCKS,
)]
pub fn gdn_in_proj_nvfp4(
    #[tile(default = 16, candidates = [1, 2, 4, 16])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 1, candidates = [0, 1])] MMA: u32,
    #[tile(default = 0, candidates = [0, 1])] DIRECT: u32,
    #[tile(default = 5, candidates = [5, 8])] STEPS: u32,
    #[tile(default = 0, candidates = [0, 4, 8])] MIN_BLOCKS: u32,
    packed: &[e2m1x2],
    // e4m3 block scales, read as their bits (widened by `e4m3x4_to_f32x4`).
    scales: &[u8],
    scale2: &[f32],
    x: &[bf16],
    conv_w: &[bf16],
    a_log: &[f32],
    dt_bias: &[f32],
    conv_hist: &mut [f32],
    proj: &mut [f32],
    conv_dim: u32,
    z_dim: u32,
    heads: u32,
    hidden: u32,
) {
    let rows = conv_dim + z_dim + 2 * heads;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    // f32 path: the warp's weights do not depend on the predecessor, so every code and block
    // scale of the lane is loaded before the wait, all in flight together: step j is values
    // lane·16 + 512·j of each of the ROWS rows. Steps past the row's end repeat the last one with
    // a zero scale, rows past the last load the last row and write nothing (no branch around the
    // loads).
    let mut codes = [u32x2(0, 0); ROWS * STEPS * (1 - MMA) + MMA];
    // The block scales wait as their e4m3 bits, four steps a word (step j in byte j % 4 of word
    // j / 4 of its row): a register per four scales instead of one each (at ROWS = 4, 80
    // registers instead of 93: six blocks an SM instead of five), so more of the grid is resident
    // with its codes in flight before the wait. Packing them waits for the scale bytes before the
    // wait, while the predecessor still runs. They are widened to f32 after it.
    let mut scale_bits = [0u32; ROWS * ((STEPS + 3) / 4) * (1 - MMA) + MMA];
    // The f32 path decodes raw (`e2m1x4_to_f32x4_raw`: no multiply a value), its values short by
    // the gap (2^126 on sm_90). x comes lifted (by 2^64 there), so that every product stays a
    // normal f32, and each block scale carries the rest of the gap (2^62): all powers of two, so
    // the sums round as the exact decode's, bit for bit.
    let lift = e2m1_raw_lift();
    let drop = e2m1_raw_gap() / lift;
    if MMA == 0 {
        #[unroll]
        for j in 0..STEPS {
            let c = min(lane_id() * 16 + 512 * j, hidden - 512 + lane_id() * 16);
            #[unroll]
            for r in 0..ROWS {
                let row = min(row0 + r, rows - 1);
                codes[j * ROWS + r] = load_early::<u32x2>(packed, row * (hidden / 2) + c / 2);
            }
        }
        #[unroll]
        for j in 0..STEPS {
            let c = min(lane_id() * 16 + 512 * j, hidden - 512 + lane_id() * 16);
            #[unroll]
            for r in 0..ROWS {
                let row = min(row0 + r, rows - 1);
                let bits = scales[row * (hidden / 16) + c / 16] as u32;
                scale_bits[(j / 4) * ROWS + r] |= bits << (8 * (j % 4));
            }
        }
    }
    // MMA path: the lane's codes (rows g and g + 8 of the block's 16, 16 bytes of each of its
    // warp's segments) and their block scales, all before the wait. The four scales of a segment
    // wait as one word (row g's two blocks, then row g + 8's), widened together after it. Rows
    // past the last load the last row and write nothing; steps past the warp's segments load its
    // last one again and weigh zero.
    let (g, q) = (lane_id() / 4, lane_id() % 4);
    let mma_row0 = block_idx() * 16;
    let per_warp = hidden / (128 * WARPS);
    let mut mcodes = [u32x4(0, 0, 0, 0); 2 * STEPS * MMA + (1 - MMA)];
    let mut mscales = [0u32; STEPS * MMA + (1 - MMA)];
    if MMA == 1 {
        let (l0, l1) = (min(mma_row0 + g, rows - 1), min(mma_row0 + g + 8, rows - 1));
        #[unroll]
        for j in 0..STEPS {
            let col = (warp_id() + WARPS * min(j, per_warp - 1)) * 128 + 32 * q;
            mcodes[2 * j] = load_early::<u32x4>(packed, l0 * (hidden / 2) + col / 2);
            mcodes[2 * j + 1] = load_early::<u32x4>(packed, l1 * (hidden / 2) + col / 2);
        }
        #[unroll]
        for j in 0..STEPS {
            let col = (warp_id() + WARPS * min(j, per_warp - 1)) * 128 + 32 * q;
            let (b0, b1) = (l0 * (hidden / 16) + col / 16, l1 * (hidden / 16) + col / 16);
            mscales[j] = (scales[b0] as u32)
                | ((scales[b0 + 1] as u32) << 8)
                | ((scales[b1] as u32) << 16)
                | ((scales[b1 + 1] as u32) << 24);
        }
    }
    // f32 path: the epilogue's operands are loaded before the wait too, one a lane (lane 8r + k
    // holds operand k of row r: conv taps 0..3 and the history's three inputs, or a row of the
    // gate a's A_log and dt_bias; operand 7 is the row's global scale), and reach lane 0 by
    // shuffles after the sums. Loaded after the sums they were a round trip at the end of every
    // block. The history is safe to read early: only this layer's previous token wrote it, many
    // launches back (as the state update reads its state early).
    // The MMA path holds them the same way over its first four warps: thread 8r + k holds
    // operand k of the block's row r.
    let mut operand = 0.0;
    let op_r = if MMA == 1 { thread_idx() / 8 } else { lane_id() / 8 };
    let op_k = lane_id() % 8;
    let op_row = if MMA == 1 { mma_row0 + op_r } else { row0 + op_r };
    {
        let (r, k, row) = (op_r, op_k, op_row);
        if r < ROWS && row < rows {
            if k == 7 {
                let segment = if row < conv_dim {
                    0
                } else if row < conv_dim + z_dim {
                    1
                } else if row < conv_dim + z_dim + heads {
                    2
                } else {
                    3
                };
                operand = scale2[segment];
            } else if row < conv_dim {
                if k < 4 {
                    operand = conv_w[4 * row + k] as f32;
                } else if k < 7 {
                    operand = conv_hist[(k - 4) * conv_dim + row];
                }
            } else if row >= conv_dim + z_dim + heads {
                let h = row - conv_dim - z_dim - heads;
                if k == 0 {
                    operand = a_log[h];
                } else if k == 1 {
                    operand = dt_bias[h];
                }
            }
        }
    }
    // Overlaps its predecessor (x is its output), and lets the state update start early.
    grid_dependency_wait();
    launch_dependents();
    // Each path sizes only its own staging (the others' are one element), so that the f32 path
    // keeps its occupancy. f32 path with DIRECT = 0: x as f32 (DIRECT = 1 stages nothing). MMA:
    // x as f16 pairs, [segment][word j][lane q] four words each (the values of lane q's word j,
    // in the decode's order), and each segment's scale back.
    let xs = shared::<f32, { 4096 - 4095 * (MMA + DIRECT) }>();
    let xh = shared::<u32, { 1 + 2047 * MMA }>();
    let xsc = shared::<f32, { 1 + 31 * MMA }>();
    if MMA == 1 {
        // Eight values a thread; a segment's 16 threads are one half of a warp (hidden / 8 is a
        // multiple of 64), whose lanes all take part in the shuffles.
        let n = hidden / 8;
        for base in (0..n).step_by(32 * WARPS) {
            let i = base + thread_idx();
            let valid = i < n;
            nvfp4_mma_stage(load_vec::<u32x4>(x, (if valid { i } else { 0 }) * 8), xh, xsc, i, valid);
        }
    } else if DIRECT == 0 {
        for i in (thread_idx()..hidden).step_by(32 * WARPS) {
            xs[i] = (x[i] as f32) * lift;
        }
    }
    if DIRECT == 0 {
        sync_threads();
    }

    let mut acc = [0.0; ROWS];
    if MMA == 1 {
        // Lane (q, g) holds B's column g: x of lane q's values when g = 2q, zeros otherwise.
        let own = g == 2 * q;
        let mut acc0 = 0.0;
        let mut acc1 = 0.0;
        #[unroll]
        for j in 0..STEPS {
            let seg = warp_id() + WARPS * min(j, per_warp - 1);
            // x of lane q's word j: words ((seg·4 + j)·4 + q)·4 .. + 3.
            let sums = nvfp4_mma_segment_paired(mcodes[2 * j], mcodes[2 * j + 1], xh, (seg * 16 + q) * 4, own);
            let sc = e4m3x4_to_f32x4(mscales[j]);
            // The segment's scale undoes x's; a step past the warp's segments weighs zero.
            let down = if j < per_warp { xsc[seg] } else { 0.0 };
            acc0 += (sums.x * sc.x + sums.y * sc.y) * down;
            acc1 += (sums.z * sc.z + sums.w * sc.w) * down;
        }
        // Each row's sum over its four lanes, then over the warps, in shared memory.
        acc0 += shfl_xor(acc0, 1);
        acc0 += shfl_xor(acc0, 2);
        acc1 += shfl_xor(acc1, 1);
        acc1 += shfl_xor(acc1, 2);
        let part = shared::<f32, { 1 + (16 * 8 - 1) * MMA }>();
        if q == 0 {
            part[warp_id() * 16 + g] = acc0;
            part[warp_id() * 16 + g + 8] = acc1;
        }
        sync_threads();
        // Row op_r's sum, at each of its eight threads (the first four warps, whole).
        if op_r < 16 {
            #[unroll]
            for w in 0..WARPS {
                acc[0] += part[w * 16 + op_r];
            }
        }
    }
    if MMA == 0 && row0 < rows {
        #[unroll]
        for j in 0..STEPS {
            let c = min(lane_id() * 16 + 512 * j, hidden - 512 + lane_id() * 16);
            let mut x0 = f32x4(0.0, 0.0, 0.0, 0.0);
            let mut x1 = x0;
            let mut x2 = x0;
            let mut x3 = x0;
            if DIRECT == 1 {
                // The lane's 16 values of x straight from global memory (L1 after the first
                // warp), beside its weights: no staging, no barrier before the first load.
                let lo = load_vec::<u32x4>(x, c);
                let hi = load_vec::<u32x4>(x, c + 8);
                let (a, b, e, f) =
                    (bf16x2_to_f32x2(lo.x), bf16x2_to_f32x2(lo.y), bf16x2_to_f32x2(lo.z), bf16x2_to_f32x2(lo.w));
                x0 = f32x4(a.x * lift, a.y * lift, b.x * lift, b.y * lift);
                x1 = f32x4(e.x * lift, e.y * lift, f.x * lift, f.y * lift);
                let (a, b, e, f) =
                    (bf16x2_to_f32x2(hi.x), bf16x2_to_f32x2(hi.y), bf16x2_to_f32x2(hi.z), bf16x2_to_f32x2(hi.w));
                x2 = f32x4(a.x * lift, a.y * lift, b.x * lift, b.y * lift);
                x3 = f32x4(e.x * lift, e.y * lift, f.x * lift, f.y * lift);
            } else {
                x0 = load_vec::<f32x4>(xs, c);
                x1 = load_vec::<f32x4>(xs, c + 4);
                x2 = load_vec::<f32x4>(xs, c + 8);
                x3 = load_vec::<f32x4>(xs, c + 12);
            }
            // Steps past the row's end weigh zero.
            let live = lane_id() * 16 + 512 * j < hidden;
            #[unroll]
            for r in 0..ROWS {
                let four = e4m3x4_to_f32x4(scale_bits[(j / 4) * ROWS + r]);
                let scale = if j % 4 == 0 {
                    four.x
                } else if j % 4 == 1 {
                    four.y
                } else if j % 4 == 2 {
                    four.z
                } else {
                    four.w
                };
                let wscale = if live { scale * drop } else { 0.0 };
                acc[r] += dot_e2m1x16_raw(codes[j * ROWS + r], x0, x1, x2, x3) * wscale;
            }
        }
        #[unroll]
        for r in 0..ROWS {
            acc[r] = warp_sum(acc[r]);
        }
    }
    // The epilogue, on the operands loaded before the wait: the f32 path's lane 0 for the warp's
    // ROWS rows, the MMA path's thread 8r for the block's row r (its sum in acc[0]). Every lane
    // of a warp that gets here takes part in the shuffles (f32: the warp agrees on row0; MMA: the
    // first four warps, whole).
    if (MMA == 0 && row0 < rows) || (MMA == 1 && op_r < 16) {
        #[unroll]
        for r in 0..ROWS * (1 - MMA) + MMA {
            let base = if MMA == 1 { (lane_id() / 8) * 8 } else { 8 * r };
            let mut t = [0.0; 8];
            #[unroll]
            for k in 0..8 {
                t[k] = shfl(operand, base + k);
            }
            let row = if MMA == 1 { op_row } else { row0 + r };
            let writer = if MMA == 1 { op_k == 0 } else { lane_id() == 0 };
            if writer && row < rows {
                if row < conv_dim {
                    // Tap 3 meets the current input, tap 0 the oldest.
                    let u = acc[r] * t[7];
                    let mut s = t[3] * u;
                    s += t[0] * t[4];
                    s += t[1] * t[5];
                    s += t[2] * t[6];
                    conv_hist[row] = t[5];
                    conv_hist[conv_dim + row] = t[6];
                    conv_hist[2 * conv_dim + row] = u;
                    proj[row] = silu(s);
                } else if row < conv_dim + z_dim {
                    proj[row] = acc[r] * t[7];
                } else if row < conv_dim + z_dim + heads {
                    proj[row] = sigmoid(acc[r] * t[7]);
                } else {
                    proj[row] = exp(-exp(t[0]) * softplus(acc[r] * t[7] + t[1]));
                }
            }
        }
    }
}
