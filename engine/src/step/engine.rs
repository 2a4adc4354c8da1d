//! The decode step on the device: every launch of a token, bound once at load to buffers that
//! never move, enqueued eagerly or captured once into a CUDA graph that serves every token at
//! every position.
//!
//! Per token the host writes [position, token] into pinned memory and enqueues one copy of those
//! 8 bytes, the step (a graph replay, or the same launches eagerly), and one download of the
//! sampled token, which is the one wait. Everything a launch needs to know about the token is
//! read from device memory: the embedding and the n-gram hash read the token word, the QSA
//! layers the position word.
//!
//! The residual streams X live in two bf16 buffers. Each block's write X += ω·y is performed by
//! the launch after it: the next mix site reads X, applies the write and writes X back (its
//! `post`), or, before a PLE block, the PLE block applies it while it writes X + PLE(X) into the
//! other buffer. So the 97 writes cost no launch of their own.

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, TileSet};

use super::plan::StepPlan;
use super::weights::{MixerOnDevice, ModelOnDevice, SyntheticPleTable};
use crate::cuda::{DeviceBuffer, Gpu, Graph, LoadedKernel, MappedHostBuffer, SideStream};
use crate::error::{Error, Result};
use crate::kernels::embed::embed_streams;
use crate::kernels::ple::ids::ple_ids;
use crate::layers::gdn::{GdnKernels, GdnLaunches, GdnScratch, GdnStateOnDevice};
use crate::layers::lm_head::LmHead;
use crate::layers::mix::{MixIo, MixKernels, MixLaunches, MixScratch};
use crate::layers::moe::{MoeKernels, MoeLaunches, MoeScratch};
use crate::layers::ple::{
    Gather, PleHashOnDevice, PleKernels, PleLaunches, PleScratch, PleStateOnDevice, PleStreams, enqueue_rows_on_side,
};
use crate::layers::qsa::{QsaCaches, QsaContext, QsaKernels, QsaLaunches, QsaScratch, check_position};
use crate::layers::sample::{SampleParams, Sampler};

/// The named stages of a step, in the order they run: what `--profile` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Embed,
    Ple,
    AttnMix,
    Gdn,
    Qsa,
    MlpMix,
    Moe,
    FinalMix,
    LmHead,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::Embed,
        Stage::Ple,
        Stage::AttnMix,
        Stage::Gdn,
        Stage::Qsa,
        Stage::MlpMix,
        Stage::Moe,
        Stage::FinalMix,
        Stage::LmHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Embed => "embedding",
            Stage::Ple => "PLE",
            Stage::AttnMix => "attention mix site",
            Stage::Gdn => "Gated DeltaNet",
            Stage::Qsa => "QSA",
            Stage::MlpMix => "MoE mix site",
            Stage::Moe => "MoE",
            Stage::FinalMix => "final mix",
            Stage::LmHead => "lm_head + argmax",
        }
    }
}

/// One group of launches of the step, its arguments bound.
enum Launch {
    Embed(embed_streams::Args),
    /// The n-gram ids and every PLE layer's row gather, on the side stream.
    PleRows {
        ids: ple_ids::Args,
        gathers: Vec<Gather>,
    },
    /// A PLE layer's projections and gate/conv (joins the side stream first when `join`).
    PleBlock {
        launches: PleLaunches,
        join: bool,
    },
    Mix(Stage, MixLaunches),
    // Boxed: the two are the largest by far (hundreds of bytes of bound arguments each).
    Gdn(Box<GdnLaunches>),
    Qsa(Box<QsaLaunches>),
    Moe(MoeLaunches),
    LmHead,
}

impl Launch {
    fn stage(&self) -> Stage {
        match self {
            Launch::Embed(_) => Stage::Embed,
            Launch::PleRows { .. } | Launch::PleBlock { .. } => Stage::Ple,
            Launch::Mix(s, _) => *s,
            Launch::Gdn(_) => Stage::Gdn,
            Launch::Qsa(_) => Stage::Qsa,
            Launch::Moe(_) => Stage::Moe,
            Launch::LmHead => Stage::LmHead,
        }
    }
}

struct Kernels {
    embed: LoadedKernel<embed_streams::Kernel>,
    mix: MixKernels,
    gdn: Option<GdnKernels>,
    qsa: Option<QsaKernels>,
    moe: MoeKernels,
    ple: Option<PleKernels>,
}

/// What the step reads and writes besides weights: every buffer allocated here, at load.
struct Buffers {
    /// [position, token] in pinned host memory, written by the host per token.
    meta_host: MappedHostBuffer<u32>,
    /// Its device copy, which the launches read.
    meta: DeviceBuffer<u32>,
    /// The residual streams X [n·d], two buffers (a PLE block writes into the other).
    residual: [DeviceBuffer<bf16>; 2],
    /// A block's input x [d].
    x: DeviceBuffer<bf16>,
    /// The token mixer's output and the MoE's output [d]: y of the write the next launch does.
    y_mixer: DeviceBuffer<bf16>,
    y_moe: DeviceBuffer<bf16>,
    /// The write gains ω [n] of the attention and of the MoE sites.
    gains_attn: DeviceBuffer<f32>,
    gains_mlp: DeviceBuffer<f32>,
    /// [vocab] f32, and the greedy token the lm_head writes.
    logits: DeviceBuffer<f32>,
    next: DeviceBuffer<u32>,
}

/// Per-sequence state.
struct States {
    gdn: Vec<Option<GdnStateOnDevice>>,
    qsa: Vec<Option<QsaCaches>>,
    ple: Vec<Option<PleStateOnDevice>>,
    ple_hash: Option<PleHashOnDevice>,
    qsa_context: Option<QsaContext>,
}

/// Scratch shared by every layer (the layers run one after another) or, for the PLE rows that
/// the side stream gathers for all layers at once, one per PLE layer.
struct Scratch {
    mix: MixScratch,
    gdn: Option<GdnScratch>,
    qsa: Option<QsaScratch>,
    moe: MoeScratch,
    ple: Vec<PleScratch>,
    ple_ids: Option<DeviceBuffer<u64>>,
}

/// A model on the device with everything one token needs, ready to decode.
pub struct Engine {
    gpu: Gpu,
    plan: StepPlan,
    model: ModelOnDevice,
    kernels: Kernels,
    buffers: Buffers,
    states: States,
    // Bound into `launches` (and held for their addresses).
    scratch: Scratch,
    side: Option<SideStream>,
    launches: Vec<Launch>,
    /// Temperature / top-p sampling after the lm_head (its token replaces the greedy one); None:
    /// greedy.
    sampler: Option<Sampler>,
    graph: Option<Graph>,
    position: usize,
    streams: usize,
    hidden: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("layers", &self.model.layers.len())
            .field("launches", &self.launches_per_token())
            .field("position", &self.position)
            .field("captured", &self.graph.is_some())
            .finish_non_exhaustive()
    }
}

/// Device time per stage of one eager step.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// (stage, seconds, launches), stages in step order, each summed over its layers.
    pub stages: Vec<(Stage, f64, usize)>,
}

impl Engine {
    /// Loads the kernels the plan chose, allocates every buffer, binds every launch. Nothing is
    /// captured yet: [`Engine::capture`] does that after a warm-up step.
    pub fn new(gpu: Gpu, plan: StepPlan, model: ModelOnDevice) -> Result<Engine> {
        let (n, d) = (plan.mix.streams, plan.mix.hidden);
        let layers = model.layers.len();
        let kernels = Kernels {
            embed: gpu.kernel(embed_streams::Tiles::DEFAULT)?,
            mix: MixKernels::load(&gpu, plan.mix_tiles)?,
            gdn: plan.gdn.map(|(_, t)| GdnKernels::load(&gpu, t)).transpose()?,
            qsa: plan.qsa.map(|(_, t)| QsaKernels::load(&gpu, t)).transpose()?,
            moe: MoeKernels::load(&gpu, plan.moe_tiles)?,
            ple: plan.ple.map(|(_, t)| PleKernels::load(&gpu, t)).transpose()?,
        };
        let mut buffers = Buffers {
            meta_host: MappedHostBuffer::new(gpu.context(), 2)?,
            meta: gpu.alloc(2)?,
            residual: [gpu.alloc(n * d)?, gpu.alloc(n * d)?],
            x: gpu.alloc(d)?,
            y_mixer: gpu.alloc(d)?,
            y_moe: gpu.alloc(d)?,
            gains_attn: gpu.alloc(n)?,
            gains_mlp: gpu.alloc(n)?,
            logits: gpu.alloc(model.vocab)?,
            next: gpu.alloc(1)?,
        };
        let position_word: DevPtr<u32> = buffers.meta.ptr();
        let token_word: DevPtr<u32> = buffers.meta.ptr().offset(1);

        let mut qsa_context = match plan.qsa {
            Some((shape, _)) => {
                let mut ctx = QsaContext::new(&gpu, shape, plan.capacity)?;
                ctx.read_position_at(position_word);
                Some(ctx)
            }
            None => None,
        };
        let mut states = States {
            gdn: Vec::with_capacity(layers),
            qsa: Vec::with_capacity(layers),
            ple: Vec::with_capacity(layers),
            ple_hash: model.ple.as_ref().map(|p| PleHashOnDevice::new(&gpu, &p.hashes)).transpose()?,
            qsa_context: None,
        };
        for layer in &model.layers {
            states.gdn.push(match (&layer.mixer, plan.gdn) {
                (MixerOnDevice::Gdn(_), Some((shape, _))) => Some(GdnStateOnDevice::new(&gpu, shape)?),
                _ => None,
            });
            states.qsa.push(match (&layer.mixer, plan.qsa, &qsa_context) {
                (MixerOnDevice::Qsa(_), Some((shape, _)), Some(ctx)) => Some(QsaCaches::new(&gpu, shape, ctx)?),
                _ => None,
            });
            states.ple.push(match (&layer.ple, plan.ple) {
                (Some(_), Some((shape, _))) => Some(PleStateOnDevice::new(&gpu, shape)?),
                _ => None,
            });
        }
        let ple_layers = model.layers.iter().filter(|l| l.ple.is_some()).count();
        let mut scratch = Scratch {
            mix: MixScratch::new(&gpu, plan.mix)?,
            gdn: plan.gdn.map(|(shape, _)| GdnScratch::new(&gpu, shape)).transpose()?,
            qsa: match (plan.qsa, &qsa_context) {
                (Some((shape, _)), Some(ctx)) => Some(QsaScratch::new(&gpu, shape, ctx)?),
                _ => None,
            },
            moe: MoeScratch::new(&gpu, plan.moe)?,
            ple: match plan.ple {
                Some((shape, _)) => (0..ple_layers).map(|_| PleScratch::new(&gpu, shape)).collect::<Result<_>>()?,
                None => vec![],
            },
            ple_ids: states.ple_hash.as_ref().map(|h| gpu.alloc(h.ids_per_step())).transpose()?,
        };

        // Bind every launch, in step order.
        let mut launches = Vec::new();
        let [x0, x1] = &mut buffers.residual;
        let residual: [DevPtrMut<bf16>; 2] = [x0.ptr_mut(), x1.ptr_mut()];
        launches.push(Launch::Embed(embed_streams::Args {
            embed: model.embed.ptr(),
            token: token_word,
            streams: residual[0],
            vocab: model.vocab as u32,
            d: d as u32,
            n: n as u32,
        }));
        let mut ple_blocks = Vec::new();
        if let (Some(hash), Some(ids), Some(ple)) = (&mut states.ple_hash, &mut scratch.ple_ids, &model.ple) {
            let heads = plan.ple.map_or(0, |(s, _)| s.heads);
            let ids_args = hash.ids_args(token_word, ids.ptr_mut());
            let mut gathers = Vec::new();
            let mut index = 0;
            for (l, layer) in model.layers.iter().enumerate() {
                let (Some(w), Some(st)) = (&layer.ple, &mut states.ple[l]) else { continue };
                let s = &mut scratch.ple[index];
                let io = PleStreams { input: DevPtr::from_addr(0), post: None, output: DevPtrMut::from_addr(0) };
                let layer_ids = ids.ptr().offset((index * heads) as u64);
                let l_launches = PleLaunches::new(w, st, s, ple.table.rows(index), layer_ids, io);
                gathers.push(l_launches.gather);
                ple_blocks.push(l_launches);
                index += 1;
            }
            launches.push(Launch::PleRows { ids: ids_args, gathers });
        }
        let y_mixer = buffers.y_mixer.ptr_mut();
        let y_moe = buffers.y_moe.ptr_mut();
        let (gains_attn, gains_mlp) = (buffers.gains_attn.ptr_mut(), buffers.gains_mlp.ptr_mut());
        let x = buffers.x.ptr_mut();
        let mut cur = 0;
        // The write the next launch performs: (y, its gains).
        let mut pending: Option<(DevPtr<bf16>, DevPtr<f32>)> = None;
        let mut ple_index = 0;
        let eps = plan.eps;
        for (l, layer) in model.layers.iter().enumerate() {
            if layer.ple.is_some() {
                let mut p = ple_blocks[ple_index];
                let io = PleStreams { input: residual[cur].into(), post: pending.take(), output: residual[1 - cur] };
                let gc = &mut p.gate_conv;
                gc.streams_in = io.input;
                gc.streams_out = io.output;
                let (y, g) = io.post.map_or((0, 0), |(y, g)| (y.addr(), g.addr()));
                gc.y = DevPtr::from_addr(y);
                gc.gains_prev = DevPtr::from_addr(g);
                gc.post = io.post.is_some();
                launches.push(Launch::PleBlock { launches: p, join: ple_index == 0 });
                cur = 1 - cur;
                ple_index += 1;
            }
            let io = MixIo { residual: residual[cur], post: pending.take(), x, gains: Some(gains_attn) };
            launches.push(Launch::Mix(Stage::AttnMix, MixLaunches::new(&layer.attn_mix, &mut scratch.mix, io, eps)));
            match &layer.mixer {
                MixerOnDevice::Gdn(w) => {
                    let (Some(st), Some(s)) = (&mut states.gdn[l], &mut scratch.gdn) else {
                        return Err(Error::Buffer(format!("layer {l}: a GDN layer in a plan without GDN")));
                    };
                    launches.push(Launch::Gdn(Box::new(GdnLaunches::new(w, st, s, x.into(), y_mixer))));
                }
                MixerOnDevice::Qsa(w) => {
                    let (Some(k), Some(ctx), Some(caches), Some(s)) =
                        (&kernels.qsa, &mut qsa_context, &mut states.qsa[l], &mut scratch.qsa)
                    else {
                        return Err(Error::Buffer(format!("layer {l}: a QSA layer in a plan without QSA")));
                    };
                    launches.push(Launch::Qsa(Box::new(QsaLaunches::new(k, w, ctx, caches, s, x.into(), y_mixer)?)));
                }
            }
            let io = MixIo {
                residual: residual[cur],
                post: Some((y_mixer.into(), gains_attn.into())),
                x,
                gains: Some(gains_mlp),
            };
            launches.push(Launch::Mix(Stage::MlpMix, MixLaunches::new(&layer.mlp_mix, &mut scratch.mix, io, eps)));
            launches.push(Launch::Moe(MoeLaunches::new(&layer.moe, &mut scratch.moe, x.into(), y_moe)));
            pending = Some((y_moe.into(), gains_mlp.into()));
        }
        let io = MixIo { residual: residual[cur], post: pending.take(), x, gains: None };
        launches.push(Launch::Mix(Stage::FinalMix, MixLaunches::new(&model.final_mix, &mut scratch.mix, io, eps)));
        launches.push(Launch::LmHead);
        states.qsa_context = qsa_context;

        let side = if states.ple_hash.is_some() { Some(SideStream::new(&gpu)?) } else { None };
        Ok(Engine {
            gpu,
            plan,
            model,
            kernels,
            buffers,
            states,
            scratch,
            side,
            launches,
            sampler: None,
            graph: None,
            position: 0,
            streams: n,
            hidden: d,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Frees the model, its states and buffers, and hands the device back (to load another).
    pub fn into_gpu(self) -> Gpu {
        let (gpu, plan, model) = self.into_parts();
        drop((model, plan));
        // The frees are enqueued on the stream: wait for them, so the next load sees the memory.
        gpu.synchronize().ok();
        gpu
    }

    /// Frees the states, buffers, kernels and graph, and hands back the device, the plan and the
    /// model, for another [`Engine::new`] over the same weights (the step bench's placement
    /// sweep binds new buffers to one model).
    pub fn into_parts(self) -> (Gpu, StepPlan, ModelOnDevice) {
        let Engine { gpu, plan, model, kernels, buffers, states, scratch, side, launches, sampler, graph, .. } = self;
        drop((graph, sampler, launches, side, scratch, states, buffers, kernels));
        gpu.synchronize().ok();
        (gpu, plan, model)
    }

    /// [`Engine::into_gpu`], keeping a synthetic model's PLE table for the next synthetic model
    /// of the same config and seed ([`ModelOnDevice::synthetic_with`]): the step bench's tile
    /// sets each make their model, but the table once.
    pub fn into_gpu_and_ple_table(mut self) -> (Gpu, Option<SyntheticPleTable>) {
        // Nothing in flight reads the rows once the stream is idle; the launches that would are
        // freed with the engine.
        self.gpu.synchronize().ok();
        let table = self.model.take_synthetic_ple_table();
        (self.into_gpu(), table)
    }

    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }

    pub fn vocab(&self) -> usize {
        self.model.vocab
    }

    /// Tokens decoded so far in this sequence: the position of the next one.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Tokens the sequence can hold (the QSA caches' capacity; unbounded without QSA layers).
    pub fn capacity(&self) -> usize {
        if self.plan.qsa.is_some() { self.plan.capacity } else { usize::MAX }
    }

    /// Launches of one step, counted as the GPU sees them (the side stream's included).
    pub fn launches_per_token(&self) -> usize {
        self.launches
            .iter()
            .map(|l| match l {
                Launch::Embed(_) => 1,
                Launch::LmHead => 1 + usize::from(self.sampler.is_some()),
                Launch::PleRows { gathers, .. } => 1 + gathers.len(),
                Launch::PleBlock { .. } | Launch::Mix(..) => 2,
                Launch::Gdn(_) | Launch::Moe(_) => 3,
                Launch::Qsa(_) => 7,
            })
            .sum()
    }

    /// Moves the sequence to `position` without decoding the tokens before it: the caches and
    /// states keep whatever they hold. For benchmarks at a long context, which need the step's
    /// work at that position, not a meaningful sequence.
    pub fn seek(&mut self, position: usize) -> Result<()> {
        if self.plan.qsa.is_some() {
            check_position(position, self.plan.capacity)?;
        }
        self.position = position;
        Ok(())
    }

    /// Bytes one token at `position` must move at least: every weight the step reads (the routed
    /// experts' only), the GDN states read and written, the QSA caches read through the
    /// selection, the PLE rows over the bus, the logits written. The step's byte floor is this over
    /// the device's bandwidth.
    pub fn bytes_per_token(&self, position: usize) -> usize {
        let p = &self.plan;
        let f = p.formats;
        let mut bytes =
            self.hidden * 2 + p.final_mix.bytes_moved(f.mix) + self.model.lm_head.weight_bytes() + 4 * self.vocab();
        for layer in &self.model.layers {
            bytes += 2 * p.mix.bytes_moved(f.mix) + p.moe.bytes_read(f.experts);
            bytes += match (&layer.mixer, p.gdn, p.qsa) {
                (MixerOnDevice::Gdn(_), Some((shape, _)), _) => shape.layer_bytes(f.gdn_in_proj, f.gdn_out_proj),
                (MixerOnDevice::Qsa(_), _, Some((shape, _))) => shape.layer_bytes(position, f.qsa),
                _ => 0,
            };
            if let (Some(w), Some((shape, _))) = (&layer.ple, p.ple) {
                // The gathered rows, the stacked projections, the norms and the conv's state.
                bytes += 2 * shape.embed_dim()
                    + shape.proj_bytes(w.proj.is_nvfp4())
                    + w.conv.size_bytes()
                    + 8 * shape.conv_depth() * shape.residual_width();
            }
        }
        bytes
    }

    /// Forgets the sequence: every state back to its start (enqueued; nothing recaptured).
    pub fn reset(&mut self) -> Result<()> {
        for st in self.states.gdn.iter_mut().flatten() {
            st.reset(&self.gpu)?;
        }
        for st in self.states.ple.iter_mut().flatten() {
            self.gpu.fill_bytes(&mut st.conv, 0)?;
        }
        if let Some(h) = &mut self.states.ple_hash {
            h.reset(&self.gpu)?;
        }
        self.position = 0;
        Ok(())
    }

    /// Enqueues every launch of one step, calling `after(stage)` after each group.
    fn enqueue_step(&mut self, after: &mut dyn FnMut(&Gpu, Stage) -> Result<()>) -> Result<()> {
        let Engine { gpu, kernels, launches, side, model, buffers, sampler, .. } = self;
        enqueue(gpu, kernels, launches, side.as_ref(), (&mut model.lm_head, sampler.as_mut()), buffers, after)
    }

    /// Decodes `token` at the next position eagerly or through the graph (when captured):
    /// uploads [position, token], enqueues the step, downloads the greedy next token (the one
    /// wait of the token). Refuses, before anything is enqueued, a token outside the vocabulary
    /// and a position past the caches.
    pub fn step(&mut self, token: u32) -> Result<u32> {
        self.check_token(token)?;
        self.upload_meta(token)?;
        match &self.graph {
            Some(g) => g.launch()?,
            None => self.enqueue_step(&mut |_, _| Ok(()))?,
        }
        self.position += 1;
        Ok(self.gpu.download(&self.buffers.next)?[0])
    }

    /// [`Engine::step`] eagerly with an event after every launch group: the step's device time
    /// per stage (the launches run one after another here; PDL overlap across groups is lost at
    /// each event, so the sum is above a graph replay's time).
    pub fn step_profiled(&mut self, token: u32) -> Result<(u32, Profile)> {
        use cudarc::driver::sys::CUevent_flags;
        self.check_token(token)?;
        self.upload_meta(token)?;
        let ctx = self.gpu.context().clone();
        let new_event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let start = new_event().map_err(|e| Error::Driver { during: "creating an event".into(), error: e })?;
        start.record(self.gpu.stream()).map_err(|e| Error::Driver { during: "recording an event".into(), error: e })?;
        let mut marks = Vec::new();
        self.enqueue_step(&mut |gpu, stage| {
            let e = new_event().map_err(|e| Error::Driver { during: "creating an event".into(), error: e })?;
            e.record(gpu.stream()).map_err(|e| Error::Driver { during: "recording an event".into(), error: e })?;
            marks.push((stage, e));
            Ok(())
        })?;
        self.position += 1;
        let next = self.gpu.download(&self.buffers.next)?[0];
        let mut profile = Profile::default();
        let mut prev = &start;
        for (stage, e) in &marks {
            let ms = prev.elapsed_ms(e).map_err(|e| Error::Driver { during: "reading an event".into(), error: e })?;
            match profile.stages.iter_mut().find(|(s, ..)| s == stage) {
                Some((_, t, n)) => {
                    *t += f64::from(ms) / 1e3;
                    *n += 1;
                }
                None => profile.stages.push((*stage, f64::from(ms) / 1e3, 1)),
            }
            prev = e;
        }
        profile.stages.sort_by_key(|(s, ..)| *s);
        Ok((next, profile))
    }

    /// The logits [vocab] of the last step (f32, as the lm_head wrote them).
    pub fn logits(&self) -> Result<Vec<f32>> {
        self.gpu.download(&self.buffers.logits)
    }

    /// The residual streams X [n·d] after the last step's final write... as the final mix site
    /// left them (for locating a disagreement with the reference).
    pub fn residual(&self) -> Result<Vec<bf16>> {
        let last = self.launches.iter().filter(|l| matches!(l, Launch::PleBlock { .. })).count() % 2;
        self.gpu.download(&self.buffers.residual[last])
    }

    /// The experts and routing weights the last MoE layer of the last step chose (the MoE scratch
    /// holds the last layer's): for diagnosing a disagreement with the reference.
    pub fn last_routing(&self) -> Result<(Vec<u32>, Vec<f32>)> {
        Ok((self.gpu.download(&self.scratch.moe.ids)?, self.gpu.download(&self.scratch.moe.weights)?))
    }

    /// Captures the step into a CUDA graph, replayed by every later [`Engine::step`]; run one
    /// step eagerly first (a warm-up: modules load at their first launch, which a capture cannot
    /// do). The state is not touched by the capture (nothing runs during it).
    pub fn capture(&mut self) -> Result<()> {
        self.graph = None;
        let Engine { gpu, kernels, launches, side, model, buffers, sampler, .. } = self;
        let graph = gpu.capture(|| {
            let lm_head = &mut model.lm_head;
            enqueue(gpu, kernels, launches, side.as_ref(), (lm_head, sampler.as_mut()), buffers, &mut |_, _| Ok(()))
        })?;
        self.graph = Some(graph);
        Ok(())
    }

    /// Samples each next token with temperature and top-p on the device (the uniform drawn from
    /// the seed and the position of the token decoded), or greedily with None (the lm_head's fused
    /// argmax). Drops the graph: the parameters are baked into its launch; capture again.
    pub fn set_sampling(&mut self, params: Option<SampleParams>) -> Result<()> {
        self.graph = None;
        self.sampler = params.map(|p| Sampler::new(&self.gpu, self.model.vocab, p)).transpose()?;
        Ok(())
    }

    /// Drops the graph: later steps run the launches eagerly.
    pub fn release_graph(&mut self) {
        self.graph = None;
    }

    pub fn is_captured(&self) -> bool {
        self.graph.is_some()
    }

    fn check_token(&self, token: u32) -> Result<()> {
        if token as usize >= self.model.vocab {
            return Err(Error::Buffer(format!(
                "token id {token} is out of range: the vocabulary has {} tokens",
                self.model.vocab
            )));
        }
        if self.plan.qsa.is_some() {
            check_position(self.position, self.plan.capacity)?;
        }
        Ok(())
    }

    fn upload_meta(&mut self, token: u32) -> Result<()> {
        // The previous step's download waited for the stream, so the copy that read these words
        // last has finished: the host may overwrite them.
        self.buffers.meta_host.as_mut_slice().copy_from_slice(&[self.position as u32, token]);
        self.gpu.copy_from_pinned(&self.buffers.meta_host, &mut self.buffers.meta)
    }

    /// Streams × hidden: the width of the residual.
    pub fn residual_width(&self) -> usize {
        self.streams * self.hidden
    }
}

/// Enqueues every launch of one step, calling `after(stage)` after each group.
fn enqueue(
    gpu: &Gpu,
    k: &Kernels,
    launches: &[Launch],
    side: Option<&SideStream>,
    (lm_head, mut sampler): (&mut LmHead, Option<&mut Sampler>),
    buffers: &mut Buffers,
    after: &mut dyn FnMut(&Gpu, Stage) -> Result<()>,
) -> Result<()> {
    for launch in launches {
        // SAFETY: every launch was bound in `new` to buffers this engine owns (weights, states,
        // scratch, the residual and I/O buffers), sized from the plan's shapes, which the
        // uploads checked the weights against; the buffers do not move while the engine
        // lives; the position word is kept below the caches' capacity by `step`.
        unsafe {
            match launch {
                Launch::Embed(a) => k.embed.launch(gpu, a)?,
                Launch::PleRows { ids, gathers } => {
                    let (Some(side), Some(pk)) = (side, &k.ple) else { unreachable!("made with PLE") };
                    enqueue_rows_on_side(gpu, side, pk, ids, gathers)?;
                }
                Launch::PleBlock { launches, join } => {
                    let (Some(side), Some(pk)) = (side, &k.ple) else { unreachable!("made with PLE") };
                    if *join {
                        side.join(gpu)?;
                    }
                    launches.enqueue_block(gpu, pk)?;
                }
                Launch::Mix(_, m) => m.enqueue(gpu, &k.mix)?,
                Launch::Gdn(g) => g.enqueue(gpu, k.gdn.as_ref().expect("made with GDN"))?,
                Launch::Qsa(q) => q.enqueue(gpu, k.qsa.as_ref().expect("made with QSA"))?,
                Launch::Moe(m) => m.enqueue(gpu, &k.moe)?,
                Launch::LmHead => {
                    lm_head.launch(gpu, &buffers.x, &mut buffers.logits, &mut buffers.next)?;
                    if let Some(s) = &mut sampler {
                        // The position word of the metadata seeds the uniform.
                        s.launch(gpu, &buffers.logits, &buffers.meta, &mut buffers.next)?;
                    }
                }
            }
        }
        after(gpu, launch.stage())?;
    }
    Ok(())
}
