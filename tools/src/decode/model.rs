//! Where the model comes from: a Hugging Face checkpoint directory (`config.json` and
//! `*.safetensors`, perhaps `tokenizer.json`), or the model embedded in the binary — tests/data's
//! `tiny-step` (3 layers at the step's shapes, vocabulary 512, random weights, no tokenizer), so
//! the binary runs with no download and no argument.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::weights::ModelWeights;

use super::error::{Result, fail};

const EMBEDDED_CONFIG: &str = include_str!("../../../tests/data/tiny-step/config.json");
static EMBEDDED_WEIGHTS: &[u8] = include_bytes!("../../../tests/data/tiny-step/model.safetensors");

/// A model to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A checkpoint directory (`--model DIR`).
    Dir(PathBuf),
    /// tests/data/tiny-step, in the binary.
    Embedded,
    /// Random weights of the published geometry, made on the device (`--synthetic`).
    Synthetic { seed: u64 },
}

impl ModelSource {
    /// One line for the user.
    pub fn describe(&self) -> String {
        match self {
            ModelSource::Dir(d) => format!("{}", d.display()),
            ModelSource::Embedded => "the embedded tiny-step model (3 layers, random weights, vocabulary 512; \
                                      --model DIR runs a checkpoint)"
                .to_owned(),
            ModelSource::Synthetic { seed } => format!(
                "synthetic: random weights of the published geometry made on the device from seed {seed} (for \
                 benchmarks: the text is noise)"
            ),
        }
    }

    /// The directory, for a tokenizer.json beside the weights.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            ModelSource::Dir(d) => Some(d),
            ModelSource::Embedded | ModelSource::Synthetic { .. } => None,
        }
    }

    /// The model's configuration; for a directory, first that it is one and holds config.json.
    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            ModelSource::Embedded => Ok(ModelConfig::from_json(EMBEDDED_CONFIG)?),
            ModelSource::Synthetic { .. } => Ok(ModelConfig::published()),
            ModelSource::Dir(d) => {
                if !d.exists() {
                    return fail(format!("--model {}: no such directory", d.display()));
                }
                if !d.is_dir() {
                    return fail(format!("--model {}: not a directory (give the checkpoint's directory)", d.display()));
                }
                let path = d.join("config.json");
                if !path.is_file() {
                    return fail(format!(
                        "--model {}: no config.json there (a Hugging Face checkpoint directory holds config.json \
                         and model.safetensors or its shards)",
                        d.display()
                    ));
                }
                Ok(ModelConfig::from_file(&path).map_err(|e| format!("{}: {e}", d.display()))?)
            }
        }
    }

    /// The checkpoint's tensors (headers checked, data mapped, nothing read yet).
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        Ok(match self {
            ModelSource::Embedded => {
                Checkpoint::from_static("<embedded tiny-step>/model.safetensors", EMBEDDED_WEIGHTS)?
            }
            ModelSource::Dir(d) => Checkpoint::open(d)?,
            ModelSource::Synthetic { .. } => {
                return fail("a synthetic model has no checkpoint: its weights are made on the device");
            }
        })
    }

    /// Every weight read into f32 for the CPU reference, with each layer's progress on stderr
    /// when it is a terminal (one summary line either way).
    pub fn load_weights(&self, cfg: &ModelConfig) -> Result<ModelWeights> {
        let start = Instant::now();
        let ck = self.checkpoint()?;
        let tty = std::io::stderr().is_terminal();
        let weights = ModelWeights::load_with_progress(cfg, &ck, |done, of| {
            if tty {
                eprint!("\rloading layer {done}/{of}");
                let _ = std::io::stderr().flush();
            }
        });
        if tty {
            eprintln!();
        }
        let weights = weights?;
        eprintln!("loaded {} layers in {:.2} s", cfg.num_layers, start.elapsed().as_secs_f64());
        Ok(weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_model_loads() {
        let m = ModelSource::Embedded;
        let cfg = m.config().expect("config");
        assert_eq!(cfg.vocab_size, 512);
        let w = m.load_weights(&cfg).expect("weights");
        assert_eq!(w.layers.len(), cfg.num_layers);
    }
}
