//! Device functions that stage a bf16 vector in shared memory for the NVFP4 dot products:
//! `gemv_nvfp4` (its plain paths) and the NVFP4 lm_head (`lm_head_argmax_nvfp4`). A helpers file,
//! not a Rust module: both kernels name it (`#[kernel(..., helpers =
//! "src/kernels/helpers/stage_x.rs")]`) and every call is expanded in place. (The MoE router
//! stages x the same way into a global buffer, in 16-byte words, and keeps its own copy.)

/// Stages the 16-value chunk `chunk` of x (its values at `x[at + 16·chunk ..]`) as the FP4 dot
/// products read it: f16 pairs in this architecture's decode order (`stage_e2m1_x8`), divided by
/// the chunk's max|x| (a zero chunk stays zero), eight words at `xs[8·chunk ..]`, and that max
/// at `xsc[chunk]`.
fn stage_x_chunk(x: &[bf16], at: u32, chunk: u32, xs: &mut [u32], xsc: &mut [f32]) {
    let lo = load_vec::<u32x4>(x, at + chunk * 16);
    let hi = load_vec::<u32x4>(x, at + chunk * 16 + 8);
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
    let s0 = stage_e2m1_x8(
        f32x4(a.x * inv, a.y * inv, b.x * inv, b.y * inv),
        f32x4(c.x * inv, c.y * inv, d.x * inv, d.y * inv),
    );
    let s1 = stage_e2m1_x8(
        f32x4(f.x * inv, f.y * inv, g.x * inv, g.y * inv),
        f32x4(h.x * inv, h.y * inv, i.x * inv, i.y * inv),
    );
    xs[chunk * 8] = s0.x;
    xs[chunk * 8 + 1] = s0.y;
    xs[chunk * 8 + 2] = s0.z;
    xs[chunk * 8 + 3] = s0.w;
    xs[chunk * 8 + 4] = s1.x;
    xs[chunk * 8 + 5] = s1.y;
    xs[chunk * 8 + 6] = s1.z;
    xs[chunk * 8 + 7] = s1.w;
    xsc[chunk] = m;
}
