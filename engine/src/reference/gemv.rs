//! The matrix-vector product.

/// y = W·x for a row-major W [rows, cols]; sums in f64.
pub fn gemv(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(w.len(), rows * cols, "W is rows × cols");
    assert_eq!(x.len(), cols, "x has cols elements");
    w.chunks_exact(cols)
        .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() as f32)
        .collect()
}

/// Σ|W_rk·x_k| per row: the scale of a row's rounding error, which cancellation can hide from |y|.
pub fn gemv_magnitudes(w: &[f32], x: &[f32], cols: usize) -> Vec<f32> {
    w.chunks_exact(cols)
        .map(|row| row.iter().zip(x).map(|(&a, &b)| f64::from((a * b).abs())).sum::<f64>() as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_product() {
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(gemv(&w, &[1.0, 0.0, -1.0], 2, 3), [-2.0, -2.0]);
        assert_eq!(gemv_magnitudes(&w, &[1.0, 0.0, -1.0], 3), [4.0, 10.0]);
    }
}
