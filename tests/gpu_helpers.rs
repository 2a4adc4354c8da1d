//! The prelude's number-format helpers on a GPU, exhaustively against the host decoders: every
//! FP8 code in every byte position, every 16-bit FP4 quad (the exact decode and the raw one, with
//! its gap and lift, and the raw 16-value dot product against an f32 emulation of its fused
//! multiply-adds), the int8 dot of 16 FP4 values and the int8 packing against exact integer
//! arithmetic, bf16 rounding of random and special values, and the warp and block reductions.

use engine::cuda::Gpu;
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{E2m1x2, E4m3, TileSet};
use kernel_macros::kernel;

/// Decodes every word of `words` with each helper, and rounds `floats` to bf16 two ways.
#[kernel(block = 256, grid = div_ceil(n, 256))]
fn decode_check(
    words: &[u32],
    floats: &[f32],
    codes: &[e4m3],
    e4m3_quads: &mut [f32],
    e2m1_quads: &mut [f32],
    e2m1_raw_quads: &mut [f32],
    e2m1_constants: &mut [f32],
    raw_dots: &mut [f32],
    e4m3_single: &mut [f32],
    packed: &mut [u32],
    rounded: &mut [bf16],
    n: u32,
) {
    let i = block_idx() * 256 + thread_idx();
    if i < n {
        let w = words[i];
        let a = e4m3x4_to_f32x4(w);
        e4m3_quads[4 * i] = a.x;
        e4m3_quads[4 * i + 1] = a.y;
        e4m3_quads[4 * i + 2] = a.z;
        e4m3_quads[4 * i + 3] = a.w;
        let b = e2m1x4_to_f32x4(w);
        e2m1_quads[4 * i] = b.x;
        e2m1_quads[4 * i + 1] = b.y;
        e2m1_quads[4 * i + 2] = b.z;
        e2m1_quads[4 * i + 3] = b.w;
        let r = e2m1x4_to_f32x4_raw(w);
        e2m1_raw_quads[4 * i] = r.x;
        e2m1_raw_quads[4 * i + 1] = r.y;
        e2m1_raw_quads[4 * i + 2] = r.z;
        e2m1_raw_quads[4 * i + 3] = r.w;
        if i == 0 {
            e2m1_constants[0] = e2m1_raw_gap();
            e2m1_constants[1] = e2m1_raw_lift();
        }
        // Word i and word n - 1 - i against 16 of the floats (every 2n-th of them wraps), lifted.
        let lift = e2m1_raw_lift();
        let mut xs = [f32x4(0.0, 0.0, 0.0, 0.0); 4];
        #[unroll]
        for k in 0..4 {
            let at = (16 * i + 4 * k) % (2 * n);
            xs[k] = f32x4(floats[at] * lift, floats[at + 1] * lift, floats[at + 2] * lift, floats[at + 3] * lift);
        }
        raw_dots[i] = dot_e2m1x16_raw(u32x2(w, words[n - 1 - i]), xs[0], xs[1], xs[2], xs[3]);
        e4m3_single[i] = codes[i % 256] as f32;
        packed[i] = pack_bf16x2(floats[2 * i], floats[2 * i + 1]);
        rounded[i] = floats[2 * i] as bf16;
    }
}

/// The int8 helpers: word i and word n - 1 - i of codes against four int8 words, and four floats
/// packed to int8.
#[kernel(block = 256, grid = div_ceil(n, 256))]
fn int8_check(words: &[u32], q: &[u32x4], floats: &[f32x4], dots: &mut [i32], packed: &mut [u32], n: u32) {
    let i = block_idx() * 256 + thread_idx();
    if i < n {
        dots[i] = dot_e2m1x16_i8(u32x2(words[i], words[n - 1 - i]), q[i]);
        packed[i] = pack_i8x4(floats[i]);
    }
}

/// Each warp's sum and maximum, and the block's, of one value per thread.
#[kernel(block = 32 * WARPS, grid = blocks)]
fn reduce_check(
    #[tile(default = 8, candidates = [1, 4, 8, 32])] WARPS: u32,
    v: &[f32],
    warp_sums: &mut [f32],
    warp_maxes: &mut [f32],
    block_sums: &mut [f32],
    block_maxes: &mut [f32],
    blocks: u32,
) {
    let scratch = shared::<f32, WARPS>();
    let i = block_idx() * block_dim() + thread_idx();
    let x = v[i];
    let s = warp_sum(x);
    let m = warp_max(x);
    if lane_id() == 0 {
        warp_sums[i / 32] = s;
        warp_maxes[i / 32] = m;
    }
    // Twice in a row on one scratch array: the helper's leading barrier makes that safe.
    let bs = block_sum(x, scratch);
    let bm = block_max(x, scratch);
    if thread_idx() == 0 {
        block_sums[block_idx()] = bs;
        block_maxes[block_idx()] = bm;
    }
}

/// n words (n = 2^16): word i holds i in its low half, so every 16-bit pattern appears there (all
/// FP4 quads, -0 among them; all FP8 pairs), and an odd multiple of i in its high half, a
/// permutation of the same patterns.
fn every_16_bit_pattern(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| i | ((i.wrapping_mul(40503) & 0xffff) << 16)).collect()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
#[ignore = "needs a CUDA device"]
fn number_format_helpers_match_the_host_decoders() {
    let gpu: Gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("decode");
    let n = 1usize << 16;
    let words = every_16_bit_pattern(n);
    let mut floats: Vec<f32> =
        (0..2 * n).map(|_| rng.normal() * 2f32.powi((rng.uniform() * 60.0) as i32 - 30)).collect();
    // Specials and exact halfway cases of bf16 rounding.
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        f32::MAX,
        1e-40,
        -1e-40,
    ];
    floats[..specials.len()].copy_from_slice(&specials);
    let codes: Vec<E4m3> = (0..=255u8).map(E4m3).collect();

    let dw = gpu.upload(&words).expect("upload");
    let df = gpu.upload(&floats).expect("upload");
    let dc = gpu.upload(&codes).expect("upload");
    let mut q8 = gpu.alloc::<f32>(4 * n).expect("alloc");
    let mut q4 = gpu.alloc::<f32>(4 * n).expect("alloc");
    let mut r4 = gpu.alloc::<f32>(4 * n).expect("alloc");
    let mut gap = gpu.alloc::<f32>(2).expect("alloc");
    let mut dots = gpu.alloc::<f32>(n).expect("alloc");
    let mut s8 = gpu.alloc::<f32>(n).expect("alloc");
    let mut packed = gpu.alloc::<u32>(n).expect("alloc");
    let mut rounded = gpu.alloc::<bf16>(n).expect("alloc");
    for b in [&mut q8, &mut q4, &mut r4, &mut gap, &mut dots, &mut s8] {
        gpu.fill_bytes(b, 0xff).expect("poison");
    }
    gpu.fill_bytes(&mut packed, 0xa5).expect("poison");
    gpu.fill_bytes(&mut rounded, 0xa5).expect("poison");
    let k = gpu.kernel::<decode_check::Kernel>(decode_check::Tiles::DEFAULT).expect("compile");
    let args = decode_check::Args {
        words: dw.ptr(),
        floats: df.ptr(),
        codes: dc.ptr(),
        e4m3_quads: q8.ptr_mut(),
        e2m1_quads: q4.ptr_mut(),
        e2m1_raw_quads: r4.ptr_mut(),
        e2m1_constants: gap.ptr_mut(),
        raw_dots: dots.ptr_mut(),
        e4m3_single: s8.ptr_mut(),
        packed: packed.ptr_mut(),
        rounded: rounded.ptr_mut(),
        n: n as u32,
    };
    // SAFETY: every buffer has the length the kernel indexes for n words.
    unsafe { k.launch(&gpu, &args) }.expect("launch");
    let (q8, q4, s8) = (gpu.download(&q8).expect("dl"), gpu.download(&q4).expect("dl"), gpu.download(&s8).expect("dl"));
    let (packed, rounded) = (gpu.download(&packed).expect("dl"), gpu.download(&rounded).expect("dl"));
    let (r4, gaps, dots) =
        (gpu.download(&r4).expect("dl"), gpu.download(&gap).expect("dl"), gpu.download(&dots).expect("dl"));
    // The raw decode's gap: 2^126 where FP4 is decoded in software (sm_90), 1 where converted;
    // the activations' lift with it: 2^64, or none.
    let (gap, lift) = (gaps[0], gaps[1]);
    assert!(
        (gap, lift) == (2f32.powi(126), 2f32.powi(64)) || (gap, lift) == (1.0, 1.0),
        "e2m1_raw_gap() = {gap}, e2m1_raw_lift() = {lift}"
    );

    let mut bad = Vec::new();
    for (i, &w) in words.iter().enumerate() {
        for lane in 0..4 {
            let byte = (w >> (8 * lane)) as u8;
            let want = E4m3(byte).to_f32();
            if !same(q8[4 * i + lane], want) {
                bad.push(format!("e4m3 word {w:#010x} lane {lane}: got {} want {want}", q8[4 * i + lane]));
            }
            let nibble = ((w >> (4 * lane)) & 0xf) as u8;
            let want = E2m1x2::decode_nibble(nibble);
            if !same(q4[4 * i + lane], want) {
                bad.push(format!("e2m1 word {w:#010x} lane {lane}: got {} want {want}", q4[4 * i + lane]));
            }
            // Exact in f64: the raw value times the gap is the value itself.
            let raw = f64::from(r4[4 * i + lane]) * f64::from(gap);
            if !same(raw as f32, want) || raw != f64::from(want) {
                bad.push(format!("e2m1 raw word {w:#010x} lane {lane}: got {} × gap want {want}", r4[4 * i + lane]));
            }
        }
        // The raw dot product: the raw values (checked above) times the lifted floats, one f32
        // product and 15 fused multiply-adds in order, bit for bit.
        let pair = [w, words[n - 1 - i]];
        let mut want = 0.0f32;
        for k in 0..16 {
            // Value k: nibble k % 8 of word k / 8; its raw decode is lane k % 4 of the quad that
            // holds bits 16·((k % 8) / 4) of the word.
            let word = pair[k / 8] >> (16 * ((k % 8) / 4));
            let nibble = ((word >> (4 * (k % 4))) & 0xf) as u8;
            let raw = (f64::from(E2m1x2::decode_nibble(nibble)) / f64::from(gap)) as f32;
            let x = floats[(16 * i + k) % (2 * n)] * lift;
            want = if k == 0 { raw * x } else { raw.mul_add(x, want) };
        }
        if !same(dots[i], want) {
            bad.push(format!(
                "dot_e2m1x16_raw of words {:#010x}, {:#010x}: got {} want {want}",
                pair[0], pair[1], dots[i]
            ));
        }
        let want = E4m3((i % 256) as u8).to_f32();
        if !same(s8[i], want) {
            bad.push(format!("e4m3 code {}: got {} want {want}", i % 256, s8[i]));
        }
        let (lo, hi) = (bf16::from_f32(floats[2 * i]), bf16::from_f32(floats[2 * i + 1]));
        let got = (bf16::from_bits(packed[i] as u16), bf16::from_bits((packed[i] >> 16) as u16));
        if !same(got.0.to_f32(), lo.to_f32()) || !same(got.1.to_f32(), hi.to_f32()) {
            bad.push(format!("pack_bf16x2({}, {}): got {:?} want ({lo}, {hi})", floats[2 * i], floats[2 * i + 1], got));
        }
        if !same(rounded[i].to_f32(), lo.to_f32()) {
            bad.push(format!("{} as bf16: got {} want {lo}", floats[2 * i], rounded[i]));
        }
    }
    assert!(bad.is_empty(), "{} mismatches, first ones:\n{}", bad.len(), bad[..bad.len().min(12)].join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn int8_dot_and_packing_match_the_host() {
    let gpu: Gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("int8");
    let n = 1usize << 16;
    let words = every_16_bit_pattern(n);
    // Random int8 activations over the whole range, -128 included.
    let q: Vec<[u32; 4]> = (0..n).map(|_| std::array::from_fn(|_| rng.next_u64() as u32)).collect();
    // Floats around the int8 range: halfway cases, values past ±127, small ones.
    let mut floats: Vec<[f32; 4]> =
        (0..n).map(|_| std::array::from_fn(|_| rng.normal() * 2f32.powi((rng.uniform() * 9.0) as i32 - 1))).collect();
    floats[0] = [0.5, 1.5, 2.5, -0.5];
    floats[1] = [-1.5, -2.5, 126.5, -126.5];
    floats[2] = [127.4, 127.5, 300.0, -1e9];
    floats[3] = [-0.0, 0.0, 1e-30, -127.6];
    let (dw, dq, df) =
        (gpu.upload(&words).expect("upload"), gpu.upload(&q).expect("upload"), gpu.upload(&floats).expect("upload"));
    let mut dots = gpu.alloc::<i32>(n).expect("alloc");
    let mut packed = gpu.alloc::<u32>(n).expect("alloc");
    gpu.fill_bytes(&mut dots, 0xa5).expect("poison");
    gpu.fill_bytes(&mut packed, 0xa5).expect("poison");
    let k = gpu.kernel::<int8_check::Kernel>(int8_check::Tiles::DEFAULT).expect("compile");
    let args = int8_check::Args {
        words: dw.ptr(),
        q: dq.ptr(),
        floats: df.ptr(),
        dots: dots.ptr_mut(),
        packed: packed.ptr_mut(),
        n: n as u32,
    };
    // SAFETY: every buffer holds n elements.
    unsafe { k.launch(&gpu, &args) }.expect("launch");
    let (dots, packed) = (gpu.download(&dots).expect("dl"), gpu.download(&packed).expect("dl"));
    let mut bad = Vec::new();
    for i in 0..n {
        // Σ 2·value · int8, exact: value k is nibble k % 8 of word k / 8, activation k byte k % 4
        // of word k / 4.
        let pair = [words[i], words[n - 1 - i]];
        let want: i64 = (0..16)
            .map(|k| {
                let nibble = ((pair[k / 8] >> (4 * (k % 8))) & 0xf) as u8;
                let twice = 2.0 * f64::from(E2m1x2::decode_nibble(nibble));
                let x = (q[i][k / 4] >> (8 * (k % 4))) as u8 as i8;
                twice as i64 * i64::from(x)
            })
            .sum();
        if i64::from(dots[i]) != want {
            bad.push(format!(
                "dot_e2m1x16_i8 of {:#010x}, {:#010x} and {:08x?}: got {} want {want}",
                pair[0], pair[1], q[i], dots[i]
            ));
        }
        // Round half to even, clamp to ±127.
        let want: u32 = (0..4)
            .map(|k| {
                let v = floats[i][k].round_ties_even().clamp(-127.0, 127.0) as i32 as i8;
                u32::from(v as u8) << (8 * k)
            })
            .sum();
        if packed[i] != want {
            bad.push(format!("pack_i8x4({:?}): got {:#010x} want {want:#010x}", floats[i], packed[i]));
        }
    }
    assert!(bad.is_empty(), "{} mismatches, first ones:\n{}", bad.len(), bad[..bad.len().min(12)].join("\n"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn warp_and_block_reductions() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("reduce");
    for tiles in reduce_check::Tiles::candidates() {
        let blocks = 37usize;
        let threads = 32 * tiles.warps as usize;
        let v: Vec<f32> = (0..blocks * threads).map(|_| rng.normal()).collect();
        let dv = gpu.upload(&v).expect("upload");
        let mut ws = gpu.alloc::<f32>(v.len() / 32).expect("alloc");
        let mut wm = gpu.alloc::<f32>(v.len() / 32).expect("alloc");
        let mut bs = gpu.alloc::<f32>(blocks).expect("alloc");
        let mut bm = gpu.alloc::<f32>(blocks).expect("alloc");
        for b in [&mut ws, &mut wm, &mut bs, &mut bm] {
            gpu.fill_bytes(b, 0xff).expect("poison");
        }
        let k = gpu.kernel::<reduce_check::Kernel>(tiles).expect("compile");
        let args = reduce_check::Args {
            v: dv.ptr(),
            warp_sums: ws.ptr_mut(),
            warp_maxes: wm.ptr_mut(),
            block_sums: bs.ptr_mut(),
            block_maxes: bm.ptr_mut(),
            blocks: blocks as u32,
        };
        // SAFETY: v holds blocks × threads values; the outputs one per warp and one per block.
        unsafe { k.launch(&gpu, &args) }.expect("launch");
        let (ws, wm, bs, bm) = (
            gpu.download(&ws).expect("dl"),
            gpu.download(&wm).expect("dl"),
            gpu.download(&bs).expect("dl"),
            gpu.download(&bm).expect("dl"),
        );
        let close = |a: f32, b: f64, n: usize| (f64::from(a) - b).abs() <= 1e-6 * (n as f64) * 4.0;
        for (w, chunk) in v.chunks(32).enumerate() {
            let s: f64 = chunk.iter().map(|&x| f64::from(x)).sum();
            let m = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert!(close(ws[w], s, 32), "{tiles:?} warp {w}: sum {} want {s}", ws[w]);
            assert_eq!(wm[w], m, "{tiles:?} warp {w}: max");
        }
        for (b, chunk) in v.chunks(threads).enumerate() {
            let s: f64 = chunk.iter().map(|&x| f64::from(x)).sum();
            let m = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert!(close(bs[b], s, threads), "{tiles:?} block {b}: sum {} want {s}", bs[b]);
            assert_eq!(bm[b], m, "{tiles:?} block {b}: max");
        }
    }
}
