//! The PLE row gather from NVFP4 rows, dequantised to bf16 on the way: a quarter of bf16's bytes
//! cross the bus (96 bytes a 160-value row against 320), which is what lets the full table (29 GB
//! instead of 102 GB) sit in host RAM.

use kernel_macros::kernel;

/// `rows[r, :] = dequant(table row ids[r])` for r < `count`, rows of `width` values, as bf16.
///
/// A table row is `row_words` 32-bit words (a multiple of 4, so rows stay 16-byte aligned): the
/// e2m1 codes (`width / 2` bytes, the even value in the low nibble), then one e4m3 scale per 16
/// values, then padding. Value = code · scale · `scale2` (the layer's global scale), in that order,
/// as `model::nvfp4::Nvfp4Matrix::dequantise` computes it, rounded to bf16.
///
/// Each thread takes 32 values of one row: one 16-byte load of codes and one 4-byte load of the
/// word holding its two scales, both issued before either is used, so a step's reads are all in
/// flight at once (see `gather_bf16`).
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(count * (width / 32), 32 * WARPS),
    require(width % 32 == 0, row_words % 4 == 0, row_words * 4 >= width / 2 + width / 16),
)]
pub fn ple_gather_nvfp4(
    #[tile(default = 4, candidates = [2, 4])] WARPS: u32,
    table: &[u32],
    ids: &[u64],
    rows: &mut [bf16],
    count: u32,
    width: u32,
    row_words: u32,
    scale2: f32,
) {
    let pieces = width / 32;
    let i = block_idx() * block_dim() + thread_idx();
    if i < count * pieces {
        let r = i / pieces;
        let p = i % pieces;
        let row = ids[r] * (row_words as u64);
        let codes = load_vec::<u32x4>(table, row + ((p * 4) as u64));
        // Scales 2p and 2p + 1: bytes 2p and 2p + 1 after the codes, in word width/8 + p/2.
        let scale_word = table[row + ((width / 8 + p / 2) as u64)];
        let scales = e4m3x4_to_f32x4(scale_word);
        let s0 = if p % 2 == 0 { scales.x } else { scales.z };
        let s1 = if p % 2 == 0 { scales.y } else { scales.w };
        let out = r * width + p * 32;

        let a = e2m1x4_to_f32x4(codes.x);
        let b = e2m1x4_to_f32x4(codes.x >> 16);
        let c = e2m1x4_to_f32x4(codes.y);
        let d = e2m1x4_to_f32x4(codes.y >> 16);
        store_vec(
            rows,
            out,
            u32x4(
                pack_bf16x2(a.x * s0 * scale2, a.y * s0 * scale2),
                pack_bf16x2(a.z * s0 * scale2, a.w * s0 * scale2),
                pack_bf16x2(b.x * s0 * scale2, b.y * s0 * scale2),
                pack_bf16x2(b.z * s0 * scale2, b.w * s0 * scale2),
            ),
        );
        store_vec(
            rows,
            out + 8,
            u32x4(
                pack_bf16x2(c.x * s0 * scale2, c.y * s0 * scale2),
                pack_bf16x2(c.z * s0 * scale2, c.w * s0 * scale2),
                pack_bf16x2(d.x * s0 * scale2, d.y * s0 * scale2),
                pack_bf16x2(d.z * s0 * scale2, d.w * s0 * scale2),
            ),
        );
        let e = e2m1x4_to_f32x4(codes.z);
        let f = e2m1x4_to_f32x4(codes.z >> 16);
        let g = e2m1x4_to_f32x4(codes.w);
        let h = e2m1x4_to_f32x4(codes.w >> 16);
        store_vec(
            rows,
            out + 16,
            u32x4(
                pack_bf16x2(e.x * s1 * scale2, e.y * s1 * scale2),
                pack_bf16x2(e.z * s1 * scale2, e.w * s1 * scale2),
                pack_bf16x2(f.x * s1 * scale2, f.y * s1 * scale2),
                pack_bf16x2(f.z * s1 * scale2, f.w * s1 * scale2),
            ),
        );
        store_vec(
            rows,
            out + 24,
            u32x4(
                pack_bf16x2(g.x * s1 * scale2, g.y * s1 * scale2),
                pack_bf16x2(g.z * s1 * scale2, g.w * s1 * scale2),
                pack_bf16x2(h.x * s1 * scale2, h.y * s1 * scale2),
                pack_bf16x2(h.z * s1 * scale2, h.w * s1 * scale2),
            ),
        );
    }
}
