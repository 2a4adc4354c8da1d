//! The Gated DeltaNet delta rule on the fp32 state with whole-head blocks, so that the gated
//! RMSNorm of a head's dv outputs (the only coupling between its columns) is one block reduction
//! in the epilogue: no fence, no counter, no last-block tail, and out_proj is the plain GEMV.

use kernel_macros::kernel;

/// One decode step of the Gated DeltaNet recurrence for every value head h (key head
/// κ = h / (value_heads / key_heads)), with the gated norm:
///
/// ```text
/// k̂ = l2norm(k_κ), q̂ = l2norm(q_κ)/√dk          (eps 1e-6 inside the root of the sum)
/// S ← α_h S;  δ = β_h (v_h − Sᵀk̂);  S ← S + k̂ δᵀ;  o_h = Sᵀq̂
/// y_h = norm_w ⊙ RMSNorm(o_h) ⊙ act(z_h)          act = σ or SiLU
/// ```
///
/// `proj` is what the input projection wrote: q [Hk·dk], k [Hk·dk], v [Hv·dv] (conv and SiLU
/// applied), z [Hv·dv], β [Hv], α [Hv]. The state is [Hv, dk, dv] row-major; y is [Hv·dv] in
/// bf16, the input of out_proj.
///
/// Per state column v everything but the norm is local to the column: (Sᵀk̂)_v, the update of
/// column v and (Sᵀq̂)_v read only column v. So a warp takes 4·COL_LANES whole columns: lane
/// (tj, rg) holds the 4 columns 4·tj.. over the RPT rows rg·RPT.. (32/COL_LANES row groups fill
/// the warp, RPT of them cover dk) in registers, with the RPT values of k̂ and q̂ it meets. The
/// norms of k and q and the column sums Sᵀk̂ and Sᵀq̂ are xor butterflies over the row groups (the
/// lanes with the same tj): every lane gets the same bits, in a fixed order, so the result is
/// deterministic and the state update needs no barrier. RPT stops at 16: at 32 (dk 128 over 4
/// row groups) the 128 state values and 64 of k̂ and q̂ of a thread spill (255 registers on sm_90).
///
/// One block of WARPS warps covers all dv columns of a head (grid: the value heads). After the
/// butterflies every lane of a warp holds its 4 columns' o; Σo² over the head is each warp's
/// partial (its row group 0 lanes, xor-reduced over the column lanes) through shared memory, one
/// `sync_threads()`, then the partials added in warp order by every thread: deterministic.
///
/// The kernel overlaps its predecessor (programmatic dependent launch): the state loads come
/// before `grid_dependency_wait()` (the state was last written by this kernel a token ago, at
/// least two launches back); everything that reads `proj` or writes comes after. TRIGGER says
/// where it lets its successor launch: 0 after the wait, 1 before its state loads (the successor
/// still waits for this grid's end before it reads anything this grid writes, so both are safe).
///
/// In the step (one H100, 2026-12-06, BENCHMARKS.md, GDN section) its work after the wait costs
/// about 3.0 µs a layer, 1.8 of them the state's stores; two blocks a head, each storing half,
/// was slower.
#[kernel(
    block = 32 * WARPS,
    grid = value_heads,
    require(
        dk == RPT * (32 / COL_LANES),
        dv == 4 * COL_LANES * WARPS,
        key_heads > 0,
        value_heads % key_heads == 0,
    ),
)]
pub fn gdn_delta_rule_normed(
    #[tile(default = 4, candidates = [2, 4, 8])] COL_LANES: u32,
    #[tile(default = 16, candidates = [4, 8, 16])] RPT: u32,
    #[tile(default = 8, candidates = [2, 4, 8, 16])] WARPS: u32,
    #[tile(default = 0, candidates = [0, 1], step)] TRIGGER: u32,
    proj: &[f32],
    norm_w: &[bf16],
    state: &mut [f32],
    y: &mut [bf16],
    key_heads: u32,
    value_heads: u32,
    dk: u32,
    dv: u32,
    eps: f32,
    sigmoid_gate: bool,
) {
    // Each warp's Σo² over its columns.
    let partials = shared::<f32, WARPS>();
    let head = block_idx();
    let tj = lane_id() % COL_LANES;
    let rg = lane_id() / COL_LANES;
    let j0 = warp_id() * 4 * COL_LANES + 4 * tj;
    let i0 = rg * RPT;
    let key_head = head / (value_heads / key_heads);
    let q_base = key_head * dk + i0;
    let k_base = key_heads * dk + key_head * dk + i0;
    let v_base = 2 * key_heads * dk + head * dv;
    let z_base = 2 * key_heads * dk + value_heads * dv + head * dv;
    let gate_base = 2 * key_heads * dk + 2 * value_heads * dv;
    let s_base = head * dk * dv;

    if TRIGGER == 1 {
        launch_dependents();
    }
    // The state first: its loads are the long pole, everything else overlaps them.
    let mut s0 = [0.0; RPT];
    let mut s1 = [0.0; RPT];
    let mut s2 = [0.0; RPT];
    let mut s3 = [0.0; RPT];
    #[unroll]
    for r in 0..RPT {
        let v = load_vec::<f32x4>(state, s_base + (i0 + r) * dv + j0);
        s0[r] = v.x;
        s1[r] = v.y;
        s2[r] = v.z;
        s3[r] = v.w;
    }

    // The norm weights of this lane's 4 columns, immutable, before the wait too (`load_early`
    // keeps them there): loaded at the end, next to the stores of y, they were four dependent
    // round trips (a load after a store that may alias it waits for it).
    let norm_pair = load_early::<u32x2>(norm_w, j0);

    // Overlapped launch: proj, written by the input projection, is read only after the wait.
    grid_dependency_wait();
    if TRIGGER == 0 {
        launch_dependents();
    }

    // Everything this thread reads of proj, issued together: its rows of k and q (16-byte loads),
    // its 4 values of v and of z, the gates.
    let mut kr = [0.0; RPT];
    let mut qr = [0.0; RPT];
    #[unroll]
    for r in (0..RPT).step_by(4) {
        let kv = load_vec::<f32x4>(proj, k_base + r);
        let qv = load_vec::<f32x4>(proj, q_base + r);
        kr[r] = kv.x;
        kr[r + 1] = kv.y;
        kr[r + 2] = kv.z;
        kr[r + 3] = kv.w;
        qr[r] = qv.x;
        qr[r + 1] = qv.y;
        qr[r + 2] = qv.z;
        qr[r + 3] = qv.w;
    }
    let v = load_vec::<f32x4>(proj, v_base + j0);
    let z = load_vec::<f32x4>(proj, z_base + j0);
    let beta = proj[gate_base + head];
    let alpha = proj[gate_base + value_heads + head];

    // The l2 norms of k and q: this thread's rows, then the row groups of the warp.
    let mut k_sq = 0.0;
    let mut q_sq = 0.0;
    #[unroll]
    for r in 0..RPT {
        k_sq += kr[r] * kr[r];
        q_sq += qr[r] * qr[r];
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset >= COL_LANES {
            k_sq += shfl_xor(k_sq, offset);
            q_sq += shfl_xor(q_sq, offset);
        }
    }
    let k_scale = rsqrt(k_sq + 1e-6);
    let q_scale = rsqrt(q_sq + 1e-6) * (1.0 / sqrt(dk as f32));
    #[unroll]
    for r in 0..RPT {
        kr[r] = kr[r] * k_scale;
        qr[r] = qr[r] * q_scale;
    }

    // Decay, and m = Sᵀk̂ over this thread's rows, then over the warp's row groups.
    let mut m0 = 0.0;
    let mut m1 = 0.0;
    let mut m2 = 0.0;
    let mut m3 = 0.0;
    #[unroll]
    for r in 0..RPT {
        s0[r] = s0[r] * alpha;
        s1[r] = s1[r] * alpha;
        s2[r] = s2[r] * alpha;
        s3[r] = s3[r] * alpha;
        m0 += s0[r] * kr[r];
        m1 += s1[r] * kr[r];
        m2 += s2[r] * kr[r];
        m3 += s3[r] * kr[r];
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset >= COL_LANES {
            m0 += shfl_xor(m0, offset);
            m1 += shfl_xor(m1, offset);
            m2 += shfl_xor(m2, offset);
            m3 += shfl_xor(m3, offset);
        }
    }

    // δ = β (v − m); S += k̂ δᵀ, stored at once; and o = Sᵀq̂.
    let d0 = beta * (v.x - m0);
    let d1 = beta * (v.y - m1);
    let d2 = beta * (v.z - m2);
    let d3 = beta * (v.w - m3);
    let mut o0 = 0.0;
    let mut o1 = 0.0;
    let mut o2 = 0.0;
    let mut o3 = 0.0;
    #[unroll]
    for r in 0..RPT {
        s0[r] += kr[r] * d0;
        s1[r] += kr[r] * d1;
        s2[r] += kr[r] * d2;
        s3[r] += kr[r] * d3;
        store_vec(state, s_base + (i0 + r) * dv + j0, f32x4(s0[r], s1[r], s2[r], s3[r]));
        o0 += s0[r] * qr[r];
        o1 += s1[r] * qr[r];
        o2 += s2[r] * qr[r];
        o3 += s3[r] * qr[r];
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset >= COL_LANES {
            o0 += shfl_xor(o0, offset);
            o1 += shfl_xor(o1, offset);
            o2 += shfl_xor(o2, offset);
            o3 += shfl_xor(o3, offset);
        }
    }

    // Σo² over the head: this lane's 4 columns, the warp's column lanes (xor over the low lane
    // bits, every row group alike), then the warps' partials in warp order.
    let mut sq = o0 * o0 + o1 * o1 + o2 * o2 + o3 * o3;
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < COL_LANES {
            sq += shfl_xor(sq, offset);
        }
    }
    if lane_id() == 0 {
        partials[warp_id()] = sq;
    }
    sync_threads();
    let mut sum_sq = 0.0;
    #[unroll]
    for wi in 0..WARPS {
        sum_sq += partials[wi];
    }
    let scale = rsqrt(sum_sq / (dv as f32) + eps);

    if rg == 0 {
        let a0 = if sigmoid_gate { sigmoid(z.x) } else { silu(z.x) };
        let a1 = if sigmoid_gate { sigmoid(z.y) } else { silu(z.y) };
        let a2 = if sigmoid_gate { sigmoid(z.z) } else { silu(z.z) };
        let a3 = if sigmoid_gate { sigmoid(z.w) } else { silu(z.w) };
        let (w01, w23) = (bf16x2_to_f32x2(norm_pair.x), bf16x2_to_f32x2(norm_pair.y));
        let out = head * dv + j0;
        y[out] = (w01.x * (o0 * scale) * a0) as bf16;
        y[out + 1] = (w01.y * (o1 * scale) * a1) as bf16;
        y[out + 2] = (w23.x * (o2 * scale) * a2) as bf16;
        y[out + 3] = (w23.y * (o3 * scale) * a3) as bf16;
    }
}
