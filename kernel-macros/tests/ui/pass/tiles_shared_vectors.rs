//! u32 and bool tiles, a tile-only requirement that prunes the candidates, shared and local
//! arrays, vector loads and stores, `for` with `step_by` and `#[unroll]`, `if` as a value, tuple
//! lets and a block reduction.

use kernel_dsl::{Arch, KernelDef, TileSet};
use kernel_macros::kernel;

/// y = x · scale · rsqrt(mean(x²)), one block per row, VEC-wide loads.
#[kernel(
    block = 32 * WARPS,
    grid = rows,
    require(cols % (4 * VEC) == 0, VEC == 4 || !WIDE),
)]
pub fn scaled_rows(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [2, 4])] VEC: u32,
    #[tile(default = false)] WIDE: bool,
    x: &[f32],
    y: &mut [f32],
    rows: u32,
    cols: u32,
    scale: f32,
) {
    let scratch = shared::<f32, WARPS>();
    let stage = shared::<u32, { 32 * WARPS }>();
    let base = block_idx() * cols;
    let mut acc = [0.0; VEC];
    let (first, stride) = (thread_idx() * 4, block_dim() * 4);
    for i in (first..cols).step_by(stride) {
        let v = load_vec::<f32x4>(x, base + i);
        acc[0] += v.x * v.x + v.y * v.y;
        acc[1] += v.z * v.z + v.w * v.w;
    }
    let mut sum_sq = 0.0;
    #[unroll]
    for k in 0..VEC {
        sum_sq += acc[k];
    }
    let total = block_sum(sum_sq, scratch);
    let factor = if WIDE { scale * 2.0 } else { scale } * rsqrt(total / cols as f32 + 1e-6);
    stage[thread_idx()] = factor.to_bits();
    sync_threads();
    #[unroll(4)]
    for i in (first..cols).step_by(stride) {
        let v = load_vec::<f32x4>(x, base + i);
        let f = f32::from_bits(stage[0]);
        store_vec(y, base + i, f32x4(v.x * f, v.y * f, v.z * f, v.w * f));
    }
}

fn main() {
    // 3 WARPS × 2 VEC × 2 WIDE (a bool tile without candidates takes both values), less the
    // 3 combinations with VEC == 2 and WIDE that the tile-only requirement rules out.
    let candidates = scaled_rows::Tiles::candidates();
    assert_eq!(candidates.len(), 9);
    assert!(candidates.iter().all(|t| t.vec == 4 || !t.wide));
    assert_eq!(scaled_rows::Tiles::DEFAULT, scaled_rows::Tiles { warps: 4, vec: 4, wide: false });
    assert_eq!(scaled_rows::Tiles::DEFAULT.block_threads(), 128);
    assert!(scaled_rows::Tiles { warps: 4, vec: 2, wide: true }.check().is_err());
    assert_eq!(<scaled_rows::Kernel as KernelDef>::NAME, "scaled_rows");

    let kernel = scaled_rows::Kernel::specialize(&scaled_rows::Tiles::DEFAULT, Arch::Sm90).expect("default tiles");
    let cuda = kernel_dsl::emit::cuda(&kernel);
    for want in [
        "__launch_bounds__(128) scaled_rows(",
        "const float* __restrict__ x",
        "float* __restrict__ y",
        "__shared__ __align__(16) float scratch[4];",
        "__shared__ __align__(16) unsigned stage[128];",
        "float acc[4] = {};",
        "#pragma unroll 4",
        "reinterpret_cast<const float4*>",
        "make_float4(",
        "rsqrtf(",
        "__float_as_uint(factor)",
        "__syncthreads();",
    ] {
        assert!(cuda.contains(want), "`{want}` missing from\n{cuda}");
    }
    // WIDE is false at the default: the folded select keeps only `scale`.
    assert!(!cuda.contains("2.0f"), "the WIDE branch should fold away:\n{cuda}");

    let wide = scaled_rows::Kernel::specialize(&scaled_rows::Tiles { warps: 8, vec: 4, wide: true }, Arch::Sm90)
        .expect("wide tiles");
    let cuda = kernel_dsl::emit::cuda(&wide);
    assert!(cuda.contains("__launch_bounds__(256)"), "{cuda}");
    assert!(scaled_rows::Kernel::specialize(&scaled_rows::Tiles { warps: 8, vec: 2, wide: true }, Arch::Sm90).is_err());
}
