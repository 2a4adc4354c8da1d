//! Deterministic pseudo-random fills of device buffers: synthetic weights of the published
//! geometry made where they live (70 GB of NVFP4 experts would take minutes to make on the host
//! and to copy over), for benchmarks that need no checkpoint.
//!
//! Every value is a function of (seed, element index) alone: the index goes through SplitMix64's
//! output function (`crate::reference::fill::splitmix64`, a counter-based hash), so any thread can
//! make any element, the result does not depend on the launch geometry, and the CPU reference
//! (`crate::reference::fill`) reproduces every bit. `first` is the index of element 0, so a part
//! of a buffer can be filled as the same stream continued (or restarted) at an offset.
//!
//! Each thread makes one 16-byte group (8 bf16, 4 f32 or 16 bytes) and stores it with one vector
//! store; a last partial group is stored element by element, so a buffer of any length is filled
//! exactly and nothing past it is written. The host hands in 16-byte aligned addresses (buffers
//! start aligned; a part at an offset must keep that: `crate::synthetic` checks it).
//!
//! Floats: `fma(u, step, lo)` with u the hash's top 24 bits, exact in f32, so the values are
//! uniform in [lo, lo + 2²⁴·step) and one fused rounding, the same on the host (`f32::mul_add`),
//! makes them; bf16 is that f32 rounded to nearest even.

use kernel_macros::kernel;

/// `out[i] = bf16(fma(h(seed, first + i) >> 40, step, lo))` for i < `len`: uniform in
/// [lo, lo + 2²⁴·step), rounded to bf16 (the host passes step = (hi − lo) / 2²⁴).
///
/// `h` is SplitMix64's output function of `seed + (index + 1)·γ` (γ the golden-ratio increment),
/// wrapping u64 arithmetic.
#[kernel(
    block = THREADS,
    grid = len.div_ceil(8 * u64::from(THREADS)) as u32,
    require(len >= 1, len.div_ceil(8 * u64::from(THREADS)) <= 2_147_483_647),
)]
pub fn fill_bf16(
    #[tile(default = 256, candidates = [128, 256, 512])] THREADS: u32,
    out: &mut [bf16],
    len: u64,
    first: u64,
    seed: u64,
    lo: f32,
    step: f32,
) {
    let i = ((block_idx() as u64) * (THREADS as u64) + (thread_idx() as u64)) * 8;
    let mut v = [0.0; 8];
    #[unroll]
    for e in 0..8 {
        let mut z = seed + (first + i + (e as u64) + 1) * 0x9E37_79B9_7F4A_7C15;
        z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9;
        z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB;
        z = z ^ (z >> 31);
        v[e] = fma(((z >> 40) as u32) as f32, step, lo);
    }
    if i + 8 <= len {
        store_vec(
            out,
            i,
            u32x4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7])),
        );
    } else {
        #[unroll]
        for e in 0..8 {
            if i + (e as u64) < len {
                out[i + (e as u64)] = v[e] as bf16;
            }
        }
    }
}

/// `out[i] = fma(h(seed, first + i) >> 40, step, lo)` for i < `len`, in f32: uniform in
/// [lo, lo + 2²⁴·step). The hash is [`fill_bf16`]'s.
#[kernel(
    block = THREADS,
    grid = len.div_ceil(4 * u64::from(THREADS)) as u32,
    require(len >= 1, len.div_ceil(4 * u64::from(THREADS)) <= 2_147_483_647),
)]
pub fn fill_f32(
    #[tile(default = 256, candidates = [128, 256, 512])] THREADS: u32,
    out: &mut [f32],
    len: u64,
    first: u64,
    seed: u64,
    lo: f32,
    step: f32,
) {
    let i = ((block_idx() as u64) * (THREADS as u64) + (thread_idx() as u64)) * 4;
    let mut v = [0.0; 4];
    #[unroll]
    for e in 0..4 {
        let mut z = seed + (first + i + (e as u64) + 1) * 0x9E37_79B9_7F4A_7C15;
        z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9;
        z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB;
        z = z ^ (z >> 31);
        v[e] = fma(((z >> 40) as u32) as f32, step, lo);
    }
    if i + 4 <= len {
        store_vec(out, i, f32x4(v[0], v[1], v[2], v[3]));
    } else {
        #[unroll]
        for e in 0..4 {
            if i + (e as u64) < len {
                out[i + (e as u64)] = v[e];
            }
        }
    }
}

/// Random bytes: byte i < `len` is byte (first + i) mod 8 (little-endian) of h(seed, (first + i) / 8).
///
/// For packed e2m1 pairs every byte is a valid pair, so this is the NVFP4 codes' fill: the 16
/// codes come out uniform over the 15 values (0 twice, as ±0), mean 0, mean square 8.5625.
/// `first` is a multiple of 8, so each thread's 16 bytes are two whole hashes.
#[kernel(
    block = THREADS,
    grid = len.div_ceil(16 * u64::from(THREADS)) as u32,
    require(len >= 1, first % 8 == 0, len.div_ceil(16 * u64::from(THREADS)) <= 2_147_483_647),
)]
pub fn fill_nvfp4_codes(
    #[tile(default = 256, candidates = [128, 256, 512])] THREADS: u32,
    out: &mut [u8],
    len: u64,
    first: u64,
    seed: u64,
) {
    let i = ((block_idx() as u64) * (THREADS as u64) + (thread_idx() as u64)) * 16;
    let mut w = [0u32; 4];
    #[unroll]
    for e in 0..2 {
        let mut z = seed + ((first + i) / 8 + (e as u64) + 1) * 0x9E37_79B9_7F4A_7C15;
        z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9;
        z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB;
        z = z ^ (z >> 31);
        w[2 * e] = z as u32;
        w[2 * e + 1] = (z >> 32) as u32;
    }
    if i + 16 <= len {
        store_vec(out, i, u32x4(w[0], w[1], w[2], w[3]));
    } else {
        #[unroll]
        for e in 0..16 {
            if i + (e as u64) < len {
                out[i + (e as u64)] = ((w[e / 4] >> (8 * (e % 4))) & 255) as u8;
            }
        }
    }
}

/// Positive finite e4m3 block scales: byte i < `len` is `lo + r % span` with r
/// [`fill_nvfp4_codes`]'s byte i. E4m3 codes 1..=0x7e are the positive finite values in increasing
/// order, so the scales are the `span` consecutive values from code `lo` (0x38 = 1.0, span 16:
/// 1.0 to 3.75, two binades), and their magnitude, times the global scale the host chooses,
/// sets the weights' (`crate::synthetic`).
#[kernel(
    block = THREADS,
    grid = len.div_ceil(16 * u64::from(THREADS)) as u32,
    require(
        len >= 1,
        first % 8 == 0,
        lo >= 1,
        span >= 1,
        lo + span <= 127,
        len.div_ceil(16 * u64::from(THREADS)) <= 2_147_483_647,
    ),
)]
pub fn fill_e4m3_scales(
    #[tile(default = 256, candidates = [128, 256, 512])] THREADS: u32,
    out: &mut [u8],
    len: u64,
    first: u64,
    seed: u64,
    lo: u32,
    span: u32,
) {
    let i = ((block_idx() as u64) * (THREADS as u64) + (thread_idx() as u64)) * 16;
    let mut w = [0u32; 4];
    #[unroll]
    for e in 0..2 {
        let mut z = seed + ((first + i) / 8 + (e as u64) + 1) * 0x9E37_79B9_7F4A_7C15;
        z = (z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9;
        z = (z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB;
        z = z ^ (z >> 31);
        #[unroll]
        for b in 0..8 {
            let code = lo + ((z >> (8 * b)) as u32 & 255) % span;
            w[2 * e + b / 4] = w[2 * e + b / 4] | (code << (8 * (b % 4)));
        }
    }
    if i + 16 <= len {
        store_vec(out, i, u32x4(w[0], w[1], w[2], w[3]));
    } else {
        #[unroll]
        for e in 0..16 {
            if i + (e as u64) < len {
                out[i + (e as u64)] = ((w[e / 4] >> (8 * (e % 4))) & 255) as u8;
            }
        }
    }
}
