//! Element-wise comparison: every element is checked, NaN (an unwritten poisoned element) always
//! fails, and a failure names the elements, not just a norm.

use std::fmt::Write;

/// How far a result is from its reference.
#[derive(Clone, Copy, Debug)]
pub struct Agreement {
    /// ‖got − want‖₂ / ‖want‖₂.
    pub rel_l2: f64,
    pub max_abs: f64,
    pub elements: usize,
}

/// Checks `got[i]` against `want[i]` within `tol(i)` for every i. Returns the agreement or a
/// message listing the first mismatches.
pub fn check(what: &str, got: &[f32], want: &[f32], tol: impl Fn(usize) -> f32) -> Result<Agreement, String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} elements, expected {}", got.len(), want.len()));
    }
    let mut bad = Vec::new();
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = f64::from(g) - f64::from(w);
        num += d * d;
        den += f64::from(w) * f64::from(w);
        max_abs = max_abs.max(d.abs());
        // NaN (an unwritten, poisoned element) is never within tolerance.
        let within = d.abs() <= f64::from(tol(i));
        if !within {
            bad.push(i);
        }
    }
    let rel_l2 = if den > 0.0 { (num / den).sqrt() } else { num.sqrt() };
    if bad.is_empty() {
        return Ok(Agreement { rel_l2, max_abs, elements: got.len() });
    }
    let mut msg = format!("{what}: {} of {} elements out of tolerance (rel L2 {rel_l2:.3e})", bad.len(), got.len());
    for &i in bad.iter().take(8) {
        let _ = write!(msg, "\n  [{i}] got {} want {} (tolerance {})", got[i], want[i], tol(i));
    }
    Err(msg)
}

/// ‖got − want‖₂ / ‖want‖₂ in f64 (the plain norm of the difference when `want` is all zero); a
/// NaN in `got` makes it NaN, which no bound accepts.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    if den > 0.0 { (num / den).sqrt() } else { num.sqrt() }
}

/// Rounds to bf16 and back: what a kernel that writes bf16 can at best produce.
pub fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_counts_and_nan_fails() {
        assert!(check("ok", &[1.0, 2.0], &[1.0, 2.001], |_| 0.01).is_ok());
        let e = check("far", &[1.0, 2.5], &[1.0, 2.0], |_| 0.01).expect_err("one element is off");
        assert!(e.contains("[1] got 2.5"), "{e}");
        assert!(check("nan", &[f32::NAN], &[1.0], |_| 1e9).is_err());
        assert!(check("len", &[1.0], &[1.0, 2.0], |_| 1.0).is_err());
    }
}
