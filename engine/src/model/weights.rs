//! Every tensor of the model, named, shape-checked and read into f32 for the CPU reference.
//!
//! A linear weight is bf16, f16 or f32, or NVFP4 in the ModelOpt layout (dequantised here).
//!
//! An NVFP4 weight is also kept as stored ([`ModelWeights::nvfp4`], by the linear's checkpoint
//! name): its codes, block scales and global scale, so that the device can run the checkpoint's
//! own values rather than a re-quantisation of the dequantised ones (which need not give back the
//! same global scale, block scales or codes). Both forms are kept, not one made lazily from the
//! other: the CPU reference, every bf16 upload and the blocks with no NVFP4 kernel read the f32
//! values, and the stored form costs 0.5625 bytes a value beside the f32's 4 (a seventh more for
//! those matrices, not twice). Dequantising lazily instead would save the f32 copy of the NVFP4
//! matrices only by making [`Linear`] an enum that every reader and every test builds or matches,
//! and the CPU reference would decode the codes at every product.
//! Experts are read per expert (`experts.{e}.gate_proj.weight`, as checkpoints store them) or fused
//! (`experts.gate_up_proj` [E, 2I, d], `experts.down_proj` [E, d, I], as transformers holds them).
//! The n-gram table is read whole or from its shards; the hash buffers a checkpoint ships are
//! checked against the ones derived from the config.

use std::cell::RefCell;
use std::collections::BTreeMap;

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
    /// Its NVFP4 form, with its values replaced by that form's dequantisation: what a device
    /// computes with the NVFP4 matrix, for a reference to compare with.
    pub fn quantise_in_place(&mut self) -> Nvfp4Matrix {
        let m = Nvfp4Matrix::quantise(&self.w, self.rows, self.cols);
        self.w = m.dequantise();
        m
    }

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
    /// Every linear the checkpoint stores in NVFP4, as stored, by its name without `.weight`
    /// (`model.layers.0.mlp.experts.3.gate_proj`, `lm_head`); its dequantised values are the
    /// [`Linear`]'s `w`. Empty for a bf16 checkpoint.
    pub nvfp4: BTreeMap<String, Nvfp4Matrix>,
}

/// The checkpoint names (without `.weight`) of the linears the step has NVFP4 kernels for, as the
/// loader reads them: the upload finds their stored NVFP4 form by these.
pub mod names {
    /// Layer `l`'s prefix.
    pub fn layer(l: usize) -> String {
        format!("model.layers.{l}")
    }

    /// Layer `l`'s Gated Residual site before the token mixer (`attn`) or before the MoE.
    pub fn mix_site(l: usize, attn: bool) -> String {
        let site = if attn { "attn_hyper_connection" } else { "mlp_hyper_connection" };
        format!("{}.{site}", layer(l))
    }

    /// The final mixer's site.
    pub const FINAL_MIX: &str = "model.hyper_connection_mixer";

    /// A mix site's three projections: down, up and inject.
    pub fn mix_projections(site: &str) -> [String; 3] {
        [
            format!("{site}.input_mix_weight_down"),
            format!("{site}.input_mix_weight_up"),
            format!("{site}.block_inject_weight"),
        ]
    }

    /// Layer `l`'s GDN input projections: qkv, z, b, a.
    pub fn gdn_in_proj(l: usize) -> [String; 4] {
        ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"].map(|p| format!("{}.linear_attn.{p}", layer(l)))
    }

    /// Layer `l`'s GDN output projection.
    pub fn gdn_out_proj(l: usize) -> String {
        format!("{}.linear_attn.out_proj", layer(l))
    }

    /// Layer `l`'s QSA projections: q (with its gate rows), k, v, the indexer's stacked q/k, o.
    pub fn qsa_projections(l: usize) -> [String; 5] {
        ["q_proj", "k_proj", "v_proj", "indexer.index_qk_proj", "o_proj"].map(|p| format!("{}.self_attn.{p}", layer(l)))
    }

    /// Layer `l`'s PLE projections: key, value.
    pub fn ple_projections(l: usize) -> [String; 2] {
        ["key_proj", "value_proj"].map(|p| format!("{}.ple.{p}", layer(l)))
    }

    /// Layer `l`'s MoE block.
    pub fn moe(l: usize) -> String {
        format!("{}.mlp", layer(l))
    }

    /// Layer `l`'s routed expert `e`, or its shared expert for `None`.
    pub fn expert(l: usize, e: Option<usize>) -> String {
        match e {
            Some(e) => format!("{}.experts.{e}", moe(l)),
            None => format!("{}.shared_expert", moe(l)),
        }
    }

    /// An expert's three projections: gate, up and down.
    pub fn expert_projections(expert: &str) -> [String; 3] {
        ["gate_proj", "up_proj", "down_proj"].map(|p| format!("{expert}.{p}"))
    }

    pub const LM_HEAD: &str = "lm_head";
}

/// Reads tensors by name with their expected shapes.
struct Reader<'a> {
    ck: &'a Checkpoint,
    bias: bool,
    /// The NVFP4 linears read so far, as stored.
    nvfp4: RefCell<BTreeMap<String, Nvfp4Matrix>>,
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
            let m = nvfp4(self.ck, &t, rows, cols)?;
            let w = m.dequantise();
            self.nvfp4.borrow_mut().insert(prefix.to_owned(), m);
            w
        } else {
            t.expect_shape(&[rows, cols])?;
            t.to_f32()?
        };
        let bias = if may_have_bias && self.bias { Some(self.vector(&format!("{prefix}.bias"), rows)?) } else { None };
        Ok(Linear { rows, cols, w, bias })
    }

    fn mix(&self, prefix: &str, cfg: &ModelConfig, inject: bool) -> Result<MixWeights, CheckpointError> {
        let (n, r) = (cfg.residual_width(), cfg.hc_rank);
        let [down, up, inject_name] = names::mix_projections(prefix);
        Ok(MixWeights {
            norm: self.vector(&format!("{prefix}.hc_norm.weight"), n)?,
            down: self.linear(&down, r, n, false)?,
            up: self.linear(&up, n, r, false)?,
            inject: if inject { Some(self.linear(&inject_name, cfg.hc_streams, n, false)?) } else { None },
        })
    }

    fn gdn(&self, l: usize, cfg: &ModelConfig) -> Result<GdnWeights, CheckpointError> {
        let p = format!("{}.linear_attn", names::layer(l));
        let d = cfg.hidden_size;
        let (hv, dv) = (cfg.linear_value_heads, cfg.linear_value_dim);
        let conv_dim = cfg.gdn_conv_dim();
        let [qkv, z, b, a] = names::gdn_in_proj(l);
        Ok(GdnWeights {
            in_qkv: self.linear(&qkv, conv_dim, d, false)?,
            in_z: self.linear(&z, hv * dv, d, false)?,
            in_b: self.linear(&b, hv, d, false)?,
            in_a: self.linear(&a, hv, d, false)?,
            conv: self.tensor(&format!("{p}.conv1d.weight"), &[conv_dim, 1, cfg.linear_conv_kernel])?,
            dt_bias: self.vector(&format!("{p}.dt_bias"), hv)?,
            a_log: self.vector(&format!("{p}.A_log"), hv)?,
            norm: self.vector(&format!("{p}.norm.weight"), dv)?,
            out: self.linear(&names::gdn_out_proj(l), d, hv * dv, false)?,
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
        let [gate, up, down] = names::expert_projections(p);
        Ok(ExpertWeights {
            gate: self.linear(&gate, inter, d, false)?,
            up: self.linear(&up, inter, d, false)?,
            down: self.linear(&down, d, inter, false)?,
        })
    }

    fn moe(&self, l: usize, cfg: &ModelConfig) -> Result<MoeWeights, CheckpointError> {
        let p = names::moe(l);
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
            (0..e).map(|x| self.expert(&names::expert(l, Some(x)), inter, d)).collect::<Result<Vec<_>, _>>()?
        };
        Ok(MoeWeights {
            router: self.linear(&format!("{p}.gate"), e, d, false)?,
            experts,
            shared: self.expert(&names::expert(l, None), cfg.shared_intermediate, d)?,
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

/// Reads `{name}` (u8 [rows, cols/2]) with `{name}_scale` (e4m3 [rows, cols/16]) and
/// `{name}_scale_2` (f32, one value), as stored.
fn nvfp4(ck: &Checkpoint, t: &TensorRef<'_>, rows: usize, cols: usize) -> Result<Nvfp4Matrix, CheckpointError> {
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
    Ok(Nvfp4Matrix { rows, cols, packed: t.bytes.to_vec(), scales: scale.bytes.to_vec(), scale_2: s2[0] })
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
        let r = Reader { ck, bias: cfg.attention_bias, nvfp4: RefCell::default() };
        let d = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        let mut ple_index = 0;
        for (l, kind) in cfg.layer_kinds.iter().enumerate() {
            let p = names::layer(l);
            let ple = if cfg.is_ple_layer(l) {
                let w = r.ple(&format!("{p}.ple"), cfg, ple_index)?;
                ple_index += 1;
                Some(w)
            } else {
                None
            };
            let mixer = match kind {
                LayerKind::Gdn => MixerWeights::Gdn(r.gdn(l, cfg)?),
                LayerKind::Qsa => MixerWeights::Qsa(r.qsa(&format!("{p}.self_attn"), cfg)?),
            };
            layers.push(LayerWeights {
                ple,
                attn_mix: r.mix(&names::mix_site(l, true), cfg, true)?,
                mixer,
                mlp_mix: r.mix(&names::mix_site(l, false), cfg, true)?,
                moe: r.moe(l, cfg)?,
            });
            layer_done(l + 1, cfg.num_layers);
        }
        let embed = r.tensor("model.embed_tokens.weight", &[cfg.vocab_size, d])?;
        let final_mix = r.mix(names::FINAL_MIX, cfg, false)?;
        let lm_head = r.linear(names::LM_HEAD, cfg.vocab_size, d, false)?;
        Ok(ModelWeights { config: cfg.clone(), embed, layers, final_mix, lm_head, nvfp4: r.nvfp4.into_inner() })
    }

    /// Reads `config.json` and the checkpoint in `dir`.
    pub fn load_dir(dir: &std::path::Path) -> Result<ModelWeights, Box<dyn std::error::Error + Send + Sync>> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Checkpoint::open(dir)?;
        Ok(ModelWeights::load(&cfg, &ck)?)
    }
}
