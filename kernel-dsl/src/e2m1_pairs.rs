//! The paired E2M1 layout: NVFP4 codes rearranged at load, within each 32-bit word, so that
//! sm_90 (no FP4 conversion instruction) decodes a word's four f16 pairs in nine integer
//! instructions instead of about sixteen.
//!
//! A word holds eight E2M1 codes. In ModelOpt's layout ([`Layout::Nibbles`]) code i is nibble i
//! (bits 4i..4i+3: mantissa bit, two exponent bits, sign), and `dot_e2m1x16` meets them as the
//! f16 pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7): pair k's f16 needs a code's three magnitude
//! bits at f16 bits 11..9 and its sign at bit 15 (the value times 2^-14), in both halves. Nibbles
//! put a code's sign next to its magnitude, 3 bits short of where the f16 wants it, so each pair
//! costs two shifts and two masks there.
//!
//! [`Layout::Pairs`] stores pair k's two codes where one mask extracts them (`dot_e2m1x16_paired`
//! in the prelude; M = 0x8e008e00, the f16 bits 15 and 11..9 of both halves):
//!
//! | pair | magnitude bits (lo, hi) | sign bits (lo, hi) | the decode |
//! |---|---|---|---|
//! | 0 | 9..11, 25..27 | 15, 31 | `w & M` |
//! | 1 | 6..8, 22..24 | 12, 28 | `(w << 3) & M` |
//! | 2 | 3..5, 19..21 | 13, 29 | `((w & 0x20382038) * 68) & M` |
//! | 3 | 0..2, 16..18 | 14, 30 | `((w & 0x40074007) * 514) & M` |
//!
//! Pairs 2 and 3 are made by one multiply each: 68 = 2^6 + 2^2 copies the masked bits twice, the
//! magnitudes 6 bits up and the signs 2 bits up (514 = 2^9 + 2^1: 9 and 1), and the two copies never
//! share a bit, so the sum is their or and nothing carries. At most two shifted copies of the
//! f16 pattern fit in a word without sharing a bit (four in two words), so two pairs cannot be
//! one shift and one mask; an exhaustive search over the other two's placements found this one.
//!
//! The layout is per architecture: sm_121a converts ModelOpt's bytes in hardware
//! (`cvt.rn.f16x2.e2m1x2`) and keeps [`Layout::Nibbles`]. Weights go into the paired layout on the
//! host ([`to_layout`]) or on the device (the engine's `e2m1_pair_words` kernel, whose CPU reference
//! is [`pair_word`]); whatever reads them back as ModelOpt codes undoes it ([`from_layout`]).

use crate::arch::Arch;

/// Where a word's eight codes sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// ModelOpt's: code i in bits 4i..4i+3 (the even element in a byte's low nibble).
    Nibbles,
    /// This module's: pair k = (code k, code k + 4) where [`MAGNITUDE_BIT`] and [`SIGN_BIT`] say.
    Pairs,
}

impl Layout {
    /// The layout the `_paired` decode of `arch` reads.
    pub fn for_arch(arch: Arch) -> Layout {
        if arch.has_fp4_conversion() { Layout::Nibbles } else { Layout::Pairs }
    }
}

/// Pair k's lowest magnitude bit in the low half (the high half's is 16 above).
pub const MAGNITUDE_BIT: [u32; 4] = [9, 6, 3, 0];
/// Pair k's sign bit in the low half (the high half's is 16 above).
pub const SIGN_BIT: [u32; 4] = [15, 12, 13, 14];

/// A word of eight ModelOpt codes in the paired layout.
pub fn pair_word(nibbles: u32) -> u32 {
    let mut out = 0;
    for k in 0..4 {
        for half in 0..2 {
            let code = (nibbles >> (4 * (k + 4 * half))) & 0xf;
            let shift = 16 * half as u32;
            out |= (code & 7) << (MAGNITUDE_BIT[k] + shift);
            out |= (code >> 3) << (SIGN_BIT[k] + shift);
        }
    }
    out
}

/// The inverse of [`pair_word`].
pub fn unpair_word(paired: u32) -> u32 {
    let mut out = 0;
    for k in 0..4 {
        for half in 0..2 {
            let shift = 16 * half as u32;
            let magnitude = (paired >> (MAGNITUDE_BIT[k] + shift)) & 7;
            let sign = (paired >> (SIGN_BIT[k] + shift)) & 1;
            out |= (magnitude | sign << 3) << (4 * (k + 4 * half));
        }
    }
    out
}

/// Applies `f` to every little-endian word of `codes`.
fn map_words(codes: &mut [u8], f: fn(u32) -> u32) -> Result<(), String> {
    if !codes.len().is_multiple_of(4) {
        return Err(format!("{} code bytes: the paired layout rearranges whole 4-byte words", codes.len()));
    }
    for word in codes.chunks_exact_mut(4) {
        let w = f(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
        word.copy_from_slice(&w.to_le_bytes());
    }
    Ok(())
}

/// ModelOpt code bytes (two codes a byte, the even element low) into `layout`, in place.
pub fn to_layout(codes: &mut [u8], layout: Layout) -> Result<(), String> {
    match layout {
        Layout::Nibbles => Ok(()),
        Layout::Pairs => map_words(codes, pair_word),
    }
}

/// Code bytes in `layout` back to ModelOpt's, in place.
pub fn from_layout(codes: &mut [u8], layout: Layout) -> Result<(), String> {
    match layout {
        Layout::Nibbles => Ok(()),
        Layout::Pairs => map_words(codes, unpair_word),
    }
}

/// The sm_90 decode of the prelude's `e2m1x8_to_f16x2_paired`, in integer arithmetic on the host:
/// the four f16 pairs (bits) of a paired word. The tests hold it to the E2M1 values.
pub fn decode_paired(w: u32) -> [u32; 4] {
    const M: u32 = 0x8e00_8e00;
    [w & M, (w << 3) & M, ((w & 0x2038_2038).wrapping_mul(68)) & M, ((w & 0x4007_4007).wrapping_mul(514)) & M]
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// E2M1 code → its value (bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6, and the negatives).
    fn e2m1(code: u32) -> f32 {
        const MAG: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let v = MAG[(code & 7) as usize];
        if code & 8 != 0 { -v } else { v }
    }

    /// The f16 pairs (v_k, v_k+4) × 2^-14 of a ModelOpt word, as bits.
    fn expected_pairs(nibbles: u32) -> [u32; 4] {
        let f = |i: u32| u32::from(f16::from_f32(e2m1((nibbles >> (4 * i)) & 0xf) / 16384.0).to_bits());
        [0, 1, 2, 3].map(|k| f(k) | f(k + 4) << 16)
    }

    /// A small deterministic generator (splitmix64), seeded from the clock so every run draws
    /// fresh words; the seed is printed for a failure's replay.
    fn words(n: usize) -> (u64, Vec<u32>) {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let mut s = seed;
        let v = (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) as u32
            })
            .collect();
        (seed, v)
    }

    #[test]
    fn the_pair_bits_fill_the_word_once() {
        let mut seen = 0u64;
        for k in 0..4 {
            for half in 0..2 {
                let at = |b: u32| 1u64 << (b + 16 * half);
                for b in [MAGNITUDE_BIT[k], MAGNITUDE_BIT[k] + 1, MAGNITUDE_BIT[k] + 2, SIGN_BIT[k]] {
                    assert_eq!(seen & at(b), 0, "bit {} taken twice", b + 16 * half);
                    seen |= at(b);
                }
            }
        }
        assert_eq!(seen, 0xffff_ffff);
    }

    #[test]
    fn every_code_in_every_place_decodes_to_its_value() {
        // Each of the eight places takes all 16 codes while the other seven hold random codes:
        // a carry or a stray bit from a neighbour would show in some pair.
        let (seed, background) = words(64);
        for place in 0..8 {
            for code in 0..16u32 {
                for &b in &background {
                    let w = (b & !(0xf << (4 * place))) | code << (4 * place);
                    assert_eq!(
                        decode_paired(pair_word(w)),
                        expected_pairs(w),
                        "word {w:#010x} (code {code} in place {place}, seed {seed})"
                    );
                }
            }
        }
    }

    #[test]
    fn random_words_decode_and_round_trip() {
        let (seed, ws) = words(1 << 16);
        for w in ws {
            assert_eq!(decode_paired(pair_word(w)), expected_pairs(w), "word {w:#010x}, seed {seed}");
            assert_eq!(unpair_word(pair_word(w)), w, "word {w:#010x}, seed {seed}");
        }
    }

    #[test]
    fn byte_slices_convert_both_ways_and_refuse_a_partial_word() {
        let (_, ws) = words(33);
        let canonical: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut b = canonical.clone();
        to_layout(&mut b, Layout::Pairs).unwrap();
        let first = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(first, pair_word(ws[0]));
        from_layout(&mut b, Layout::Pairs).unwrap();
        assert_eq!(b, canonical);
        let mut same = canonical.clone();
        to_layout(&mut same, Layout::Nibbles).unwrap();
        assert_eq!(same, canonical);
        let err = to_layout(&mut b[..6], Layout::Pairs).unwrap_err();
        assert!(err.contains("6 code bytes"), "{err}");
    }

    #[test]
    fn only_the_architecture_without_the_conversion_pairs() {
        assert_eq!(Layout::for_arch(Arch::Sm90), Layout::Pairs);
        assert_eq!(Layout::for_arch(Arch::Sm121a), Layout::Nibbles);
    }
}
