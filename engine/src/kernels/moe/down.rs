//! The MoE down projection of the routed experts and the shared expert, weighted and summed into
//! one output in one launch.
//!
//! Down weights are stacked: expert e's [hidden, inter] matrix, then the shared expert's
//! [hidden, shared_inter] at expert index E. Both kernels sum in one fixed order with no atomics,
//! so every run gives the same bits.

use kernel_macros::kernel;

/// y[r] = Σ_k weights[k] · down_{ids[k]}[r]·h_k + weights[top_k] · down_shared[r]·h_shared, NVFP4
/// weights (`scale2` [E + 1]); h as the gate/up kernel staged it (`h_staged`, and `h_scale` per
/// 16-value chunk, which lines up with the weights' 16-value blocks along a row).
///
/// A warp owns ROWS output rows. Its lanes walk one flat list of tasks, a task being one 16-value
/// chunk of one slot (the routed slots' chunks, then the shared expert's), so every lane has the
/// same loop with no branch around its loads and UNROLL tasks in flight; each lane's sum is
/// weighted per task and the lanes are added by a fixed butterfly: one order, no atomics.
///
/// The kernel overlaps the gate/up kernel (programmatic dependent launch). Before the wait the
/// block reads the route and the routing weights (the router finished before the gate/up kernel
/// let this one start), keeps each slot's matrix offset and weight in shared memory, and asks L2
/// for all of its rows of the chosen experts, one bulk prefetch per slot and kind, so they stream
/// while gate/up still runs; after the wait it reads h.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(hidden, WARPS * ROWS),
    require(
        top_k + 1 <= 32 * WARPS,
        top_k < 64,
        inter % 16 == 0,
        shared_inter % 16 == 0,
        (WARPS * ROWS * inter / 16) % 16 == 0,
        (WARPS * ROWS * shared_inter / 16) % 16 == 0,
        h_stride % 16 == 0,
        hidden % (WARPS * ROWS) == 0,
    ),
)]
pub fn moe_down_nvfp4(
    #[tile(default = 1, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 2, candidates = [2, 4, 8])] UNROLL: u32,
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
    let tile0 = block_idx() * WARPS * ROWS;
    // Per slot: the first value of its matrix, and weight × the expert's global scale.
    let slot_first = shared::<u32, 64>();
    let slot_factor = shared::<f32, 64>();
    if thread_idx() <= top_k {
        let k = thread_idx();
        let routed = k < top_k;
        let expert = if routed { load_cg(ids, k) } else { experts };
        let cols = if routed { inter } else { shared_inter };
        // Expert e's matrix starts after e routed matrices of hidden × inter values.
        let first = expert * hidden * inter;
        slot_first[k] = first;
        slot_factor[k] = load_cg(weights, k) * scale2[expert];
        prefetch_l2(packed, (first + tile0 * cols) / 2, WARPS * ROWS * cols / 2);
        prefetch_l2(scales, (first + tile0 * cols) / 16, WARPS * ROWS * cols / 16);
    }
    sync_threads();
    grid_dependency_wait();
    launch_dependents();

    let row0 = tile0 + warp_id() * ROWS;
    let routed_chunks = inter / 16;
    let tasks = top_k * routed_chunks + shared_inter / 16;
    let mut total = [0.0; ROWS];
    #[unroll(UNROLL)]
    for t in (lane_id()..tasks).step_by(32) {
        let k = min(t / routed_chunks, top_k);
        let chunk = t - k * routed_chunks;
        let cols = if k < top_k { inter } else { shared_inter };
        let xa = load_vec::<u32x4>(h_staged, k * (h_stride / 8) + chunk * 2);
        let xb = load_vec::<u32x4>(h_staged, k * (h_stride / 8) + chunk * 2 + 1);
        let hs = h_scale[k * (h_stride / 16) + chunk] * slot_factor[k];
        #[unroll]
        for r in 0..ROWS {
            let v = slot_first[k] + (row0 + r) * cols + chunk * 16;
            total[r] += dot_e2m1x16(load_stream::<u32x2>(packed, v / 2), xa, xb) * ((scales[v / 16] as f32) * hs);
        }
    }
    #[unroll]
    for r in 0..ROWS {
        total[r] = warp_sum(total[r]);
    }
    if lane_id() == 0 {
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
    // Overlaps the gate/up kernel: nothing it writes is read before the wait.
    grid_dependency_wait();
    launch_dependents();
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
