//! The paired E2M1 layout on a GPU (`kernel_dsl::e2m1_pairs`): the engine's in-place kernel
//! against the host's `pair_word` on fresh random bytes, through the synthetic fills' entry point
//! too, and the paired 16-value dot bit-identical to ModelOpt's on every 16-bit code pattern.

use engine::cuda::Gpu;
use engine::kernels::e2m1_pairs::e2m1_pair_words;
use engine::synthetic::Fills;
use flashnext::rng::Rng;
use kernel_dsl::e2m1_pairs::{Layout, pair_word, to_layout};
use kernel_dsl::{DevPtrMut, E2m1x2, TileSet};
use kernel_macros::kernel;

/// Thread i's dot of words i and n - 1 - i (ModelOpt's layout) with 16 staged activations, and
/// the same two words in the paired layout with the paired dot.
#[kernel(block = 256, grid = div_ceil(n, 256))]
fn paired_dot_check(
    words: &[u32],
    paired: &[u32],
    xs: &[u32x4],
    nibbles_dot: &mut [f32],
    paired_dot: &mut [f32],
    n: u32,
) {
    let i = block_idx() * 256 + thread_idx();
    if i < n {
        let (xa, xb) = (xs[(2 * i) % 512], xs[(2 * i + 1) % 512]);
        nibbles_dot[i] = dot_e2m1x16(u32x2(words[i], words[n - 1 - i]), xa, xb);
        paired_dot[i] = dot_e2m1x16_paired(u32x2(paired[i], paired[n - 1 - i]), xa, xb);
    }
}

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_pairing_kernel_matches_the_host_on_fresh_codes() {
    let gpu: Gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("e2m1 pairs");
    for &len in &[16usize, 4096 + 16, 3 << 20] {
        for tiles in e2m1_pair_words::Tiles::candidates() {
            let k = gpu.kernel::<e2m1_pair_words::Kernel>(tiles).expect("compile");
            let words: Vec<u32> = (0..len / 4).map(|_| rng.next_u64() as u32).collect();
            let mut b = gpu.upload(&bytes_of(&words).into_iter().map(E2m1x2).collect::<Vec<_>>()).expect("upload");
            let a = e2m1_pair_words::Args { codes: DevPtrMut::from_addr(b.ptr_mut().addr()), len: len as u64 };
            // SAFETY: the kernel reads and writes bytes [0, len) of `b`, which holds len bytes.
            unsafe { k.launch(&gpu, &a) }.expect("launch");
            let got: Vec<u8> = gpu.download(&b).expect("download").iter().map(|c| c.0).collect();
            let want = bytes_of(&words.iter().map(|&w| pair_word(w)).collect::<Vec<_>>());
            let first_bad = got.iter().zip(&want).position(|(g, w)| g != w);
            assert!(first_bad.is_none(), "{tiles:?}, {len} bytes: first difference at byte {first_bad:?}");
        }
    }
    // The synthetic fills' entry point: the architecture's layout, the host's conversion.
    let words: Vec<u32> = (0..1024).map(|_| rng.next_u64() as u32).collect();
    let mut want = bytes_of(&words);
    let layout = Layout::for_arch(gpu.arch());
    to_layout(&mut want, layout).expect("whole words");
    let mut b = gpu.upload(&bytes_of(&words).into_iter().map(E2m1x2).collect::<Vec<_>>()).expect("upload");
    let fills = Fills::load(&gpu).expect("fills");
    fills.to_layout(&gpu, &mut b, layout).expect("to layout");
    let got: Vec<u8> = gpu.download(&b).expect("download").iter().map(|c| c.0).collect();
    assert!(got == want, "Fills::to_layout({layout:?}) differs from the host's");
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_paired_dot_is_the_modelopt_dot_bit_for_bit() {
    let gpu: Gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("paired dot");
    let n = 1usize << 16;
    // Word i holds i in its low half (every 16-bit code pattern) and random codes above.
    let words: Vec<u32> = (0..n as u32).map(|i| i | ((rng.next_u64() as u32) & 0xffff_0000)).collect();
    let mut paired = bytes_of(&words);
    to_layout(&mut paired, Layout::for_arch(gpu.arch())).expect("whole words");
    let paired: Vec<u32> = paired.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    // Staged activations as the kernels see them: f16 pairs of values in [-1, 1] (each chunk
    // divided by its largest), times 2^14 on sm_90 (the decode's gap), so the products span the
    // f16 range the kernels use.
    let xs: Vec<[u32; 4]> = (0..512)
        .map(|_| {
            [0; 4].map(|_| {
                let h = |v: f32| u32::from(half::f16::from_f32(v).to_bits());
                let s = if Layout::for_arch(gpu.arch()) == Layout::Pairs { 16384.0 } else { 1.0 };
                h((2.0 * rng.uniform() - 1.0) * s) | h((2.0 * rng.uniform() - 1.0) * s) << 16
            })
        })
        .collect();
    let dw = gpu.upload(&words).expect("upload");
    let dp = gpu.upload(&paired).expect("upload");
    let dx = gpu.upload(&xs.concat()).expect("upload");
    let mut a = gpu.alloc::<f32>(n).expect("alloc");
    let mut b = gpu.alloc::<f32>(n).expect("alloc");
    gpu.fill_bytes(&mut a, 0xff).expect("poison");
    gpu.fill_bytes(&mut b, 0xa5).expect("poison");
    let k = gpu.kernel::<paired_dot_check::Kernel>(TileSet::DEFAULT).expect("compile");
    let args = paired_dot_check::Args {
        words: dw.ptr(),
        paired: dp.ptr(),
        xs: kernel_dsl::DevPtr::from_addr(dx.ptr().addr()),
        nibbles_dot: a.ptr_mut(),
        paired_dot: b.ptr_mut(),
        n: n as u32,
    };
    // SAFETY: words and paired hold n words, xs 512 vectors; the outputs n floats.
    unsafe { k.launch(&gpu, &args) }.expect("launch");
    let (a, b) = (gpu.download(&a).expect("dl"), gpu.download(&b).expect("dl"));
    let bad: Vec<String> = (0..n)
        .filter(|&i| a[i].to_bits() != b[i].to_bits() || !a[i].is_finite())
        .take(8)
        .map(|i| format!("words {:#010x}, {:#010x}: {} against {}", words[i], words[n - 1 - i], b[i], a[i]))
        .collect();
    assert!(bad.is_empty(), "the paired dot differs:\n{}", bad.join("\n"));
    // Not all zero: the check compares real sums.
    assert!(a.iter().filter(|v| **v != 0.0).count() > n / 2);
}
