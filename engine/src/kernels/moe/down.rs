//! The MoE down projection of the routed experts and the shared expert, weighted and summed into
//! one output in one launch.
//!
//! Down weights are stacked: expert e's [hidden, inter] matrix, then the shared expert's
//! [hidden, shared_inter] at expert index E. Both kernels sum in one fixed order with no atomics,
//! so every run gives the same bits.

use kernel_macros::kernel;

/// y[r] = Σ_k weights[k] · down_{ids[k]}[r]·h_k + weights[top_k] · down_shared[r]·h_shared, NVFP4
/// weights (`scale2` [E + 1]); h as the gate/up kernel staged it (`h_staged`, and `h_scale` per
/// 16-value chunk, which lines up with the weights' 16-value blocks along a row): f16 pairs, or
/// with I8 the int8 form after them (h·127/max|h| rounded), summed by `dp4a`
/// (`dot_e2m1x16_i8`). NVIDIA H200, 2026-12-01: I8 takes the kernel alone from 6.22 to 5.28 µs
/// (2,087 sm_90 SASS instructions against 2,560) and the step 1.5% faster, so it is the default.
/// Its price is h's 8 bits: y within about 7e-3 relative L2 of the reference at the tests' tiny
/// shape (bound 1e-2; BENCHMARKS.md, MoE section), where f16 pairs leave the bf16 rounding of y.
///
/// A warp owns ROWS output rows. Its lanes split one flat list of tasks, a task being one
/// 16-value chunk of one slot (the routed slots' chunks, then the shared expert's): lane l takes
/// tasks l, l + 32, ..., at most BATCH of them (the published shape has 440 tasks, 14 a lane). A
/// lane first loads the codes and block scales of all its tasks, then uses them: 2·BATCH·ROWS
/// loads in flight a lane, where a loop that uses each load right after issuing it keeps one or
/// two (the compiler interleaves them). Each lane's sum is weighted per task and the lanes are
/// added by a fixed butterfly: one order, no atomics.
///
/// The kernel overlaps the gate/up kernel (programmatic dependent launch). The route and the
/// routing weights are known before the wait (the router finished before the gate/up kernel let
/// this one start), so the block keeps each slot's matrix offset and weight in shared memory and
/// issues all its weight loads before the wait: they stream while gate/up still runs. Only h,
/// which gate/up writes, is read after it.
///
/// TRIGGER says when the next kernel may launch: 0 (the default) right after the wait, 1 not
/// before this grid ends. In the step the next kernel is the Gated Residual's down-projection,
/// 132 blocks meant one an SM. Let in after the wait, its blocks found most SMs full (three of
/// these blocks, 165 registers a thread, take an SM's registers; where they land depends on where
/// the gate/up kernel still ran when they were placed) and piled up on the few SMs that held only
/// one: 132 blocks on 38 SMs, three to six on one, each extra block about 1 µs more after the
/// wait (NVIDIA H200 block records, 2026-12-02). So from then until 2026-12-06 the default was 1:
/// let in at the end, they found every SM empty, and the site after the MoE was 1.4 µs shorter
/// although its weights no longer loaded during this kernel. Bounding this kernel's registers to
/// leave room instead (MIN_BLOCKS 4, 128 registers) spilled and made the step 3.4% slower. Now
/// that kernel bounds its own residency to one block an SM (`mix_down_nvfp4`'s MAX_BLOCKS), its
/// blocks spread as SMs free up, and letting it in after the wait, with the output projections
/// doing the same, made the step 3.7% to 4.4% faster at 1k and 32k (one NVIDIA H100,
/// 2026-12-06).
///
/// MIN_BLOCKS is the residency the kernel is compiled for (`__launch_bounds__`, 0 for none): ptxas
/// keeps a batch's loads together only when its register budget holds them. At the defaults (two
/// rows a warp, no bound) it takes 164 registers and issues all 64 loads before the wait: three
/// blocks an SM, the 320 blocks in one wave. With one row a warp and no bound it takes 85 and
/// moves the codes' loads after the wait, next to their uses; a bound of 4 blocks (126
/// registers) keeps them ahead.
///
/// h comes after the wait in about ten round trips to L2, interleaved by ptxas with the products
/// (sm_90 SASS, `kernel-inspect --sass`). Not kept (sessions 47 and 51): the block copying every
/// task's int8 h and scale into shared memory first (one round trip and a barrier; 165 registers
/// as now) made the step no faster. Alone, against the default's runs beside it: −0.1% to +0.9%
/// at 1k, +0.4% to +1.3% at 32k (one NVIDIA H100, 2026-12-07; BENCHMARKS.md, MoE section). The
/// products overlap those rounds; the barrier holds every warp for the block's last load.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(hidden, WARPS * ROWS),
    min_blocks = MIN_BLOCKS,
    require(
        top_k + 1 <= 32 * WARPS,
        top_k < 64,
        inter >= 16,
        inter % 16 == 0,
        shared_inter % 16 == 0,
        top_k * (inter / 16) + shared_inter / 16 <= 32 * BATCH,
        h_stride % 16 == 0,
        hidden % (WARPS * ROWS) == 0,
    ),
)]
pub fn moe_down_nvfp4(
    #[tile(default = 2, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 16, candidates = [8, 16, 32])] BATCH: u32,
    #[tile(default = 0, candidates = [0, 2, 4, 6])] MIN_BLOCKS: u32,
    #[tile(default = true, candidates = [false, true])] I8: bool,
    #[tile(default = 0, candidates = [0, 1], step)] TRIGGER: u32,
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
        // Expert e's matrix starts after e routed matrices of hidden × inter values.
        let first = expert * hidden * inter;
        slot_first[k] = first;
        slot_factor[k] = load_cg(weights, k) * scale2[expert];
    }
    sync_threads();

    let row0 = tile0 + warp_id() * ROWS;
    let routed_chunks = inter / 16;
    let tasks = top_k * routed_chunks + shared_inter / 16;
    // The lane's codes and block scales, every load issued before the first is used and before
    // the wait. The scales stay e4m3 until after the wait: converting one waits for its load,
    // which would hold back the loads behind it (the fill, `scales[0]`, is any e4m3; every entry
    // is overwritten). `at` is the task's 16-value chunk of h; `factor` its slot's weight × global
    // scale, zero past the end of the list.
    let mut codes = [u32x2(0, 0); BATCH * ROWS];
    let mut block_scale = [scales[0]; BATCH * ROWS];
    let mut factor = [0.0; BATCH];
    let mut at = [0; BATCH];
    #[unroll]
    for j in 0..BATCH {
        // Past the end a lane repeats the last task with a zero factor: no branch around the
        // loads.
        let t = min(lane_id() + 32 * j, tasks - 1);
        let k = min(t / routed_chunks, top_k);
        let chunk = t - k * routed_chunks;
        let cols = if k < top_k { inter } else { shared_inter };
        at[j] = k * (h_stride / 16) + chunk;
        factor[j] = if lane_id() + 32 * j < tasks { slot_factor[k] } else { 0.0 };
        #[unroll]
        for r in 0..ROWS {
            let v = slot_first[k] + (row0 + r) * cols + chunk * 16;
            codes[j * ROWS + r] = load_early::<u32x2>(packed, v / 2);
            block_scale[j * ROWS + r] = scales[v / 16];
        }
    }
    grid_dependency_wait();
    if TRIGGER == 0 {
        launch_dependents();
    }

    let mut total = [0.0; ROWS];
    #[unroll]
    for j in 0..BATCH {
        let hs = h_scale[at[j]];
        if I8 {
            // h in int8 after its f16 pairs; the sums are short by 2·127 (put back below).
            let hq = load_vec::<u32x4>(h_staged, (top_k + 1) * (h_stride / 8) + at[j]);
            #[unroll]
            for r in 0..ROWS {
                let scale = (block_scale[j * ROWS + r] as f32) * factor[j];
                total[r] += (dot_e2m1x16_i8(codes[j * ROWS + r], hq) as f32) * (scale * hs);
            }
        } else {
            let xa = load_vec::<u32x4>(h_staged, at[j] * 2);
            let xb = load_vec::<u32x4>(h_staged, at[j] * 2 + 1);
            #[unroll]
            for r in 0..ROWS {
                let scale = (block_scale[j * ROWS + r] as f32) * factor[j];
                total[r] += dot_e2m1x16(codes[j * ROWS + r], xa, xb) * (scale * hs);
            }
        }
    }
    let unit = if I8 { 1.0 / 254.0 } else { 1.0 };
    #[unroll]
    for r in 0..ROWS {
        total[r] = warp_sum(total[r]) * unit;
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
