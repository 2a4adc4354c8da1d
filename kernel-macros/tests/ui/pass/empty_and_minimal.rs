//! The smallest kernel: no tiles, one buffer and one scalar, a three-dimensional grid, and the launch
//! geometry the generated `launch_dims` computes from the arguments.

use kernel_dsl::{Arch, KernelDef, LaunchDims, TileSet};
use kernel_macros::kernel;

#[kernel(block = 64, grid = (n, 2, 3))]
fn fill(out: &mut [u32], n: u32) {
    let i = block_idx() * 64 + thread_idx();
    out[i] = block_idx_y() + block_idx_z() * 2;
}

fn main() {
    let out = kernel_dsl::DevPtrMut::<u32>::from_addr(0x1000);
    let dims = fill::Kernel::launch_dims(&fill::Tiles::DEFAULT, &fill::Args { out, n: 5 }).expect("dims");
    assert_eq!(dims, LaunchDims { grid: [5, 2, 3], block: [64, 1, 1], dynamic_shared_bytes: 0, cooperative: false });
    assert!(fill::Kernel::launch_dims(&fill::Tiles::DEFAULT, &fill::Args { out, n: 0 }).is_err());
    assert_eq!(fill::Tiles::candidates().len(), 1);
    let cuda = kernel_dsl::emit::cuda(&fill::Kernel::specialize(&fill::Tiles::DEFAULT, Arch::Sm90).expect("fill"));
    assert!(cuda.contains("__launch_bounds__(64) fill("), "{cuda}");
}
