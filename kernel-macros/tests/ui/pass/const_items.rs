//! A `const` in a kernel body: a scalar of tiles and literals, named once where the expression
//! would repeat (an array's length, the loop over it, a bound), replaced by its value at each use.

use kernel_dsl::{Arch, KernelDef};
use kernel_macros::kernel;

/// y[i] = x[i] + 1 for the first 256 values, PER values a thread, all loaded before any store.
#[kernel(block = 32 * WARPS, grid = 1)]
pub fn staged_copy(#[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32, x: &[f32], y: &mut [f32]) {
    /// Values a thread holds: 256 over the block, rounded up.
    const PER: u32 = (256 + 32 * WARPS - 1) / (32 * WARPS);
    const LAST: u32 = 255;
    let mut held = [0.0; PER];
    #[unroll]
    for t in 0..PER {
        held[t] = x[min(thread_idx() + t * 32 * WARPS, LAST)];
    }
    #[unroll]
    for t in 0..PER {
        let i = thread_idx() + t * 32 * WARPS;
        if i <= LAST {
            y[i] = held[t] + 1.0;
        }
    }
}

fn main() {
    for (warps, per) in [(2, 4), (4, 2), (8, 1)] {
        let tiles = staged_copy::Tiles { warps };
        let kernel = staged_copy::Kernel::specialize(&tiles, Arch::Sm90).expect("tiles");
        let cuda = kernel_dsl::emit::cuda(&kernel);
        // The array is sized by the constant's value; no name is emitted for it.
        assert!(cuda.contains(&format!("float held[{per}] = {{}};")), "held[{per}] missing from\n{cuda}");
        assert!(!cuda.contains("PER =") && !cuda.contains("PER]"), "the constant is emitted by name in\n{cuda}");
    }
    assert_eq!(<staged_copy::Kernel as KernelDef>::NAME, "staged_copy");
}
