//! Host-side types for the kernel element types that Rust lacks: the bytes a buffer of `e4m3` or
//! `e2m1x2` holds on the device. bf16 and f16 are the `half` crate's.

use bytemuck::{Pod, Zeroable};

/// One FP8 E4M3 value (OCP "fn" variant), as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct E4m3(pub u8);

/// Two FP4 E2M1 values in one byte, the element with the even index in the low nibble.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct E2m1x2(pub u8);

impl E4m3 {
    /// The exact value: bias 7, subnormals below exponent code 1, `S.1111.111` is NaN.
    pub fn to_f32(self) -> f32 {
        let sign = if self.0 & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((self.0 >> 3) & 0xf);
        let man = f32::from(self.0 & 0x7);
        if exp == 0xf && self.0 & 0x7 == 0x7 {
            return f32::NAN;
        }
        if exp == 0 { sign * man / 8.0 * 2f32.powi(-6) } else { sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7) }
    }
}

impl E2m1x2 {
    /// The eight magnitudes of E2M1, by code.
    pub const MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

    /// The value of a 4-bit code (sign in bit 3).
    pub fn decode_nibble(code: u8) -> f32 {
        let m = Self::MAGNITUDES[usize::from(code & 7)];
        if code & 8 != 0 { -m } else { m }
    }

    /// The two values, the even-indexed one first.
    pub fn to_f32(self) -> [f32; 2] {
        [Self::decode_nibble(self.0 & 0xf), Self::decode_nibble(self.0 >> 4)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_known_values() {
        assert_eq!(E4m3(0x00).to_f32(), 0.0);
        assert_eq!(E4m3(0x38).to_f32(), 1.0);
        assert_eq!(E4m3(0x7e).to_f32(), 448.0);
        assert_eq!(E4m3(0xfe).to_f32(), -448.0);
        assert_eq!(E4m3(0x01).to_f32(), 2f32.powi(-9));
        assert!(E4m3(0x7f).to_f32().is_nan());
        assert_eq!(E4m3(0x40).to_f32(), 2.0);
    }

    #[test]
    fn e2m1_known_values() {
        assert_eq!(E2m1x2(0x21).to_f32(), [0.5, 1.0]);
        assert_eq!(E2m1x2(0xf7).to_f32(), [6.0, -6.0]);
        assert_eq!(E2m1x2(0x80).to_f32(), [0.0, -0.0]);
    }
}
