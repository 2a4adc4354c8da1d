//! Temperature and top-p (nucleus) sampling, plainly: sort, cumulative sum, pick. The semantics
//! the device's sampler (`kernels::sample`) implements in fixed point:
//!
//! - order: the tokens by logit descending, then by id ascending; NaN logits last, probability 0;
//! - mass: w_i = exp((l_i − l_max)/T), Z = Σ w_i (f64 here);
//! - nucleus: the smallest prefix of the order whose mass reaches top_p·Z (at least one token;
//!   top_p ≥ 1 keeps them all); S its mass;
//! - uniform: u = r / 2³², r = [`uniform_bits`]`(seed, position)`;
//! - pick: the first token of the order whose cumulative mass exceeds u·S.
//!
//! If every mass is zero (only with non-finite logits) the token is 0.

/// Temperature (> 0), nucleus (in (0, 1]) and the seed of a sampled decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

/// The 32 random bits of a position: the high half of splitmix64's output for the state
/// `seed + (position + 1)·γ` (γ = 0x9E3779B97F4A7C15), which is splitmix64's (position + 1)-th
/// output from `seed`.
pub fn uniform_bits(seed: u64, position: u32) -> u32 {
    let mut z = seed.wrapping_add((u64::from(position) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 32) as u32
}

/// The distribution a sampler draws from for one set of logits.
#[derive(Clone, Debug)]
pub struct Nucleus {
    /// Every token id, in the order (logit descending, then id ascending, NaN last).
    pub order: Vec<u32>,
    /// `cumulative[k]`: the mass of `order[..=k]` (unnormalised, the largest logit's is 1).
    pub cumulative: Vec<f64>,
    /// Tokens in the nucleus: `order[..kept]` (0 when every mass is zero).
    pub kept: usize,
}

impl Nucleus {
    pub fn new(logits: &[f32], temperature: f32, top_p: f32) -> Nucleus {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (logits[a as usize], logits[b as usize]);
            let by_logit = match (x.is_nan(), y.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                (false, false) => y.total_cmp(&x),
            };
            by_logit.then(a.cmp(&b))
        });
        let max = order.first().map_or(f64::NAN, |&i| f64::from(logits[i as usize]));
        let mut cumulative = Vec::with_capacity(order.len());
        let mut sum = 0.0f64;
        for &i in &order {
            let w = ((f64::from(logits[i as usize]) - max) / f64::from(temperature)).exp();
            sum += if w.is_nan() { 0.0 } else { w };
            cumulative.push(sum);
        }
        let kept = if sum > 0.0 {
            let cut = if top_p >= 1.0 { sum } else { f64::from(top_p) * sum };
            cumulative.iter().position(|&c| c >= cut).map_or(order.len(), |k| k + 1)
        } else {
            0
        };
        Nucleus { order, cumulative, kept }
    }

    /// S: the nucleus's mass.
    pub fn mass(&self) -> f64 {
        if self.kept == 0 { 0.0 } else { self.cumulative[self.kept - 1] }
    }

    /// The token for a uniform u in [0, 1): the first of the order whose cumulative mass exceeds
    /// u·S (0 when every mass is zero).
    pub fn pick(&self, u: f64) -> u32 {
        let target = u * self.mass();
        match self.cumulative[..self.kept].iter().position(|&c| c > target) {
            Some(k) => self.order[k],
            None => self.order.get(self.kept.saturating_sub(1)).copied().unwrap_or(0),
        }
    }

    /// The normalised probability of each token in the nucleus (0 outside it), by id.
    pub fn probabilities(&self) -> Vec<f64> {
        let mut p = vec![0.0; self.order.len()];
        let s = self.mass();
        for k in 0..self.kept {
            let before = if k == 0 { 0.0 } else { self.cumulative[k - 1] };
            p[self.order[k] as usize] = (self.cumulative[k] - before) / s;
        }
        p
    }
}

/// u for 32 random bits: r / 2³².
pub fn uniform(bits: u32) -> f64 {
    f64::from(bits) / 4_294_967_296.0
}

/// The token sampled from `logits` at `position`.
pub fn sample(logits: &[f32], params: SampleParams, position: u32) -> u32 {
    Nucleus::new(logits, params.temperature, params.top_p).pick(uniform(uniform_bits(params.seed, position)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::decoder::argmax;

    fn params(temperature: f32, top_p: f32) -> SampleParams {
        SampleParams { temperature, top_p, seed: 0x5eed }
    }

    #[test]
    fn uniform_bits_are_splitmix64() {
        // splitmix64's first output from state 0 is 0xE220A8397B1DCDAF.
        assert_eq!(uniform_bits(0, 0), 0xE220_A839);
        assert_ne!(uniform_bits(1, 0), uniform_bits(0, 0));
        assert_ne!(uniform_bits(0, 1), uniform_bits(0, 0));
    }

    #[test]
    fn a_tiny_nucleus_or_temperature_is_the_argmax() {
        let logits = [0.5, 2.0, -1.0, 2.0, 1.9, f32::NAN];
        for position in 0..200 {
            // 2.0 ties at ids 1 and 3: the lower id first.
            assert_eq!(sample(&logits, params(1.0, 1e-6), position), 1);
            let t = sample(&logits, params(1e-4, 1.0), position);
            assert!(t == 1 || t == 3, "position {position}: {t}");
        }
        assert_eq!(argmax(&logits[..5]), 1);
        // With T small the tie stays: ids 1 and 3 share the mass, 1.9 is e^-1000 below them.
        let n = Nucleus::new(&logits, 1e-4, 1.0);
        let p = n.probabilities();
        assert!((p[1] - 0.5).abs() < 1e-12 && (p[3] - 0.5).abs() < 1e-12, "{p:?}");
        assert_eq!(n.order, vec![1, 3, 4, 0, 2, 5]);
    }

    #[test]
    fn the_nucleus_is_the_smallest_prefix_reaching_top_p() {
        let probs = [0.2f64, 0.5, 0.3];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        for (top_p, kept) in [(0.1, 1), (0.49, 1), (0.75, 2), (0.85, 3), (1.0, 3)] {
            assert_eq!(Nucleus::new(&logits, 1.0, top_p).kept, kept, "top_p {top_p}");
        }
        let n = Nucleus::new(&logits, 1.0, 0.75);
        assert_eq!(&n.order[..2], &[1, 2]);
        let p = n.probabilities();
        assert!((p[1] - 0.625).abs() < 1e-6 && (p[2] - 0.375).abs() < 1e-6 && p[0] == 0.0, "{p:?}");
        assert_eq!(n.pick(0.0), 1);
        assert_eq!(n.pick(0.62), 1);
        assert_eq!(n.pick(0.63), 2);
        assert_eq!(n.pick(0.999_999), 2);
    }

    #[test]
    fn non_finite_logits() {
        assert_eq!(sample(&[f32::NAN, f32::NAN], params(1.0, 0.9), 3), 0);
        assert_eq!(sample(&[f32::NEG_INFINITY; 4], params(1.0, 0.9), 3), 0);
        for position in 0..100 {
            let t = sample(&[f32::NAN, 0.0, f32::NEG_INFINITY, 0.1], params(1.0, 1.0), position);
            assert!(t == 1 || t == 3, "{t}");
        }
    }

    /// Draws over many positions against the exact probabilities: a chi-square over the kept
    /// tokens (7 degrees of freedom at most; 40 is beyond its 1e-5 quantile), none outside.
    #[test]
    fn draws_follow_the_probabilities() {
        let logits = [1.0f32, 0.2, -0.5, 2.0, 0.0, 1.5, -3.0, 0.7];
        for (temperature, top_p) in [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8), (1.0, 0.5)] {
            let n = Nucleus::new(&logits, temperature, top_p);
            let p = n.probabilities();
            let draws = 40_000u32;
            let mut counts = [0u32; 8];
            for position in 0..draws {
                counts[sample(&logits, params(temperature, top_p), position) as usize] += 1;
            }
            let mut chi2 = 0.0;
            for t in 0..8 {
                if p[t] == 0.0 {
                    assert_eq!(counts[t], 0, "T {temperature} top_p {top_p}: token {t} is outside the nucleus");
                } else {
                    let want = p[t] * f64::from(draws);
                    chi2 += (f64::from(counts[t]) - want).powi(2) / want;
                }
            }
            assert!(n.kept >= 2, "the case must keep several tokens");
            assert!(chi2 < 40.0, "T {temperature} top_p {top_p}: chi-square {chi2:.1}, counts {counts:?}, p {p:?}");
        }
    }
}
