//! The four GDN input projections in one grouped GEMV over one read of x, with the causal conv,
//! SiLU and the gates in the epilogue.

use kernel_macros::kernel;

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
/// The products are f32 (x staged in shared memory as f32 by every block, 10 KB at the published
/// shape, from L2): q, k and v feed the fp32 state, whose 1e-4 tolerance the f16 activations of
/// the MoE's NVFP4 kernels would not meet. Each warp owns ROWS rows; per step a lane streams 16
/// FP4 values (8 bytes) of each, decodes them to f32, sums the 16 products and scales the sum by
/// the block's e4m3 scale.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(conv_dim + z_dim + 2 * heads, WARPS * ROWS),
    require((conv_dim + z_dim + 2 * heads) % ROWS == 0, hidden % (32 * 16) == 0, hidden <= 4096),
)]
pub fn gdn_in_proj_nvfp4(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 2, candidates = [1, 2])] UNROLL: u32,
    packed: &[e2m1x2],
    scales: &[e4m3],
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
    // Overlaps its predecessor (x is its output), and lets the state update start early.
    grid_dependency_wait();
    launch_dependents();
    let xs = shared::<f32, 4096>();
    for i in (thread_idx()..hidden).step_by(32 * WARPS) {
        xs[i] = x[i] as f32;
    }
    sync_threads();

    let rows = conv_dim + z_dim + 2 * heads;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    if row0 < rows {
        let mut acc = [0.0; ROWS];
        #[unroll(UNROLL)]
        for c in (lane_id() * 16..hidden).step_by(32 * 16) {
            let x0 = load_vec::<f32x4>(xs, c);
            let x1 = load_vec::<f32x4>(xs, c + 4);
            let x2 = load_vec::<f32x4>(xs, c + 8);
            let x3 = load_vec::<f32x4>(xs, c + 12);
            #[unroll]
            for r in 0..ROWS {
                let row = row0 + r;
                let wv = load_stream::<u32x2>(packed, row * (hidden / 2) + c / 2);
                let w0 = e2m1x4_to_f32x4(wv.x);
                let w1 = e2m1x4_to_f32x4(wv.x >> 16);
                let w2 = e2m1x4_to_f32x4(wv.y);
                let w3 = e2m1x4_to_f32x4(wv.y >> 16);
                let mut s = w0.x * x0.x;
                s += w0.y * x0.y;
                s += w0.z * x0.z;
                s += w0.w * x0.w;
                s += w1.x * x1.x;
                s += w1.y * x1.y;
                s += w1.z * x1.z;
                s += w1.w * x1.w;
                s += w2.x * x2.x;
                s += w2.y * x2.y;
                s += w2.z * x2.z;
                s += w2.w * x2.w;
                s += w3.x * x3.x;
                s += w3.y * x3.y;
                s += w3.z * x3.z;
                s += w3.w * x3.w;
                acc[r] += s * (scales[row * (hidden / 16) + c / 16] as f32);
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
                if row < conv_dim {
                    let u = acc[r] * scale2[0];
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
                    proj[row] = acc[r] * scale2[1];
                } else if row < conv_dim + z_dim + heads {
                    proj[row] = sigmoid(acc[r] * scale2[2]);
                } else {
                    let h = row - conv_dim - z_dim - heads;
                    proj[row] = exp(-exp(a_log[h]) * softplus(acc[r] * scale2[3] + dt_bias[h]));
                }
            }
        }
    }
}
