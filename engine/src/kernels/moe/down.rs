//! The MoE down projection of the routed experts and the shared expert, weighted and summed into
//! one output in one launch.
//!
//! Each warp owns ROWS output rows; its 32/LANES lane groups take the slots (the top_k routed
//! experts, then the shared expert) in turn, group g the slots g, g + 32/LANES, ..., so that all of
//! a row's loads are in flight at once. Each group's sum is weighted per slot and the groups are
//! added by a fixed butterfly: one fixed order, no atomics, the same bits on every run. Down
//! weights are stacked: expert e's [hidden, inter] matrix, then the shared expert's
//! [hidden, shared_inter] at expert index E.

use kernel_macros::kernel;

/// y[r] = Σ_k weights[k] · down_{ids[k]}[r]·h_k + weights[top_k] · down_shared[r]·h_shared, NVFP4
/// weights (`scale2` [E + 1]); h as the gate/up kernel staged it (`h_staged`, `h_scale`).
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(hidden, WARPS * ROWS),
    require(
        32 % LANES == 0,
        inter % (16 * LANES) == 0,
        shared_inter % (16 * LANES) == 0,
        h_stride % 8 == 0,
        hidden % ROWS == 0,
    ),
)]
pub fn moe_down_nvfp4(
    #[tile(default = 1, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 8, candidates = [4, 8, 16])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] UNROLL: u32,
    h_staged: &[u32x4],
    h_scale: &[f32],
    ids: &[u32],
    weights: &[f32],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    y: &mut [bf16],
    experts: u32,
    hidden: u32,
    inter: u32,
    shared_inter: u32,
    h_stride: u32,
    top_k: u32,
) {
    let lane = lane_id() % LANES;
    let group = lane_id() / LANES;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    let active = row0 < hidden;
    let mut total = [0.0; ROWS];
    if active {
        #[unroll(UNROLL)]
        for k in (group..top_k + 1).step_by(32 / LANES) {
            let routed = k < top_k;
            let expert = if routed { ids[k] } else { experts };
            let cols = if routed { inter } else { shared_inter };
            // Expert e's matrix starts after e routed matrices of hidden × inter values.
            let first = expert * hidden * inter;
            let factor = weights[k] * scale2[expert] * h_scale[k];
            #[unroll(4)]
            for c in (lane * 16..cols).step_by(16 * LANES) {
                let xa = load_vec::<u32x4>(h_staged, k * (h_stride / 8) + c / 8);
                let xb = load_vec::<u32x4>(h_staged, k * (h_stride / 8) + c / 8 + 1);
                #[unroll]
                for r in 0..ROWS {
                    let v = first + (row0 + r) * cols + c;
                    let block = dot_e2m1x16(load_stream::<u32x2>(packed, v / 2), xa, xb) * (scales[v / 16] as f32);
                    total[r] += block * factor;
                }
            }
        }
    }
    // Every lane's partial, added over the whole warp: within the groups, then across them.
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        #[unroll]
        for r in 0..ROWS {
            total[r] += shfl_xor(total[r], offset);
        }
    }
    if active && lane_id() == 0 {
        #[unroll]
        for r in 0..ROWS {
            y[row0 + r] = total[r] as bf16;
        }
    }
}

/// The same for bf16 weights and the bf16 h the bf16 gate/up kernel writes: 8 weights (16 bytes)
/// per lane and step.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(hidden, WARPS * ROWS),
    require(
        32 % LANES == 0,
        inter % (8 * LANES) == 0,
        shared_inter % (8 * LANES) == 0,
        h_stride % 8 == 0,
        hidden % ROWS == 0,
    ),
)]
pub fn moe_down_bf16(
    #[tile(default = 1, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 16, candidates = [4, 8, 16])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] UNROLL: u32,
    h: &[bf16],
    ids: &[u32],
    weights: &[f32],
    down: &[bf16],
    y: &mut [bf16],
    experts: u32,
    hidden: u32,
    inter: u32,
    shared_inter: u32,
    h_stride: u32,
    top_k: u32,
) {
    let lane = lane_id() % LANES;
    let group = lane_id() / LANES;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    let active = row0 < hidden;
    let mut total = [0.0; ROWS];
    if active {
        #[unroll(UNROLL)]
        for k in (group..top_k + 1).step_by(32 / LANES) {
            let routed = k < top_k;
            let expert = if routed { ids[k] } else { experts };
            let cols = if routed { inter } else { shared_inter };
            let first = expert * hidden * inter;
            let factor = weights[k];
            #[unroll(4)]
            for c in (lane * 8..cols).step_by(8 * LANES) {
                let hv = load_vec::<u32x4>(h, k * h_stride + c);
                #[unroll]
                for r in 0..ROWS {
                    total[r] += dot_bf16x8(load_stream::<u32x4>(down, first + (row0 + r) * cols + c), hv) * factor;
                }
            }
        }
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        #[unroll]
        for r in 0..ROWS {
            total[r] += shfl_xor(total[r], offset);
        }
    }
    if active && lane_id() == 0 {
        #[unroll]
        for r in 0..ROWS {
            y[row0 + r] = total[r] as bf16;
        }
    }
}
