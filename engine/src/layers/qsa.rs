//! One QSA layer (sparse attention with an indexer) on the device: its weights as the kernels read
//! them, its caches (keys and values, the indexer's raw keys and pooled block keys) sized at load
//! for a context length, its scratch, and its seven launches:
//!
//! 1. the stacked projection [q_proj; k_proj; v_proj; index_qk_proj]·x: one GEMV over one read
//!    of x ([`gemv_bf16`], or [`gemv_nvfp4`] with the four matrices' global scales), its output
//!    in bf16 (what [`qsa_prepare`] reads);
//! 2. [`qsa_prepare`]: the zero-centred norms and partial RoPE of q, k and the index queries, the
//!    cache appends, and the pooled key of a block that completes;
//! 3. [`qsa_block_scores`]: every complete block's score against the index queries (none while
//!    the complete blocks fit the budget, when all of them are selected);
//! 4. the top `top` blocks by score, on the device: [`qsa_top_blocks`] (one block) or
//!    [`qsa_top_blocks_grid`] (many blocks and grid barriers), as [`TopK`] chooses;
//! 5. [`qsa_attention`]: gated GQA through the selection plus the tail, split over tokens;
//! 6. [`qsa_attention_combine`]: the splits combined, σ(gate) applied, o in bf16;
//! 7. o_proj: the GEMV (bf16 or NVFP4), split-K.
//!
//! Every launch reads the token's position from one device word ([`QsaContext::position`]) and
//! every count it depends on from device memory, so one captured graph serves every position:
//! the caller writes the position with [`QsaContext::set_position`] before each token (eager or
//! before a graph replay; it is an ordinary copy on the engine's stream, so it is ordered before
//! the launches that follow). `set_position` refuses, with [`Error::ContextTooLong`], a position
//! the caches cannot hold, before anything is enqueued: the kernels themselves do not check.

use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, KernelDef, LaunchError, TileSet};

use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel};
use crate::error::{Error, Result};
use crate::kernels::gemv_bf16::gemv_bf16;
use crate::kernels::gemv_nvfp4::gemv_nvfp4;
use crate::kernels::qsa::attention::qsa_attention;
use crate::kernels::qsa::block_scores::qsa_block_scores;
use crate::kernels::qsa::combine::qsa_attention_combine;
use crate::kernels::qsa::prepare::qsa_prepare;
use crate::kernels::qsa::top_blocks::qsa_top_blocks;
use crate::kernels::qsa::top_blocks_grid::{self, qsa_top_blocks_grid};
use crate::layers::matrix::{MatrixOnDevice, matrix_bytes};
use crate::model::config::ModelConfig;
use crate::model::nvfp4::Nvfp4Matrix;
use crate::model::weights::QsaWeights;
use crate::reference::rope::Rope;

/// The largest K_SPLIT among gemv_bf16's tile candidates: the GEMVs' partial sums are sized for it.
const MAX_SPLIT: usize = 16;
/// The smallest CHUNK among qsa_attention's tile candidates: the split partials are sized for
/// the most splits any tile set makes.
const MIN_CHUNK: usize = 16;

/// The shape of a QSA layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QsaShape {
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The indexer's query heads (it has one key head) and their width.
    pub index_heads: usize,
    pub index_dim: usize,
    /// Rotated dimensions of every head (attention and indexer).
    pub rotary: usize,
    /// Tokens per indexer block.
    pub block_tokens: usize,
    /// Blocks kept by the top-k (the budget in blocks).
    pub top: usize,
    pub eps: f32,
    pub rope_theta: f64,
}

impl QsaShape {
    /// The published Qwen3.8-Flash-Next's QSA layer (`from_config` of the embedded config gives
    /// it; a test holds the two together), for the tests and benches that run that shape.
    pub const PUBLISHED: QsaShape = QsaShape {
        hidden: 2560,
        q_heads: 24,
        kv_heads: 2,
        head_dim: 256,
        index_heads: 4,
        index_dim: 128,
        rotary: 64,
        block_tokens: 4,
        top: 512,
        eps: 1e-6,
        rope_theta: 1e7,
    };

    pub fn from_config(cfg: &ModelConfig) -> Result<QsaShape> {
        let sh = QsaShape {
            hidden: cfg.hidden_size,
            q_heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            index_heads: cfg.indexer_heads,
            index_dim: cfg.indexer_head_dim,
            rotary: cfg.rotary_dim,
            block_tokens: cfg.indexer_block,
            top: cfg.indexer_top_blocks(),
            eps: cfg.rms_norm_eps,
            rope_theta: cfg.rope_theta,
        };
        if sh.block_tokens == 0 || sh.top == 0 || sh.kv_heads == 0 || !sh.q_heads.is_multiple_of(sh.kv_heads) {
            return Err(Error::Buffer(format!(
                "QSA: {} query heads on {} key/value heads, blocks of {} tokens, {} blocks kept: not a QSA shape",
                sh.q_heads, sh.kv_heads, sh.block_tokens, sh.top
            )));
        }
        Ok(sh)
    }

    /// Width of the attention's output, o_proj's input.
    pub fn attn_dim(&self) -> usize {
        self.q_heads * self.head_dim
    }

    /// Width of one token's key (or value) row in the caches.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Rows of the stacked projection: q with its gate (per head D query rows, then D gate rows),
    /// k, v, the index queries and the index key, in the order [`qsa_prepare`] reads them.
    pub fn in_rows(&self) -> usize {
        2 * self.attn_dim() + 2 * self.kv_dim() + (self.index_heads + 1) * self.index_dim
    }

    /// The token capacity the caches get for `context` tokens asked for: rounded up to whole
    /// groups of 4 blocks (the top-k reads the scores 4 at a time).
    pub fn capacity_for(&self, context: usize) -> usize {
        context.max(1).div_ceil(4 * self.block_tokens) * 4 * self.block_tokens
    }

    /// Bytes of the layer's weights: the stacked projection and o_proj (bf16, or NVFP4 when
    /// `nvfp4`), the four norms in bf16.
    pub fn weight_bytes(&self, nvfp4: bool) -> usize {
        matrix_bytes(self.in_rows(), self.hidden, nvfp4, 4)
            + matrix_bytes(self.hidden, self.attn_dim(), nvfp4, 1)
            + 2 * (2 * self.head_dim + 2 * self.index_dim)
    }

    /// Bytes one token at `position` must move at least: the weights, x and y, the cache
    /// appends (its key and value rows in bf16, its raw index key and, at worst, a pooled key in
    /// f32), the pooled keys of every complete block, the scores written and read back, and the
    /// selected tokens' key and value rows (every token while the blocks fit the budget, else
    /// `top` blocks plus the tail).
    pub fn layer_bytes(&self, position: usize, nvfp4: bool) -> usize {
        let c = self.block_tokens;
        let complete = (position + 1) / c;
        let attended = complete.min(self.top) * c + (position + 1 - complete * c);
        let appends = 2 * 2 * self.kv_dim() + 2 * 4 * self.index_dim;
        self.weight_bytes(nvfp4)
            + 2 * 2 * self.hidden
            + appends
            + 4 * complete * self.index_dim
            + 2 * 4 * complete
            + 2 * 2 * attended * self.kv_dim()
    }
}

/// The refusal of a token the caches cannot hold: position `position` needs `position + 1`
/// tokens of cache.
pub fn check_position(position: usize, capacity: usize) -> Result<()> {
    if position >= capacity {
        return Err(Error::ContextTooLong { needed: position + 1, capacity });
    }
    Ok(())
}

/// The stacked projection [q_proj; k_proj; v_proj; index_qk_proj] in bf16.
pub fn stack_in_proj(w: &QsaWeights) -> Vec<bf16> {
    [&w.q, &w.k, &w.v, &w.index_qk].iter().flat_map(|l| l.w.iter().map(|&v| bf16::from_f32(v))).collect()
}

/// A QSA layer's weights on the device: the projections bf16 or NVFP4, the norms bf16.
#[derive(Debug)]
pub struct QsaWeightsOnDevice {
    pub shape: QsaShape,
    /// [in_rows, hidden]: see [`QsaShape::in_rows`]; in NVFP4 the four matrices with their own
    /// global scales.
    pub in_proj: MatrixOnDevice,
    /// [hidden, attn_dim].
    pub o_proj: MatrixOnDevice,
    /// [head_dim] each.
    pub q_norm: DeviceBuffer<bf16>,
    pub k_norm: DeviceBuffer<bf16>,
    /// [index_dim] each.
    pub index_q_norm: DeviceBuffer<bf16>,
    pub index_k_norm: DeviceBuffer<bf16>,
}

impl QsaWeightsOnDevice {
    /// Uploads `w` rounded to bf16 (exact for a bf16 checkpoint), after checking every length
    /// against `shape`.
    pub fn upload_bf16(gpu: &Gpu, shape: QsaShape, w: &QsaWeights) -> Result<Self> {
        Self::upload(gpu, shape, w, None)
    }

    /// Uploads `w` with the projections from NVFP4 matrices where given: `in_proj` the four
    /// [q_proj (with its gate rows), k_proj, v_proj, index_qk_proj], `o_proj` [hidden, attn_dim];
    /// the norms (and the projections otherwise) rounded to bf16. Each matrix goes up once, in the
    /// format it runs in.
    pub fn upload(
        gpu: &Gpu,
        shape: QsaShape,
        w: &QsaWeights,
        nvfp4: Option<([&Nvfp4Matrix; 4], &Nvfp4Matrix)>,
    ) -> Result<Self> {
        let (d, sh) = (shape.hidden, shape);
        let checks = [
            ("q_proj", w.q.w.len(), 2 * sh.attn_dim() * d),
            ("k_proj", w.k.w.len(), sh.kv_dim() * d),
            ("v_proj", w.v.w.len(), sh.kv_dim() * d),
            ("index_qk_proj", w.index_qk.w.len(), (sh.index_heads + 1) * sh.index_dim * d),
            ("o_proj", w.o.w.len(), d * sh.attn_dim()),
            ("q_norm", w.q_norm.len(), sh.head_dim),
            ("k_norm", w.k_norm.len(), sh.head_dim),
            ("q_layernorm", w.index_q_norm.len(), sh.index_dim),
            ("k_layernorm", w.index_k_norm.len(), sh.index_dim),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("QSA {what}: {got} values for a shape that needs {want}")));
            }
        }
        if [&w.q, &w.k, &w.v, &w.index_qk, &w.o].iter().any(|l| l.bias.is_some()) {
            return Err(Error::Buffer("QSA projections have no bias in this model".to_owned()));
        }
        let (in_proj, o_proj) = match nvfp4 {
            Some((in_proj, o_proj)) => {
                let rows = [2 * sh.attn_dim(), sh.kv_dim(), sh.kv_dim(), (sh.index_heads + 1) * sh.index_dim];
                let names = ["q_proj", "k_proj", "v_proj", "index_qk_proj"];
                for ((m, r), name) in in_proj.iter().zip(rows).zip(names).chain([((&o_proj, d), "o_proj")]) {
                    if m.rows != r {
                        return Err(Error::Buffer(format!(
                            "QSA {name} in NVFP4: {} rows for a shape that needs {r}",
                            m.rows
                        )));
                    }
                }
                (
                    MatrixOnDevice::nvfp4(gpu, "QSA in_proj", &in_proj, d)?,
                    MatrixOnDevice::nvfp4(gpu, "QSA o_proj", &[o_proj], sh.attn_dim())?,
                )
            }
            None => (MatrixOnDevice::Bf16(gpu.upload(&stack_in_proj(w))?), MatrixOnDevice::bf16(gpu, &w.o.w)?),
        };
        let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        Ok(QsaWeightsOnDevice {
            shape,
            in_proj,
            o_proj,
            q_norm: gpu.upload(&to_bf16(&w.q_norm))?,
            k_norm: gpu.upload(&to_bf16(&w.k_norm))?,
            index_q_norm: gpu.upload(&to_bf16(&w.index_q_norm))?,
            index_k_norm: gpu.upload(&to_bf16(&w.index_k_norm))?,
        })
    }
}

/// What every QSA layer of a model shares: the token capacity, the RoPE table for every position
/// below it, and the device word holding the current token's position, which every launch reads.
#[derive(Debug)]
pub struct QsaContext {
    capacity: usize,
    /// [capacity, rotary/2, 2] f32: cos and sin (`Rope::table`).
    pub rope: DeviceBuffer<f32>,
    /// [1]: the position of the token being decoded.
    pub position: DeviceBuffer<u32>,
    /// Where the launches read the position: `position` unless
    /// [`QsaContext::read_position_at`] moved it into the step's per-token metadata.
    position_at: u64,
}

impl QsaContext {
    /// For `context` tokens (rounded up by [`QsaShape::capacity_for`]); position 0.
    pub fn new(gpu: &Gpu, shape: QsaShape, context: usize) -> Result<QsaContext> {
        let capacity = shape.capacity_for(context);
        if u32::try_from(capacity).is_err() {
            return Err(Error::Buffer(format!("QSA: a context of {capacity} tokens does not fit 32-bit positions")));
        }
        let rope = Rope::new(shape.rope_theta, shape.rotary);
        let position = gpu.upload(&[0u32])?;
        Ok(QsaContext {
            capacity,
            rope: gpu.upload(&rope.table(capacity))?,
            position_at: position.ptr().addr(),
            position,
        })
    }

    /// Makes the launches built after this read the position from `word` (the step's per-token
    /// metadata, uploaded with the token in one copy) instead of this context's own word;
    /// [`QsaContext::set_position`] then no longer reaches them. The word must outlive the
    /// launches, and whoever writes it must keep it below [`QsaContext::capacity`]
    /// ([`check_position`]).
    pub fn read_position_at(&mut self, word: DevPtr<u32>) {
        self.position_at = word.addr();
    }

    /// Tokens the caches built for this context hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the position the next pass (eager or a graph replay) decodes at, or refuses with
    /// [`Error::ContextTooLong`] (writing nothing) when the caches cannot hold it.
    pub fn set_position(&mut self, gpu: &Gpu, position: usize) -> Result<()> {
        check_position(position, self.capacity)?;
        gpu.write(&mut self.position, &[position as u32])
    }
}

/// A layer's caches, sized for its context's capacity. Positions at or after the current one
/// are never read, so nothing needs clearing at the start of a sequence.
#[derive(Debug)]
pub struct QsaCaches {
    capacity: usize,
    /// [capacity, kv_heads, head_dim] bf16: keys after norm and RoPE; values.
    pub k: DeviceBuffer<bf16>,
    pub v: DeviceBuffer<bf16>,
    /// [capacity, index_dim] f32: the indexer's raw keys.
    pub index_keys: DeviceBuffer<f32>,
    /// [capacity / block_tokens, index_dim] f32: pooled keys, normed and rotated.
    pub block_keys: DeviceBuffer<f32>,
}

impl QsaCaches {
    pub fn new(gpu: &Gpu, shape: QsaShape, ctx: &QsaContext) -> Result<QsaCaches> {
        let cap = ctx.capacity;
        Ok(QsaCaches {
            capacity: cap,
            k: gpu.alloc(cap * shape.kv_dim())?,
            v: gpu.alloc(cap * shape.kv_dim())?,
            index_keys: gpu.alloc(cap * shape.index_dim)?,
            block_keys: gpu.alloc(cap / shape.block_tokens * shape.index_dim)?,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// What one QSA pass writes besides its output and the caches. Layers run one after another may
/// share one scratch. The GEMV counters must be zero before the first pass; every pass leaves
/// them zero.
#[derive(Debug)]
pub struct QsaScratch {
    capacity: usize,
    /// The stacked projection's output [in_rows], bf16.
    pub proj: DeviceBuffer<bf16>,
    /// Its split-K partials [16, in_rows] and row-tile counters [in_rows].
    pub proj_partial: DeviceBuffer<f32>,
    pub proj_counters: DeviceBuffer<u32>,
    /// Queries after norm and RoPE, and the raw gate, [q_heads, head_dim] f32.
    pub q: DeviceBuffer<f32>,
    pub gate: DeviceBuffer<f32>,
    /// The index queries after norm and RoPE [index_heads, index_dim] f32.
    pub index_q: DeviceBuffer<f32>,
    /// Block scores [capacity / block_tokens] and their count [1].
    pub scores: DeviceBuffer<f32>,
    pub n_blocks: DeviceBuffer<u32>,
    /// The chosen blocks [top], ascending, and their count [1].
    pub selected: DeviceBuffer<u32>,
    pub count: DeviceBuffer<u32>,
    /// The multi-block top-k's histograms, barrier counter and per-block counts
    /// [`top_blocks_grid::SCRATCH_WORDS`]: zero at allocation, left as found by every launch.
    pub top_k: DeviceBuffer<u32>,
    /// The attention's split partials [q_heads, splits, head_dim] and [q_heads, splits, 2].
    pub partial_acc: DeviceBuffer<f32>,
    pub partial_ml: DeviceBuffer<f32>,
    /// The gated attention output, o_proj's input [attn_dim], bf16.
    pub o: DeviceBuffer<bf16>,
    /// o_proj's split-K partials [16, hidden] and counters [hidden].
    pub out_partial: DeviceBuffer<f32>,
    pub out_counters: DeviceBuffer<u32>,
}

impl QsaScratch {
    pub fn new(gpu: &Gpu, shape: QsaShape, ctx: &QsaContext) -> Result<QsaScratch> {
        let splits = max_splits(shape);
        let mut s = QsaScratch {
            capacity: ctx.capacity,
            proj: gpu.alloc(shape.in_rows())?,
            proj_partial: gpu.alloc(MAX_SPLIT * shape.in_rows())?,
            proj_counters: gpu.alloc(shape.in_rows())?,
            q: gpu.alloc(shape.attn_dim())?,
            gate: gpu.alloc(shape.attn_dim())?,
            index_q: gpu.alloc(shape.index_heads * shape.index_dim)?,
            scores: gpu.alloc(ctx.capacity / shape.block_tokens)?,
            n_blocks: gpu.alloc(1)?,
            selected: gpu.alloc(shape.top)?,
            count: gpu.alloc(1)?,
            top_k: gpu.alloc(top_blocks_grid::SCRATCH_WORDS)?,
            partial_acc: gpu.alloc(shape.q_heads * splits * shape.head_dim)?,
            partial_ml: gpu.alloc(shape.q_heads * splits * 2)?,
            o: gpu.alloc(shape.attn_dim())?,
            out_partial: gpu.alloc(MAX_SPLIT * shape.hidden)?,
            out_counters: gpu.alloc(shape.hidden)?,
        };
        gpu.fill_bytes(&mut s.proj_counters, 0)?;
        gpu.fill_bytes(&mut s.out_counters, 0)?;
        gpu.fill_bytes(&mut s.top_k, 0)?;
        Ok(s)
    }
}

/// The most splits the attention makes at any of its tile candidates.
fn max_splits(shape: QsaShape) -> usize {
    ((shape.top + 1) * shape.block_tokens).div_ceil(MIN_CHUNK)
}

/// Which top-k kernel the layer runs, at which tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopK {
    /// [`qsa_top_blocks`]: one block does it all (no grid barrier; one SM loads the scores).
    OneBlock(qsa_top_blocks::Tiles),
    /// [`qsa_top_blocks_grid`]: BLOCKS blocks with grid barriers, which must all be resident at
    /// once ([`QsaKernels::load`] checks the device can hold them).
    Grid(qsa_top_blocks_grid::Tiles),
}

/// Tile choices for the seven launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QsaTiles {
    pub in_proj: gemv_bf16::Tiles,
    pub prepare: qsa_prepare::Tiles,
    pub block_scores: qsa_block_scores::Tiles,
    pub top_k: TopK,
    pub attention: qsa_attention::Tiles,
    pub combine: qsa_attention_combine::Tiles,
    pub o_proj: gemv_bf16::Tiles,
    /// The projections' GEMVs when the weights are NVFP4.
    pub in_proj_nvfp4: gemv_nvfp4::Tiles,
    pub o_proj_nvfp4: gemv_nvfp4::Tiles,
}

impl Default for QsaTiles {
    fn default() -> Self {
        QsaTiles {
            // 13,952 rows at the published shape: 1,744 blocks unsplit, enough to fill the SMs.
            in_proj: TileSet::DEFAULT,
            prepare: TileSet::DEFAULT,
            block_scores: TileSet::DEFAULT,
            top_k: TopK::OneBlock(TileSet::DEFAULT),
            attention: TileSet::DEFAULT,
            combine: TileSet::DEFAULT,
            // o_proj is 2560 × 6144, the shape of GDN's out_proj: split K four ways as it does
            // (H200, benches/gdn.rs: 10.5 µs against 15.1 µs unsplit).
            o_proj: gemv_bf16::Tiles { k_split: 4, ..TileSet::DEFAULT },
            // H200, benches/gemv_nvfp4.rs: the stacked projection 10.66 µs with 8 warps a block
            // against 14.46 at 4 (bf16: 18.17); o_proj split as out_proj is.
            // Its weights' first steps loaded before the wait: behind the mix site's short
            // up-projection they land while it ends (14.8 → 10.4 µs a launch in the H200 step).
            in_proj_nvfp4: gemv_nvfp4::Tiles { warps: 8, early: 8, ..TileSet::DEFAULT },
            // The row path, as GDN's out_proj of the same shape (its tiles say why).
            o_proj_nvfp4: crate::kernels::gemv_nvfp4::ROW_PATH,
        }
    }
}

impl QsaTiles {
    /// The defaults, with the top-k kernel chosen for caches of `capacity` tokens: the one-block
    /// kernel up to 16,384 blocks (64k tokens at the published 4 a block), the multi-block one
    /// past that. On the H200 the one-block kernel is faster at 8,192 blocks (7.2 µs against
    /// 9.2) and grows with the count (20.8 µs at 32,768 in the layer), while the multi-block one
    /// stays near 9 µs (BENCHMARKS.md). The graph is fixed at load, so the choice goes by the
    /// largest count the caches allow.
    pub fn for_capacity(shape: QsaShape, capacity: usize) -> QsaTiles {
        let top_k = if capacity / shape.block_tokens > 16_384 {
            TopK::Grid(TileSet::DEFAULT)
        } else {
            TopK::OneBlock(TileSet::DEFAULT)
        };
        QsaTiles { top_k, ..QsaTiles::default() }
    }

    /// The defaults, with each GEMV's K split lowered (to 1 at worst) until `shape` allows it
    /// (small shapes cannot split K as far as the published one), the attention's warps set
    /// to what the head width needs (head_dim = 64·WARPS) and its blocks a key/value head
    /// lowered until they divide that head's query heads.
    pub fn fitting(shape: QsaShape) -> QsaTiles {
        let mut t = QsaTiles::default();
        if shape.head_dim.is_multiple_of(64) && shape.head_dim >= 64 {
            t.attention.warps = (shape.head_dim / 64) as u32;
        }
        // The attention's blocks a key/value head share its query heads evenly (1 always does).
        let group = shape.q_heads / shape.kv_heads.max(1);
        while t.attention.head_blocks > 1 && !group.is_multiple_of(t.attention.head_blocks as usize) {
            t.attention.head_blocks -= 1;
        }
        let a = QsaLaunches::unbound(shape, 4 * shape.block_tokens, t.attention);
        for (tiles, args) in [(&mut t.in_proj, &a.in_proj), (&mut t.o_proj, &a.o_proj)] {
            while tiles.k_split > 1 && gemv_bf16::Kernel::launch_dims(tiles, args).is_err() {
                tiles.k_split /= 2;
            }
        }
        // NVFP4: the row path where it fits; else lower the split, then the lanes a row (16
        // values each), until the shape fits; one that never fits keeps the default and
        // `check_nvfp4` refuses it.
        for (tiles, args) in [(&mut t.in_proj_nvfp4, &a.in_proj_nvfp4), (&mut t.o_proj_nvfp4, &a.o_proj_nvfp4)] {
            if let Some(v) = crate::kernels::gemv_nvfp4::fitting(*tiles, args, |_| true) {
                *tiles = v;
            }
        }
        t
    }

    /// Whether the NVFP4 projections' GEMVs can run `shape` at these tiles (with their scratch).
    pub fn check_nvfp4(&self, shape: QsaShape) -> std::result::Result<(), LaunchError> {
        let a = QsaLaunches::unbound(shape, 4 * shape.block_tokens, self.attention);
        let dims = gemv_nvfp4::Kernel::launch_dims(&self.in_proj_nvfp4, &a.in_proj_nvfp4)?;
        gemv_scratch_fits("gemv_nvfp4 (QSA in_proj)", dims, shape.in_rows())?;
        let dims = gemv_nvfp4::Kernel::launch_dims(&self.o_proj_nvfp4, &a.o_proj_nvfp4)?;
        gemv_scratch_fits("gemv_nvfp4 (QSA o_proj)", dims, shape.hidden)
    }

    /// Whether these tiles can run `shape` with caches of `capacity` tokens: each kernel's
    /// requirements, checked as a launch would, and the scratch's sizes.
    pub fn check(&self, shape: QsaShape, capacity: usize) -> std::result::Result<(), LaunchError> {
        let a = QsaLaunches::unbound(shape, capacity, self.attention);
        let gemv_fits = |name: &'static str, tiles: &gemv_bf16::Tiles, args: &gemv_bf16::Args, rows: usize| {
            gemv_scratch_fits(name, gemv_bf16::Kernel::launch_dims(tiles, args)?, rows)
        };
        gemv_fits("gemv_bf16 (QSA in_proj)", &self.in_proj, &a.in_proj, shape.in_rows())?;
        qsa_prepare::Kernel::launch_dims(&self.prepare, &a.prepare)?;
        qsa_block_scores::Kernel::launch_dims(&self.block_scores, &a.block_scores)?;
        match &self.top_k {
            TopK::OneBlock(t) => qsa_top_blocks::Kernel::launch_dims(t, &a.top_blocks).map(|_| ())?,
            TopK::Grid(t) => qsa_top_blocks_grid::Kernel::launch_dims(t, &a.top_blocks_grid).map(|_| ())?,
        }
        let dims = qsa_attention::Kernel::launch_dims(&self.attention, &a.attention)?;
        if dims.grid[1] as usize > max_splits(shape) {
            return Err(LaunchError {
                kernel: "qsa_attention",
                message: format!("{} splits; the partials hold {}", dims.grid[1], max_splits(shape)),
            });
        }
        qsa_attention_combine::Kernel::launch_dims(&self.combine, &a.combine)?;
        gemv_fits("gemv_bf16 (QSA o_proj)", &self.o_proj, &a.o_proj, shape.hidden)?;
        Ok(())
    }
}

/// Whether a GEMV's grid fits its scratch: split-K partials for [`MAX_SPLIT`] splits and one
/// counter per row (at most `rows` row tiles).
fn gemv_scratch_fits(
    name: &'static str,
    dims: kernel_dsl::LaunchDims,
    rows: usize,
) -> std::result::Result<(), LaunchError> {
    if dims.grid[0] as usize > rows || dims.grid[1] as usize > MAX_SPLIT {
        return Err(LaunchError {
            kernel: name,
            message: "the GEMV's scratch is sized for 16 splits and one counter per row".to_owned(),
        });
    }
    Ok(())
}

/// The QSA kernels, compiled for one device at chosen tiles.
#[derive(Debug)]
pub struct QsaKernels {
    pub tiles: QsaTiles,
    pub in_proj: LoadedKernel<gemv_bf16::Kernel>,
    pub prepare: LoadedKernel<qsa_prepare::Kernel>,
    pub block_scores: LoadedKernel<qsa_block_scores::Kernel>,
    pub top_k: TopKKernel,
    pub attention: LoadedKernel<qsa_attention::Kernel>,
    pub combine: LoadedKernel<qsa_attention_combine::Kernel>,
    pub o_proj: LoadedKernel<gemv_bf16::Kernel>,
    pub in_proj_nvfp4: LoadedKernel<gemv_nvfp4::Kernel>,
    pub o_proj_nvfp4: LoadedKernel<gemv_nvfp4::Kernel>,
}

/// The loaded top-k kernel of [`TopK`]'s choice.
#[derive(Debug)]
pub enum TopKKernel {
    OneBlock(LoadedKernel<qsa_top_blocks::Kernel>),
    Grid(LoadedKernel<qsa_top_blocks_grid::Kernel>),
}

impl QsaKernels {
    /// Compiles the kernels; with the multi-block top-k, refuses a grid the device cannot hold
    /// at once (its grid barrier would wait forever).
    pub fn load(gpu: &Gpu, tiles: QsaTiles) -> Result<QsaKernels> {
        let top_k = match tiles.top_k {
            TopK::OneBlock(t) => TopKKernel::OneBlock(gpu.kernel(t)?),
            TopK::Grid(t) => {
                let k = gpu.kernel(t)?;
                let resident = k.co_resident_blocks(gpu)?;
                if resident < t.blocks {
                    return Err(Error::Buffer(format!(
                        "the multi-block top-k needs its {} blocks resident at once; this device holds {resident}",
                        t.blocks
                    )));
                }
                TopKKernel::Grid(k)
            }
        };
        Ok(QsaKernels {
            tiles,
            in_proj: gpu.kernel(tiles.in_proj)?,
            prepare: gpu.kernel(tiles.prepare)?,
            block_scores: gpu.kernel(tiles.block_scores)?,
            top_k,
            attention: gpu.kernel(tiles.attention)?,
            combine: gpu.kernel(tiles.combine)?,
            o_proj: gpu.kernel(tiles.o_proj)?,
            in_proj_nvfp4: gpu.kernel(tiles.in_proj_nvfp4)?,
            o_proj_nvfp4: gpu.kernel(tiles.o_proj_nvfp4)?,
        })
    }
}

/// One of the seven launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    InProj,
    Prepare,
    BlockScores,
    TopBlocks,
    Attention,
    Combine,
    OProj,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::InProj,
        Stage::Prepare,
        Stage::BlockScores,
        Stage::TopBlocks,
        Stage::Attention,
        Stage::Combine,
        Stage::OProj,
    ];
}

/// The seven launches of one QSA pass, arguments bound.
#[derive(Clone, Copy, Debug)]
pub struct QsaLaunches {
    pub in_proj: gemv_bf16::Args,
    pub prepare: qsa_prepare::Args,
    pub block_scores: qsa_block_scores::Args,
    pub top_blocks: qsa_top_blocks::Args,
    pub top_blocks_grid: qsa_top_blocks_grid::Args,
    pub attention: qsa_attention::Args,
    pub combine: qsa_attention_combine::Args,
    pub o_proj: gemv_bf16::Args,
    pub in_proj_nvfp4: gemv_nvfp4::Args,
    pub o_proj_nvfp4: gemv_nvfp4::Args,
    /// Whether the projections' weights are NVFP4 (then the `_nvfp4` launches run).
    pub nvfp4: bool,
}

/// Every address of a pass, so that one function builds the arguments both for a pass and for
/// checking a shape (with every address 0).
#[derive(Default)]
struct Addresses {
    x: u64,
    y: u64,
    /// in_proj, o_proj (bf16 values or NVFP4 codes), q_norm, k_norm, index_q_norm, index_k_norm.
    w: [u64; 6],
    /// NVFP4 only: in_proj's block scales and global scales, o_proj's; in_proj's row boundaries.
    nvfp4: Option<([u64; 4], [u32; 3])>,
    /// rope, position.
    ctx: [u64; 2],
    /// k, v, index_keys, block_keys.
    caches: [u64; 4],
    /// proj, proj_partial, proj_counters, q, gate, index_q, scores, n_blocks, selected, count,
    /// top_k,
    /// partial_acc, partial_ml, o, out_partial, out_counters.
    s: [u64; 16],
}

impl QsaLaunches {
    /// The launches of `y = QSA(x)` at the position `ctx` holds, with these weights, caches and
    /// scratch; `tiles` are the ones the kernels were loaded with (the attention's split count,
    /// which the combine takes, depends on them).
    pub fn new(
        k: &QsaKernels,
        w: &QsaWeightsOnDevice,
        ctx: &mut QsaContext,
        caches: &mut QsaCaches,
        s: &mut QsaScratch,
        x: DevPtr<bf16>,
        y: DevPtrMut<bf16>,
    ) -> Result<QsaLaunches> {
        if caches.capacity != ctx.capacity || s.capacity != ctx.capacity {
            return Err(Error::Buffer(format!(
                "QSA: caches for {} tokens and scratch for {} in a context of {}",
                caches.capacity, s.capacity, ctx.capacity
            )));
        }
        k.tiles.check(w.shape, ctx.capacity)?;
        let ((in_proj, segs), (o_proj, _)) = (w.in_proj.addresses(), w.o_proj.addresses());
        let nvfp4 = match (w.in_proj.is_nvfp4(), w.o_proj.is_nvfp4()) {
            (true, true) => {
                k.tiles.check_nvfp4(w.shape)?;
                Some(([in_proj[1], in_proj[2], o_proj[1], o_proj[2]], segs))
            }
            (false, false) => None,
            _ => return Err(Error::Buffer("QSA: the two projections must be in one format".to_owned())),
        };
        let a = Addresses {
            x: x.addr(),
            y: y.addr(),
            nvfp4,
            w: [
                in_proj[0],
                o_proj[0],
                w.q_norm.ptr().addr(),
                w.k_norm.ptr().addr(),
                w.index_q_norm.ptr().addr(),
                w.index_k_norm.ptr().addr(),
            ],
            ctx: [ctx.rope.ptr().addr(), ctx.position_at],
            caches: [
                caches.k.ptr_mut().addr(),
                caches.v.ptr_mut().addr(),
                caches.index_keys.ptr_mut().addr(),
                caches.block_keys.ptr_mut().addr(),
            ],
            s: [
                s.proj.ptr_mut().addr(),
                s.proj_partial.ptr_mut().addr(),
                s.proj_counters.ptr_mut().addr(),
                s.q.ptr_mut().addr(),
                s.gate.ptr_mut().addr(),
                s.index_q.ptr_mut().addr(),
                s.scores.ptr_mut().addr(),
                s.n_blocks.ptr_mut().addr(),
                s.selected.ptr_mut().addr(),
                s.count.ptr_mut().addr(),
                s.top_k.ptr_mut().addr(),
                s.partial_acc.ptr_mut().addr(),
                s.partial_ml.ptr_mut().addr(),
                s.o.ptr_mut().addr(),
                s.out_partial.ptr_mut().addr(),
                s.out_counters.ptr_mut().addr(),
            ],
        };
        Ok(QsaLaunches::build(w.shape, ctx.capacity, k.tiles.attention, &a))
    }

    /// The launches with every address 0: for checking a shape against tiles.
    pub fn unbound(shape: QsaShape, capacity: usize, attention: qsa_attention::Tiles) -> QsaLaunches {
        QsaLaunches::build(shape, capacity, attention, &Addresses::default())
    }

    fn build(sh: QsaShape, capacity: usize, attention: qsa_attention::Tiles, a: &Addresses) -> QsaLaunches {
        fn r<T>(addr: u64) -> DevPtr<T> {
            DevPtr::from_addr(addr)
        }
        fn w<T>(addr: u64) -> DevPtrMut<T> {
            DevPtrMut::from_addr(addr)
        }
        let u = |v: usize| v as u32;
        let [in_proj, o_proj, q_norm, k_norm, index_q_norm, index_k_norm] = a.w;
        let ([in_scales, in_scale2, o_scales, o_scale2], [seg1, seg2, seg3]) =
            a.nvfp4.unwrap_or(([0; 4], [u(sh.in_rows()); 3]));
        let [rope, position] = a.ctx;
        let [k_cache, v_cache, index_keys, block_keys] = a.caches;
        let [
            proj,
            proj_partial,
            proj_counters,
            q,
            gate,
            index_q,
            scores,
            n_blocks,
            selected,
            count,
            top_k,
            partial_acc,
            partial_ml,
            o,
            out_partial,
            out_counters,
        ] = a.s;
        let block_capacity = u(capacity / sh.block_tokens);
        let attention_args = qsa_attention::Args {
            q: r(q),
            k_cache: r(k_cache),
            v_cache: r(v_cache),
            selected: r(selected),
            position: r(position),
            partial_acc: w(partial_acc),
            partial_ml: w(partial_ml),
            q_heads: u(sh.q_heads),
            kv_heads: u(sh.kv_heads),
            head_dim: u(sh.head_dim),
            block_tokens: u(sh.block_tokens),
            top: u(sh.top),
            scale: 1.0 / (sh.head_dim as f32).sqrt(),
        };
        // The combine reads as many splits as the attention's grid has (0 where the shape does
        // not fit the tiles: `QsaTiles::check` reports that), and counts the live ones in the
        // attention's chunks.
        let splits = qsa_attention::Kernel::launch_dims(&attention, &attention_args).map_or(0, |d| d.grid[1]);
        QsaLaunches {
            in_proj: gemv_bf16::Args {
                w: r(in_proj),
                x: r(a.x),
                y: w(proj),
                partial: w(proj_partial),
                counters: w(proj_counters),
                rows: u(sh.in_rows()),
                cols: u(sh.hidden),
            },
            prepare: qsa_prepare::Args {
                proj: r(proj),
                q_norm: r(q_norm),
                k_norm: r(k_norm),
                index_q_norm: r(index_q_norm),
                index_k_norm: r(index_k_norm),
                rope: r(rope),
                position: r(position),
                q: w(q),
                gate: w(gate),
                k_cache: w(k_cache),
                v_cache: w(v_cache),
                index_q: w(index_q),
                index_keys: w(index_keys),
                block_keys: w(block_keys),
                q_heads: u(sh.q_heads),
                kv_heads: u(sh.kv_heads),
                head_dim: u(sh.head_dim),
                index_heads: u(sh.index_heads),
                index_dim: u(sh.index_dim),
                rotary: u(sh.rotary),
                block_tokens: u(sh.block_tokens),
                eps: sh.eps,
            },
            block_scores: qsa_block_scores::Args {
                index_q: r(index_q),
                block_keys: r(block_keys),
                position: r(position),
                scores: w(scores),
                n_blocks: w(n_blocks),
                heads: u(sh.index_heads),
                dim: u(sh.index_dim),
                block_tokens: u(sh.block_tokens),
                capacity: block_capacity,
                top: u(sh.top),
            },
            top_blocks: qsa_top_blocks::Args {
                scores: r(scores),
                n_blocks: r(n_blocks),
                selected: w(selected),
                count: w(count),
                capacity: block_capacity,
                top: u(sh.top),
            },
            top_blocks_grid: qsa_top_blocks_grid::Args {
                scores: r(scores),
                n_blocks: r(n_blocks),
                selected: w(selected),
                count: w(count),
                scratch: w(top_k),
                capacity: block_capacity,
                top: u(sh.top),
            },
            attention: attention_args,
            combine: qsa_attention_combine::Args {
                partial_acc: r(partial_acc),
                partial_ml: r(partial_ml),
                gate: r(gate),
                position: r(position),
                o: w(o),
                q_heads: u(sh.q_heads),
                head_dim: u(sh.head_dim),
                splits,
                chunk: attention.chunk,
                block_tokens: u(sh.block_tokens),
                top: u(sh.top),
            },
            o_proj: gemv_bf16::Args {
                w: r(o_proj),
                x: r(o),
                y: w(a.y),
                partial: w(out_partial),
                counters: w(out_counters),
                rows: u(sh.hidden),
                cols: u(sh.attn_dim()),
            },
            in_proj_nvfp4: gemv_nvfp4::Args {
                packed: r(in_proj),
                scales: r(in_scales),
                scale2: r(in_scale2),
                x: r(a.x),
                y: w(proj),
                partial: w(proj_partial),
                counters: w(proj_counters),
                rows: u(sh.in_rows()),
                cols: u(sh.hidden),
                seg1,
                seg2,
                seg3,
            },
            o_proj_nvfp4: gemv_nvfp4::Args {
                packed: r(o_proj),
                scales: r(o_scales),
                scale2: r(o_scale2),
                x: r(o),
                y: w(a.y),
                partial: w(out_partial),
                counters: w(out_counters),
                rows: u(sh.hidden),
                cols: u(sh.attn_dim()),
                seg1: u(sh.hidden),
                seg2: u(sh.hidden),
                seg3: u(sh.hidden),
            },
            nvfp4: a.nvfp4.is_some(),
        }
    }

    /// Enqueues one of the seven launches.
    ///
    /// # Safety
    /// The launches were built by [`QsaLaunches::new`] from buffers that are still alive, with
    /// `x` and `y` addressing `hidden` bf16 elements that overlap neither weights, caches, context
    /// nor scratch, and the context's position below its capacity (as
    /// [`QsaContext::set_position`] ensures).
    pub unsafe fn enqueue_stage(&self, gpu: &Gpu, k: &QsaKernels, stage: Stage) -> Result<()> {
        // SAFETY: every buffer behind the arguments was sized from the shape and the context's
        // capacity when it was made (the upload checks the weights' lengths against the shape,
        // `new` the capacities and the tiles); the caller vouches for x, y, the position and
        // liveness.
        unsafe {
            match stage {
                Stage::InProj if self.nvfp4 => k.in_proj_nvfp4.launch(gpu, &self.in_proj_nvfp4),
                Stage::InProj => k.in_proj.launch(gpu, &self.in_proj),
                Stage::Prepare => k.prepare.launch(gpu, &self.prepare),
                Stage::BlockScores => k.block_scores.launch(gpu, &self.block_scores),
                Stage::TopBlocks => match &k.top_k {
                    TopKKernel::OneBlock(t) => t.launch(gpu, &self.top_blocks),
                    TopKKernel::Grid(t) => t.launch(gpu, &self.top_blocks_grid),
                },
                Stage::Attention => k.attention.launch(gpu, &self.attention),
                Stage::Combine => k.combine.launch(gpu, &self.combine),
                Stage::OProj if self.nvfp4 => k.o_proj_nvfp4.launch(gpu, &self.o_proj_nvfp4),
                Stage::OProj => k.o_proj.launch(gpu, &self.o_proj),
            }
        }
    }

    /// Enqueues the pass: the seven launches in order.
    ///
    /// # Safety
    /// As for [`QsaLaunches::enqueue_stage`].
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &QsaKernels) -> Result<()> {
        for stage in Stage::ALL {
            // SAFETY: forwarded from the caller.
            unsafe { self.enqueue_stage(gpu, k, stage) }?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The combine counts the live splits from the position in the attention's chunks, and reads
    /// partials laid out by the attention's split count: both must come from the attention's
    /// tiles and words, whatever CHUNK the tiles hold.
    #[test]
    fn the_combine_reads_the_splits_as_the_attention_writes_them() {
        for chunk in [16, 32] {
            let attention = qsa_attention::Tiles { chunk, ..TileSet::DEFAULT };
            let a = Addresses { ctx: [0x1000, 0x2000], ..Addresses::default() };
            let l = QsaLaunches::build(PUBLISHED, 32_768, attention, &a);
            let dims = qsa_attention::Kernel::launch_dims(&attention, &l.attention).expect("the attention fits");
            assert_eq!(l.combine.chunk, chunk);
            assert_eq!(l.combine.splits, dims.grid[1], "CHUNK {chunk}");
            assert_eq!(l.combine.position.addr(), 0x2000);
            assert_eq!(l.attention.position.addr(), 0x2000);
            assert_eq!((l.combine.block_tokens, l.combine.top), (l.attention.block_tokens, l.attention.top));
            // The most tokens the attention attends to (the budget's blocks and a tail of
            // block_tokens − 1) fill every split but, at most, the last.
            let most = PUBLISHED.top * PUBLISHED.block_tokens + PUBLISHED.block_tokens - 1;
            assert_eq!(most.div_ceil(chunk as usize), dims.grid[1] as usize, "CHUNK {chunk}");
        }
    }

    #[test]
    fn long_contexts_take_the_multi_block_top_k() {
        let short = QsaTiles::for_capacity(PUBLISHED, 32_768);
        let long = QsaTiles::for_capacity(PUBLISHED, 131_072);
        assert!(matches!(short.top_k, TopK::OneBlock(_)), "{short:?}");
        assert!(matches!(long.top_k, TopK::Grid(_)), "{long:?}");
        assert_eq!(QsaTiles { top_k: short.top_k, ..long }, short, "only the top-k differs");
    }

    const PUBLISHED: QsaShape = QsaShape::PUBLISHED;

    #[test]
    fn published_shape_matches_the_embedded_config() {
        assert_eq!(QsaShape::from_config(&ModelConfig::published()).expect("shape"), QsaShape::PUBLISHED);
    }

    #[test]
    fn published_shape_sizes() {
        assert_eq!(PUBLISHED.in_rows(), 24 * 512 + 2 * 512 + 5 * 128);
        assert_eq!(PUBLISHED.capacity_for(32_768), 32_768);
        assert_eq!(PUBLISHED.capacity_for(100_001), 100_016);
        // ~51.4 M bf16 weights (MODEL.md: 0.62 B over 12 layers).
        let wb = PUBLISHED.weight_bytes(false) as f64;
        assert!((102.0e6..104.0e6).contains(&wb), "{wb}");
        // At 128k: the weights, 2,051 tokens of K/V (4.2 MB), 32k pooled keys (16.8 MB).
        let extra = (PUBLISHED.layer_bytes(131_070, false) - PUBLISHED.weight_bytes(false)) as f64;
        assert!((20.0e6..22.0e6).contains(&extra), "{extra}");
        // Dense while the blocks fit: 100 tokens attended.
        let dense = PUBLISHED.layer_bytes(99, false) - PUBLISHED.weight_bytes(false);
        assert!(dense > 4 * 100 * 512 && dense < 4 * 100 * 512 + 40_000, "{dense}");
    }

    #[test]
    fn default_tiles_fit_the_published_shape() {
        QsaTiles::default().check(PUBLISHED, PUBLISHED.capacity_for(131_072)).expect("default tiles");
        assert_eq!(QsaTiles::fitting(PUBLISHED), QsaTiles::default());
    }

    /// The small shapes of tests/gpu_qsa_layer.rs run at the tiles `fitting` picks.
    #[test]
    fn fitting_tiles_fit_small_shapes() {
        let tiny =
            QsaShape { hidden: 256, q_heads: 4, index_heads: 2, index_dim: 64, top: 4, rope_theta: 1e4, ..PUBLISHED };
        let gqa3 = QsaShape { q_heads: 6, head_dim: 128, index_heads: 3, index_dim: 32, rotary: 32, top: 3, ..tiny };
        for (sh, context) in [(tiny, 80), (tiny, 212), (gqa3, 61)] {
            let t = QsaTiles::fitting(sh);
            t.check(sh, sh.capacity_for(context)).unwrap_or_else(|e| panic!("{sh:?}: {e}"));
        }
        assert_eq!(QsaTiles::fitting(gqa3).attention.warps, 2);
        assert_eq!(QsaTiles::fitting(gqa3).o_proj.k_split, 1);
        assert_eq!(QsaTiles::fitting(tiny).o_proj.k_split, 4);
        // The attention's 3 blocks a key/value head lowered to what divides 2 and kept at 3.
        assert_eq!(QsaTiles::fitting(tiny).attention.head_blocks, 2);
        assert_eq!(QsaTiles::fitting(gqa3).attention.head_blocks, 3);
        // o_proj's NVFP4 GEMV: the row path at the published width, the split path where the
        // row path's columns do not fit (tiny's 1,024), lowered until it fits.
        assert_eq!(QsaTiles::fitting(PUBLISHED).o_proj_nvfp4, crate::kernels::gemv_nvfp4::ROW_PATH);
        for sh in [tiny, gqa3] {
            let t = QsaTiles::fitting(sh);
            assert_eq!(t.o_proj_nvfp4.rows, 0, "{sh:?}");
            t.check_nvfp4(sh).unwrap_or_else(|e| panic!("{sh:?}: {e}"));
        }
    }

    #[test]
    fn a_position_past_the_caches_is_refused() {
        assert!(check_position(0, 16).is_ok());
        assert!(check_position(15, 16).is_ok());
        match check_position(16, 16) {
            Err(Error::ContextTooLong { needed: 17, capacity: 16 }) => {}
            other => panic!("{other:?}"),
        }
    }
}
