//! The bodies of the parsers' fuzz targets, in one place: `fuzz/` (cargo-fuzz, nightly) and
//! `tests/fuzz_parsers.rs` (a bounded mutation fuzzer on stable, run by CI) call the same code.
//!
//! A target takes any bytes and must return: every input is either accepted or refused with an
//! error; a panic (an index out of range, an overflow in a debug build, an `expect`) is the bug
//! the fuzzers look for. Each target goes on past a successful parse into what the engine does
//! next with the result on the host (the step's plan for a config, reading every tensor and the
//! whole model's weights for a checkpoint), since that is where a parsed but absurd input would
//! first be used.

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::weights::ModelWeights;
use engine::step::{Formats, StepPlan};

/// The configs of the tiny checkpoints in tests/data, which [`safetensors`] loads a parsed
/// checkpoint against (a checkpoint made from one of them gets past the names to the shapes and
/// values).
const CONFIGS: [&str; 3] = [
    include_str!("../tests/data/tiny-step/config.json"),
    include_str!("../tests/data/tiny-sparse/config.json"),
    include_str!("../tests/data/tiny-dense/config.json"),
];

/// Fuzz target `config`: `config.json` from any bytes (as UTF-8, lossily), then what the engine
/// derives from a config it accepted: the step's plan at a small and a long context, in both
/// formats, and the derived sizes. Returns whether the config was accepted.
pub fn config(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(cfg) = ModelConfig::from_json(&text) else { return false };
    let _ = (cfg.ngram_heads(), cfg.residual_width(), cfg.gdn_conv_dim(), cfg.indexer_top_blocks());
    for formats in [Formats::BF16, Formats::NVFP4] {
        for context in [1, 4096, 1 << 20] {
            let _ = StepPlan::new(&cfg, formats, context);
        }
    }
    true
}

/// Fuzz target `safetensors`: one safetensors file from any bytes ([`Checkpoint::from_bytes`]),
/// then every tensor read as the loaders read them (f32, integers, shape checks), and the whole
/// model's weights loaded against each tiny config. Returns whether the file parsed.
pub fn safetensors(data: &[u8]) -> bool {
    let Ok(ck) = Checkpoint::from_bytes("<fuzz>/model.safetensors", data.to_vec()) else { return false };
    for name in ck.names() {
        let Some(t) = ck.get(name) else { continue };
        let _ = (t.elements(), t.to_f32(), t.to_i64(), t.expect_shape(&[t.elements()]));
    }
    for text in CONFIGS {
        if let Ok(cfg) = ModelConfig::from_json(text) {
            let _ = ModelWeights::load(&cfg, &ck);
        }
    }
    true
}
