//! The next token from a step's logits: greedy, or temperature and top-p sampling on the host.
//!
//! Sampling is deterministic given (seed, position), so a run replays exactly and two backends
//! with the same logits pick the same tokens:
//! 1. p = softmax(logits / T), in f64;
//! 2. the ids in order of higher logit, then lower id; the nucleus is the shortest prefix of that
//!    order whose probability reaches top-p (at least one id);
//! 3. u in [0, 1) is output number `position` (from 0) of a splitmix64 generator seeded with the
//!    seed — `splitmix64_mix(seed + (position + 1)·0x9E3779B97F4A7C15)`, top 53 bits — a counter,
//!    so no generator state is carried from step to step;
//! 4. the id where the nucleus's cumulative probability first exceeds u times its total (the
//!    inverse CDF).

use super::error::{Result, fail};

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampler {
    /// The argmax, the lower id on ties (the backend's fused choice).
    Greedy,
    /// Temperature and top-p, seeded.
    TopP { temperature: f64, top_p: f64, seed: u64 },
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform in [0, 1) for `position` under `seed` (53 bits).
pub fn uniform(seed: u64, position: u64) -> f64 {
    let z = mix(seed.wrapping_add(position.wrapping_add(1).wrapping_mul(GAMMA)));
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl Sampler {
    /// From the options: greedy when no temperature is given or it is 0.
    pub fn from_options(temperature: Option<f64>, top_p: f64, seed: u64) -> Result<Sampler> {
        if !(top_p > 0.0 && top_p <= 1.0) {
            return fail(format!("--top-p {top_p} is outside (0, 1]"));
        }
        match temperature {
            None => Ok(Sampler::Greedy),
            Some(0.0) => Ok(Sampler::Greedy),
            Some(t) if t.is_finite() && t > 0.0 => Ok(Sampler::TopP { temperature: t, top_p, seed }),
            Some(t) => fail(format!("--temperature {t} must be a finite number ≥ 0 (0 is greedy)")),
        }
    }

    pub fn is_greedy(&self) -> bool {
        matches!(self, Sampler::Greedy)
    }

    /// The id to decode at `position` (the index in the sequence it will take) from `logits`.
    pub fn sample(&self, logits: &[f32], position: u64) -> Result<u32> {
        if logits.is_empty() {
            return fail("the backend returned no logits");
        }
        if let Some(i) = logits.iter().position(|x| x.is_nan()) {
            return fail(format!("the logits of position {position} hold NaN (at id {i})"));
        }
        match *self {
            Sampler::Greedy => Ok(engine::reference::decoder::argmax(logits)),
            Sampler::TopP { temperature, top_p, seed } => {
                Ok(top_p_choice(logits, temperature, top_p, uniform(seed, position)))
            }
        }
    }
}

/// Ids taken in order from the top before falling back to sorting the whole vocabulary: the
/// nucleus and the inverse CDF's crossing are nearly always within them, and a full sort of a
/// 248k vocabulary per token would cost as much as a GPU decode step.
const HEAD: usize = 1024;

/// Steps 1, 2 and 4 of the module's rule for a given uniform `u`. The weights are
/// exp((logit − max) / T); their total is summed in id order; with top-p < 1 the nucleus ends at
/// the first id where the cumulative weight reaches top-p × total, with top-p = 1 it is every id.
pub fn top_p_choice(logits: &[f32], temperature: f64, top_p: f64, u: f64) -> u32 {
    // Higher logit first, then the lower id: a total order (NaN is refused before this).
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize].partial_cmp(&logits[*a as usize]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(b))
    };
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let weight = |i: u32| ((f64::from(logits[i as usize]) - f64::from(max)) / temperature).exp();
    let total: f64 = (0..logits.len() as u32).map(weight).sum();
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    if order.len() > HEAD {
        order.select_nth_unstable_by(HEAD - 1, cmp);
        order[..HEAD].sort_by(cmp);
        if let Some(id) = walk(&order[..HEAD], weight, total, top_p, u) {
            return id;
        }
    }
    order.sort_by(cmp);
    walk(&order, weight, total, top_p, u).unwrap_or(order[order.len() - 1])
}

/// The choice within `sorted`, a prefix of the order, or None when it needs ids past the prefix.
fn walk(sorted: &[u32], weight: impl Fn(u32) -> f64, total: f64, top_p: f64, u: f64) -> Option<u32> {
    let mass = if top_p >= 1.0 {
        total
    } else {
        let mut cum = 0.0;
        sorted.iter().map(|&i| weight(i)).find_map(|w| {
            cum += w;
            (cum >= top_p * total).then_some(cum)
        })?
    };
    let target = u * mass;
    let mut cum = 0.0;
    for &i in sorted {
        let w = weight(i);
        if cum + w > target || (top_p < 1.0 && cum + w >= mass) {
            return Some(i);
        }
        cum += w;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_published_sequence() {
        // splitmix64 seeded with 0: the first outputs of the reference implementation.
        assert_eq!(mix(GAMMA), 0xE220_A839_7B1D_CDAF);
        assert_eq!(mix(GAMMA.wrapping_mul(2)), 0x6E78_9E6A_A1B9_65F4);
        assert!((0..1000).map(|p| uniform(7, p)).all(|u| (0.0..1.0).contains(&u)));
    }

    #[test]
    fn a_tiny_top_p_is_greedy_with_ties_to_the_lower_id() {
        let logits = [0.5, 2.0, 2.0, -1.0];
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(top_p_choice(&logits, 1.0, 1e-9, u), 1);
        }
    }

    #[test]
    fn the_inverse_cdf_walks_the_nucleus_in_order() {
        // T = 1: probabilities ∝ e^l; ids 2 (0.5), 0 (0.3), 1 (0.2) after sorting.
        let logits = [0.3f32.ln(), 0.2f32.ln(), 0.5f32.ln()];
        assert_eq!(top_p_choice(&logits, 1.0, 1.0, 0.0), 2);
        assert_eq!(top_p_choice(&logits, 1.0, 1.0, 0.49), 2);
        assert_eq!(top_p_choice(&logits, 1.0, 1.0, 0.51), 0);
        assert_eq!(top_p_choice(&logits, 1.0, 1.0, 0.81), 1);
        // top-p 0.79 keeps ids 2 and 0 (0.5 + 0.3 reaches it): u scales over their 0.8.
        assert_eq!(top_p_choice(&logits, 1.0, 0.79, 0.99), 0);
        assert_eq!(top_p_choice(&logits, 1.0, 0.79, 0.63), 0);
        assert_eq!(top_p_choice(&logits, 1.0, 0.79, 0.6), 2);
    }

    /// The rule written plainly: the whole vocabulary sorted, the nucleus cut, the CDF inverted.
    fn naive(logits: &[f32], temperature: f64, top_p: f64, u: f64) -> u32 {
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].partial_cmp(&logits[a as usize]).expect("no NaN").then(a.cmp(&b)));
        let max = f64::from(logits[order[0] as usize]);
        let w: Vec<f64> = order.iter().map(|&i| ((f64::from(logits[i as usize]) - max) / temperature).exp()).collect();
        let total: f64 = (0..logits.len()).map(|i| ((f64::from(logits[i]) - max) / temperature).exp()).sum();
        let (mut kept, mut mass) = (w.len(), total);
        if top_p < 1.0 {
            let mut cum = 0.0;
            for (k, x) in w.iter().enumerate() {
                cum += x;
                if cum >= top_p * total {
                    (kept, mass) = (k + 1, cum);
                    break;
                }
            }
        }
        let mut cum = 0.0;
        for k in 0..kept {
            cum += w[k];
            if cum > u * mass {
                return order[k];
            }
        }
        order[kept - 1]
    }

    #[test]
    fn the_head_shortcut_chooses_as_the_full_sort_does() {
        let mut state = 99u64;
        let mut next = || {
            state = state.wrapping_add(GAMMA);
            mix(state)
        };
        for (vocab, spread) in [(5000usize, 8.0f32), (5000, 0.5), (300, 3.0), (20_000, 0.05)] {
            // Logits quantised to a few levels, so ties are common.
            let logits: Vec<f32> =
                (0..vocab).map(|_| ((next() % 64) as f32 / 64.0 * spread).round_ties_even()).collect();
            for (t, p) in [(1.0, 1.0), (0.7, 0.9), (2.0, 0.5), (1.0, 0.999)] {
                for _ in 0..20 {
                    let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
                    assert_eq!(
                        top_p_choice(&logits, t, p, u),
                        naive(&logits, t, p, u),
                        "V {vocab}, spread {spread}, T {t}, top-p {p}, u {u}"
                    );
                }
            }
        }
    }

    #[test]
    fn sampling_is_a_function_of_seed_and_position() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let s = Sampler::from_options(Some(0.8), 0.95, 42).expect("sampler");
        let a: Vec<u32> = (0..32).map(|p| s.sample(&logits, p).expect("id")).collect();
        let b: Vec<u32> = (0..32).map(|p| s.sample(&logits, p).expect("id")).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&x| x != a[0]), "32 draws at T=0.8 should not all agree: {a:?}");
        let other = Sampler::from_options(Some(0.8), 0.95, 43).expect("sampler");
        assert_ne!(a, (0..32).map(|p| other.sample(&logits, p).expect("id")).collect::<Vec<_>>());
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(Sampler::from_options(Some(-1.0), 1.0, 0).is_err());
        assert!(Sampler::from_options(Some(1.0), 0.0, 0).is_err());
        assert!(Sampler::from_options(Some(1.0), 1.5, 0).is_err());
        assert_eq!(Sampler::from_options(Some(0.0), 1.0, 0).expect("greedy"), Sampler::Greedy);
        assert!(Sampler::from_options(Some(1.0), 1.0, 0).expect("sampler").sample(&[f32::NAN], 0).is_err());
    }
}
