//! out_proj with the gated RMSNorm of the heads in its prologue, so that the state update
//! ([`super::delta_rule::gdn_delta_rule`]) needs no last-block tail; launched overlapped with the
//! state update, its weights (immutable) all in flight before the grid dependency wait.

use kernel_macros::kernel;

/// y = W·x with x_h = norm_w ⊙ RMSNorm(o_h) ⊙ act(z_h) for every value head h (act = σ or SiLU),
/// W [rows, cols] row-major bf16, o [cols] f32 (the state update's output), z at
/// `proj[z_offset..]` f32; x is rounded to bf16 (as the separate norm stored it), the products
/// summed in f32, y rounded to bf16.
///
/// Grid (row tiles of WARPS·ROWS rows, column slices of 256·STEPS columns). A slice holds whole
/// heads, so a block normalises only its own slice's heads: a warp per head, o and z from L2
/// (written by the state update and the input projection), the head's Σo² a warp butterfly, x
/// into shared memory as bf16. Each lane owns STEPS 16-byte loads of each of its warp's ROWS
/// rows, held in registers: with EARLY = 1 they are issued before `grid_dependency_wait()`, so
/// that the weights stream while the state update still runs (they are immutable; nothing is
/// written before the wait). With several slices, each block writes its partial sums to
/// `partial` [slices, rows] and the last block of a row tile (a counter per tile in `counters`,
/// zero before the first launch, left zero) adds them in slice order: deterministic.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rows, WARPS * ROWS), cols / (256 * STEPS)),
    require(
        rows % ROWS == 0,
        cols % (256 * STEPS) == 0,
        (256 * STEPS) % dv == 0,
        dv % 64 == 0,
        z_offset % 2 == 0,
        ROWS * STEPS <= 24,
    ),
)]
pub fn gdn_out_proj(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 6, candidates = [3, 6, 12, 24])] STEPS: u32,
    #[tile(default = 1, candidates = [0, 1])] EARLY: u32,
    w: &[bf16],
    o: &[f32],
    proj: &[f32],
    norm_w: &[bf16],
    y: &mut [bf16],
    partial: &mut [f32],
    counters: &mut [u32],
    rows: u32,
    cols: u32,
    dv: u32,
    z_offset: u32,
    eps: f32,
    sigmoid_gate: bool,
) {
    // The block's slice of x, bf16 pairs.
    let xs = shared::<u32, { 128 * STEPS }>();
    let split = block_idx_y();
    let k_begin = split * 256 * STEPS;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    // Whole warps past the last row still take part in the block's barriers below.
    let active = row0 < rows;

    if EARLY == 0 {
        grid_dependency_wait();
    }
    // Every warp loads (a warp past the last row reads row 0's and drops it): loads under a
    // branch here made ptxas for sm_121a spill the buffer.
    let wrow = if active { row0 } else { 0 };
    let mut wbuf = [u32x4(0, 0, 0, 0); ROWS * STEPS];
    #[unroll]
    for s in 0..STEPS {
        #[unroll]
        for r in 0..ROWS {
            wbuf[s * ROWS + r] = load_stream::<u32x4>(w, (wrow + r) * cols + k_begin + s * 256 + lane_id() * 8);
        }
    }
    if EARLY == 1 {
        // The weights are in flight; o and z are the predecessors' outputs.
        grid_dependency_wait();
    }
    launch_dependents();

    // The gated norm of the slice's heads, a warp per head.
    let h0 = k_begin / dv;
    for hh in (warp_id()..256 * STEPS / dv).step_by(WARPS) {
        let base = (h0 + hh) * dv;
        let mut sum_sq = 0.0;
        for j in (2 * lane_id()..dv).step_by(64) {
            let v = load_vec::<f32x2>(o, base + j);
            sum_sq += v.x * v.x + v.y * v.y;
        }
        let scale = rsqrt(warp_sum(sum_sq) / (dv as f32) + eps);
        for j in (2 * lane_id()..dv).step_by(64) {
            let v = load_vec::<f32x2>(o, base + j);
            let g = load_vec::<f32x2>(proj, z_offset + base + j);
            let a0 = if sigmoid_gate { sigmoid(g.x) } else { silu(g.x) };
            let a1 = if sigmoid_gate { sigmoid(g.y) } else { silu(g.y) };
            let x0 = (norm_w[j] as f32) * (v.x * scale) * a0;
            let x1 = (norm_w[j + 1] as f32) * (v.y * scale) * a1;
            xs[(hh * dv + j) / 2] = pack_bf16x2(x0, x1);
        }
    }
    sync_threads();

    let mut acc = [0.0; ROWS];
    if active {
        #[unroll]
        for s in 0..STEPS {
            let xv = load_vec::<u32x4>(xs, s * 128 + lane_id() * 4);
            #[unroll]
            for r in 0..ROWS {
                acc[r] += dot_bf16x8(wbuf[s * ROWS + r], xv);
            }
        }
    }
    #[unroll]
    for r in 0..ROWS {
        acc[r] = warp_sum(acc[r]);
    }

    let slices = grid_dim_y();
    if slices == 1 {
        if active && lane_id() == 0 {
            #[unroll]
            for r in 0..ROWS {
                y[row0 + r] = acc[r] as bf16;
            }
        }
    } else {
        if active && lane_id() == 0 {
            #[unroll]
            for r in 0..ROWS {
                partial[split * rows + row0 + r] = acc[r];
            }
        }
        // Publish the partials before counting this block in.
        thread_fence();
        sync_threads();
        let last = shared::<u32, 1>();
        if thread_idx() == 0 {
            let arrived = atomic_add(counters, block_idx(), 1);
            last[0] = if arrived == slices - 1 { 1 } else { 0 };
        }
        sync_threads();
        if last[0] == 1 {
            let row = block_idx() * WARPS * ROWS + thread_idx();
            if thread_idx() < WARPS * ROWS && row < rows {
                let mut sum = 0.0;
                for s in 0..slices {
                    sum += load_cg(partial, s * rows + row);
                }
                y[row] = sum as bf16;
            }
            if thread_idx() == 0 {
                counters[block_idx()] = 0;
            }
        }
    }
}
