//! The Gated Residual read ("hyper-connection" mix): from the n residual streams to one block input
//! and n write gains.

use super::norm::{sigmoid, silu, zc_rms_norm};
use crate::model::weights::MixWeights;

/// What a mix site gives its block.
#[derive(Clone, Debug, PartialEq)]
pub struct Mixed {
    /// The block input [d].
    pub x: Vec<f32>,
    /// The write gains ω [n] (None at the final mixer).
    pub gains: Option<Vec<f32>>,
}

/// `X̂ = ZC(X)` per stream; `u = SiLU(W_down·X̂ / n)`; `G = σ(W_up·u)`; `x = mean_s G_s ⊙ X̂_s`;
/// `ω = 2σ(W_inj·X̂ / n)`.
pub fn mix(streams: &[f32], w: &MixWeights, n: usize, eps: f32) -> Mixed {
    let d = streams.len() / n;
    let normed = zc_rms_norm(streams, &w.norm, d, eps);
    let u: Vec<f32> = w.down.apply(&normed).iter().map(|&v| silu(v / n as f32)).collect();
    let gates: Vec<f32> = w.up.apply(&u).iter().map(|&v| sigmoid(v)).collect();
    let x = (0..d)
        .map(|i| ((0..n).map(|s| f64::from(gates[s * d + i] * normed[s * d + i])).sum::<f64>() / n as f64) as f32)
        .collect();
    let gains = w.inject.as_ref().map(|inj| inj.apply(&normed).iter().map(|&v| 2.0 * sigmoid(v / n as f32)).collect());
    Mixed { x, gains }
}

/// The write: `X_s += ω_s · y` for every stream s.
pub fn write(streams: &mut [f32], gains: &[f32], y: &[f32]) {
    let d = y.len();
    for (s, &g) in gains.iter().enumerate() {
        for (v, &yi) in streams[s * d..(s + 1) * d].iter_mut().zip(y) {
            *v += g * yi;
        }
    }
}

/// The write as the device stores the residual streams, in bf16 like the reference model:
/// `X_s ← bf16(fma(ω_s, y, X_s))`, one f32 rounding of the product-sum, then one to bf16.
pub fn write_bf16(streams: &mut [f32], gains: &[f32], y: &[f32]) {
    let d = y.len();
    for (s, &g) in gains.iter().enumerate() {
        for (v, &yi) in streams[s * d..(s + 1) * d].iter_mut().zip(y) {
            *v = half::bf16::from_f32(g.mul_add(yi, *v)).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bf16_write_rounds_the_fused_sum() {
        let mut x = [1.0, 2.0, -1.0, 0.5];
        write_bf16(&mut x, &[0.5, 2.0], &[1.0, 1.0 / 128.0]);
        // Stream 0: 1 + 0.5 = 1.5, and 2 + 2^-8, below half a bf16 step at 2 (2^-6): back to 2.
        // Stream 1: -1 + 2 = 1, and 0.5 + 2^-6, exact in bf16.
        assert_eq!(x, [1.5, 2.0, 1.0, 0.515_625]);
        let mut plain = [1.0, 2.0, -1.0, 0.5];
        write(&mut plain, &[0.5, 2.0], &[1.0, 1.0 / 128.0]);
        assert_eq!(plain[1], 2.003_906_3, "the f32 write keeps what bf16 drops");
    }
}
