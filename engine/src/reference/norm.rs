//! RMS norms and the l2 norm.

/// Zero-centred RMSNorm of each group of `group_len` values:
/// `y = x · rsqrt(mean(x²) + eps) · (1 + w)`, with `w` as long as `x` (a weight per element).
pub fn zc_rms_norm(x: &[f32], w: &[f32], group_len: usize, eps: f32) -> Vec<f32> {
    assert_eq!(x.len(), w.len(), "one weight per element");
    assert!(group_len > 0 && x.len().is_multiple_of(group_len), "whole groups");
    let mut y = Vec::with_capacity(x.len());
    for (xg, wg) in x.chunks_exact(group_len).zip(w.chunks_exact(group_len)) {
        let scale = rms_scale(xg, eps);
        y.extend(xg.iter().zip(wg).map(|(&v, &g)| v * scale * (1.0 + g)));
    }
    y
}

/// Zero-centred RMSNorm of each group with one weight vector shared by all groups (per-head norms).
pub fn zc_rms_norm_shared(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    assert!(!w.is_empty() && x.len().is_multiple_of(w.len()), "whole groups");
    let mut y = Vec::with_capacity(x.len());
    for xg in x.chunks_exact(w.len()) {
        let scale = rms_scale(xg, eps);
        y.extend(xg.iter().zip(w).map(|(&v, &g)| v * scale * (1.0 + g)));
    }
    y
}

/// `rsqrt(mean(x²) + eps)`, the sum in f64.
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mean_sq = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / x.len() as f64;
    (1.0 / (mean_sq + f64::from(eps)).sqrt()) as f32
}

/// The GDN output norm: `w ⊙ RMSNorm(x) ⊙ act(z)`, a plain weight (not 1 + w), act = sigmoid or SiLU.
pub fn gated_rms_norm(x: &[f32], z: &[f32], w: &[f32], eps: f32, sigmoid_gate: bool) -> Vec<f32> {
    let scale = rms_scale(x, eps);
    x.iter()
        .zip(z)
        .zip(w)
        .map(|((&v, &g), &wt)| {
            let act = if sigmoid_gate { sigmoid(g) } else { silu(g) };
            wt * (v * scale) * act
        })
        .collect()
}

/// `x · rsqrt(Σx² + eps)`: the eps inside the root of the sum, as the reference has it.
pub fn l2_norm(x: &[f32], eps: f32) -> Vec<f32> {
    let sum_sq = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
    let scale = (1.0 / (sum_sq + f64::from(eps)).sqrt()) as f32;
    x.iter().map(|&v| v * scale).collect()
}

pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-f64::from(x)).exp())) as f32
}

pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `log(1 + eˣ)`, as torch computes it by default: x itself above 20.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { f64::from(x).exp().ln_1p() as f32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_with_zero_weight_is_identity() {
        let x = [1.0, -1.0, 1.0, -1.0, 2.0, 2.0, 2.0, 2.0];
        let y = zc_rms_norm(&x, &[0.0; 8], 4, 0.0);
        assert_eq!(&y[..4], &x[..4]);
        assert_eq!(&y[4..], &[1.0; 4]);
        let y = zc_rms_norm(&x[..4], &[1.0; 4], 4, 0.0);
        assert_eq!(y, [2.0, -2.0, 2.0, -2.0]);
        assert_eq!(zc_rms_norm_shared(&x, &[0.0; 4], 0.0), zc_rms_norm(&x, &[0.0; 8], 4, 0.0));
    }

    #[test]
    fn gated_norm_uses_the_plain_weight() {
        let y = gated_rms_norm(&[3.0, -3.0], &[0.0, 0.0], &[2.0, 2.0], 0.0, true);
        assert_eq!(y, [1.0, -1.0]); // rms 3 → ±1, × 2, × σ(0) = ½
        let y = gated_rms_norm(&[3.0, -3.0], &[0.0, 0.0], &[2.0, 2.0], 0.0, false);
        assert_eq!(y, [0.0, 0.0]); // SiLU(0) = 0
    }

    #[test]
    fn activations() {
        assert_eq!(l2_norm(&[3.0, 4.0], 0.0), [0.6, 0.8]);
        assert_eq!(softplus(30.0), 30.0);
        assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
