//! RMS norms.

/// Zero-centred RMSNorm of each group of `group_len` values:
/// `y = x · rsqrt(mean(x²) + eps) · (1 + w)`, with `w` as long as `x` (a weight per element).
pub fn zc_rms_norm(x: &[f32], w: &[f32], group_len: usize, eps: f32) -> Vec<f32> {
    assert_eq!(x.len(), w.len(), "one weight per element");
    assert!(group_len > 0 && x.len().is_multiple_of(group_len), "whole groups");
    let mut y = Vec::with_capacity(x.len());
    for (xg, wg) in x.chunks_exact(group_len).zip(w.chunks_exact(group_len)) {
        let mean_sq = xg.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / group_len as f64;
        let scale = (1.0 / (mean_sq + f64::from(eps)).sqrt()) as f32;
        y.extend(xg.iter().zip(wg).map(|(&v, &g)| v * scale * (1.0 + g)));
    }
    y
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
    }
}
