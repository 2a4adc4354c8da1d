//! Every tensor of the model, named, shape-checked and read into f32 for the CPU reference.
//!
//! A linear weight is bf16, f16 or f32, or NVFP4 in the ModelOpt layout (dequantised here).
//! Experts are read per expert (`experts.{e}.gate_proj.weight`, as checkpoints store them) or fused
//! (`experts.gate_up_proj` [E, 2I, d], `experts.down_proj` [E, d, I], as transformers holds them).
//! The n-gram table is read whole or from its shards; the hash buffers a checkpoint ships are
//! checked against the ones derived from the config.

use safetensors::Dtype;

use super::checkpoint::{Checkpoint, CheckpointError, TensorRef};
use super::config::{LayerKind, ModelConfig};
use super::ngram_hash::NgramHash;
use super::nvfp4::Nvfp4Matrix;

/// A dense [rows, cols] weight, row-major, with an optional bias.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// y = W·x (+ b).
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let mut y = crate::reference::gemv::gemv(&self.w, x, self.rows, self.cols);
        if let Some(b) = &self.bias {
            y.iter_mut().zip(b).for_each(|(y, b)| *y += b);
        }
        y
    }
}

/// One Gated Residual site: the norm, the low-rank mix and (except in the final mixer) the inject.
#[derive(Clone, Debug, PartialEq)]
pub struct MixWeights {
    pub norm: Vec<f32>,
    pub down: Linear,
    pub up: Linear,
    pub inject: Option<Linear>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GdnWeights {
    pub in_qkv: Linear,
    pub in_z: Linear,
    pub in_b: Linear,
    pub in_a: Linear,
    /// [conv_dim, kernel]: tap kernel−1 multiplies the current input.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub a_log: Vec<f32>,
    /// The gated norm's plain weight [dv].
    pub norm: Vec<f32>,
    pub out: Linear,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QsaWeights {
    /// [Hq·2D, d]: per head, D query rows then D gate rows.
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// [(H_I + 1)·d_I, d]: the index query heads, then the one index key.
    pub index_qk: Linear,
    pub index_q_norm: Vec<f32>,
    pub index_k_norm: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ExpertWeights {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeWeights {
    pub router: Linear,
    pub experts: Vec<ExpertWeights>,
    pub shared: ExpertWeights,
    pub shared_gate: Linear,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PleWeights {
    pub hash: NgramHash,
    /// [rows_padded, width]: the n-gram table.
    pub table: Vec<f32>,
    pub width: usize,
    pub key: Linear,
    pub value: Linear,
    pub norm_key: Vec<f32>,
    pub norm_query: Vec<f32>,
    pub norm_conv: Vec<f32>,
    /// [N, kernel]: depthwise, dilated by ngram_size.
    pub conv: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MixerWeights {
    Gdn(GdnWeights),
    Qsa(QsaWeights),
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    pub ple: Option<PleWeights>,
    pub attn_mix: MixWeights,
    pub mixer: MixerWeights,
    pub mlp_mix: MixWeights,
    pub moe: MoeWeights,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// [V, d].
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_mix: MixWeights,
    pub lm_head: Linear,
}

/// Reads tensors by name with their expected shapes.
struct Reader<'a> {
    ck: &'a Checkpoint,
    bias: bool,
}

impl Reader<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let t = self.ck.require(name)?;
        t.expect_shape(shape)?;
        t.to_f32()
    }

    /// A vector, stored as [n] (or, for convs, [n, 1, k]).
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, CheckpointError> {
        self.tensor(name, &[n])
    }

    /// `{prefix}.weight` [rows, cols] in any supported encoding, and `{prefix}.bias` if the model
    /// has biases on this projection.
    fn linear(&self, prefix: &str, rows: usize, cols: usize, may_have_bias: bool) -> Result<Linear, CheckpointError> {
        let name = format!("{prefix}.weight");
        let t = self.ck.require(&name)?;
        let w = if self.ck.contains(&format!("{name}_scale")) {
            nvfp4(self.ck, &t, rows, cols)?
        } else {
            t.expect_shape(&[rows, cols])?;
            t.to_f32()?
        };
        let bias = if may_have_bias && self.bias { Some(self.vector(&format!("{prefix}.bias"), rows)?) } else { None };
        Ok(Linear { rows, cols, w, bias })
    }

    fn mix(&self, prefix: &str, cfg: &ModelConfig, inject: bool) -> Result<MixWeights, CheckpointError> {
        let (n, r) = (cfg.residual_width(), cfg.hc_rank);
        Ok(MixWeights {
            norm: self.vector(&format!("{prefix}.hc_norm.weight"), n)?,
            down: self.linear(&format!("{prefix}.input_mix_weight_down"), r, n, false)?,
            up: self.linear(&format!("{prefix}.input_mix_weight_up"), n, r, false)?,
            inject: if inject {
                Some(self.linear(&format!("{prefix}.block_inject_weight"), cfg.hc_streams, n, false)?)
            } else {
                None
            },
        })
    }

    fn gdn(&self, p: &str, cfg: &ModelConfig) -> Result<GdnWeights, CheckpointError> {
        let d = cfg.hidden_size;
        let (hv, dv) = (cfg.linear_value_heads, cfg.linear_value_dim);
        let conv_dim = cfg.gdn_conv_dim();
        Ok(GdnWeights {
            in_qkv: self.linear(&format!("{p}.in_proj_qkv"), conv_dim, d, false)?,
            in_z: self.linear(&format!("{p}.in_proj_z"), hv * dv, d, false)?,
            in_b: self.linear(&format!("{p}.in_proj_b"), hv, d, false)?,
            in_a: self.linear(&format!("{p}.in_proj_a"), hv, d, false)?,
            conv: self.tensor(&format!("{p}.conv1d.weight"), &[conv_dim, 1, cfg.linear_conv_kernel])?,
            dt_bias: self.vector(&format!("{p}.dt_bias"), hv)?,
            a_log: self.vector(&format!("{p}.A_log"), hv)?,
            norm: self.vector(&format!("{p}.norm.weight"), dv)?,
            out: self.linear(&format!("{p}.out_proj"), d, hv * dv, false)?,
        })
    }

    fn qsa(&self, p: &str, cfg: &ModelConfig) -> Result<QsaWeights, CheckpointError> {
        let d = cfg.hidden_size;
        let (hq, hkv, dh) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (hi, di) = (cfg.indexer_heads, cfg.indexer_head_dim);
        Ok(QsaWeights {
            q: self.linear(&format!("{p}.q_proj"), hq * 2 * dh, d, true)?,
            k: self.linear(&format!("{p}.k_proj"), hkv * dh, d, true)?,
            v: self.linear(&format!("{p}.v_proj"), hkv * dh, d, true)?,
            o: self.linear(&format!("{p}.o_proj"), d, hq * dh, true)?,
            q_norm: self.vector(&format!("{p}.q_norm.weight"), dh)?,
            k_norm: self.vector(&format!("{p}.k_norm.weight"), dh)?,
            index_qk: self.linear(&format!("{p}.indexer.index_qk_proj"), (hi + 1) * di, d, false)?,
            index_q_norm: self.vector(&format!("{p}.indexer.q_layernorm.weight"), di)?,
            index_k_norm: self.vector(&format!("{p}.indexer.k_layernorm.weight"), di)?,
        })
    }

    fn expert(&self, p: &str, inter: usize, d: usize) -> Result<ExpertWeights, CheckpointError> {
        Ok(ExpertWeights {
            gate: self.linear(&format!("{p}.gate_proj"), inter, d, false)?,
            up: self.linear(&format!("{p}.up_proj"), inter, d, false)?,
            down: self.linear(&format!("{p}.down_proj"), d, inter, false)?,
        })
    }

    fn moe(&self, p: &str, cfg: &ModelConfig) -> Result<MoeWeights, CheckpointError> {
        let (d, e, inter) = (cfg.hidden_size, cfg.num_experts, cfg.expert_intermediate);
        let fused = format!("{p}.experts.gate_up_proj");
        let experts = if self.ck.contains(&fused) {
            let gate_up = self.tensor(&fused, &[e, 2 * inter, d])?;
            let down = self.tensor(&format!("{p}.experts.down_proj"), &[e, d, inter])?;
            let plain = |w: &[f32], rows, cols| Linear { rows, cols, w: w.to_vec(), bias: None };
            (0..e)
                .map(|x| {
                    let gu = &gate_up[x * 2 * inter * d..(x + 1) * 2 * inter * d];
                    ExpertWeights {
                        gate: plain(&gu[..inter * d], inter, d),
                        up: plain(&gu[inter * d..], inter, d),
                        down: plain(&down[x * d * inter..(x + 1) * d * inter], d, inter),
                    }
                })
                .collect()
        } else {
            (0..e).map(|x| self.expert(&format!("{p}.experts.{x}"), inter, d)).collect::<Result<Vec<_>, _>>()?
        };
        Ok(MoeWeights {
            router: self.linear(&format!("{p}.gate"), e, d, false)?,
            experts,
            shared: self.expert(&format!("{p}.shared_expert"), cfg.shared_intermediate, d)?,
            shared_gate: self.linear(&format!("{p}.shared_expert_gate"), 1, d, false)?,
        })
    }

    fn ple(&self, p: &str, cfg: &ModelConfig, ple_index: usize) -> Result<PleWeights, CheckpointError> {
        let hash = NgramHash::new(cfg, ple_index);
        let heads = cfg.ngram_heads();
        let width = cfg.ple_embed_dim / heads;
        let rows = hash.rows_padded as usize;
        let whole = format!("{p}.ple_embedding.ngram_embedding.weight");
        let table =
            if self.ck.contains(&whole) {
                self.tensor(&whole, &[rows, width])?
            } else {
                let parts = cfg.split_ngram_parts;
                if !rows.is_multiple_of(parts) {
                    return Err(CheckpointError(format!("{rows} n-gram rows do not split into {parts} shards")));
                }
                let mut table = Vec::with_capacity(rows * width);
                for s in 0..parts {
                    table.extend(self.tensor(
                        &format!("{p}.ple_embedding.ngram_embedding.shard_{s}.weight"),
                        &[rows / parts, width],
                    )?);
                }
                table
            };
        // The hash buffers, where the checkpoint ships them, must be the ones the config derives.
        let buffers: [(&str, Vec<u64>); 3] = [
            ("layer_multipliers", hash.multipliers.clone()),
            ("ngram_heads_vocab_sizes", hash.primes.clone()),
            ("ngram_heads_offsets", hash.offsets.clone()),
        ];
        for (buf, derived) in buffers {
            let name = format!("{p}.ple_embedding.{buf}");
            if let Some(t) = self.ck.get(&name) {
                let stored: Vec<u64> = t.to_i64()?.into_iter().map(|v| v as u64).collect();
                if stored != derived {
                    return Err(CheckpointError(format!(
                        "tensor `{name}` holds {stored:?}, but the config derives {derived:?}: the n-gram hash settings \
                         (vocab_size, seed, ngram_vocab_size_base, ple_layer_ids) do not match this checkpoint"
                    )));
                }
            }
        }
        let (n, pd) = (cfg.residual_width(), cfg.ple_embed_dim);
        Ok(PleWeights {
            hash,
            table,
            width,
            key: self.linear(&format!("{p}.key_proj"), n, pd, false)?,
            value: self.linear(&format!("{p}.value_proj"), cfg.hidden_size, pd, false)?,
            norm_key: self.vector(&format!("{p}.norm_key.weight"), n)?,
            norm_query: self.vector(&format!("{p}.norm_query.weight"), n)?,
            norm_conv: self.vector(&format!("{p}.norm_conv.weight"), n)?,
            conv: self.tensor(&format!("{p}.conv1d.weight"), &[n, 1, cfg.ple_conv_kernel])?,
        })
    }
}

/// Dequantises `{name}` (u8 [rows, cols/2]) with `{name}_scale` (e4m3 [rows, cols/16]) and
/// `{name}_scale_2` (f32, one value).
fn nvfp4(ck: &Checkpoint, t: &TensorRef<'_>, rows: usize, cols: usize) -> Result<Vec<f32>, CheckpointError> {
    if !cols.is_multiple_of(16) {
        return Err(CheckpointError(format!(
            "tensor `{}` is NVFP4 but has {cols} columns, not a multiple of 16",
            t.name
        )));
    }
    if t.dtype != Dtype::U8 {
        return Err(CheckpointError(format!(
            "tensor `{}` has a block scale, so it is NVFP4, but its dtype is {:?}, not U8",
            t.name, t.dtype
        )));
    }
    t.expect_shape(&[rows, cols / 2])?;
    let scale = ck.require(&format!("{}_scale", t.name))?;
    if !matches!(scale.dtype, Dtype::F8_E4M3 | Dtype::U8) {
        return Err(CheckpointError(format!(
            "tensor `{}` has dtype {:?}; NVFP4 block scales are F8_E4M3",
            scale.name, scale.dtype
        )));
    }
    scale.expect_shape(&[rows, cols / 16])?;
    let scale_2 = ck.require(&format!("{}_scale_2", t.name))?;
    let s2 = scale_2.to_f32()?;
    if s2.len() != 1 {
        return Err(CheckpointError(format!(
            "tensor `{}` has shape {:?}; expected one value",
            scale_2.name, scale_2.shape
        )));
    }
    let m = Nvfp4Matrix { rows, cols, packed: t.bytes.to_vec(), scales: scale.bytes.to_vec(), scale_2: s2[0] };
    Ok(m.dequantise())
}

impl ModelWeights {
    /// Reads every tensor the model needs from `ck`, checking names, shapes and dtypes.
    pub fn load(cfg: &ModelConfig, ck: &Checkpoint) -> Result<ModelWeights, CheckpointError> {
        ModelWeights::load_with_progress(cfg, ck, |_, _| {})
    }

    /// [`ModelWeights::load`], calling `layer_done(l + 1, num_layers)` after each layer is read
    /// (a full checkpoint takes minutes to read into f32; the decode binary shows it).
    pub fn load_with_progress(
        cfg: &ModelConfig,
        ck: &Checkpoint,
        mut layer_done: impl FnMut(usize, usize),
    ) -> Result<ModelWeights, CheckpointError> {
        let r = Reader { ck, bias: cfg.attention_bias };
        let d = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut ple_index = 0;
        for (l, kind) in cfg.layer_kinds.iter().enumerate() {
            let p = format!("model.layers.{l}");
            let ple = if cfg.is_ple_layer(l) {
                let w = r.ple(&format!("{p}.ple"), cfg, ple_index)?;
                ple_index += 1;
                Some(w)
            } else {
                None
            };
            let mixer = match kind {
                LayerKind::Gdn => MixerWeights::Gdn(r.gdn(&format!("{p}.linear_attn"), cfg)?),
                LayerKind::Qsa => MixerWeights::Qsa(r.qsa(&format!("{p}.self_attn"), cfg)?),
            };
            layers.push(LayerWeights {
                ple,
                attn_mix: r.mix(&format!("{p}.attn_hyper_connection"), cfg, true)?,
                mixer,
                mlp_mix: r.mix(&format!("{p}.mlp_hyper_connection"), cfg, true)?,
                moe: r.moe(&format!("{p}.mlp"), cfg)?,
            });
            layer_done(l + 1, cfg.num_layers);
        }
        Ok(ModelWeights {
            config: cfg.clone(),
            embed: r.tensor("model.embed_tokens.weight", &[cfg.vocab_size, d])?,
            layers,
            final_mix: r.mix("model.hyper_connection_mixer", cfg, false)?,
            lm_head: r.linear("lm_head", cfg.vocab_size, d, false)?,
        })
    }

    /// Reads `config.json` and the checkpoint in `dir`.
    pub fn load_dir(dir: &std::path::Path) -> Result<ModelWeights, Box<dyn std::error::Error + Send + Sync>> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir)?;
        Ok(ModelWeights::load(&cfg, &ck)?)
    }
}
