//! Zero-centred RMSNorm over groups: the Gated Residual's per-stream norm.

use kernel_macros::kernel;

/// Zero-centred RMSNorm over groups of a bf16 matrix:
/// y[g, i] = x[g, i] · rsqrt(mean_i x[g, i]² + eps) · (1 + w[g, i]), sums in f32.
///
/// One block per group. Threads stride over the group with 16-byte loads (8 bf16 each): a first
/// pass sums squares, a block reduction gives the scale, a second pass re-reads x (from L1/L2),
/// applies it and writes y with 16-byte stores.
#[kernel(block = 32 * WARPS, grid = groups, require(group_len % 8 == 0))]
pub fn zc_rmsnorm(
    #[tile(default = 8, candidates = [2, 4, 8, 16])] WARPS: u32,
    x: &[bf16],
    w: &[bf16],
    y: &mut [bf16],
    groups: u32,
    group_len: u32,
    eps: f32,
) {
    let scratch = shared::<f32, WARPS>();
    let base = block_idx() * group_len;
    let stride = block_dim() * 8;

    let mut sum_sq = 0.0;
    for i in (thread_idx() * 8..group_len).step_by(stride) {
        let v = load_vec::<u32x4>(x, base + i);
        let a = bf16x2_to_f32x2(v.x);
        let b = bf16x2_to_f32x2(v.y);
        let c = bf16x2_to_f32x2(v.z);
        let d = bf16x2_to_f32x2(v.w);
        sum_sq += a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
        sum_sq += c.x * c.x + c.y * c.y + d.x * d.x + d.y * d.y;
    }
    let total = block_sum(sum_sq, scratch);
    let scale = rsqrt(total / group_len as f32 + eps);

    for i in (thread_idx() * 8..group_len).step_by(stride) {
        let v = load_vec::<u32x4>(x, base + i);
        let g = load_vec::<u32x4>(w, base + i);
        // Element pairs: x values, then weights; the same order of operations as the reference.
        let (x0, w0) = (bf16x2_to_f32x2(v.x), bf16x2_to_f32x2(g.x));
        let (x1, w1) = (bf16x2_to_f32x2(v.y), bf16x2_to_f32x2(g.y));
        let (x2, w2) = (bf16x2_to_f32x2(v.z), bf16x2_to_f32x2(g.z));
        let (x3, w3) = (bf16x2_to_f32x2(v.w), bf16x2_to_f32x2(g.w));
        let out = u32x4(
            pack_bf16x2(x0.x * scale * (1.0 + w0.x), x0.y * scale * (1.0 + w0.y)),
            pack_bf16x2(x1.x * scale * (1.0 + w1.x), x1.y * scale * (1.0 + w1.y)),
            pack_bf16x2(x2.x * scale * (1.0 + w2.x), x2.y * scale * (1.0 + w2.y)),
            pack_bf16x2(x3.x * scale * (1.0 + w3.x), x3.y * scale * (1.0 + w3.y)),
        );
        store_vec(y, base + i, out);
    }
}
