//! The MoE router on the device: logits, softmax, top-k, renormalisation, in one launch.

use kernel_macros::kernel;

/// Routes one token and prepares the experts' input.
///
/// Phase 1 spreads the experts + 1 logits over the grid, a warp each: `router·x` for the experts
/// (bf16 [experts, hidden]) and `shared_gate·x` as the last one. The last block to finish (a
/// counter in `counter[0]`, zero before the first launch and put back to zero) takes phase 2:
/// - every warp: x as the NVFP4 kernels read it, f16 pairs divided by max|x| (`x_staged`
///   [hidden/8], `x_scale` [1]);
/// - warp 0: the softmax over the experts in f32 (PER_LANE probabilities a lane, in registers),
///   then top_k rounds of a warp argmax
///   (probability descending, the lower expert first on ties), the routing weights (renormalised
///   to sum to 1 when `renormalise`), and σ(shared_gate·x) in `weights[top_k]`;
/// - `h_max` [top_k + 1] zeroed for the gate/up kernel.
/// Nothing comes back to the host.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(experts + 1, WARPS),
    require(
        experts <= 32 * PER_LANE,
        hidden % 256 == 0,
        top_k >= 1,
        top_k <= experts,
        top_k < 64,
    ),
)]
pub fn moe_router(
    #[tile(default = 8, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [2, 4])] UNROLL: u32,
    #[tile(default = 16, candidates = [16, 32])] PER_LANE: u32,
    router: &[bf16],
    shared_gate: &[bf16],
    x: &[bf16],
    logits: &mut [f32],
    counter: &mut [u32],
    ids: &mut [u32],
    weights: &mut [f32],
    x_staged: &mut [u32x4],
    x_scale: &mut [f32],
    h_max: &mut [u32],
    experts: u32,
    hidden: u32,
    top_k: u32,
    renormalise: bool,
) {
    let e = block_idx() * WARPS + warp_id();
    if e <= experts {
        let mut acc = 0.0;
        #[unroll(UNROLL)]
        for k in (lane_id() * 8..hidden).step_by(256) {
            let xv = load_vec::<u32x4>(x, k);
            if e < experts {
                acc += dot_bf16x8(load_stream::<u32x4>(router, e * hidden + k), xv);
            } else {
                acc += dot_bf16x8(load_vec::<u32x4>(shared_gate, k), xv);
            }
        }
        let logit = warp_sum(acc);
        if lane_id() == 0 {
            logits[e] = logit;
        }
    }
    // Publish the logits, then count this block in; the last one goes on.
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        last[0] = if atomic_add(counter, 0, 1) == grid_dim() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 0 {
        return;
    }

    // x for the NVFP4 experts: f16 pairs, divided by max|x|.
    let scratch = shared::<f32, WARPS>();
    let mut m = 0.0;
    for i in (thread_idx() * 8..hidden).step_by(256 * WARPS) {
        let v = load_vec::<u32x4>(x, i);
        let (a, b, c, d) = (bf16x2_to_f32x2(v.x), bf16x2_to_f32x2(v.y), bf16x2_to_f32x2(v.z), bf16x2_to_f32x2(v.w));
        m = max(m, max(max(abs(a.x), abs(a.y)), max(abs(b.x), abs(b.y))));
        m = max(m, max(max(abs(c.x), abs(c.y)), max(abs(d.x), abs(d.y))));
    }
    let x_max = block_max(m, scratch);
    let inv = if x_max > 0.0 { 1.0 / x_max } else { 0.0 };
    for g in (thread_idx()..hidden / 8).step_by(32 * WARPS) {
        let v = load_vec::<u32x4>(x, g * 8);
        let (a, b, c, d) = (bf16x2_to_f32x2(v.x), bf16x2_to_f32x2(v.y), bf16x2_to_f32x2(v.z), bf16x2_to_f32x2(v.w));
        x_staged[g] = stage_e2m1_x8(
            f32x4(a.x * inv, a.y * inv, b.x * inv, b.y * inv),
            f32x4(c.x * inv, c.y * inv, d.x * inv, d.y * inv),
        );
    }
    if thread_idx() == 0 {
        x_scale[0] = x_max;
        counter[0] = 0;
    }
    if thread_idx() <= top_k {
        h_max[thread_idx()] = 0;
    }
    if warp_id() != 0 {
        return;
    }

    // Warp 0: softmax and top-k, lane l holding the probabilities of experts l, l + 32, ... in
    // registers (the loops over them unroll, so every index is a constant).
    let mut p = [f32::NEG_INFINITY; PER_LANE];
    #[unroll]
    for j in 0..PER_LANE {
        let i = lane_id() + 32 * j;
        if i < experts {
            p[j] = load_cg(logits, i);
        }
    }
    let mut top = f32::NEG_INFINITY;
    #[unroll]
    for j in 0..PER_LANE {
        top = max(top, p[j]);
    }
    top = warp_max(top);
    let mut s = 0.0;
    #[unroll]
    for j in 0..PER_LANE {
        if lane_id() + 32 * j < experts {
            p[j] = exp(p[j] - top);
            s += p[j];
        } else {
            p[j] = -1.0;
        }
    }
    let total = warp_sum(s);
    #[unroll]
    for j in 0..PER_LANE {
        if p[j] >= 0.0 {
            p[j] = p[j] / total;
        }
    }
    let mut chosen_sum = 0.0;
    for k in 0..top_k {
        let mut bp = -1.0;
        let mut bi = experts;
        // Each lane looks at its experts in increasing order, so it keeps the lower one on a tie.
        #[unroll]
        for j in 0..PER_LANE {
            if p[j] > bp {
                bp = p[j];
                bi = lane_id() + 32 * j;
            }
        }
        let mut offset = 16;
        while offset > 0 {
            let op = shfl_xor(bp, offset);
            let oi = shfl_xor(bi, offset);
            if op > bp || (op == bp && oi < bi) {
                bp = op;
                bi = oi;
            }
            offset = offset >> 1;
        }
        // Every lane holds the winner now; its owner strikes it.
        #[unroll]
        for j in 0..PER_LANE {
            if lane_id() + 32 * j == bi {
                p[j] = -1.0;
            }
        }
        if lane_id() == 0 {
            ids[k] = bi;
            weights[k] = bp;
        }
        chosen_sum += bp;
    }
    sync_warp();
    if renormalise && lane_id() < top_k {
        // Lane k rescales weight k (top_k < 64: a second pass for the lanes above 32).
        weights[lane_id()] = weights[lane_id()] / chosen_sum;
    }
    if renormalise && lane_id() + 32 < top_k {
        weights[lane_id() + 32] = weights[lane_id() + 32] / chosen_sum;
    }
    if lane_id() == 0 {
        weights[top_k] = sigmoid(load_cg(logits, experts));
    }
}
