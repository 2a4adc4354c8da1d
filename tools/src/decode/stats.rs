//! The timing report: the prompt's steps and the generated tokens' steps, timed apart, as
//! tokens/s and ms/token, and against the byte floor (the bytes a step must read over the memory
//! bandwidth) when the backend knows its bytes per token.

use std::time::Duration;

/// What one run took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// Prompt tokens decoded, and how long they took.
    pub prompt_tokens: usize,
    pub prompt: Duration,
    /// Generated tokens that were decoded (each token's choice and its step; the last token is
    /// chosen but not decoded), and how long they took.
    pub steps: usize,
    pub decode: Duration,
}

fn rate(tokens: usize, d: Duration) -> (f64, f64) {
    let s = d.as_secs_f64();
    let per = if tokens == 0 { 0.0 } else { s * 1e3 / tokens as f64 };
    (if s > 0.0 { tokens as f64 / s } else { 0.0 }, per)
}

/// The report's lines.
pub fn report(t: &Timing, bytes_per_token: Option<u64>, peak_gbs: f64) -> Vec<String> {
    let mut lines = Vec::new();
    let (tps, ms) = rate(t.prompt_tokens, t.prompt);
    lines.push(format!(
        "prefill: {} tokens in {:.1} ms: {tps:.2} tok/s, {ms:.3} ms/token",
        t.prompt_tokens,
        t.prompt.as_secs_f64() * 1e3
    ));
    if t.steps == 0 {
        lines.push("decode: no generated token was decoded (at most one was generated)".to_owned());
        return lines;
    }
    let (tps, ms) = rate(t.steps, t.decode);
    lines.push(format!(
        "decode: {} tokens in {:.1} ms: {tps:.2} tok/s, {ms:.3} ms/token",
        t.steps,
        t.decode.as_secs_f64() * 1e3
    ));
    if let Some(bytes) = bytes_per_token {
        let floor_ms = bytes as f64 / (peak_gbs * 1e9) * 1e3;
        let achieved = bytes as f64 / (ms * 1e-3) / 1e9;
        lines.push(format!(
            "byte floor: {:.1} MB per token at {peak_gbs:.0} GB/s is {floor_ms:.3} ms/token; measured {:.2}× that \
             ({achieved:.0} GB/s achieved)",
            bytes as f64 / 1e6,
            ms / floor_ms
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_states_rates_and_the_floor() {
        let t = Timing {
            prompt_tokens: 4,
            prompt: Duration::from_millis(8),
            steps: 10,
            decode: Duration::from_millis(200),
        };
        let lines = report(&t, Some(5_460_000_000), 273.0);
        assert!(lines[0].contains("500.00 tok/s") && lines[0].contains("2.000 ms/token"), "{lines:?}");
        assert!(lines[1].contains("50.00 tok/s") && lines[1].contains("20.000 ms/token"), "{lines:?}");
        assert!(lines[2].contains("20.000 ms/token") && lines[2].contains("1.00×"), "{lines:?}");
        assert_eq!(report(&t, None, 273.0).len(), 2);
    }
}
