//! The model's configuration: a Hugging Face `config.json` of `qwen4_exp`, read with the
//! reference's defaults, derived fields and validation rules.
//!
//! Both forms are accepted: the vision-language checkpoint (`model_type: "qwen4_exp"`, the text
//! decoder's fields under `text_config`) and the text config alone (`"qwen4_exp_text"`).

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value};

/// The kind of a decoder layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attention`).
    Gdn,
    /// Gated attention over indexer-selected blocks (`qwen_sparse_attention`).
    Qsa,
}

/// The text decoder's configuration, every field resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub rms_norm_eps: f32,
    pub eos_token_id: Option<u32>,
    /// The activation of the MoE experts and of the GDN conv (`hidden_act`); only SiLU exists.
    pub hidden_act: String,

    // Gated attention.
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub rope_theta: f64,
    /// Rotated dimensions of each head: `int(head_dim · partial_rotary_factor)`.
    pub rotary_dim: usize,

    // The QSA indexer.
    pub indexer_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_budget: usize,
    pub indexer_block: usize,

    // Gated DeltaNet.
    pub linear_key_heads: usize,
    pub linear_value_heads: usize,
    pub linear_key_dim: usize,
    pub linear_value_dim: usize,
    pub linear_conv_kernel: usize,
    /// The GDN output gate: true for sigmoid, false for SiLU (`output_gate_type or hidden_act`).
    pub gdn_gate_sigmoid: bool,

    // MoE.
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate: usize,
    pub shared_intermediate: usize,
    pub norm_topk_prob: bool,

    // Gated Residual.
    pub hc_streams: usize,
    pub hc_rank: usize,

    // PLE (n-gram embedding).
    /// 0-based indices of the PLE layers, ascending.
    pub ple_layers: Vec<usize>,
    pub ple_embed_dim: usize,
    pub ple_conv_kernel: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub ngram_vocab_size_base: u64,
    pub ngram_vocab_divisible_by: u64,
    pub ple_seed: u64,
    pub split_ngram_parts: usize,
}

/// The largest size a config may give (a dimension, a count of heads, layers or experts): the
/// kernels index in 32 bits.
pub const MAX_SIZE: usize = (1 << 31) - 1;

/// The most layers a model may have (the layer list is made before the other sizes are checked).
pub const MAX_LAYERS: usize = 1 << 16;

/// The most parameters a model may have: 2⁴⁴ (17.6 T, 500× the published model), far below what
/// would overflow the byte counts the loaders and the plan form.
pub const MAX_PARAMETERS: u64 = 1 << 44;

/// What is wrong with a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config.json: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn bad<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// Typed access to the fields of one JSON object, with the defaults of the reference.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str, default: Option<usize>) -> Result<usize, ConfigError> {
        match self.get(key) {
            None => default.ok_or_else(|| ConfigError(format!("`{key}` is missing"))),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| ConfigError(format!("`{key}` must be a non-negative integer, found {v}"))),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.get(key).map(|_| self.usize(key, None)).transpose()
    }

    fn f64(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| ConfigError(format!("`{key}` must be a number, found {v}"))),
        }
    }

    fn bool(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| ConfigError(format!("`{key}` must be true or false, found {v}"))),
        }
    }

    fn string(&self, key: &str, default: &str) -> Result<String, ConfigError> {
        match self.get(key) {
            None => Ok(default.to_owned()),
            Some(v) => {
                v.as_str().map(str::to_owned).ok_or_else(|| ConfigError(format!("`{key}` must be a string, found {v}")))
            }
        }
    }
}

impl ModelConfig {
    /// Reads `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        ModelConfig::from_json(&text)
    }

    /// The published model's text config (../shared/design/MODEL.md, "Published geometry"): 48
    /// layers (every fourth QSA), d 2560, 512 experts of 640, PLE on layer id 2. For benchmarks
    /// with synthetic weights (`crate::synthetic`), where no checkpoint brings its config.json.
    pub fn published() -> ModelConfig {
        let json = serde_json::json!({
            "model_type": "qwen4_exp_text",
            "vocab_size": 248320, "hidden_size": 2560, "num_hidden_layers": 48, "full_attention_interval": 4,
            "num_attention_heads": 24, "num_key_value_heads": 2, "head_dim": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048,
            "indexer_compress_ratio": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "output_gate_type": "sigmoid",
            "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 640,
            "shared_expert_intermediate_size": 640, "norm_topk_prob": true,
            "hc_count": 4, "hc_lowrank": 320, "rms_norm_eps": 1e-6, "eos_token_id": 248044,
            "ple_layer_ids": [2], "ple_embed_dim": 2560, "ple_conv_kernel_size": 4, "ngram_size": 3,
            "heads_per_ngram": 8, "ngram_vocab_size_base": 20_000_000, "make_ngram_vocab_size_divisible_by": 128,
        });
        ModelConfig::from_json(&json.to_string()).expect("the published geometry is a valid config")
    }

    /// Reads `config.json` from its text.
    pub fn from_json(text: &str) -> Result<ModelConfig, ConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|e| ConfigError(format!("not valid JSON: {e}")))?;
        let Value::Object(root) = root else { return bad("the top level is not a JSON object") };
        let model_type = root.get("model_type").and_then(Value::as_str);
        let text_config = match (model_type, root.get("text_config")) {
            (Some("qwen4_exp"), Some(Value::Object(t))) => t,
            (Some("qwen4_exp"), _) => return bad("model_type `qwen4_exp` needs a `text_config` object"),
            (Some("qwen4_exp_text") | None, _) => &root,
            (Some(other), _) => return bad(format!("model_type `{other}` is not qwen4_exp or qwen4_exp_text")),
        };
        ModelConfig::from_text_config(text_config)
    }

    fn from_text_config(obj: &Map<String, Value>) -> Result<ModelConfig, ConfigError> {
        let f = Fields(obj);
        let hidden_size = f.usize("hidden_size", Some(2048))?;
        let num_layers = f.usize("num_hidden_layers", Some(40))?;
        let num_heads = f.usize("num_attention_heads", Some(16))?;
        if hidden_size == 0 || num_layers == 0 || num_heads == 0 {
            return bad("hidden_size, num_hidden_layers and num_attention_heads must be positive");
        }
        if num_layers > MAX_LAYERS {
            return bad(format!("num_hidden_layers {num_layers} is above the {MAX_LAYERS} this engine supports"));
        }
        let head_dim = f.usize("head_dim", Some(hidden_size / num_heads))?;
        let hidden_act = f.string("hidden_act", "silu")?;
        if hidden_act != "silu" {
            return bad(format!("hidden_act `{hidden_act}` is not supported (the experts and the GDN conv use silu)"));
        }

        // RoPE: `rope_parameters`, or the legacy top-level keys folded into it.
        let rope = match f.get("rope_parameters").or_else(|| f.get("rope_scaling")) {
            Some(Value::Object(r)) => Some(r),
            Some(v) => return bad(format!("`rope_parameters` must be an object, found {v}")),
            None => None,
        };
        let rope_field = |key: &str| rope.and_then(|r| r.get(key)).filter(|v| !v.is_null()).or_else(|| f.get(key));
        let rope_type =
            rope_field("rope_type").or_else(|| rope_field("type")).and_then(Value::as_str).unwrap_or("default");
        if rope_type != "default" {
            return bad(format!("rope_type `{rope_type}` is not supported (only `default`)"));
        }
        let rope_theta = match rope_field("rope_theta") {
            None => 10_000.0,
            Some(v) => v.as_f64().ok_or_else(|| ConfigError(format!("`rope_theta` must be a number, found {v}")))?,
        };
        let partial = match rope_field("partial_rotary_factor") {
            None => 1.0,
            Some(v) => {
                v.as_f64().ok_or_else(|| ConfigError(format!("`partial_rotary_factor` must be a number, found {v}")))?
            }
        };
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return bad(format!(
                "head_dim {head_dim} × partial_rotary_factor {partial} gives {rotary_dim} rotary dimensions: it must be even, positive and at most head_dim"
            ));
        }

        let layer_kinds = match f.get("layer_types") {
            None => {
                let interval = f.usize("full_attention_interval", Some(4))?;
                if interval == 0 {
                    return bad("`full_attention_interval` must be positive");
                }
                (0..num_layers).map(|i| if (i + 1) % interval == 0 { LayerKind::Qsa } else { LayerKind::Gdn }).collect()
            }
            Some(Value::Array(types)) => {
                let mut kinds = Vec::with_capacity(types.len());
                for t in types {
                    kinds.push(match t.as_str() {
                        Some("linear_attention") => LayerKind::Gdn,
                        // The published checkpoint names its indexer layers `full_attention`.
                        Some("qwen_sparse_attention" | "full_attention") => LayerKind::Qsa,
                        _ => return bad(format!("Unsupported Qwen4-Exp layer type {t}: expected linear_attention or qwen_sparse_attention")),
                    });
                }
                if kinds.len() != num_layers {
                    return bad(format!(
                        "`layer_types` lists {} layers, num_hidden_layers is {num_layers}",
                        kinds.len()
                    ));
                }
                kinds
            }
            Some(v) => return bad(format!("`layer_types` must be a list, found {v}")),
        };

        let hidden_act_gate = f.string("output_gate_type", &hidden_act)?;
        let gdn_gate_sigmoid = match hidden_act_gate.as_str() {
            "sigmoid" => true,
            "silu" => false,
            other => return bad(format!("Unsupported Qwen4-Exp output gate activation `{other}` (sigmoid or silu)")),
        };

        let eos_token_id = match f.get("eos_token_id") {
            None => None,
            Some(Value::Array(list)) => match list.first() {
                Some(v) => Some(token_id(v)?),
                None => return bad("`eos_token_id` is an empty list"),
            },
            Some(v) => Some(token_id(v)?),
        };

        let mut ple_ids = match f.get("ple_layer_ids") {
            None => vec![],
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| ConfigError(format!("`ple_layer_ids` holds {v}, not an integer")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(v) => return bad(format!("`ple_layer_ids` must be a list, found {v}")),
        };
        ple_ids.sort_unstable();
        ple_ids.dedup();

        let indexer = [
            ("indexer_n_heads", f.opt_usize("indexer_n_heads")?),
            ("indexer_kv_heads", f.opt_usize("indexer_kv_heads")?),
            ("indexer_head_dim", f.opt_usize("indexer_head_dim")?),
            ("indexer_budget", f.opt_usize("indexer_budget")?),
            ("indexer_compress_ratio", f.opt_usize("indexer_compress_ratio")?),
        ];

        let cfg = ModelConfig {
            vocab_size: f.usize("vocab_size", Some(248_320))?,
            hidden_size,
            num_layers,
            layer_kinds,
            rms_norm_eps: f.f64("rms_norm_eps", 1e-6)? as f32,
            eos_token_id,
            hidden_act,
            num_heads,
            num_kv_heads: f.usize("num_key_value_heads", Some(2))?,
            head_dim,
            attention_bias: f.bool("attention_bias", false)?,
            rope_theta,
            rotary_dim,
            indexer_heads: indexer[0].1.unwrap_or(0),
            indexer_head_dim: indexer[2].1.unwrap_or(0),
            indexer_budget: indexer[3].1.unwrap_or(0),
            indexer_block: indexer[4].1.unwrap_or(0),
            linear_key_heads: f.usize("linear_num_key_heads", Some(16))?,
            linear_value_heads: f.usize("linear_num_value_heads", Some(32))?,
            linear_key_dim: f.usize("linear_key_head_dim", Some(128))?,
            linear_value_dim: f.usize("linear_value_head_dim", Some(128))?,
            linear_conv_kernel: f.usize("linear_conv_kernel_dim", Some(4))?,
            gdn_gate_sigmoid,
            num_experts: f.usize("num_experts", Some(512))?,
            experts_per_token: f.usize("num_experts_per_tok", Some(10))?,
            expert_intermediate: f.usize("moe_intermediate_size", Some(512))?,
            shared_intermediate: f.usize("shared_expert_intermediate_size", Some(512))?,
            norm_topk_prob: f.bool("norm_topk_prob", true)?,
            hc_streams: f.usize("hc_count", Some(4))?,
            hc_rank: f.usize("hc_lowrank", Some(320))?,
            ple_layers: ple_ids.iter().map(|&id| id.wrapping_sub(1)).collect(),
            ple_embed_dim: f.opt_usize("ple_embed_dim")?.unwrap_or(hidden_size),
            ple_conv_kernel: f.usize("ple_conv_kernel_size", Some(4))?,
            ngram_size: f.usize("ngram_size", Some(3))?,
            heads_per_ngram: f.usize("heads_per_ngram", Some(8))?,
            ngram_vocab_size_base: f.usize("ngram_vocab_size_base", Some(20_000_000))? as u64,
            ngram_vocab_divisible_by: f.usize("make_ngram_vocab_size_divisible_by", Some(128))? as u64,
            ple_seed: f.usize("seed", Some(1234))? as u64,
            split_ngram_parts: f.usize("split_ngram_parts", Some(512))?,
        };
        cfg.validate(&ple_ids, &indexer)?;
        Ok(cfg)
    }

    /// The reference's `validate_architecture`, plus what building the layers would reject.
    fn validate(&self, ple_ids: &[usize], indexer: &[(&str, Option<usize>); 5]) -> Result<(), ConfigError> {
        self.check_sizes()?;
        if self.hc_streams <= 1 {
            return bad(format!("Qwen4-Exp requires hc_count > 1, found {}", self.hc_streams));
        }
        if self.hc_rank == 0 {
            return bad("hc_lowrank must be positive");
        }
        if self.num_experts == 0 {
            return bad("num_experts must be positive");
        }
        if self.experts_per_token == 0 || self.experts_per_token > self.num_experts {
            return bad(format!(
                "num_experts_per_tok must be in [1, num_experts] = [1, {}], found {}",
                self.num_experts, self.experts_per_token
            ));
        }
        if self.expert_intermediate == 0 || self.shared_intermediate == 0 {
            return bad("moe_intermediate_size and shared_expert_intermediate_size must be positive");
        }
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_attention_heads {} must be a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.linear_key_heads == 0 || !self.linear_value_heads.is_multiple_of(self.linear_key_heads) {
            return bad(format!(
                "linear_num_value_heads {} must be a multiple of linear_num_key_heads {}",
                self.linear_value_heads, self.linear_key_heads
            ));
        }
        if self.linear_conv_kernel == 0 {
            return bad("linear_conv_kernel_dim must be positive");
        }
        let any_indexer = indexer.iter().any(|(_, v)| v.is_some());
        let needs_indexer = self.layer_kinds.contains(&LayerKind::Qsa);
        if any_indexer || needs_indexer {
            if let Some((name, _)) = indexer.iter().find(|(_, v)| v.is_none()) {
                return bad(format!(
                    "QSA config is missing required fields: `{name}` (sparse-attention layers need all five indexer_* fields)"
                ));
            }
            if let Some((name, _)) = indexer.iter().find(|(_, v)| *v == Some(0)) {
                return bad(format!("`{name}` must be positive"));
            }
            if indexer[1].1 != Some(1) {
                return bad(format!("indexer_kv_heads must be 1, found {}", indexer[1].1.unwrap_or(0)));
            }
            if !self.indexer_budget.is_multiple_of(self.indexer_block) {
                return bad(format!(
                    "indexer_budget {} must be a multiple of indexer_compress_ratio {}",
                    self.indexer_budget, self.indexer_block
                ));
            }
            if self.rotary_dim > self.indexer_head_dim {
                return bad(format!(
                    "attention RoPE dimensions ({}) must fit the QSA index head ({})",
                    self.rotary_dim, self.indexer_head_dim
                ));
            }
        }
        if !ple_ids.is_empty() {
            let heads = self.ngram_heads();
            if heads == 0 || self.ple_embed_dim == 0 || !self.ple_embed_dim.is_multiple_of(heads) {
                return bad(format!(
                    "ple_embed_dim {} must be a positive multiple of the n-gram heads ({} = (ngram_size − 1) × heads_per_ngram)",
                    self.ple_embed_dim, heads
                ));
            }
            if self.ple_conv_kernel == 0 || self.split_ngram_parts == 0 || self.ngram_vocab_divisible_by == 0 {
                return bad(
                    "ple_conv_kernel_size, split_ngram_parts and make_ngram_vocab_size_divisible_by must be positive",
                );
            }
            for &id in ple_ids {
                if id == 0 || id > self.num_layers {
                    return bad(format!(
                        "ple_layer_ids must contain one-indexed ids in [1, {}], found {id}",
                        self.num_layers
                    ));
                }
                if self.layer_kinds[id - 1] != LayerKind::Gdn {
                    return bad(format!("PLE is only supported on linear_attention layers; layer id {id} is not one"));
                }
            }
            if self.eos_token_id.is_none() {
                return bad("PLE needs `eos_token_id` (the n-gram padding and reset token)");
            }
        }
        if let Some(eos) = self.eos_token_id
            && eos as usize >= self.vocab_size
        {
            return bad(format!("eos_token_id {eos} is not below vocab_size {}", self.vocab_size));
        }
        Ok(())
    }

    /// Sizes the engine can address (not a rule of the reference, which would run out of memory
    /// instead): every size below 2³¹ (the kernels index in 32 bits) and the model's weights
    /// below [`MAX_PARAMETERS`], so that no product of sizes the loaders and the plan form
    /// overflows. A fuzzed or mistyped config is refused here, by name, instead of panicking on
    /// an overflow later.
    fn check_sizes(&self) -> Result<(), ConfigError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("indexer_n_heads", self.indexer_heads),
            ("indexer_head_dim", self.indexer_head_dim),
            ("indexer_budget", self.indexer_budget),
            ("indexer_compress_ratio", self.indexer_block),
            ("linear_num_key_heads", self.linear_key_heads),
            ("linear_num_value_heads", self.linear_value_heads),
            ("linear_key_head_dim", self.linear_key_dim),
            ("linear_value_head_dim", self.linear_value_dim),
            ("linear_conv_kernel_dim", self.linear_conv_kernel),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.experts_per_token),
            ("moe_intermediate_size", self.expert_intermediate),
            ("shared_expert_intermediate_size", self.shared_intermediate),
            ("hc_count", self.hc_streams),
            ("hc_lowrank", self.hc_rank),
            ("ple_embed_dim", self.ple_embed_dim),
            ("ple_conv_kernel_size", self.ple_conv_kernel),
            ("ngram_size", self.ngram_size),
            ("heads_per_ngram", self.heads_per_ngram),
            ("split_ngram_parts", self.split_ngram_parts),
        ];
        if let Some((name, v)) = sizes.iter().find(|(_, v)| *v > MAX_SIZE) {
            return bad(format!("`{name}` is {v}: sizes above {MAX_SIZE} are not supported"));
        }
        for (name, v) in [
            ("ngram_vocab_size_base", self.ngram_vocab_size_base),
            ("make_ngram_vocab_size_divisible_by", self.ngram_vocab_divisible_by),
        ] {
            if v > MAX_SIZE as u64 {
                return bad(format!("`{name}` is {v}: sizes above {MAX_SIZE} are not supported"));
            }
        }
        if self.vocab_size == 0 {
            return bad("vocab_size must be positive");
        }
        let params = self.parameters_estimate();
        if params > MAX_PARAMETERS as f64 {
            return bad(format!(
                "the sizes describe a model of {params:.3e} parameters, more than the {MAX_PARAMETERS:.1e} this engine can address"
            ));
        }
        Ok(())
    }

    /// The weights' parameter count, roughly (every projection, the experts, the embedding and the
    /// lm_head; norms and the n-gram table left out), in f64 so that absurd sizes cannot overflow.
    pub fn parameters_estimate(&self) -> f64 {
        let f = |v: usize| v as f64;
        let (d, n, layers) = (f(self.hidden_size), f(self.hc_streams), f(self.num_layers));
        let mix = 2.0 * n * d * f(self.hc_rank) + n * n * d;
        let experts = (f(self.num_experts) * f(self.expert_intermediate) + f(self.shared_intermediate)) * 3.0 * d
            + f(self.num_experts) * d;
        let value = f(self.linear_value_heads) * f(self.linear_value_dim);
        let gdn = (2.0 * f(self.linear_key_heads) * f(self.linear_key_dim) + 3.0 * value) * d
            + 2.0 * f(self.linear_value_heads) * d;
        let qsa = (3.0 * f(self.num_heads) + 2.0 * f(self.num_kv_heads)) * f(self.head_dim) * d
            + (f(self.indexer_heads) + 1.0) * f(self.indexer_head_dim) * d;
        let ple = f(self.ple_layers.len()) * (n * d + d) * f(self.ple_embed_dim);
        2.0 * f(self.vocab_size) * d + layers * (2.0 * mix + experts + gdn.max(qsa)) + ple
    }

    /// `(ngram_size − 1) · heads_per_ngram`: the hashed heads of each PLE layer.
    pub fn ngram_heads(&self) -> usize {
        self.ngram_size.saturating_sub(1) * self.heads_per_ngram
    }

    /// Width of the Gated Residual state: streams × hidden size.
    pub fn residual_width(&self) -> usize {
        self.hc_streams * self.hidden_size
    }

    /// Channels of the GDN causal conv: q, k and v.
    pub fn gdn_conv_dim(&self) -> usize {
        2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim
    }

    pub fn is_ple_layer(&self, layer: usize) -> bool {
        self.ple_layers.contains(&layer)
    }

    /// Blocks the indexer keeps once the context outgrows the budget.
    pub fn indexer_top_blocks(&self) -> usize {
        self.indexer_budget / self.indexer_block.max(1)
    }
}

fn token_id(v: &Value) -> Result<u32, ConfigError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| ConfigError(format!("`eos_token_id` holds {v}, not a token id")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen4_exp_text",
            "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 24,
            "hc_count": 4, "hc_lowrank": 16, "eos_token_id": 7, "ple_layer_ids": [2],
            "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8, "indexer_compress_ratio": 4,
            "output_gate_type": "sigmoid"
        })
    }

    fn parse(v: &serde_json::Value) -> Result<ModelConfig, ConfigError> {
        ModelConfig::from_json(&v.to_string())
    }

    #[test]
    fn reads_the_text_config_and_derives_fields() {
        let c = parse(&tiny()).expect("valid");
        assert_eq!(c.layer_kinds, [LayerKind::Gdn, LayerKind::Gdn, LayerKind::Gdn, LayerKind::Qsa]);
        assert_eq!(c.rotary_dim, 8);
        assert_eq!(c.ple_layers, [1]);
        assert_eq!(c.ngram_heads(), 16);
        assert_eq!(c.indexer_top_blocks(), 2);
        assert!(c.gdn_gate_sigmoid);
        assert_eq!(c.eos_token_id, Some(7));
        // The nested form gives the same config.
        let nested = serde_json::json!({"model_type": "qwen4_exp", "text_config": tiny(), "vision_config": {}});
        assert_eq!(parse(&nested).expect("valid"), c);
    }

    #[test]
    fn the_published_geometry() {
        let c = ModelConfig::published();
        assert_eq!(c.layer_kinds.iter().filter(|&&k| k == LayerKind::Qsa).count(), 12);
        assert_eq!(c.layer_kinds[3], LayerKind::Qsa);
        assert_eq!((c.hidden_size, c.num_layers, c.vocab_size), (2560, 48, 248_320));
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim), (24, 2, 256, 64));
        assert_eq!((c.indexer_heads, c.indexer_head_dim, c.indexer_top_blocks()), (4, 128, 512));
        assert_eq!(
            (c.linear_key_heads, c.linear_value_heads, c.linear_key_dim, c.linear_value_dim),
            (16, 48, 128, 128)
        );
        assert_eq!(
            (c.num_experts, c.experts_per_token, c.expert_intermediate, c.shared_intermediate),
            (512, 10, 640, 640)
        );
        assert_eq!((c.hc_streams, c.hc_rank, c.ple_layers.clone()), (4, 320, vec![1]));
        assert_eq!((c.ngram_heads(), c.ple_embed_dim / c.ngram_heads()), (16, 160));
        assert!(c.gdn_gate_sigmoid && c.norm_topk_prob);
    }

    #[test]
    fn defaults_follow_the_reference() {
        let mut v = tiny();
        let o = v.as_object_mut().expect("object");
        o.remove("output_gate_type");
        o.remove("rope_parameters");
        // Full rotary (32 dims) must fit the index head.
        o.insert("indexer_head_dim".into(), serde_json::json!(32));
        let c = parse(&v).expect("valid");
        assert!(!c.gdn_gate_sigmoid, "without output_gate_type the gate is hidden_act, SiLU");
        assert_eq!(c.rope_theta, 10_000.0);
        assert_eq!(c.rotary_dim, 32, "no partial_rotary_factor means full rotary");
    }

    #[test]
    fn layer_types_accept_full_attention() {
        let mut v = tiny();
        v["layer_types"] =
            serde_json::json!(["linear_attention", "linear_attention", "full_attention", "qwen_sparse_attention"]);
        let c = parse(&v).expect("valid");
        assert_eq!(c.layer_kinds[2], LayerKind::Qsa);
    }

    #[test]
    fn each_violation_is_named() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            ("hc_count", serde_json::json!(1), "hc_count > 1"),
            ("num_experts_per_tok", serde_json::json!(9), "num_experts_per_tok must be in [1, num_experts]"),
            ("indexer_kv_heads", serde_json::json!(2), "indexer_kv_heads must be 1"),
            ("indexer_budget", serde_json::json!(10), "multiple of indexer_compress_ratio"),
            ("indexer_head_dim", serde_json::json!(4), "must fit the QSA index head"),
            ("ple_layer_ids", serde_json::json!([4]), "only supported on linear_attention"),
            ("ple_layer_ids", serde_json::json!([0]), "one-indexed ids"),
            ("output_gate_type", serde_json::json!("relu"), "output gate activation"),
            (
                "layer_types",
                serde_json::json!(["linear_attention", "hybrid_indexed", "linear_attention", "full_attention"]),
                "Unsupported Qwen4-Exp layer type",
            ),
            ("hidden_size", serde_json::json!("64"), "`hidden_size` must be a non-negative integer"),
            ("eos_token_id", serde_json::json!(1000), "not below vocab_size"),
            // Sizes the engine can address (found by fuzzing: their products overflowed).
            ("hidden_size", serde_json::json!(1u64 << 32), "`hidden_size` is 4294967296: sizes above 2147483647"),
            ("num_experts", serde_json::json!(2_000_000_000), "parameters, more than the"),
            ("num_hidden_layers", serde_json::json!(100_000), "num_hidden_layers 100000 is above the 65536"),
            ("vocab_size", serde_json::json!(0), "vocab_size must be positive"),
        ];
        for (key, value, want) in cases {
            let mut v = tiny();
            v[key] = value;
            let err = parse(&v).expect_err(key).to_string();
            assert!(err.contains(want), "{key}: {err}");
        }
        let mut v = tiny();
        v.as_object_mut().expect("object").remove("indexer_budget");
        assert!(parse(&v).expect_err("missing").to_string().contains("missing required fields: `indexer_budget`"));
        let mut v = tiny();
        v.as_object_mut().expect("object").remove("eos_token_id");
        assert!(parse(&v).expect_err("no eos").to_string().contains("PLE needs `eos_token_id`"));
        assert!(ModelConfig::from_json("{ not json").expect_err("syntax").to_string().contains("not valid JSON"));
        assert!(ModelConfig::from_json(r#"{"model_type": "llama"}"#).expect_err("type").to_string().contains("llama"));
    }
}
