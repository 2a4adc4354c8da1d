//! Teacher-forced scoring: every given id decoded in turn, the logits of every position kept, and
//! written as safetensors (`logits` [T, V] f32, `tokens` [T] i64) — the file the parity checks
//! compare between backends and against the transformers goldens.

use std::path::Path;
use std::time::Instant;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::backend::Backend;
use super::error::{Result, fail};

/// The logits [T·V] after each of `ids`, from position 0, and the seconds it took.
pub fn score(backend: &mut dyn Backend, ids: &[u32]) -> Result<(Vec<f32>, f64)> {
    if ids.is_empty() {
        return fail("--score: no token ids to score");
    }
    backend.reset()?;
    let vocab = backend.vocab();
    let start = Instant::now();
    let mut logits = Vec::with_capacity(ids.len() * vocab);
    for &t in ids {
        backend.step(t)?;
        let l = backend.logits()?;
        if l.len() != vocab {
            return fail(format!("the backend returned {} logits for a vocabulary of {vocab}", l.len()));
        }
        logits.extend(l);
    }
    Ok((logits, start.elapsed().as_secs_f64()))
}

/// Writes `ids` and their `logits` [T·V] to `path`.
pub fn write(path: &Path, ids: &[u32], logits: &[f32]) -> Result<()> {
    let t = ids.len();
    let vocab = logits.len() / t.max(1);
    let logit_bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let token_bytes: Vec<u8> = ids.iter().flat_map(|&x| i64::from(x).to_le_bytes()).collect();
    let tensors = [
        ("logits", TensorView::new(Dtype::F32, vec![t, vocab], &logit_bytes)?),
        ("tokens", TensorView::new(Dtype::I64, vec![t], &token_bytes)?),
    ];
    safetensors::serialize_to_file(tensors, None, path)
        .map_err(|e| format!("--out {}: cannot write: {e}", path.display()))?;
    Ok(())
}
