//! Random device words for the layer benches' synthetic weights: a hash of (seed, index), masked,
//! made on the device at its speed (a layer's weights are gigabytes across the benches' copies,
//! too slow to make on the host and upload). The masks choose what the bits may be: an exponent
//! range for bf16 and f32 values, any E2M1 code, or a band of E4M3 block scales. Included by the
//! benches that use it (`#[path = "common/random_bits.rs"] mod random_bits;`).

use engine::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use kernel_dsl::DevPtrMut;
use kernel_macros::kernel;

/// Fills words with a hash of (seed, index), masked: random bits at device speed.
#[kernel(block = 256, grid = div_ceil(n, 256))]
pub(crate) fn fill_bits(out: &mut [u32], n: u32, seed: u32, and_mask: u32, or_mask: u32) {
    let i = block_idx() * 256 + thread_idx();
    if i < n {
        let mut z = i * 0x9e3779b9 + seed;
        z = (z ^ (z >> 16)) * 0x85ebca6b;
        z = (z ^ (z >> 13)) * 0xc2b2ae35;
        z = z ^ (z >> 16);
        out[i] = (z & and_mask) | or_mask;
    }
}

/// Fills `buf`'s 4-byte words with `(hash & and_mask) | or_mask`.
pub(crate) fn fill<T: bytemuck::Pod>(
    gpu: &Gpu,
    k: &LoadedKernel<fill_bits::Kernel>,
    buf: &mut DeviceBuffer<T>,
    seed: u32,
    and_mask: u32,
    or_mask: u32,
) {
    let words = (buf.size_bytes() / 4) as u32;
    let args = fill_bits::Args { out: DevPtrMut::from_addr(buf.ptr_mut().addr()), n: words, seed, and_mask, or_mask };
    // SAFETY: the buffer holds at least `words` 4-byte words.
    unsafe { k.launch(gpu, &args) }.expect("fill");
}
