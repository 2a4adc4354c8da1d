//! The MoE router on the device: logits, softmax, top-k, renormalisation, in one launch.

use kernel_macros::kernel;

/// Routes one token and prepares the experts' input.
///
/// The kernel overlaps its predecessor (programmatic dependent launch): before
/// `grid_dependency_wait()` each warp only asks L2 for its row of the router (bf16
/// [experts, hidden]) or of `shared_gate` (the last row), which do not depend on anything before.
/// After the wait, phase 1 spreads the experts + 1 logits over the grid, a warp each (BATCH
/// pieces of the row and of x a lane in flight at once), then every thread of the grid stages at
/// most one 16-value chunk of x as the NVFP4 kernels read it: f16 pairs divided by the chunk's
/// max|x| (`x_staged` [hidden/8], `x_scale` [hidden/16]), so no grid-wide maximum is needed. The
/// last block to finish (a counter in `counter[0]`, zero before the first launch and put back to
/// zero) takes phase 2 in warp 0: the softmax over the experts in f32 (PER_LANE probabilities a
/// lane, in registers), the top-k (probability descending, the lower expert first on ties), the
/// routing weights (renormalised to sum to 1 when `renormalise`), and σ(shared_gate·x) in
/// `weights[top_k]`. Nothing comes back to the host.
///
/// The top-k: with FILTER (the default) a threshold that every chosen key must reach, then each
/// candidate's rank among the candidates (the code says how); otherwise, and for more than 32
/// candidates (many equal keys) or top_k > 32, top_k rounds of a warp argmax, each two pairwise
/// trees over a lane's probabilities and two `redux.sync` reductions over the warp. NVIDIA H200,
/// 2026-12-02 (BENCHMARKS.md, MoE section): the router alone 6.27 → 5.66 µs a launch (5.77 on
/// this code, in a run about 1% slower throughout). Holding each warp's row in registers from
/// before the wait instead of the L2 prefetch was slower alone (6.29 µs) and is not kept.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(experts + 1, WARPS),
    helpers = "src/kernels/helpers/router.rs",
    require(
        experts <= 32 * PER_LANE,
        PER_LANE <= 32,
        hidden % 256 == 0,
        hidden / 16 <= div_ceil(experts + 1, WARPS) * WARPS * 32,
        top_k >= 1,
        top_k <= experts,
        top_k < 64,
    ),
)]
pub fn moe_router(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 10, candidates = [5, 10])] BATCH: u32,
    #[tile(default = 16, candidates = [16, 32])] PER_LANE: u32,
    #[tile(default = true, candidates = [false, true])] FILTER: bool,
    router: &[bf16],
    shared_gate: &[bf16],
    x: &[bf16],
    logits: &mut [f32],
    counter: &mut [u32],
    ids: &mut [u32],
    weights: &mut [f32],
    x_staged: &mut [u32x4],
    x_scale: &mut [f32],
    experts: u32,
    hidden: u32,
    top_k: u32,
    renormalise: bool,
) {
    let e = block_idx() * WARPS + warp_id();
    if lane_id() == 0 {
        if e < experts {
            prefetch_l2(router, e * hidden, hidden * 2);
        } else if e == experts {
            prefetch_l2(shared_gate, 0, hidden * 2);
        }
    }
    grid_dependency_wait();
    launch_dependents();

    // The branch stays outside the loops: a load under a branch inside a loop is not hoisted,
    // and every step would then wait for the one before.
    if e < experts {
        let logit = row_dot(router, e * hidden, x, hidden, true);
        if lane_id() == 0 {
            logits[e] = logit;
        }
    } else if e == experts {
        let logit = row_dot(shared_gate, 0, x, hidden, false);
        if lane_id() == 0 {
            logits[e] = logit;
        }
    }

    // x for the NVFP4 experts, one 16-value chunk a thread of the grid: after the logits, whose
    // loads it would otherwise split into two rounds (its stores may alias them); x is in L1 by
    // now.
    let chunk = block_idx() * 32 * WARPS + thread_idx();
    if chunk < hidden / 16 {
        let lo = load_vec::<u32x4>(x, chunk * 16);
        let hi = load_vec::<u32x4>(x, chunk * 16 + 8);
        let (a, b, c, d) = (bf16x2_to_f32x2(lo.x), bf16x2_to_f32x2(lo.y), bf16x2_to_f32x2(lo.z), bf16x2_to_f32x2(lo.w));
        let (f, g, h, i) = (bf16x2_to_f32x2(hi.x), bf16x2_to_f32x2(hi.y), bf16x2_to_f32x2(hi.z), bf16x2_to_f32x2(hi.w));
        let m0 = max(
            max(max(abs(a.x), abs(a.y)), max(abs(b.x), abs(b.y))),
            max(max(abs(c.x), abs(c.y)), max(abs(d.x), abs(d.y))),
        );
        let m1 = max(
            max(max(abs(f.x), abs(f.y)), max(abs(g.x), abs(g.y))),
            max(max(abs(h.x), abs(h.y)), max(abs(i.x), abs(i.y))),
        );
        let m = max(m0, m1);
        let inv = if m > 0.0 { 1.0 / m } else { 0.0 };
        x_staged[chunk * 2] = stage_e2m1_x8(
            f32x4(a.x * inv, a.y * inv, b.x * inv, b.y * inv),
            f32x4(c.x * inv, c.y * inv, d.x * inv, d.y * inv),
        );
        x_staged[chunk * 2 + 1] = stage_e2m1_x8(
            f32x4(f.x * inv, f.y * inv, g.x * inv, g.y * inv),
            f32x4(h.x * inv, h.y * inv, i.x * inv, i.y * inv),
        );
        x_scale[chunk] = m;
    }

    // Publish the logits, then count this block in; the last one goes on. This tail costs the
    // H200 step about 2.4 µs a layer; the route taken in every consumer instead cost more, and a
    // fence by one thread or faster rounds changed nothing (BENCHMARKS.md, step section, session 25).
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        last[0] = if atomic_add(counter, 0, 1) == grid_dim() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 0 || warp_id() != 0 {
        return;
    }
    if lane_id() == 0 {
        counter[0] = 0;
    }

    // Warp 0: softmax and top-k, lane l holding the probabilities of experts l, l + 32, ... in
    // registers (the loops over them unroll, so every index is a constant).
    // Every load unconditional (index clamped to the shared gate's slot), so all are in flight
    // at once; the lanes past the experts are masked after.
    let mut p = [f32::NEG_INFINITY; PER_LANE];
    #[unroll]
    for j in 0..PER_LANE {
        let i = lane_id() + 32 * j;
        let v = load_cg(logits, min(i, experts));
        p[j] = if i < experts { v } else { f32::NEG_INFINITY };
    }
    let shared_logit = load_cg(logits, experts);
    let mut top = f32::NEG_INFINITY;
    #[unroll]
    for j in 0..PER_LANE {
        top = max(top, p[j]);
    }
    top = warp_max(top);
    // exp(-inf) = 0 for the lanes past the experts: no branch, so the exps overlap.
    let mut s = 0.0;
    #[unroll]
    for j in 0..PER_LANE {
        p[j] = exp(p[j] - top);
        s += p[j];
    }
    let total = warp_sum(s);
    // Each expert's key orders like its probability: the bits of exp(logit - max) plus one (in
    // [0, 1], so the bits order as the values and cannot overflow), 0 for the lanes past the
    // experts and for the experts already chosen, so those lose to every real expert, one whose
    // exp underflowed to zero included. Dividing by the total is monotone, so it cannot reorder
    // them (at most merge two neighbours by rounding); it is done once, for the chosen weights.
    let mut key = [0u32; PER_LANE];
    #[unroll]
    for j in 0..PER_LANE {
        key[j] = if lane_id() + 32 * j < experts { p[j].to_bits() + 1 } else { 0 };
    }
    // FILTER (top_k <= 32): the top_k-th largest of the 32 lanes' best keys is a threshold that
    // at least top_k keys reach, so every chosen expert's key is at or above it. The keys that
    // reach it (usually a few more than top_k) gather in shared memory, and each takes its place
    // by counting the candidates ahead of it (larger key, or the same key and a lower index): a
    // few dozen shuffles and shared loads instead of top_k dependent rounds. Past 32 candidates
    // (many equal keys) the rounds below do it.
    let cand_key = shared::<u32, 32>();
    let cand_id = shared::<u32, 32>();
    let mut routed = false;
    if FILTER && top_k <= 32 {
        // Once, not a round: a plain chain of maxima does.
        let mut lane_best = 0u32;
        #[unroll]
        for j in 0..PER_LANE {
            lane_best = max(lane_best, key[j]);
        }
        // A lane's best is the threshold candidate when fewer than top_k lanes' bests beat it;
        // the smallest such best is the top_k-th largest.
        let mut beaten_by = 0u32;
        #[unroll]
        for m in 0..32 {
            beaten_by += if shfl(lane_best, m) > lane_best { 1 } else { 0 };
        }
        let threshold = warp_min_u32(if beaten_by < top_k { lane_best } else { 0xffffffff });
        // Every real key is at least 1 and top_k lanes hold one, so the threshold is too: the
        // lanes past the experts (key 0) never qualify.
        let mut count = 0u32;
        #[unroll]
        for j in 0..PER_LANE {
            count += if key[j] >= threshold { 1 } else { 0 };
        }
        // Where a lane's candidates go: the inclusive sum of the counts over the lanes below.
        let mut upto = count;
        #[unroll]
        for i in 0..5 {
            let d = 1u32 << i;
            let below = shfl(upto, (lane_id() + 32 - d) % 32);
            if lane_id() >= d {
                upto += below;
            }
        }
        let candidates = shfl(upto, 31);
        if candidates <= 32 {
            let mut at = upto - count;
            #[unroll]
            for j in 0..PER_LANE {
                if key[j] >= threshold {
                    cand_key[at] = key[j];
                    cand_id[at] = lane_id() + 32 * j;
                    at += 1;
                }
            }
            sync_warp();
            let mine = if lane_id() < candidates { cand_key[lane_id()] } else { 0 };
            let my_id = if lane_id() < candidates { cand_id[lane_id()] } else { 0 };
            let mut ahead = 0u32;
            #[unroll]
            for m in 0..32 {
                if m < candidates {
                    let (other, other_id) = (cand_key[m], cand_id[m]);
                    ahead += if other > mine || (other == mine && other_id < my_id) { 1 } else { 0 };
                }
            }
            let chosen = lane_id() < candidates && ahead < top_k;
            let chosen_p = if chosen { f32::from_bits(mine - 1) } else { 0.0 };
            let norm = if renormalise { warp_sum(chosen_p) } else { total };
            if chosen {
                ids[ahead] = my_id;
                weights[ahead] = chosen_p / norm;
            }
            routed = true;
        }
    }
    if !routed {
        let mut chosen_sum = 0.0;
        let (mut first_id, mut second_id) = (0u32, 0u32);
        let (mut first_p, mut second_p) = (0.0, 0.0);
        for k in 0..top_k {
            // A round is two pairwise trees over the lane's keys (depth log2 PER_LANE, not a chain
            // of PER_LANE dependent compares): the largest key, then the lowest index holding it;
            // then the same two reductions over the warp, one `redux.sync` each.
            let mut best = [0u32; PER_LANE];
            #[unroll]
            for j in 0..PER_LANE {
                best[j] = key[j];
            }
            // Level by level, entry j takes the larger of 2j and 2j + 1 (a level past PER_LANE's
            // depth runs no iterations).
            #[unroll]
            for j in 0..PER_LANE / 2 {
                best[j] = max(best[2 * j], best[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 4 {
                best[j] = max(best[2 * j], best[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 8 {
                best[j] = max(best[2 * j], best[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 16 {
                best[j] = max(best[2 * j], best[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 32 {
                best[j] = max(best[2 * j], best[2 * j + 1]);
            }
            let best_key = warp_max_u32(best[0]);
            let mut lowest = [0u32; PER_LANE];
            #[unroll]
            for j in 0..PER_LANE {
                lowest[j] = if key[j] == best_key { lane_id() + 32 * j } else { 0xffffffff };
            }
            #[unroll]
            for j in 0..PER_LANE / 2 {
                lowest[j] = min(lowest[2 * j], lowest[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 4 {
                lowest[j] = min(lowest[2 * j], lowest[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 8 {
                lowest[j] = min(lowest[2 * j], lowest[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 16 {
                lowest[j] = min(lowest[2 * j], lowest[2 * j + 1]);
            }
            #[unroll]
            for j in 0..PER_LANE / 32 {
                lowest[j] = min(lowest[2 * j], lowest[2 * j + 1]);
            }
            let bi = warp_min_u32(lowest[0]);
            let bp = if best_key > 0 { f32::from_bits(best_key - 1) } else { 0.0 };
            // Every lane holds the winner now; its owner strikes it.
            #[unroll]
            for j in 0..PER_LANE {
                if lane_id() + 32 * j == bi {
                    key[j] = 0;
                }
            }
            // Lane k (k < 32), or lane k - 32, keeps the k-th choice for the writes below.
            if lane_id() == k % 32 {
                if k < 32 {
                    first_id = bi;
                    first_p = bp;
                } else {
                    second_id = bi;
                    second_p = bp;
                }
            }
            chosen_sum += bp;
        }
        // The choices leave from registers as probabilities, renormalised to sum to 1 when asked
        // (top_k < 64): one division a lane.
        let norm = if renormalise { chosen_sum } else { total };
        if lane_id() < top_k {
            ids[lane_id()] = first_id;
            weights[lane_id()] = first_p / norm;
        }
        if lane_id() + 32 < top_k {
            ids[lane_id() + 32] = second_id;
            weights[lane_id() + 32] = second_p / norm;
        }
    }
    if lane_id() == 0 {
        weights[top_k] = sigmoid(shared_logit);
    }
}
