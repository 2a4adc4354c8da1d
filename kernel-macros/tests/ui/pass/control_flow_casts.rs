//! `while`, `loop`, `break`, `continue` and `return`, casts between the kernel types, the math and
//! warp intrinsics, atomics, shadowing, and the `raw_cuda` escape hatch.

use kernel_dsl::{AnyKernel, Arch, KernelDef, TileSet};
use kernel_macros::kernel;

/// Softmax statistics of bf16 rows: the max and the sum of exponentials, one warp per row.
#[kernel(block = 32, grid = rows, require(cols > 0))]
pub fn row_stats(x: &[bf16], stats: &mut [f32], hits: &mut [u32], rows: u32, cols: u32, limit: i32) {
    let row = block_idx();
    if row >= rows {
        return;
    }
    let base = row as u64 * cols as u64;
    let mut m = f32::NEG_INFINITY;
    let mut i = lane_id();
    while i < cols {
        let v = x[base + i as u64] as f32;
        m = m.max(v);
        i += 32;
    }
    m = warp_max(m);
    let mut s = 0.0;
    let mut j = lane_id();
    loop {
        if j >= cols {
            break;
        }
        let v = x[base + j as u64] as f32;
        j += 32;
        if v == f32::NEG_INFINITY {
            continue;
        }
        s = fma(exp(v - m), 1.0, s);
    }
    let s = warp_sum(s);
    // Integer arithmetic and bits: shifts, masks, signed casts, a clamp.
    let bits = s.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32 - 127;
    let clamped = min(max(exponent, -limit), limit);
    let mut code: u32 = 0;
    code |= (clamped + 128) as u32;
    code <<= 1u32;
    let halves = bf16x2_to_f32x2(pack_bf16x2(m, s));
    let lo = shfl_xor(halves.x, 16);
    // Two CUDA functions the DSL has no intrinsic for.
    let ones = raw_cuda::<u32>("__popc({0})", code);
    raw_cuda::<()>("__nanosleep({0})", 100u32);
    if lane_id() == 0 {
        stats[2 * row] = m;
        stats[2 * row + 1] = s + lo * 0.0;
        let old = atomic_add(hits, 0, ones & 1);
        hits[1 + (old & 1)] = (s as bf16) as f32 as u32;
    }
}

fn main() {
    // No tiles: one candidate, the unit tile set.
    assert_eq!(row_stats::Tiles::candidates().len(), 1);
    assert_eq!(row_stats::Tiles::DEFAULT.block_threads(), 32);
    assert_eq!(row_stats::ERASED.name(), "row_stats");
    assert_eq!(row_stats::ERASED.template().params.len(), 6);

    let kernel = row_stats::Kernel::specialize(&row_stats::Tiles::DEFAULT, Arch::Sm90).expect("default tiles");
    let cuda = kernel_dsl::emit::cuda(&kernel);
    for want in [
        "__launch_bounds__(32) row_stats(",
        "// Softmax statistics of bf16 rows",
        "while (",
        "break;",
        "continue;",
        "return;",
        "atomicAdd(",
        "(__popc(code))",
        "__nanosleep(",
        "const int limit",
    ] {
        assert!(cuda.contains(want), "`{want}` missing from\n{cuda}");
    }
    // The shadowing `let s` gets a fresh C name.
    assert!(cuda.contains("s_1"), "{cuda}");
    let _ = <row_stats::Kernel as KernelDef>::template();
}
