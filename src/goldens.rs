//! The goldens tools/goldens/make_goldens.py writes beside each tiny model in tests/data: the
//! transformers reference's tokens, logits and residual streams.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

#[derive(Debug)]
pub struct Goldens {
    /// The prompt, then the reference's greedy continuation.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// [T, V]: teacher-forced logits at every position.
    pub logits: Vec<f32>,
    /// [L, prompt_len, n·d]: the residual streams after each layer over the prompt.
    pub hidden: Vec<f32>,
}

/// tests/data/`name`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// The goldens of the model in `dir`; panics with the reason when they cannot be read.
pub fn load(dir: &Path) -> Goldens {
    let bytes = std::fs::read(dir.join("goldens.safetensors")).expect("goldens.safetensors");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let f32s = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let i64s = |name: &str| -> Vec<i64> {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
    };
    Goldens {
        tokens: i64s("tokens").into_iter().map(|t| t as u32).collect(),
        prompt_len: i64s("prompt_len")[0] as usize,
        logits: f32s("logits"),
        hidden: f32s("hidden"),
    }
}
