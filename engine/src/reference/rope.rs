//! Rotary position embedding, NeoX style (rotate half) on the first `rotary_dim` dimensions.

/// The inverse frequencies of one configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    /// `inv_freq[j] = θ^(−2j / rotary_dim)` for j < rotary_dim / 2.
    pub fn new(theta: f64, rotary_dim: usize) -> Rope {
        let inv_freq =
            (0..rotary_dim / 2).map(|j| (1.0 / theta.powf(2.0 * j as f64 / rotary_dim as f64)) as f32).collect();
        Rope { inv_freq }
    }

    pub fn rotary_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// The cosines and sines of positions 0..`positions`, [positions, rotary_dim / 2, 2] (cos then
    /// sin), computed as [`Rope::apply`] computes them: the table the device's RoPE reads.
    pub fn table(&self, positions: usize) -> Vec<f32> {
        let mut t = Vec::with_capacity(positions * self.inv_freq.len() * 2);
        for pos in 0..positions {
            for &f in &self.inv_freq {
                let angle = f64::from(pos as f32 * f);
                t.push(angle.cos() as f32);
                t.push(angle.sin() as f32);
            }
        }
        t
    }

    /// Rotates `v`'s first `rotary_dim` values for position `pos`: pairs (i, i + rotary_dim/2);
    /// the rest of `v` is left as it is.
    pub fn apply(&self, v: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, &f) in self.inv_freq.iter().enumerate() {
            // The angle in f32, as the reference forms it (position × inverse frequency).
            let angle = f64::from(pos as f32 * f);
            let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
            let (a, b) = (v[i], v[i + half]);
            v[i] = a * cos - b * sin;
            v[i + half] = b * cos + a * sin;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_rotates_as_apply_does() {
        let rope = Rope::new(1e4, 8);
        let t = rope.table(300);
        let mut v: Vec<f32> = (0..10).map(|i| i as f32 - 3.5).collect();
        let x = v.clone();
        rope.apply(&mut v, 299);
        for j in 0..4 {
            let (cos, sin) = (t[(299 * 4 + j) * 2], t[(299 * 4 + j) * 2 + 1]);
            assert_eq!(v[j], x[j] * cos - x[j + 4] * sin);
            assert_eq!(v[j + 4], x[j + 4] * cos + x[j] * sin);
        }
    }

    #[test]
    fn rotates_pairs_a_half_apart_and_leaves_the_rest() {
        let rope = Rope::new(1.0, 4); // θ = 1: every frequency is 1
        let mut v = [1.0, 0.0, 0.0, 0.0, 7.0];
        rope.apply(&mut v, 0);
        assert_eq!(v, [1.0, 0.0, 0.0, 0.0, 7.0]);
        let mut v = [1.0, 0.0, 0.0, 0.0, 7.0];
        rope.apply(&mut v, 1);
        assert!((v[0] - 1f32.cos()).abs() < 1e-6 && (v[2] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(v[4], 7.0);
    }
}
