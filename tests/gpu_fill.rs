//! The fill kernels on a GPU against their CPU twins (`engine::reference::fill`), every element
//! bit for bit: buffers poisoned first, fresh seeds, lengths with and without a partial last
//! group, offsets into the stream (`first`) and into the buffer, every tile candidate. Then the
//! e4m3 scales decode to positive finite values and the fill's speed (bytes/s) is printed.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::fill::{fill_bf16, fill_e4m3_scales, fill_f32, fill_nvfp4_codes};
use engine::reference::fill::{self as reference, Uniform};
use engine::synthetic::{Fills, SCALE_LO, SCALE_SPAN};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{DevPtrMut, E4m3, TileSet};

const POISON: u8 = 0xab;
/// Lengths: a single element, less than one group, exact groups, a partial last group, many blocks.
const LENS: [usize; 8] = [1, 3, 8, 16, 17, 1000, 4103, 1 << 20];

fn poisoned<T: bytemuck::Pod>(gpu: &Gpu, len: usize) -> DeviceBuffer<T> {
    let mut b = gpu.alloc::<T>(len).expect("alloc");
    gpu.fill_bytes(&mut b, POISON).expect("poison");
    b
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_and_f32_fills_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("fill bf16/f32");
    for tiles in fill_bf16::Tiles::candidates() {
        let k = gpu.kernel::<fill_bf16::Kernel>(tiles).expect("compile");
        for len in LENS {
            let (seed, first) = (rng.next_u64(), rng.next_u64() % 1000);
            let u = Uniform::new(-0.5 + rng.uniform(), 1.0 + rng.uniform());
            let mut b = poisoned::<bf16>(&gpu, len);
            let a = fill_bf16::Args { out: b.ptr_mut(), len: len as u64, first, seed, lo: u.lo, step: u.step };
            // SAFETY: the kernel writes out[0..len) of `b`.
            unsafe { k.launch(&gpu, &a) }.expect("launch");
            let got = gpu.download(&b).expect("download");
            let mut want = vec![bf16::ZERO; len];
            reference::fill_bf16(&mut want, first, seed, u);
            for i in 0..len {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{tiles:?} len {len} first {first}: element {i}");
            }
        }
    }
    for tiles in fill_f32::Tiles::candidates() {
        let k = gpu.kernel::<fill_f32::Kernel>(tiles).expect("compile");
        for len in LENS {
            let (seed, first) = (rng.next_u64(), rng.next_u64() % 1000);
            let u = Uniform::new(1e-3f32.ln(), 1e-1f32.ln());
            let mut b = poisoned::<f32>(&gpu, len);
            let a = fill_f32::Args { out: b.ptr_mut(), len: len as u64, first, seed, lo: u.lo, step: u.step };
            // SAFETY: the kernel writes out[0..len) of `b`.
            unsafe { k.launch(&gpu, &a) }.expect("launch");
            let got = gpu.download(&b).expect("download");
            let mut want = vec![0f32; len];
            reference::fill_f32(&mut want, first, seed, u);
            for i in 0..len {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{tiles:?} len {len} first {first}: element {i}");
                assert!(got[i] >= u.lo && got[i] <= u.hi(), "element {i} = {} outside [{}, {}]", got[i], u.lo, u.hi());
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn code_and_scale_fills_match_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("fill codes/scales");
    let codes_tiles = fill_nvfp4_codes::Tiles::candidates();
    let scales_tiles = fill_e4m3_scales::Tiles::candidates();
    for (ct, st) in codes_tiles.into_iter().zip(scales_tiles) {
        let kc = gpu.kernel::<fill_nvfp4_codes::Kernel>(ct).expect("compile");
        let ks = gpu.kernel::<fill_e4m3_scales::Kernel>(st).expect("compile");
        for len in LENS {
            let (seed, first) = (rng.next_u64(), 8 * (rng.next_u64() % 1000));
            let mut b = poisoned::<u8>(&gpu, len);
            let a = fill_nvfp4_codes::Args { out: b.ptr_mut(), len: len as u64, first, seed };
            // SAFETY: the kernel writes out[0..len) of `b`.
            unsafe { kc.launch(&gpu, &a) }.expect("launch");
            let got = gpu.download(&b).expect("download");
            let mut want = vec![0u8; len];
            reference::fill_nvfp4_codes(&mut want, first, seed);
            for i in 0..len {
                assert_eq!(got[i], want[i], "codes {ct:?} len {len} first {first}: byte {i}");
            }

            // Scales at a few ranges of codes, the published one among them.
            let (lo, span) = match rng.next_u64() % 3 {
                0 => (SCALE_LO, SCALE_SPAN),
                1 => (1, 126),
                _ => (0x30 + (rng.next_u64() % 16) as u8, 1 + (rng.next_u64() % 32) as u8),
            };
            let mut b = poisoned::<u8>(&gpu, len);
            let a = fill_e4m3_scales::Args {
                out: b.ptr_mut(),
                len: len as u64,
                first,
                seed,
                lo: u32::from(lo),
                span: u32::from(span),
            };
            // SAFETY: as above.
            unsafe { ks.launch(&gpu, &a) }.expect("launch");
            let got = gpu.download(&b).expect("download");
            let mut want = vec![0u8; len];
            reference::fill_e4m3_scales(&mut want, first, seed, lo, span);
            for i in 0..len {
                assert_eq!(got[i], want[i], "scales {st:?} lo {lo:#x} span {span} len {len} first {first}: byte {i}");
                let v = E4m3(got[i]).to_f32();
                assert!(v.is_finite() && v > 0.0, "scale {:#x} = {v}", got[i]);
            }
        }
    }
}

/// The launch checks alone (no device): scale codes that would not be positive and finite, a
/// stream offset that splits a hash, an empty fill.
#[test]
fn requirements_refuse_bad_arguments() {
    use kernel_dsl::KernelDef;
    let k: fill_e4m3_scales::Tiles = TileSet::DEFAULT;
    let out = DevPtrMut::from_addr(0);
    let scales = |lo, span, first| fill_e4m3_scales::Args { out, len: 16, first, seed: 0, lo, span };
    for (lo, span, first) in [(0, 16, 0), (0x38, 0, 0), (0x70, 16, 0), (0x38, 16, 4)] {
        assert!(fill_e4m3_scales::Kernel::launch_dims(&k, &scales(lo, span, first)).is_err(), "{lo} {span} {first}");
    }
    assert!(fill_e4m3_scales::Kernel::launch_dims(&k, &scales(1, 126, 8)).is_ok());
    assert!(fill_e4m3_scales::Kernel::launch_dims(&k, &scales(0x70, 15, 8)).is_ok());
    let codes = fill_nvfp4_codes::Args { out, len: 0, first: 0, seed: 0 };
    assert!(fill_nvfp4_codes::Kernel::launch_dims(&TileSet::DEFAULT, &codes).is_err(), "an empty fill");
}

#[test]
#[ignore = "needs a CUDA device"]
fn ranges_of_a_buffer_through_the_host_helper() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("fill ranges");
    let f = Fills::load(&gpu).expect("fills");
    let len = 10_000;
    let seed = rng.next_u64();
    let (u1, u2) = (Uniform::with_std(0.1), Uniform::with_std(3.0));
    let mut b = poisoned::<bf16>(&gpu, len);
    // Two parts of one stream at different magnitudes, the second from its own offset.
    f.bf16_range(&gpu, &mut b, 0, 4096, 0, seed, u1).expect("part 1");
    f.bf16_range(&gpu, &mut b, 4096, len - 4096, 4096, seed, u2).expect("part 2");
    let got = gpu.download(&b).expect("download");
    for (i, g) in got.iter().enumerate() {
        let u = if i < 4096 { u1 } else { u2 };
        assert_eq!(g.to_bits(), reference::uniform_bf16(seed, i as u64, u).to_bits(), "element {i}");
    }
    assert!(f.bf16_range(&gpu, &mut b, 3, 8, 0, seed, u1).is_err(), "a misaligned part is refused");
    assert!(f.bf16_range(&gpu, &mut b, 8, len, 0, seed, u1).is_err(), "a part past the end is refused");
}

#[test]
#[ignore = "needs a CUDA device"]
fn fill_speed() {
    let gpu = flashnext::gpu::open();
    let f = Fills::load(&gpu).expect("fills");
    let bytes = 4usize << 30;
    let mut codes = gpu.alloc::<kernel_dsl::E2m1x2>(bytes).expect("4 GiB");
    let mut scales = gpu.alloc::<E4m3>(bytes / 8).expect("scales");
    let mut values = gpu.alloc::<bf16>(bytes / 2).expect("bf16");
    f.codes(&gpu, &mut codes, 1).expect("warm-up");
    gpu.synchronize().expect("sync");
    let time = |run: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        for _ in 0..3 {
            run();
        }
        gpu.synchronize().expect("sync");
        t.elapsed().as_secs_f64() / 3.0
    };
    let s = time(&mut || f.codes(&gpu, &mut codes, 2).expect("codes"));
    println!("fill_nvfp4_codes: {:.2} ms for {} GiB, {:.0} GB/s", s * 1e3, bytes >> 30, bytes as f64 / s / 1e9);
    let s = time(&mut || f.scales(&gpu, &mut scales, 3).expect("scales"));
    println!(
        "fill_e4m3_scales: {:.2} ms for {} MiB, {:.0} GB/s",
        s * 1e3,
        (bytes / 8) >> 20,
        (bytes / 8) as f64 / s / 1e9
    );
    let s = time(&mut || f.bf16(&gpu, &mut values, 4, Uniform::with_std(1.0)).expect("bf16"));
    println!("fill_bf16: {:.2} ms for {} GiB, {:.0} GB/s", s * 1e3, bytes >> 30, bytes as f64 / s / 1e9);
}
