//! The MoE gate and up projections of the routed experts and the shared expert, in one launch,
//! with the `SiLU(gate) ⊙ up` epilogue.
//!
//! Weights of every expert are stacked: expert e's gate rows are rows `e·2I .. e·2I + I` of one
//! [(E + 1)·2I-ish, hidden] matrix, its up rows follow, and the shared expert comes last (expert
//! index E, its own intermediate size). The grid is (row tiles, top_k + 1 slots): slot k < top_k is
//! the expert the router chose k-th, slot top_k the shared expert.

use kernel_macros::kernel;

/// h[slot, r] = SiLU(gate_r·x) · (up_r·x) for NVFP4 weights (ModelOpt layout, stacked as above;
/// `scale2` [E + 1, 2] holds each expert's gate and up global scales).
///
/// x comes staged by the router (f16 pairs divided by `x_scale[0]`, in this architecture's decode
/// order). A group of LANES lanes takes ROWS rows; per lane and step it streams 16 FP4 values
/// (8 bytes) of a gate row and of the matching up row and sums f16 products per 16-value block
/// before scaling by the block's e4m3 scale in f32. h goes out in f32, and each slot's largest
/// |h| raises `h_max` (f32 bits, an atomic max; the router zeroed it). The last block to finish (a
/// counter in `counter[0]`, left at zero) stages h for the down projection: f16 pairs divided by
/// the slot's largest |h| (`h_staged` [(top_k + 1)·h_stride/8], `h_scale` [top_k + 1]).
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(inter.max(shared_inter), WARPS * (32 / LANES) * ROWS), top_k + 1),
    require(
        32 % LANES == 0,
        hidden % (16 * LANES) == 0,
        inter % ROWS == 0,
        shared_inter % ROWS == 0,
        h_stride >= inter.max(shared_inter),
        h_stride % 8 == 0,
    ),
)]
pub fn moe_gate_up_nvfp4(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 32, candidates = [8, 16, 32])] LANES: u32,
    #[tile(default = 8, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 2, candidates = [2, 4, 8])] UNROLL: u32,
    x_staged: &[u32x4],
    x_scale: &[f32],
    ids: &[u32],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    h: &mut [f32],
    h_max: &mut [u32],
    counter: &mut [u32],
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
    let expert = if routed { ids[slot] } else { experts };
    let rows = if routed { inter } else { shared_inter };
    let lane = lane_id() % LANES;
    let row0 = ((block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES) * ROWS;
    let active = row0 < rows;
    // The gate row r of this expert, as a row of the stacked matrix; its up row is `rows` further.
    let gate0 = expert * 2 * inter + row0;

    let mut g_acc = [0.0; ROWS];
    let mut u_acc = [0.0; ROWS];
    if active {
        #[unroll(UNROLL)]
        for c in (lane * 16..hidden).step_by(16 * LANES) {
            let xa = load_vec::<u32x4>(x_staged, c / 8);
            let xb = load_vec::<u32x4>(x_staged, c / 8 + 1);
            #[unroll]
            for r in 0..ROWS {
                let g_row = gate0 + r;
                let u_row = g_row + rows;
                let gw = load_stream::<u32x2>(packed, g_row * (hidden / 2) + c / 2);
                let uw = load_stream::<u32x2>(packed, u_row * (hidden / 2) + c / 2);
                let gs = scales[g_row * (hidden / 16) + c / 16] as f32;
                let us = scales[u_row * (hidden / 16) + c / 16] as f32;
                g_acc[r] += dot_e2m1x16(gw, xa, xb) * gs;
                u_acc[r] += dot_e2m1x16(uw, xa, xb) * us;
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
    if active && lane == 0 {
        let x_max = x_scale[0];
        let g_scale = scale2[expert * 2] * x_max;
        let u_scale = scale2[expert * 2 + 1] * x_max;
        let mut largest = 0u32;
        #[unroll]
        for r in 0..ROWS {
            let v = silu(g_acc[r] * g_scale) * (u_acc[r] * u_scale);
            h[slot * h_stride + row0 + r] = v;
            largest = max(largest, abs(v).to_bits());
        }
        atomic_max(h_max, slot, largest);
    }

    // Publish h, count this block in; the last one stages h for the down projection.
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        last[0] = if atomic_add(counter, 0, 1) == grid_dim() * grid_dim_y() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 1 {
        let groups = h_stride / 8;
        for i in (thread_idx()..(top_k + 1) * groups).step_by(32 * WARPS) {
            let k = i / groups;
            let largest = f32::from_bits(load_cg(h_max, k));
            let inv = if largest > 0.0 { 1.0 / largest } else { 0.0 };
            let b = i * 8;
            h_staged[i] = stage_e2m1_x8(
                f32x4(load_cg(h, b) * inv, load_cg(h, b + 1) * inv, load_cg(h, b + 2) * inv, load_cg(h, b + 3) * inv),
                f32x4(
                    load_cg(h, b + 4) * inv,
                    load_cg(h, b + 5) * inv,
                    load_cg(h, b + 6) * inv,
                    load_cg(h, b + 7) * inv,
                ),
            );
        }
        if thread_idx() <= top_k {
            h_scale[thread_idx()] = f32::from_bits(load_cg(h_max, thread_idx()));
        }
        if thread_idx() == 0 {
            counter[0] = 0;
        }
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
