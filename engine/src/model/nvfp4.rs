//! NVFP4 weights in NVIDIA ModelOpt's layout: 4-bit E2M1 values in blocks of 16, each block with
//! an FP8 E4M3 scale, the tensor with one f32 scale.
//!
//! Stored as `weight` u8 [out, in/2] (the element with the even index in the low nibble),
//! `weight_scale` e4m3 [out, in/16], `weight_scale_2` f32. A value is
//! `e2m1 × e4m3(block scale) × weight_scale_2`.
//!
//! Quantisation follows ModelOpt: `weight_scale_2 = amax / (6 · 448)`; a block's scale is
//! `amax_block / (6 · weight_scale_2)` rounded to e4m3; each value is divided by the rounded block
//! scale times `weight_scale_2` and rounded to the nearest e2m1, a tie going to the even code (the
//! rule of a round-to-nearest-even conversion). A block of zeros gets scale 0.

use kernel_dsl::{E2m1x2, E4m3};

/// Values per block sharing one e4m3 scale.
pub const BLOCK: usize = 16;

/// One weight matrix in NVFP4.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Matrix {
    pub rows: usize,
    pub cols: usize,
    /// [rows, cols / 2]: two e2m1 codes per byte, the even element in the low nibble.
    pub packed: Vec<u8>,
    /// [rows, cols / 16]: e4m3 codes.
    pub scales: Vec<u8>,
    pub scale_2: f32,
}

/// f32 → e4m3 ("fn": saturating at 448, no infinities), round to nearest, ties to the even code.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let mag = x.abs().min(448.0);
    // The 127 non-negative finite codes in increasing order of value: a plain nearest search.
    let mut best = 0u8;
    let mut best_d = f32::INFINITY;
    for code in 0u8..=0x7e {
        let d = (E4m3(code).to_f32() - mag).abs();
        if d < best_d || (d == best_d && code % 2 == 0) {
            best = code;
            best_d = d;
        }
    }
    if best == 0 { 0 } else { sign | best }
}

/// The e2m1 code (sign in bit 3) nearest to `x`, magnitudes clamped at 6, a tie to the even code.
pub fn e2m1_from_f32(x: f32) -> u8 {
    let mag = x.abs().min(6.0);
    let mut best = 0u8;
    let mut best_d = f32::INFINITY;
    for (code, &v) in E2m1x2::MAGNITUDES.iter().enumerate() {
        let d = (v - mag).abs();
        if d < best_d || (d == best_d && code % 2 == 0) {
            best = code as u8;
            best_d = d;
        }
    }
    if best != 0 && x < 0.0 { best | 8 } else { best }
}

impl Nvfp4Matrix {
    /// Quantises a row-major [rows, cols] matrix; `cols` must be a multiple of 16.
    pub fn quantise(w: &[f32], rows: usize, cols: usize) -> Nvfp4Matrix {
        let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        Nvfp4Matrix::quantise_with_scale_2(w, rows, cols, Nvfp4Matrix::scale_2_for(amax))
    }

    /// The global scale for values up to `amax`: the largest block scale (448) times the largest
    /// code (6) reaches it.
    pub fn scale_2_for(amax: f32) -> f32 {
        amax / (6.0 * 448.0)
    }

    /// Quantises with a given global scale: for a matrix quantised in parts (a table too large to
    /// hold in f32 at once), each part with the scale of the whole.
    pub fn quantise_with_scale_2(w: &[f32], rows: usize, cols: usize, scale_2: f32) -> Nvfp4Matrix {
        assert_eq!(w.len(), rows * cols, "w is rows × cols");
        assert_eq!(cols % BLOCK, 0, "NVFP4 needs a multiple of 16 columns");
        let blocks = cols / BLOCK;
        let mut packed = vec![0u8; rows * cols / 2];
        let mut scales = vec![0u8; rows * blocks];
        for r in 0..rows {
            for b in 0..blocks {
                let block = &w[r * cols + b * BLOCK..r * cols + (b + 1) * BLOCK];
                let block_amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = if scale_2 > 0.0 { e4m3_from_f32(block_amax / (6.0 * scale_2)) } else { 0 };
                scales[r * blocks + b] = scale;
                let denom = E4m3(scale).to_f32() * scale_2;
                for (i, &v) in block.iter().enumerate() {
                    let code = if denom > 0.0 { e2m1_from_f32(v / denom) } else { 0 };
                    let col = b * BLOCK + i;
                    packed[r * cols / 2 + col / 2] |= code << (4 * (col % 2));
                }
            }
        }
        Nvfp4Matrix { rows, cols, packed, scales, scale_2 }
    }

    /// The values, row-major.
    pub fn dequantise(&self) -> Vec<f32> {
        let blocks = self.cols / BLOCK;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for col in 0..self.cols {
                let byte = self.packed[r * self.cols / 2 + col / 2];
                let code = (byte >> (4 * (col % 2))) & 0xf;
                let scale = E4m3(self.scales[r * blocks + col / BLOCK]).to_f32();
                out.push(E2m1x2::decode_nibble(code) * scale * self.scale_2);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_rounding_known_values() {
        assert_eq!(e4m3_from_f32(1.0), 0x38);
        assert_eq!(e4m3_from_f32(448.0), 0x7e);
        assert_eq!(e4m3_from_f32(1e6), 0x7e, "saturates");
        assert_eq!(e4m3_from_f32(-2.0), 0xc0);
        assert_eq!(e4m3_from_f32(2f32.powi(-9)), 0x01, "smallest subnormal");
        assert_eq!(e4m3_from_f32(2f32.powi(-11)), 0x00, "below half of it");
        // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): the even code wins.
        assert_eq!(e4m3_from_f32(1.0625), 0x38);
        assert_eq!(e4m3_from_f32(1.1875), 0x3a);
        for code in 0u8..=0x7e {
            assert_eq!(e4m3_from_f32(E4m3(code).to_f32()), code, "code {code:#x} round-trips");
        }
    }

    #[test]
    fn e2m1_rounding_known_values() {
        assert_eq!(e2m1_from_f32(0.0), 0);
        assert_eq!(e2m1_from_f32(0.25), 0, "tie between 0 and 0.5 goes to the even code 0");
        assert_eq!(e2m1_from_f32(0.75), 2, "tie between 0.5 (1) and 1.0 (2)");
        assert_eq!(e2m1_from_f32(2.5), 4, "tie between 2 (4) and 3 (5)");
        assert_eq!(e2m1_from_f32(5.0), 6, "tie between 4 (6) and 6 (7)");
        assert_eq!(e2m1_from_f32(-6.5), 15);
        assert_eq!(e2m1_from_f32(-0.1), 0, "no negative zero code");
    }

    #[test]
    fn round_trip_is_within_half_a_step() {
        let rows = 3;
        let cols = 32;
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let q = Nvfp4Matrix::quantise(&w, rows, cols);
        let d = q.dequantise();
        for r in 0..rows {
            for b in 0..cols / BLOCK {
                let block = r * cols + b * BLOCK..r * cols + (b + 1) * BLOCK;
                let scale = E4m3(q.scales[r * (cols / BLOCK) + b]).to_f32() * q.scale_2;
                let amax = w[block.clone()].iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for i in block {
                    // Half the widest e2m1 step (2, between 4 and 6) times the block scale, plus the
                    // block's largest value may sit above 6·scale after e4m3 rounding of the scale.
                    let bound = scale + (amax - 6.0 * scale).max(0.0);
                    assert!((w[i] - d[i]).abs() <= bound * 1.0001, "[{i}] {} vs {}", w[i], d[i]);
                }
            }
        }
    }

    #[test]
    fn known_block() {
        // One block: the largest value sets the scales exactly.
        let mut w = vec![0.0f32; 16];
        w[0] = 6.0 * 448.0;
        w[1] = -3.0 * 448.0;
        w[2] = 0.5 * 448.0;
        let q = Nvfp4Matrix::quantise(&w, 1, 16);
        assert_eq!(q.scale_2, 1.0);
        assert_eq!(q.scales, [0x7e]); // 448
        assert_eq!(q.packed[0], 0x7 | (0xd << 4)); // 6, -3
        assert_eq!(q.packed[1], 0x1); // 0.5, 0
        assert_eq!(q.dequantise()[..3], [2688.0, -1344.0, 224.0]);
        let zeros = Nvfp4Matrix::quantise(&[0.0; 16], 1, 16);
        assert_eq!(zeros.dequantise(), vec![0.0; 16]);
    }
}
