//! The pseudo-random fills of `crate::kernels::fill` on the CPU, bit for bit: what the GPU tests
//! compare every element with, and what fills the synthetic PLE table in host memory
//! (`crate::synthetic`), which the device never writes.
//!
//! Every value is a function of (seed, index): [`splitmix64`] of the index, a counter-based hash,
//! so a range of a buffer can be made on its own (by any thread, in any order).

use half::bf16;

/// SplitMix64's increment γ (2⁶⁴ / φ, odd).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The `index`-th output of a SplitMix64 generator started at `seed`: its output function of
/// `seed + (index + 1)·γ`, wrapping. (`flashnext::rng::Rng::new(seed)` yields index 0, 1, ...)
pub fn splitmix64(seed: u64, index: u64) -> u64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for one part of something seeded with `seed`: parts with different `tags` get streams
/// that share nothing visible (the tags are hashed, so seeds of nearby tags are not offsets of one
/// stream).
pub fn derive_seed(seed: u64, tags: &[u64]) -> u64 {
    tags.iter().fold(splitmix64(seed, u64::MAX), |s, &t| splitmix64(s ^ splitmix64(t, 0x5EED), t))
}

/// The uniform distribution [`uniform_f32`] draws from: [lo, lo + 2²⁴·step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Uniform {
    pub lo: f32,
    pub step: f32,
}

impl Uniform {
    /// Uniform in [lo, hi) (hi itself is never drawn).
    pub fn new(lo: f32, hi: f32) -> Uniform {
        Uniform { lo, step: (hi - lo) / (1u32 << 24) as f32 }
    }

    /// Uniform in [−bound, bound).
    pub fn symmetric(bound: f32) -> Uniform {
        Uniform::new(-bound, bound)
    }

    /// Zero mean and standard deviation `std`: bound √3·std.
    pub fn with_std(std: f32) -> Uniform {
        Uniform::symmetric(3f32.sqrt() * std)
    }

    pub fn hi(&self) -> f32 {
        self.lo + (1u32 << 24) as f32 * self.step
    }
}

/// Element `index` of the f32 fill: `fma(h >> 40, step, lo)`, h = [`splitmix64`]`(seed, index)`.
pub fn uniform_f32(seed: u64, index: u64, u: Uniform) -> f32 {
    ((splitmix64(seed, index) >> 40) as f32).mul_add(u.step, u.lo)
}

/// Element `index` of the bf16 fill: [`uniform_f32`] rounded to nearest even.
pub fn uniform_bf16(seed: u64, index: u64, u: Uniform) -> bf16 {
    bf16::from_f32(uniform_f32(seed, index, u))
}

/// `out[i]` = element `first + i` of the bf16 fill.
pub fn fill_bf16(out: &mut [bf16], first: u64, seed: u64, u: Uniform) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = uniform_bf16(seed, first + i as u64, u);
    }
}

/// `out[i]` = element `first + i` of the f32 fill.
pub fn fill_f32(out: &mut [f32], first: u64, seed: u64, u: Uniform) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = uniform_f32(seed, first + i as u64, u);
    }
}

/// Byte `index` of the byte stream: byte `index % 8` (little-endian) of `splitmix64(seed, index / 8)`.
pub fn random_byte(seed: u64, index: u64) -> u8 {
    (splitmix64(seed, index / 8) >> (8 * (index % 8))) as u8
}

/// `out[i]` = byte `first + i` of the byte stream: the NVFP4 codes' fill (every byte is a valid
/// pair of e2m1 codes). One hash per 8-byte word of the stream the range touches (the host fill
/// of the PLE table makes 29 GB with it).
pub fn fill_nvfp4_codes(out: &mut [u8], first: u64, seed: u64) {
    let mut i = 0;
    while i < out.len() {
        let index = first + i as u64;
        let word = splitmix64(seed, index / 8).to_le_bytes();
        let from = (index % 8) as usize;
        let n = (8 - from).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
    }
}

/// The e4m3 scale code made of random byte `r`: `lo + r % span` (codes `lo..lo + span`, positive
/// and finite when 1 ≤ lo and lo + span ≤ 127).
pub fn scale_code(r: u8, lo: u8, span: u8) -> u8 {
    lo + r % span
}

/// `out[i]` = [`scale_code`] of byte `first + i` of the byte stream: the e4m3 scales' fill.
pub fn fill_e4m3_scales(out: &mut [u8], first: u64, seed: u64, lo: u8, span: u8) {
    fill_nvfp4_codes(out, first, seed);
    for b in out.iter_mut() {
        *b = scale_code(*b, lo, span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_is_the_generator_s_sequence() {
        // SplitMix64 from seed 0: the published first outputs.
        assert_eq!(splitmix64(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0, 2), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn uniform_stays_in_range_with_the_right_moments() {
        let u = Uniform::with_std(0.02);
        let n = 200_000;
        let (mut sum, mut sq) = (0f64, 0f64);
        for i in 0..n {
            let v = uniform_f32(7, i, u);
            assert!(v >= u.lo && v < u.hi(), "{v}");
            sum += f64::from(v);
            sq += f64::from(v) * f64::from(v);
        }
        let mean = sum / n as f64;
        let std = (sq / n as f64 - mean * mean).sqrt();
        assert!(mean.abs() < 2e-4, "mean {mean}");
        assert!((std - 0.02).abs() < 2e-4, "std {std}");
    }

    #[test]
    fn a_range_is_the_stream_at_its_offset() {
        let mut whole = vec![0u8; 100];
        fill_nvfp4_codes(&mut whole, 0, 42);
        for (i, &b) in whole.iter().enumerate() {
            assert_eq!(b, random_byte(42, i as u64));
        }
        for first in [0usize, 3, 8, 13] {
            let mut part = vec![0u8; 100 - first];
            fill_nvfp4_codes(&mut part, first as u64, 42);
            assert_eq!(part, whole[first..]);
        }
        for (at, len) in [(3usize, 5usize), (13, 2), (17, 1), (6, 19)] {
            let mut mid = vec![0u8; len];
            fill_nvfp4_codes(&mut mid, at as u64, 42);
            assert_eq!(mid, whole[at..at + len]);
        }
        let mut scales = vec![0u8; 37];
        fill_e4m3_scales(&mut scales, 16, 9, 0x38, 16);
        for (i, &s) in scales.iter().enumerate() {
            assert_eq!(s, scale_code(random_byte(9, 16 + i as u64), 0x38, 16));
            assert!((0x38..0x48).contains(&s));
        }
    }

    #[test]
    fn derived_seeds_differ() {
        let mut seen = std::collections::HashSet::new();
        for a in 0..50 {
            for b in 0..20 {
                assert!(seen.insert(derive_seed(1, &[a, b])), "{a} {b}");
            }
        }
        assert_ne!(derive_seed(1, &[2]), derive_seed(2, &[2]));
    }
}
