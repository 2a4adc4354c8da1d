//! The CPU reference against the transformers reference: the goldens in tests/data were made by
//! tools/goldens/make_goldens.py (transformers 5.17, fp32) from tiny random models with the real
//! architecture. Teacher-forced logits at every position within 1e-3 relative L2, and the greedy
//! continuation token for token.

use flashnext::compare::rel_l2;
use flashnext::goldens::{data, load as goldens};

use engine::model::weights::ModelWeights;
use engine::reference::decoder::Decoder;

fn check(name: &str) {
    let dir = data(name);
    let weights = ModelWeights::load_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let g = goldens(&dir);
    let cfg = &weights.config;
    let (vocab, width, layers) = (cfg.vocab_size, cfg.residual_width(), cfg.num_layers);
    assert_eq!(g.logits.len(), g.tokens.len() * vocab, "{name}: goldens and config disagree on the vocabulary");

    // Teacher forcing: every position's logits; the streams after every layer over the prompt.
    let mut dec = Decoder::new(&weights);
    let mut worst = (0.0f64, 0usize);
    for (t, &token) in g.tokens.iter().enumerate() {
        let mut layer_errors = Vec::new();
        let logits = dec
            .step_observed(token, |l, streams| {
                if t < g.prompt_len {
                    let off = (l * g.prompt_len + t) * width;
                    layer_errors.push(format!("{:.1e}", rel_l2(streams, &g.hidden[off..off + width])));
                }
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let err = rel_l2(&logits, &g.logits[t * vocab..(t + 1) * vocab]);
        if err > worst.0 {
            worst = (err, t);
        }
        assert!(
            err <= 1e-3,
            "{name}: logits at position {t} (token {token}) are {err:.2e} from transformers (relative L2); \
             the streams after each layer: [{}] (of {layers} layers)",
            layer_errors.join(", ")
        );
    }
    println!("{name}: {} positions, worst logits relative L2 {:.2e} at position {}", g.tokens.len(), worst.0, worst.1);

    // Greedy decoding from the prompt gives the reference's continuation.
    let mut dec = Decoder::new(&weights);
    let prompt = &g.tokens[..g.prompt_len];
    let want = &g.tokens[g.prompt_len..];
    let got = dec.greedy(prompt, want.len()).unwrap_or_else(|e| panic!("{e}"));
    assert!(want.len() >= 32, "{name}: the goldens hold {} new tokens, fewer than 32", want.len());
    assert_eq!(got, want, "{name}: greedy continuation");
}

#[test]
fn tiny_sparse_matches_transformers() {
    check("tiny-sparse");
}

#[test]
fn tiny_dense_matches_transformers() {
    check("tiny-dense");
}

#[test]
fn tiny_sparse_nvfp4_matches_transformers_on_the_dequantised_weights() {
    check("tiny-sparse-nvfp4");
}

#[test]
fn tiny_step_matches_transformers() {
    check("tiny-step");
}
