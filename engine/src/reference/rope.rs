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
