//! The whole model's weights on the device, each block in the layout its kernels read, made from
//! the host weights of a checkpoint ([`ModelWeights`]) in the formats the plan asks for.
//!
//! An NVFP4 matrix goes up as the checkpoint stores it where it does ([`ModelWeights::nvfp4`]):
//! the engine's NVFP4 layout is ModelOpt's, matrix by matrix (codes [rows, cols/2] with the even
//! element in the low nibble, e4m3 block scales [rows, cols/16] over 16 consecutive values of a
//! row, one f32 global scale per matrix, which every NVFP4 kernel takes per matrix: an expert's
//! gate, up and down, each mix projection, each GDN input projection, the lm_head). The blocks
//! only stack whole matrices row after row, so the codes and scales are the stored bytes, unchanged.
//! A weight the checkpoint stores in bf16 (or an NVFP4 one whose shape is not the one the step
//! needs, said in a one-line notice) is quantised here, at load, from its values. Where bf16 is
//! asked for, the dequantised values are rounded to bf16 (NVFP4 stored or not).

use std::borrow::Cow;

use half::bf16;

use super::plan::StepPlan;
use crate::cuda::{DeviceBuffer, Gpu, MappedHostBuffer};
use crate::error::{Error, Result};
use crate::layers::gdn::GdnWeightsOnDevice;
use crate::layers::lm_head::LmHead;
use crate::layers::mix::{MixShape, MixWeightsOnDevice};
use crate::layers::moe::{ExpertNvfp4, MoeShape, MoeWeightsOnDevice, StackedNvfp4};
use crate::layers::ple::{PleTableOnHost, PleWeightsOnDevice, TableRows};
use crate::layers::qsa::QsaWeightsOnDevice;
use crate::model::config::ModelConfig;
use crate::model::ngram_hash::NgramHash;
use crate::model::nvfp4::Nvfp4Matrix;
use crate::model::ple_table::{RowFormat, TableHeader};
use crate::model::weights::{Linear, MixWeights, MixerWeights, ModelWeights, names};
use crate::synthetic;

/// One layer's token mixer.
#[derive(Debug)]
pub enum MixerOnDevice {
    Gdn(GdnWeightsOnDevice),
    Qsa(QsaWeightsOnDevice),
}

/// One decoder layer: (PLE), the attention mix site, the token mixer, the MoE mix site, the MoE.
#[derive(Debug)]
pub struct LayerOnDevice {
    pub ple: Option<PleWeightsOnDevice>,
    pub attn_mix: MixWeightsOnDevice,
    pub mixer: MixerOnDevice,
    pub mlp_mix: MixWeightsOnDevice,
    pub moe: MoeWeightsOnDevice,
}

/// Where the PLE layers' n-gram rows live: host memory the device reads over the bus, never
/// device memory (the published table is 51 B values).
#[derive(Debug)]
pub enum PleTable {
    /// Every PLE layer's bf16 rows, layer after layer, in pinned mapped host memory: the tables a
    /// checkpoint loaded whole ([`crate::model::weights::PleWeights::table`]) are put here.
    Mapped(MappedHostBuffer<bf16>),
    /// A table file's rows ([`crate::model::ple_table`]), pinned, registered or pageable.
    File(PleTableOnHost),
}

impl PleTable {
    /// The rows PLE layer `index` (its rank among the PLE layers) gathers from.
    pub fn rows(&self, index: usize) -> TableRows {
        match self {
            PleTable::Mapped(b) => TableRows::Bf16(b.ptr()),
            PleTable::File(t) => t.rows(index),
        }
    }
}

/// The n-gram hashing and the table of the PLE layers.
#[derive(Debug)]
pub struct PleOnDevice {
    /// One per PLE layer, in layer order.
    pub hashes: Vec<NgramHash>,
    pub table: PleTable,
    /// The seed the rows were made from, for a synthetic model's table
    /// ([`ModelOnDevice::synthetic`]); None for a checkpoint's.
    pub synthetic_seed: Option<u64>,
}

/// A synthetic model's PLE table taken from its model ([`ModelOnDevice::take_synthetic_ple_table`]),
/// for the next synthetic model of the same config, row format and seed
/// ([`ModelOnDevice::synthetic_with`]). Its rows depend on neither the tiles nor the device
/// weights, and at the published size they are 30.7 GB of pinned host memory, filled on the CPU:
/// most of the time a synthetic model takes to make. A bench that times the step at several tile
/// sets (each its own model, since the tiles choose the device weights' layouts) makes them once.
#[derive(Debug)]
pub struct SyntheticPleTable {
    seed: u64,
    rows: PleTableOnHost,
}

impl SyntheticPleTable {
    /// The row format it was made in.
    pub fn format(&self) -> RowFormat {
        self.rows.header().format
    }

    /// Ok when its rows are the ones [`ModelOnDevice::synthetic`] makes for `cfg` in `format`
    /// from `seed`: the same seed, and a header of the same format, row width, layers, rows and
    /// hashes as the config's.
    fn fits(&self, cfg: &ModelConfig, format: RowFormat, seed: u64) -> Result<()> {
        let want = TableHeader::for_config(cfg, format).map_err(|e| Error::Buffer(e.to_string()))?;
        let got = self.rows.header();
        let shape = |h: &TableHeader| (h.format, h.width, h.layers, h.rows, h.hash_fingerprint);
        if self.seed != seed || shape(got) != shape(&want) {
            return Err(Error::Buffer(format!(
                "the kept PLE table was made from seed {} as {:?} rows of {} values over {} layers ({} rows, hashes \
                 {:#x}); this model is seed {seed}, {:?} rows of {} values over {} layers ({} rows, hashes {:#x})",
                self.seed,
                got.format,
                got.width,
                got.layers,
                got.rows,
                got.hash_fingerprint,
                want.format,
                want.width,
                want.layers,
                want.rows,
                want.hash_fingerprint
            )));
        }
        Ok(())
    }
}

/// Every weight of the step on the device.
#[derive(Debug)]
pub struct ModelOnDevice {
    /// [vocab, hidden] bf16.
    pub embed: DeviceBuffer<bf16>,
    pub vocab: usize,
    pub layers: Vec<LayerOnDevice>,
    pub final_mix: MixWeightsOnDevice,
    pub lm_head: LmHead,
    pub ple: Option<PleOnDevice>,
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// The NVFP4 form of the linear `name` whose values are `l`: the checkpoint's own where it stores
/// one of `l`'s shape, else `l` quantised (its values first rounded to bf16 where `via_bf16`, as
/// the mix sites have always quantised them).
pub fn nvfp4_matrix<'a>(w: &'a ModelWeights, name: &str, l: &Linear, via_bf16: bool) -> Cow<'a, Nvfp4Matrix> {
    if let Some(m) = w.nvfp4.get(name) {
        if m.rows == l.rows && m.cols == l.cols {
            return Cow::Borrowed(m);
        }
        eprintln!(
            "NVFP4 `{name}` is stored [{}, {}] where the step needs [{}, {}]: quantised again from its values",
            m.rows, m.cols, l.rows, l.cols
        );
    }
    Cow::Owned(if via_bf16 {
        Nvfp4Matrix::quantise(&l.w.iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<_>>(), l.rows, l.cols)
    } else {
        Nvfp4Matrix::quantise(&l.w, l.rows, l.cols)
    })
}

/// A mix site's NVFP4 matrices as they go up: down, up, and inject where the site has one.
#[derive(Debug)]
pub struct MixNvfp4<'a> {
    pub down: Cow<'a, Nvfp4Matrix>,
    pub up: Cow<'a, Nvfp4Matrix>,
    pub inject: Option<Cow<'a, Nvfp4Matrix>>,
}

/// The NVFP4 matrices of the mix site `site` ([`names::mix_site`], [`names::FINAL_MIX`]).
pub fn mix_nvfp4<'a>(w: &'a ModelWeights, site: &str, m: &MixWeights) -> MixNvfp4<'a> {
    let [down, up, inject] = names::mix_projections(site);
    MixNvfp4 {
        down: nvfp4_matrix(w, &down, &m.down, true),
        up: nvfp4_matrix(w, &up, &m.up, true),
        inject: m.inject.as_ref().map(|l| nvfp4_matrix(w, &inject, l, true)),
    }
}

/// Layer `l`'s experts in NVFP4, stacked as the MoE kernels read them.
pub fn moe_nvfp4(w: &ModelWeights, l: usize) -> StackedNvfp4 {
    let moe = &w.layers[l].moe;
    let expert = |x: &crate::model::weights::ExpertWeights, e: Option<usize>| {
        let [gate, up, down] = names::expert_projections(&names::expert(l, e));
        ExpertNvfp4 {
            gate: nvfp4_matrix(w, &gate, &x.gate, false).into_owned(),
            up: nvfp4_matrix(w, &up, &x.up, false).into_owned(),
            down: nvfp4_matrix(w, &down, &x.down, false).into_owned(),
        }
    };
    let experts: Vec<ExpertNvfp4> = moe.experts.iter().enumerate().map(|(e, x)| expert(x, Some(e))).collect();
    StackedNvfp4::stack(&experts, &expert(&moe.shared, None))
}

/// Layer `l`'s GDN input projections (qkv, z, b, a) in NVFP4; None if it is not a GDN layer.
pub fn gdn_in_proj_nvfp4(w: &ModelWeights, l: usize) -> Option<[Cow<'_, Nvfp4Matrix>; 4]> {
    let MixerWeights::Gdn(g) = &w.layers[l].mixer else { return None };
    let [qkv, z, b, a] = names::gdn_in_proj(l);
    Some([
        nvfp4_matrix(w, &qkv, &g.in_qkv, false),
        nvfp4_matrix(w, &z, &g.in_z, false),
        nvfp4_matrix(w, &b, &g.in_b, false),
        nvfp4_matrix(w, &a, &g.in_a, false),
    ])
}

/// The lm_head in NVFP4.
pub fn lm_head_nvfp4(w: &ModelWeights) -> Cow<'_, Nvfp4Matrix> {
    nvfp4_matrix(w, names::LM_HEAD, &w.lm_head, false)
}

fn check_mix(w: &MixWeights, shape: MixShape) -> Result<()> {
    if w.norm.len() != shape.width() || w.down.rows != shape.rank || w.inject.is_some() != shape.inject {
        return Err(Error::Buffer(format!(
            "a Gated Residual site with a norm of {} and rank {} where the config says {} and {}",
            w.norm.len(),
            w.down.rows,
            shape.width(),
            shape.rank
        )));
    }
    Ok(())
}

/// The mix site `site` ([`names::mix_site`], [`names::FINAL_MIX`]) of `w`, whose weights are
/// `m`, on the device, its projections in NVFP4 where `nvfp4`.
fn mix_on_device(
    gpu: &Gpu,
    w: &ModelWeights,
    m: &MixWeights,
    site: &str,
    shape: MixShape,
    nvfp4: bool,
) -> Result<MixWeightsOnDevice> {
    check_mix(m, shape)?;
    if !nvfp4 {
        return MixWeightsOnDevice::upload(gpu, m, shape.streams);
    }
    let q = mix_nvfp4(w, site, m);
    MixWeightsOnDevice::upload_nvfp4(gpu, shape, &to_bf16(&m.norm), &q.down, &q.up, q.inject.as_deref())
}

fn moe_on_device(
    gpu: &Gpu,
    weights: &ModelWeights,
    l: usize,
    shape: MoeShape,
    nvfp4: bool,
) -> Result<MoeWeightsOnDevice> {
    let w = &weights.layers[l].moe;
    let e = shape.experts;
    let experts_fit = w.experts.len() == e
        && w.experts.iter().all(|x| x.gate.rows == shape.inter && x.down.cols == shape.inter)
        && w.shared.gate.rows == shape.shared_inter;
    if !experts_fit {
        return Err(Error::Buffer(format!(
            "MoE with {} experts where the config says {e} of {} rows and a shared expert of {}",
            w.experts.len(),
            shape.inter,
            shape.shared_inter
        )));
    }
    let router = to_bf16(&w.router.w);
    let shared_gate = to_bf16(&w.shared_gate.w);
    if nvfp4 {
        MoeWeightsOnDevice::upload_nvfp4(gpu, shape, &router, &shared_gate, &moe_nvfp4(weights, l))
    } else {
        let all = || w.experts.iter().chain(std::iter::once(&w.shared));
        let gate_up: Vec<bf16> = all().flat_map(|x| to_bf16(&x.gate.w).into_iter().chain(to_bf16(&x.up.w))).collect();
        let down: Vec<bf16> = all().flat_map(|x| to_bf16(&x.down.w)).collect();
        MoeWeightsOnDevice::upload_bf16(gpu, shape, &router, &shared_gate, &gate_up, &down)
    }
}

impl ModelOnDevice {
    /// Random weights of `cfg` made on the device from `seed` ([`crate::synthetic`]) in the
    /// plan's formats, the PLE table in pinned host memory in `table` format;
    /// `progress(what, done, total)` as each layer lands and while the table fills. Refuses, before
    /// allocating, a model that does not fit the device's memory (saying how much it needs).
    pub fn synthetic(
        gpu: &Gpu,
        cfg: &ModelConfig,
        plan: &StepPlan,
        seed: u64,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<ModelOnDevice> {
        ModelOnDevice::synthetic_with(gpu, cfg, plan, seed, None, progress)
    }

    /// [`ModelOnDevice::synthetic`], with the PLE table of an earlier synthetic model in place of
    /// a new one when `kept` is Some. It must have been made for this config, the plan's row
    /// format and `seed` (the rows it would make are then the ones it holds); else an error says
    /// which differs, and nothing is allocated.
    pub fn synthetic_with(
        gpu: &Gpu,
        cfg: &ModelConfig,
        plan: &StepPlan,
        seed: u64,
        kept: Option<SyntheticPleTable>,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<ModelOnDevice> {
        let f = plan.formats;
        let bytes = synthetic::synthetic_weight_bytes(cfg, &f)?;
        let (free, _) = gpu.memory()?;
        // Caches, states, scratch and the kernels' modules come on top of the weights.
        let margin = 2 << 30;
        if bytes.device() + margin > free {
            return Err(Error::Buffer(format!(
                "the synthetic model needs {:.1} GB of device memory for its weights (and ~2 GB more), {:.1} GB \
                 are free on {}",
                bytes.device() as f64 / 1e9,
                free as f64 / 1e9,
                gpu.info().name
            )));
        }
        if let Some((shape, tiles)) = &plan.ple {
            tiles.check(*shape, f.ple_table).map_err(|e| {
                Error::Buffer(format!("the GPU kernels cannot run this model's PLE table in {:?}: {e}", f.ple_table))
            })?;
        }
        if let Some(k) = &kept {
            k.fits(cfg, f.ple_table, seed)?;
        }
        let mut layers = synthetic::layers(gpu, cfg, &f, seed, progress)?;
        if let Some((_, tiles)) = &plan.gdn {
            synthetic::gdn_in_proj_to_layout(gpu, &mut layers, tiles.in_proj_layout(gpu.arch()))?;
        }
        let ple = if cfg.ple_layers.is_empty() {
            None
        } else {
            let table = match kept {
                Some(k) => {
                    progress("PLE table: kept from the last model", 1, 1);
                    k.rows
                }
                None => synthetic::ple_table(gpu, cfg, f.ple_table, synthetic::model_part_seed(seed, 3), progress)?,
            };
            let hashes = cfg.ple_layers.iter().enumerate().map(|(i, _)| NgramHash::new(cfg, i)).collect();
            Some(PleOnDevice { hashes, table: PleTable::File(table), synthetic_seed: Some(seed) })
        };
        let (vocab, d) = (cfg.vocab_size, cfg.hidden_size);
        Ok(ModelOnDevice {
            embed: synthetic::embed(gpu, vocab, d, synthetic::model_part_seed(seed, 1))?,
            vocab,
            layers,
            final_mix: synthetic::final_mix(gpu, cfg, &f, seed)?,
            lm_head: synthetic::lm_head(
                gpu,
                vocab,
                d,
                f.lm_head,
                synthetic::model_part_seed(seed, 2),
                plan.lm_head_tiles,
            )?,
            ple,
        })
    }

    /// The PLE table of a synthetic model, taken out for the next one
    /// ([`ModelOnDevice::synthetic_with`]); None, leaving the model as it was, for a checkpoint's
    /// table or a model without PLE layers. The model's PLE layers then have no rows to read: take
    /// it only from a model about to be freed ([`crate::step::Engine::into_gpu_and_ple_table`]).
    pub fn take_synthetic_ple_table(&mut self) -> Option<SyntheticPleTable> {
        match self.ple.take() {
            Some(PleOnDevice { table: PleTable::File(rows), synthetic_seed: Some(seed), .. }) => {
                Some(SyntheticPleTable { seed, rows })
            }
            other => {
                self.ple = other;
                None
            }
        }
    }

    /// Uploads `w` as `plan` says, calling `progress(done, total)` after each layer.
    pub fn upload(
        gpu: &Gpu,
        w: &ModelWeights,
        plan: &StepPlan,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<ModelOnDevice> {
        let cfg = &w.config;
        let (vocab, d) = (cfg.vocab_size, cfg.hidden_size);
        if w.embed.len() != vocab * d || w.lm_head.rows != vocab || w.lm_head.cols != d {
            return Err(Error::Buffer(format!(
                "embedding of {} values and lm_head [{}, {}] for a vocabulary of {vocab} × {d}",
                w.embed.len(),
                w.lm_head.rows,
                w.lm_head.cols
            )));
        }
        let f = plan.formats;
        let total = w.layers.len();
        let mut layers = Vec::with_capacity(total);
        for (l, lw) in w.layers.iter().enumerate() {
            let mixer = match (&lw.mixer, &plan.gdn, &plan.qsa) {
                (MixerWeights::Gdn(g), Some((shape, tiles)), _) => {
                    let in_proj = if f.gdn_in_proj { gdn_in_proj_nvfp4(w, l) } else { None };
                    let in_proj = in_proj.as_ref().map(|m| [&*m[0], &*m[1], &*m[2], &*m[3]]);
                    let out_proj = f.gdn_out_proj.then(|| nvfp4_matrix(w, &names::gdn_out_proj(l), &g.out, false));
                    let layout = tiles.in_proj_layout(gpu.arch());
                    MixerOnDevice::Gdn(GdnWeightsOnDevice::upload(
                        gpu,
                        *shape,
                        g,
                        in_proj,
                        out_proj.as_deref(),
                        layout,
                    )?)
                }
                (MixerWeights::Qsa(q), _, Some((shape, _))) => {
                    let [qn, kn, vn, ixn, on] = names::qsa_projections(l);
                    let m = f.qsa.then(|| {
                        let stacked = [
                            nvfp4_matrix(w, &qn, &q.q, false),
                            nvfp4_matrix(w, &kn, &q.k, false),
                            nvfp4_matrix(w, &vn, &q.v, false),
                            nvfp4_matrix(w, &ixn, &q.index_qk, false),
                        ];
                        (stacked, nvfp4_matrix(w, &on, &q.o, false))
                    });
                    let nvfp4 = m.as_ref().map(|(s, o)| ([&*s[0], &*s[1], &*s[2], &*s[3]], &**o));
                    MixerOnDevice::Qsa(QsaWeightsOnDevice::upload(gpu, *shape, q, nvfp4)?)
                }
                _ => {
                    return Err(Error::Buffer(format!(
                        "layer {l}: its weights are of a kind the config does not list"
                    )));
                }
            };
            let ple = match (&lw.ple, &plan.ple) {
                (Some(p), Some((shape, _))) => {
                    let [key, value] = names::ple_projections(l);
                    let m = f
                        .ple_proj
                        .then(|| [nvfp4_matrix(w, &key, &p.key, false), nvfp4_matrix(w, &value, &p.value, false)]);
                    let nvfp4 = m.as_ref().map(|[k, v]| [&**k, &**v]);
                    Some(PleWeightsOnDevice::upload(gpu, *shape, p, nvfp4)?)
                }
                (None, _) => None,
                (Some(_), None) => {
                    return Err(Error::Buffer(format!("layer {l} has PLE weights the config has no PLE for")));
                }
            };
            layers.push(LayerOnDevice {
                ple,
                attn_mix: mix_on_device(gpu, w, &lw.attn_mix, &names::mix_site(l, true), plan.mix, f.mix)?,
                mixer,
                mlp_mix: mix_on_device(gpu, w, &lw.mlp_mix, &names::mix_site(l, false), plan.mix, f.mix)?,
                moe: moe_on_device(gpu, w, l, plan.moe, f.experts)?,
            });
            progress(l + 1, total);
        }
        let ple_weights: Vec<_> = w.layers.iter().filter_map(|l| l.ple.as_ref()).collect();
        let ple = if ple_weights.is_empty() {
            None
        } else {
            // The tables layer after layer, as the ids address them (each layer's rows_padded).
            let len: usize = ple_weights.iter().map(|p| p.table.len()).sum();
            let mut table = MappedHostBuffer::<bf16>::new(gpu.context(), len)?;
            let mut at = 0;
            for p in &ple_weights {
                if p.table.len() != p.hash.rows_padded as usize * p.width {
                    return Err(Error::Buffer(format!(
                        "a PLE table of {} values for {} rows of {}",
                        p.table.len(),
                        p.hash.rows_padded,
                        p.width
                    )));
                }
                for (dst, &src) in table.as_mut_slice()[at..at + p.table.len()].iter_mut().zip(&p.table) {
                    *dst = bf16::from_f32(src);
                }
                at += p.table.len();
            }
            Some(PleOnDevice {
                hashes: ple_weights.iter().map(|p| p.hash.clone()).collect(),
                table: PleTable::Mapped(table),
                synthetic_seed: None,
            })
        };
        let lm_head = if f.lm_head {
            LmHead::nvfp4(gpu, &lm_head_nvfp4(w), plan.lm_head_tiles)?
        } else {
            LmHead::bf16(gpu, &to_bf16(&w.lm_head.w), vocab, d, plan.lm_head_tiles)?
        };
        Ok(ModelOnDevice {
            embed: gpu.upload(&to_bf16(&w.embed))?,
            vocab,
            layers,
            final_mix: mix_on_device(gpu, w, &w.final_mix, names::FINAL_MIX, plan.final_mix, f.mix)?,
            lm_head,
            ple,
        })
    }
}
