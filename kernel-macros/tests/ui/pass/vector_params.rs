//! Buffers of vectors as kernel parameters: their launcher fields address arrays of the lanes.
use kernel_dsl::{DevPtr, DevPtrMut, KernelArgs};
use kernel_macros::kernel;

#[kernel(block = 32, grid = div_ceil(n, 32))]
fn copy_vectors(src: &[u32x4], dst: &mut [u32x4], n: u32) {
    let i = block_idx() * 32 + thread_idx();
    if i < n {
        dst[i] = src[i];
    }
}

fn main() {
    let args = copy_vectors::Args { src: DevPtr::<[u32; 4]>::from_addr(16), dst: DevPtrMut::<[u32; 4]>::from_addr(32), n: 3 };
    assert_eq!(args.params().len(), 3);
    let k = <copy_vectors::Kernel as kernel_dsl::KernelDef>::specialize(&kernel_dsl::TileSet::DEFAULT, kernel_dsl::Arch::Sm90)
        .expect("specialise");
    let cuda = kernel_dsl::emit::cuda(&k);
    assert!(cuda.contains("const uint4* __restrict__ src"), "{cuda}");
}
