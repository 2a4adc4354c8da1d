//! The delta rule on the fp32 state of every value head in one pass (the state read once and
//! written once), with the gated RMSNorm of the heads' outputs folded into its last blocks.

use kernel_macros::kernel;

/// One decode step of the Gated DeltaNet recurrence, for every value head h (key head
/// κ = h / (value_heads / key_heads), as the reference's repeat_interleave has it):
///
/// ```text
/// k̂ = l2norm(k_κ), q̂ = l2norm(q_κ)/√dk          (eps 1e-6 inside the root of the sum)
/// S ← α_h S;  δ = β_h (v_h − Sᵀk̂);  S ← S + k̂ δᵀ;  o_h = Sᵀq̂
/// y_h = norm_w ⊙ RMSNorm(o_h) ⊙ act(z_h)          act = σ or SiLU
/// ```
///
/// `proj` is what [`super::in_proj::gdn_in_proj_bf16`] wrote: q [Hk·dk], k [Hk·dk], v [Hv·dv]
/// (conv and SiLU applied), z [Hv·dv], β [Hv], α [Hv]. The state is [Hv, dk, dv] row-major.
///
/// Grid (value heads, column slices of 4·COL_LANES state columns). Thread (tj, rg) holds the
/// 4 columns 4·tj.. of its slice over RPT consecutive rows rg·RPT.. in registers (16-byte loads
/// and stores, each row of a slice contiguous), with the RPT values of k̂ and q̂ it meets. The
/// column sums Sᵀk̂ and Sᵀq̂ are reduced over the ROW_SPLIT row groups in a fixed order (xor
/// shuffles inside a warp, then the warps' partials added in warp order through shared memory):
/// deterministic. Every block recomputes the two l2 norms (2·dk floats from L2, cheap).
///
/// The kernel overlaps its predecessor (programmatic dependent launch): the state loads come
/// before `grid_dependency_wait()`, everything that reads `proj` or writes comes after.
///
/// o_h goes to `o` in f32; the last slice block of a head to finish (a counter per head in
/// `counters` [Hv], zero before the first launch and left zero) reads the head's o back from L2
/// and writes y_h in bf16: the input of out_proj.
#[kernel(
    block = COL_LANES * ROW_SPLIT,
    grid = (value_heads, dv / (4 * COL_LANES)),
    require(
        dk == RPT * ROW_SPLIT,
        dv % (4 * COL_LANES) == 0,
        (COL_LANES * ROW_SPLIT) % 32 == 0,
        key_heads > 0,
        value_heads % key_heads == 0,
    ),
)]
pub fn gdn_state_update(
    #[tile(default = 16, candidates = [4, 8, 16, 32])] COL_LANES: u32,
    #[tile(default = 8, candidates = [8, 16])] ROW_SPLIT: u32,
    #[tile(default = 16, candidates = [4, 8, 16])] RPT: u32,
    proj: &[f32],
    norm_w: &[bf16],
    state: &mut [f32],
    o: &mut [f32],
    counters: &mut [u32],
    y: &mut [bf16],
    key_heads: u32,
    value_heads: u32,
    dk: u32,
    dv: u32,
    eps: f32,
    sigmoid_gate: bool,
) {
    let scratch = shared::<f32, { COL_LANES * ROW_SPLIT / 32 }>();
    // Per warp, the 4·COL_LANES column partials of its first row group.
    let partials = shared::<f32, { COL_LANES * ROW_SPLIT / 32 * 4 * COL_LANES }>();
    let warps = COL_LANES * ROW_SPLIT / 32;
    let head = block_idx();
    let tj = thread_idx() % COL_LANES;
    let rg = thread_idx() / COL_LANES;
    let j0 = block_idx_y() * 4 * COL_LANES + 4 * tj;
    let i0 = rg * RPT;
    let key_head = head / (value_heads / key_heads);
    let q_base = key_head * dk;
    let k_base = key_heads * dk + key_head * dk;
    let v_base = 2 * key_heads * dk + head * dv;
    let z_base = 2 * key_heads * dk + value_heads * dv + head * dv;
    let gate_base = 2 * key_heads * dk + 2 * value_heads * dv;
    let s_base = head * dk * dv;

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

    // Overlapped launch: the state was last written by this kernel a token ago (at least two
    // launches back), so its loads above may run while the input projection still runs; proj,
    // written by that projection, is read only after the wait.
    grid_dependency_wait();
    launch_dependents();

    // k̂ and q̂ on this thread's rows; the sums of squares over all dk rows (one column lane adds).
    let mut kr = [0.0; RPT];
    let mut qr = [0.0; RPT];
    let mut k_sq = 0.0;
    let mut q_sq = 0.0;
    #[unroll]
    for r in 0..RPT {
        kr[r] = proj[k_base + i0 + r];
        qr[r] = proj[q_base + i0 + r];
        k_sq += kr[r] * kr[r];
        q_sq += qr[r] * qr[r];
    }
    let k_total = block_sum(if tj == 0 { k_sq } else { 0.0 }, scratch);
    let q_total = block_sum(if tj == 0 { q_sq } else { 0.0 }, scratch);
    let k_scale = rsqrt(k_total + 1e-6);
    let q_scale = rsqrt(q_total + 1e-6);
    let inv_sqrt_dk = 1.0 / sqrt(dk as f32);
    #[unroll]
    for r in 0..RPT {
        kr[r] = kr[r] * k_scale;
        qr[r] = qr[r] * q_scale * inv_sqrt_dk;
    }
    let beta = proj[gate_base + head];
    let alpha = proj[gate_base + value_heads + head];

    // Decay, and this thread's part of m = Sᵀk̂.
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
    // Sum over the row groups: lanes tj, tj + COL_LANES, ... of a warp, then the warps in order.
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
    if lane_id() < COL_LANES {
        let p = warp_id() * 4 * COL_LANES + 4 * tj;
        partials[p] = m0;
        partials[p + 1] = m1;
        partials[p + 2] = m2;
        partials[p + 3] = m3;
    }
    sync_threads();
    m0 = 0.0;
    m1 = 0.0;
    m2 = 0.0;
    m3 = 0.0;
    for wi in 0..warps {
        let p = wi * 4 * COL_LANES + 4 * tj;
        m0 += partials[p];
        m1 += partials[p + 1];
        m2 += partials[p + 2];
        m3 += partials[p + 3];
    }

    // δ = β (v − m); S += k̂ δᵀ, stored; and this thread's part of o = Sᵀq̂.
    let v = load_vec::<f32x4>(proj, v_base + j0);
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
    // Every thread has read the partials of m: they may be overwritten.
    sync_threads();
    if lane_id() < COL_LANES {
        let p = warp_id() * 4 * COL_LANES + 4 * tj;
        partials[p] = o0;
        partials[p + 1] = o1;
        partials[p + 2] = o2;
        partials[p + 3] = o3;
    }
    sync_threads();
    if rg == 0 {
        o0 = 0.0;
        o1 = 0.0;
        o2 = 0.0;
        o3 = 0.0;
        for wi in 0..warps {
            let p = wi * 4 * COL_LANES + 4 * tj;
            o0 += partials[p];
            o1 += partials[p + 1];
            o2 += partials[p + 2];
            o3 += partials[p + 3];
        }
        store_vec(o, head * dv + j0, f32x4(o0, o1, o2, o3));
    }

    // Publish o, count this slice in; the head's last slice applies the gated norm.
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        last[0] = if atomic_add(counters, head, 1) == grid_dim_y() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 1 {
        let mut sum_sq = 0.0;
        for j in (thread_idx()..dv).step_by(COL_LANES * ROW_SPLIT) {
            let v = load_cg(o, head * dv + j);
            sum_sq += v * v;
        }
        let scale = rsqrt(block_sum(sum_sq, scratch) / (dv as f32) + eps);
        for j in (thread_idx()..dv).step_by(COL_LANES * ROW_SPLIT) {
            let g = proj[z_base + j];
            let act = if sigmoid_gate { sigmoid(g) } else { silu(g) };
            y[head * dv + j] = ((norm_w[j] as f32) * (load_cg(o, head * dv + j) * scale) * act) as bf16;
        }
        if thread_idx() == 0 {
            counters[head] = 0;
        }
    }
}
