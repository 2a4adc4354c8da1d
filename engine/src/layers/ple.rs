//! PLE on the device: the n-gram hash constants of every PLE layer and the token history, on the
//! device for [`ple_ids`] (one launch per step for every PLE layer), and per PLE layer the row
//! gather ([`Gather`]: [`ple_gather_bf16`], or [`ple_gather_nvfp4`] dequantising NVFP4 rows to
//! bf16) from a table the device can address (mapped host memory:
//! [`crate::cuda::MappedHostBuffer`]), the key and value projections stacked in one GEMV
//! ([`gemv_bf16`], or [`gemv_nvfp4`] for NVFP4 weights: 18.4 MB a token instead of 65.5 at the
//! published shape), and [`ple_gate_conv`] (norms, gate, dilated conv with its state, the sum
//! into the streams).
//!
//! The table: [`PleTableOnHost`] holds the rows of a table file ([`crate::model::ple_table`]) in
//! pinned host memory, in the file's mapping registered in place, or in the mapping read through
//! the host's page tables. The rows never change while the engine runs, so no step can read a row
//! that is being replaced: there is no device-side cache of rows to evict.
//!
//! The residual streams here are f32 [n·d]; the block reads them and writes their sum with its
//! output to another buffer.
//!
//! One table holds every PLE layer's rows, layer after layer (each layer `rows_padded` rows, see
//! [`table_row_bases`]); the ids the kernel writes already include their layer's first row.

use cudarc::driver::sys::CUdevice_attribute;
use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, KernelDef, LaunchError, TileSet};
use memmap2::Mmap;

use crate::cuda::host_mapped::HostRegistration;
use crate::cuda::{DeviceBuffer, Gpu, LoadedKernel, MappedHostBuffer, SideStream};
use crate::error::{Error, Result};
use crate::kernels::gemv_bf16::gemv_bf16;
use crate::kernels::gemv_nvfp4::gemv_nvfp4;
use crate::kernels::ple::gate_conv::ple_gate_conv;
use crate::kernels::ple::gather_bf16::ple_gather_bf16;
use crate::kernels::ple::gather_nvfp4::ple_gather_nvfp4;
use crate::kernels::ple::ids::ple_ids;
use crate::layers::matrix::{MatrixOnDevice, matrix_bytes};
use crate::model::config::ModelConfig;
use crate::model::ngram_hash::NgramHash;
use crate::model::nvfp4::Nvfp4Matrix;
use crate::model::ple_table::{HEADER_BYTES, PleTableFile, RowFormat, TableHeader, nvfp4_row_words};
use crate::model::weights::PleWeights;

/// The first row of each PLE layer's rows in the one table, and the table's total rows.
pub fn table_row_bases(hashes: &[NgramHash]) -> (Vec<u64>, u64) {
    let mut bases = Vec::with_capacity(hashes.len());
    let mut total = 0u64;
    for h in hashes {
        bases.push(total);
        total += h.rows_padded;
    }
    (bases, total)
}

/// The hash constants of every PLE layer and the token history, on the device.
#[derive(Debug)]
pub struct PleHashOnDevice {
    /// [layers, ngram_size].
    multipliers: DeviceBuffer<u64>,
    /// [layers, heads].
    primes: DeviceBuffer<u64>,
    /// [layers, heads]: each head's first row in the one table (its layer's base included).
    offsets: DeviceBuffer<u64>,
    /// [ngram_size − 1]: the tokens before the next one, oldest first.
    history: DeviceBuffer<u32>,
    initial_history: Vec<u32>,
    layers: u32,
    heads: u32,
    heads_per_ngram: u32,
    ngram_size: u32,
    eos: u32,
}

impl PleHashOnDevice {
    /// The constants of `hashes` (the PLE layers in ascending order, all of one config), the
    /// history at the start of a sequence.
    pub fn new(gpu: &Gpu, hashes: &[NgramHash]) -> Result<PleHashOnDevice> {
        let first = hashes.first().ok_or_else(|| Error::Buffer("no PLE layer to hash for".into()))?;
        let (ngram_size, per_ngram, eos) = (first.ngram_size(), first.heads_per_ngram(), first.eos());
        let heads = first.primes.len();
        if ngram_size < 2 || heads != (ngram_size - 1) * per_ngram {
            return Err(Error::Buffer(format!(
                "PLE hash with n-gram size {ngram_size} and {per_ngram} heads per order has {heads} heads"
            )));
        }
        if hashes.iter().any(|h| h.ngram_size() != ngram_size || h.primes.len() != heads || h.eos() != eos) {
            return Err(Error::Buffer("PLE layers with different hash geometries".into()));
        }
        let (bases, _) = table_row_bases(hashes);
        let multipliers: Vec<u64> = hashes.iter().flat_map(|h| h.multipliers.iter().copied()).collect();
        let primes: Vec<u64> = hashes.iter().flat_map(|h| h.primes.iter().copied()).collect();
        let offsets: Vec<u64> =
            hashes.iter().zip(&bases).flat_map(|(h, &b)| h.offsets.iter().map(move |&o| o + b)).collect();
        let initial_history = first.initial_history();
        Ok(PleHashOnDevice {
            multipliers: gpu.upload(&multipliers)?,
            primes: gpu.upload(&primes)?,
            offsets: gpu.upload(&offsets)?,
            history: gpu.upload(&initial_history)?,
            initial_history,
            layers: hashes.len() as u32,
            heads: heads as u32,
            heads_per_ngram: per_ngram as u32,
            ngram_size: ngram_size as u32,
            eos,
        })
    }

    /// Ids per step: one per head of every PLE layer.
    pub fn ids_per_step(&self) -> usize {
        (self.layers * self.heads) as usize
    }

    /// Puts the history back to the start of a sequence (enqueued on the stream).
    pub fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.write(&mut self.history, &self.initial_history)
    }

    /// The history on the device, oldest first (waits for the stream).
    pub fn history(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        gpu.download(&self.history)
    }

    /// The launch that hashes `token[0]` into `ids` [`ids_per_step`](Self::ids_per_step) and
    /// advances the history by it.
    pub fn ids_args(&mut self, token: DevPtr<u32>, ids: DevPtrMut<u64>) -> ple_ids::Args {
        ple_ids::Args {
            token,
            history: self.history.ptr_mut(),
            multipliers: self.multipliers.ptr(),
            primes: self.primes.ptr(),
            offsets: self.offsets.ptr(),
            ids,
            layers: self.layers,
            heads: self.heads,
            heads_per_ngram: self.heads_per_ngram,
            ngram_size: self.ngram_size,
            eos: self.eos,
        }
    }
}

/// A table's rows where the device reads them, in their format.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TableRows {
    Bf16(DevPtr<bf16>),
    /// Rows of `row_words` words ([`crate::model::ple_table::nvfp4_row_words`]); `scale_2` is the
    /// layer's global scale.
    Nvfp4 {
        table: DevPtr<u32>,
        row_words: u32,
        scale_2: f32,
    },
}

/// One PLE layer's gather, in its table's format.
#[derive(Clone, Copy, Debug)]
pub enum Gather {
    Bf16(ple_gather_bf16::Args),
    Nvfp4(ple_gather_nvfp4::Args),
}

impl Gather {
    /// The `count` rows `ids` addresses in `table`, as bf16, into `rows` [count, width].
    pub fn new(table: TableRows, ids: DevPtr<u64>, rows: DevPtrMut<bf16>, count: usize, width: usize) -> Gather {
        match table {
            TableRows::Bf16(table) => Gather::Bf16(gather_args(table, ids, rows, count, width)),
            TableRows::Nvfp4 { table, row_words, scale_2 } => Gather::Nvfp4(ple_gather_nvfp4::Args {
                table,
                ids,
                rows,
                count: count as u32,
                width: width as u32,
                row_words,
                scale2: scale_2,
            }),
        }
    }

    /// Enqueues the gather on the side stream, or on the GPU's stream.
    ///
    /// # Safety
    /// As for [`LoadedKernel::launch`]: the table holds every row the ids address, `rows` count ×
    /// width values.
    pub unsafe fn launch(&self, gpu: &Gpu, k: &PleKernels, side: Option<&SideStream>) -> Result<()> {
        // SAFETY: the caller's guarantees.
        unsafe {
            match (self, side) {
                (Gather::Bf16(a), None) => k.gather.launch(gpu, a),
                (Gather::Bf16(a), Some(side)) => k.gather.launch_on(gpu, side.stream(), a),
                (Gather::Nvfp4(a), None) => k.gather_nvfp4.launch(gpu, a),
                (Gather::Nvfp4(a), Some(side)) => k.gather_nvfp4.launch_on(gpu, side.stream(), a),
            }
        }
    }
}

/// The launch that copies the `count` rows `ids` addresses in `table` (rows of `width` bf16) into
/// `rows` [count, width].
pub fn gather_args(
    table: DevPtr<bf16>,
    ids: DevPtr<u64>,
    rows: DevPtrMut<bf16>,
    count: usize,
    width: usize,
) -> ple_gather_bf16::Args {
    ple_gather_bf16::Args { table, ids, rows, count: count as u32, width: width as u32 }
}

/// The geometry of one PLE layer's block on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PleShape {
    /// Residual streams n.
    pub streams: usize,
    /// Channels per stream d.
    pub hidden: usize,
    /// Table rows per step (the hash heads) and the values per row.
    pub heads: usize,
    pub width: usize,
    pub conv_kernel: usize,
    /// The conv's dilation: the n-gram size.
    pub dilation: usize,
    pub eps: f32,
}

impl PleShape {
    pub fn from_config(cfg: &ModelConfig) -> Result<PleShape> {
        let heads = cfg.ngram_heads();
        if heads == 0 || !cfg.ple_embed_dim.is_multiple_of(heads) {
            return Err(Error::Buffer(format!("PLE width {} over {heads} heads", cfg.ple_embed_dim)));
        }
        if cfg.ple_conv_kernel < 2 {
            return Err(Error::Buffer(format!("a PLE conv of kernel {} has no state", cfg.ple_conv_kernel)));
        }
        Ok(PleShape {
            streams: cfg.hc_streams,
            hidden: cfg.hidden_size,
            heads,
            width: cfg.ple_embed_dim / heads,
            conv_kernel: cfg.ple_conv_kernel,
            dilation: cfg.ngram_size,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The gathered embedding's length: heads × width.
    pub fn embed_dim(&self) -> usize {
        self.heads * self.width
    }

    /// n·d.
    pub fn residual_width(&self) -> usize {
        self.streams * self.hidden
    }

    /// The rows of the stacked projection: the key's n·d, then the value's d.
    pub fn proj_rows(&self) -> usize {
        (self.streams + 1) * self.hidden
    }

    /// Bytes of the stacked projection's weights, bf16 or NVFP4 (two global scales).
    pub fn proj_bytes(&self, nvfp4: bool) -> usize {
        matrix_bytes(self.proj_rows(), self.embed_dim(), nvfp4, 2)
    }

    /// The conv state's rows: (kernel − 1)·dilation previous inputs.
    pub fn conv_depth(&self) -> usize {
        (self.conv_kernel - 1) * self.dilation
    }
}

/// One PLE layer's weights on the device (the table lives elsewhere: host memory).
#[derive(Debug)]
pub struct PleWeightsOnDevice {
    pub shape: PleShape,
    /// [(n + 1)·d, embed_dim]: key_proj's rows, then value_proj's; bf16, or NVFP4 with a
    /// global scale each.
    pub proj: MatrixOnDevice,
    /// [n·d] each.
    pub norm_key: DeviceBuffer<bf16>,
    pub norm_query: DeviceBuffer<bf16>,
    pub norm_conv: DeviceBuffer<bf16>,
    /// [n·d, kernel].
    pub conv: DeviceBuffer<bf16>,
}

impl PleWeightsOnDevice {
    /// The weights of `w` rounded to bf16, the projections from `nvfp4` (key, value) instead
    /// where given.
    pub fn upload(
        gpu: &Gpu,
        shape: PleShape,
        w: &PleWeights,
        nvfp4: Option<[&Nvfp4Matrix; 2]>,
    ) -> Result<PleWeightsOnDevice> {
        let (nd, p) = (shape.residual_width(), shape.embed_dim());
        let checks = [
            ("key_proj", w.key.rows * w.key.cols, nd * p),
            ("value_proj", w.value.rows * w.value.cols, shape.hidden * p),
            ("conv", w.conv.len(), nd * shape.conv_kernel),
        ];
        for (what, got, want) in checks {
            if got != want {
                return Err(Error::Buffer(format!("PLE {what} has {got} values, the shape needs {want}")));
            }
        }
        let bf = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&x| bf16::from_f32(x)).collect() };
        let proj = match nvfp4 {
            Some([key, value]) => {
                for (m, rows, what) in [(key, nd, "key_proj"), (value, shape.hidden, "value_proj")] {
                    if m.rows != rows || m.cols != p {
                        return Err(Error::Buffer(format!(
                            "PLE {what} in NVFP4 is [{}, {}], the shape needs [{rows}, {p}]",
                            m.rows, m.cols
                        )));
                    }
                }
                MatrixOnDevice::nvfp4(gpu, "PLE projections", &[key, value], p)?
            }
            None => {
                let stacked: Vec<bf16> = w.key.w.iter().chain(&w.value.w).map(|&x| bf16::from_f32(x)).collect();
                MatrixOnDevice::Bf16(gpu.upload(&stacked)?)
            }
        };
        Ok(PleWeightsOnDevice {
            shape,
            proj,
            norm_key: gpu.upload(&bf(&w.norm_key))?,
            norm_query: gpu.upload(&bf(&w.norm_query))?,
            norm_conv: gpu.upload(&bf(&w.norm_conv))?,
            conv: gpu.upload(&bf(&w.conv))?,
        })
    }
}

/// What one PLE layer carries from token to token on the device: the conv's previous inputs
/// [depth, n·d] f32, oldest first, zero at the start of a sequence. (The token history is shared
/// by every PLE layer: [`PleHashOnDevice`].)
#[derive(Debug)]
pub struct PleStateOnDevice {
    pub conv: DeviceBuffer<f32>,
}

impl PleStateOnDevice {
    pub fn new(gpu: &Gpu, shape: PleShape) -> Result<PleStateOnDevice> {
        Ok(PleStateOnDevice { conv: gpu.alloc(shape.conv_depth() * shape.residual_width())? })
    }
}

/// One PLE layer's scratch: the gathered rows, the projections, the GEMV's split-K partials and
/// counters.
#[derive(Debug)]
pub struct PleScratch {
    /// [embed_dim]: the rows, head after head.
    pub rows: DeviceBuffer<bf16>,
    /// [(n + 1)·d]: key, then value.
    pub proj: DeviceBuffer<bf16>,
    pub partial: DeviceBuffer<f32>,
    pub counters: DeviceBuffer<u32>,
}

/// The largest split-K the projection's scratch allows.
const MAX_PROJ_SPLIT: usize = 16;

impl PleScratch {
    pub fn new(gpu: &Gpu, shape: PleShape) -> Result<PleScratch> {
        let mut s = PleScratch {
            rows: gpu.alloc(shape.embed_dim())?,
            proj: gpu.alloc(shape.proj_rows())?,
            partial: gpu.alloc(MAX_PROJ_SPLIT * shape.proj_rows())?,
            counters: gpu.alloc(shape.proj_rows())?,
        };
        gpu.fill_bytes(&mut s.counters, 0)?;
        Ok(s)
    }
}

/// Tile choices for the PLE kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PleTiles {
    pub gather: ple_gather_bf16::Tiles,
    pub gather_nvfp4: ple_gather_nvfp4::Tiles,
    pub proj: gemv_bf16::Tiles,
    /// The projections' GEMV when their weights are NVFP4.
    pub proj_nvfp4: gemv_nvfp4::Tiles,
    pub gate_conv: ple_gate_conv::Tiles,
}

impl Default for PleTiles {
    fn default() -> Self {
        PleTiles {
            gather: ple_gather_bf16::Tiles::DEFAULT,
            gather_nvfp4: ple_gather_nvfp4::Tiles::DEFAULT,
            proj: gemv_bf16::Tiles::DEFAULT,
            // 12,800 × 2,560 at the published shape, about QSA's stacked input projection
            // (13,952 × 2,560): its tiles, whose first steps load before the wait.
            proj_nvfp4: gemv_nvfp4::Tiles { warps: 8, early: 8, ..TileSet::DEFAULT },
            gate_conv: ple_gate_conv::Tiles::DEFAULT,
        }
    }
}

impl PleTiles {
    /// Whether these tiles run `shape` with a table of `format` rows: each launch's requirements
    /// (the format's gather, the stacked projection within its scratch, the gate and conv), checked
    /// as a launch would with every address 0.
    pub fn check(&self, shape: PleShape, format: RowFormat) -> std::result::Result<(), LaunchError> {
        let (count, width) = (shape.heads, shape.width);
        match Gather::new(ple_table_rows_unbound(format, width), DevPtr::NULL, DevPtrMut::NULL, count, width) {
            Gather::Bf16(a) => ple_gather_bf16::Kernel::launch_dims(&self.gather, &a).map(|_| ())?,
            Gather::Nvfp4(a) => ple_gather_nvfp4::Kernel::launch_dims(&self.gather_nvfp4, &a).map(|_| ())?,
        }
        let proj = PleLaunches::unbound(shape, format).proj;
        proj_split_fits("gemv_bf16 (PLE projections)", &gemv_bf16::Kernel::launch_dims(&self.proj, &proj)?)?;
        ple_gate_conv::Kernel::launch_dims(&self.gate_conv, &PleLaunches::unbound(shape, format).gate_conv)?;
        Ok(())
    }

    /// Whether the projections' NVFP4 GEMV runs `shape` at these tiles, within its scratch.
    pub fn check_nvfp4(&self, shape: PleShape) -> std::result::Result<(), LaunchError> {
        let proj = PleLaunches::unbound(shape, RowFormat::Bf16).proj_nvfp4;
        proj_split_fits("gemv_nvfp4 (PLE projections)", &gemv_nvfp4::Kernel::launch_dims(&self.proj_nvfp4, &proj)?)
    }
}

/// Whether a projection GEMV's split-K (its grid's height) fits the scratch's partials.
fn proj_split_fits(kernel: &'static str, dims: &kernel_dsl::LaunchDims) -> std::result::Result<(), LaunchError> {
    if dims.grid[1] as usize > MAX_PROJ_SPLIT {
        return Err(LaunchError {
            kernel,
            message: format!("split-K {}: the scratch holds {MAX_PROJ_SPLIT}", dims.grid[1]),
        });
    }
    Ok(())
}

impl PleTiles {
    /// Tiles that run `shape` with either format's rows: each kernel at its default where that fits,
    /// else at its first candidate that does (the projection's GEMV trying a narrower vector
    /// first: a PLE width below 256 columns cannot take 32 lanes of 8). The result may still fail
    /// [`PleTiles::check`] where no candidate of some kernel fits: the plan refuses it then.
    pub fn fitting(shape: PleShape) -> PleTiles {
        // Each kernel against the others as chosen so far; the error names the kernel. The
        // format-independent kernels are checked with bf16 rows (the check stops at the first
        // error, and the NVFP4 gather comes first).
        let fails = |t: &PleTiles, kernel: &str| {
            let f = if kernel == "ple_gather_nvfp4" { RowFormat::Nvfp4 } else { RowFormat::Bf16 };
            t.check(shape, f).err().is_some_and(|e| e.kernel.contains(kernel))
        };
        /// `t` with the first of `tries` that `kernel` accepts put in by `set`, if it rejects `t`.
        fn refit<T: Copy>(
            t: PleTiles,
            kernel: &str,
            tries: impl IntoIterator<Item = T>,
            set: fn(&mut PleTiles, T),
            fails: &dyn Fn(&PleTiles, &str) -> bool,
        ) -> PleTiles {
            if !fails(&t, kernel) {
                return t;
            }
            let with = |v: T| {
                let mut c = t;
                set(&mut c, v);
                c
            };
            tries.into_iter().map(with).find(|c| !fails(c, kernel)).unwrap_or(t)
        }
        let d = PleTiles::default();
        let narrow = gemv_bf16::Tiles { vec: 4, ..d.proj };
        let proj = std::iter::once(narrow).chain(gemv_bf16::Tiles::candidates());
        let t = refit(d, "gemv_bf16", proj, |t, v| t.proj = v, &fails);
        let t = refit(t, "ple_gather_bf16", ple_gather_bf16::Tiles::candidates(), |t, v| t.gather = v, &fails);
        let t = refit(t, "ple_gather_nvfp4", ple_gather_nvfp4::Tiles::candidates(), |t, v| t.gather_nvfp4 = v, &fails);
        let mut t = refit(t, "ple_gate_conv", ple_gate_conv::Tiles::candidates(), |t, v| t.gate_conv = v, &fails);
        // The NVFP4 projections: the default where it fits, else the split lowered, then the
        // lanes a row; one that never fits keeps the default and `check_nvfp4` refuses it.
        let proj = PleLaunches::unbound(shape, RowFormat::Bf16).proj_nvfp4;
        let in_scratch = |d: &kernel_dsl::LaunchDims| proj_split_fits("", d).is_ok();
        if let Some(v) = crate::kernels::gemv_nvfp4::fitting(t.proj_nvfp4, &proj, in_scratch) {
            t.proj_nvfp4 = v;
        }
        t
    }
}

/// A table of `format` rows at address 0 (its global scale 1): for checking shapes.
fn ple_table_rows_unbound(format: RowFormat, width: usize) -> TableRows {
    match format {
        RowFormat::Bf16 => TableRows::Bf16(DevPtr::NULL),
        RowFormat::Nvfp4 => {
            TableRows::Nvfp4 { table: DevPtr::NULL, row_words: nvfp4_row_words(width) as u32, scale_2: 1.0 }
        }
    }
}

/// The PLE kernels, compiled.
#[derive(Debug)]
pub struct PleKernels {
    pub ids: LoadedKernel<ple_ids::Kernel>,
    pub gather: LoadedKernel<ple_gather_bf16::Kernel>,
    pub gather_nvfp4: LoadedKernel<ple_gather_nvfp4::Kernel>,
    pub proj: LoadedKernel<gemv_bf16::Kernel>,
    pub proj_nvfp4: LoadedKernel<gemv_nvfp4::Kernel>,
    pub gate_conv: LoadedKernel<ple_gate_conv::Kernel>,
}

impl PleKernels {
    pub fn load(gpu: &Gpu, tiles: PleTiles) -> Result<PleKernels> {
        if tiles.proj.k_split as usize > MAX_PROJ_SPLIT {
            return Err(Error::Buffer(format!("projection split-K {} over {MAX_PROJ_SPLIT}", tiles.proj.k_split)));
        }
        Ok(PleKernels {
            ids: gpu.kernel(ple_ids::Tiles::DEFAULT)?,
            gather: gpu.kernel(tiles.gather)?,
            gather_nvfp4: gpu.kernel(tiles.gather_nvfp4)?,
            proj: gpu.kernel(tiles.proj)?,
            proj_nvfp4: gpu.kernel(tiles.proj_nvfp4)?,
            gate_conv: gpu.kernel(tiles.gate_conv)?,
        })
    }
}

/// The residual streams a PLE block reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct PleStreams {
    /// X, bf16 [n, d], before the previous block's write.
    pub input: DevPtr<bf16>,
    /// The previous block's output y [d] and its write gains [n], applied to X first; None when
    /// the write was done before.
    pub post: Option<(DevPtr<bf16>, DevPtr<f32>)>,
    /// X + PLE(X), bf16 [n, d]; must not overlap `input`.
    pub output: DevPtrMut<bf16>,
}

/// The projections' GEMV in both formats: the weights' addresses and row boundaries
/// ([`MatrixOnDevice::addresses`]: values or codes, block scales, global scales) and the
/// scratch's (the gathered rows, the projections, the split-K partials and counters); 0 for a
/// shape check.
fn projection_args(
    sh: PleShape,
    (w, [seg1, seg2, seg3]): ([u64; 3], [u32; 3]),
    [rows, proj, partial, counters]: [u64; 4],
) -> (gemv_bf16::Args, gemv_nvfp4::Args) {
    let (out_rows, cols) = (sh.proj_rows() as u32, sh.embed_dim() as u32);
    let (x, y) = (DevPtr::from_addr(rows), DevPtrMut::from_addr(proj));
    let (partial, counters) = (DevPtrMut::from_addr(partial), DevPtrMut::from_addr(counters));
    (
        gemv_bf16::Args { w: DevPtr::from_addr(w[0]), x, y, partial, counters, rows: out_rows, cols },
        gemv_nvfp4::Args {
            packed: DevPtr::from_addr(w[0]),
            scales: DevPtr::from_addr(w[1]),
            scale2: DevPtr::from_addr(w[2]),
            x,
            y,
            partial,
            counters,
            rows: out_rows,
            cols,
            seg1,
            seg2,
            seg3,
        },
    )
}

/// The three launches of one PLE layer after the ids: gather, projections (in the weights'
/// format), gate and conv.
#[derive(Clone, Copy, Debug)]
pub struct PleLaunches {
    pub gather: Gather,
    pub proj: gemv_bf16::Args,
    pub proj_nvfp4: gemv_nvfp4::Args,
    /// Whether the projections' weights are NVFP4 (then `proj_nvfp4` runs).
    pub nvfp4: bool,
    pub gate_conv: ple_gate_conv::Args,
}

impl PleLaunches {
    /// `streams_out` = X + PLE(X) in bf16, for the PLE layer whose rows start at `ids` (its
    /// `heads` ids among the step's) in `table`, where X is `streams_in` after the previous
    /// block's write when `post` = (y, its gains) is given (then the mix site after this block
    /// takes none: the write happened here).
    pub fn new(
        w: &PleWeightsOnDevice,
        st: &mut PleStateOnDevice,
        s: &mut PleScratch,
        table: TableRows,
        ids: DevPtr<u64>,
        io: PleStreams,
    ) -> PleLaunches {
        let sh = w.shape;
        let PleStreams { input: streams_in, post, output: streams_out } = io;
        let (y, gains_prev) = post.map_or((0, 0), |(y, g)| (y.addr(), g.addr()));
        let scratch =
            [s.rows.ptr().addr(), s.proj.ptr_mut().addr(), s.partial.ptr_mut().addr(), s.counters.ptr_mut().addr()];
        let (proj, proj_nvfp4) = projection_args(sh, w.proj.addresses(), scratch);
        PleLaunches {
            gather: Gather::new(table, ids, s.rows.ptr_mut(), sh.heads, sh.width),
            proj,
            proj_nvfp4,
            nvfp4: w.proj.is_nvfp4(),
            gate_conv: ple_gate_conv::Args {
                proj: s.proj.ptr(),
                streams_in,
                y: DevPtr::from_addr(y),
                gains_prev: DevPtr::from_addr(gains_prev),
                norm_key: w.norm_key.ptr(),
                norm_query: w.norm_query.ptr(),
                norm_conv: w.norm_conv.ptr(),
                conv_w: w.conv.ptr(),
                conv_state: st.conv.ptr_mut(),
                streams_out,
                streams: sh.streams as u32,
                d: sh.hidden as u32,
                kernel_size: sh.conv_kernel as u32,
                dilation: sh.dilation as u32,
                eps: sh.eps,
                post: post.is_some(),
            },
        }
    }

    /// The launches with every address 0, no write before the block: for checking a shape
    /// against tiles.
    pub fn unbound(shape: PleShape, format: RowFormat) -> PleLaunches {
        let sh = shape;
        // Two matrices stacked: the key's n·d rows, then the value's.
        let rows = sh.proj_rows() as u32;
        let (proj, proj_nvfp4) = projection_args(sh, ([0; 3], [sh.residual_width() as u32, rows, rows]), [0; 4]);
        PleLaunches {
            gather: Gather::new(
                ple_table_rows_unbound(format, sh.width),
                DevPtr::NULL,
                DevPtrMut::NULL,
                sh.heads,
                sh.width,
            ),
            proj,
            proj_nvfp4,
            nvfp4: false,
            gate_conv: ple_gate_conv::Args {
                proj: DevPtr::NULL,
                streams_in: DevPtr::NULL,
                y: DevPtr::NULL,
                gains_prev: DevPtr::NULL,
                norm_key: DevPtr::NULL,
                norm_query: DevPtr::NULL,
                norm_conv: DevPtr::NULL,
                conv_w: DevPtr::NULL,
                conv_state: DevPtrMut::NULL,
                streams_out: DevPtrMut::NULL,
                streams: sh.streams as u32,
                d: sh.hidden as u32,
                kernel_size: sh.conv_kernel as u32,
                dilation: sh.dilation as u32,
                eps: sh.eps,
                post: false,
            },
        }
    }

    /// Enqueues the three launches.
    ///
    /// # Safety
    /// The buffers the launches were built from are alive; the table holds every row the ids can
    /// address; the streams' input and output hold n·d values and do not overlap.
    pub unsafe fn enqueue(&self, gpu: &Gpu, k: &PleKernels) -> Result<()> {
        // SAFETY: the caller's guarantees, and each buffer has the length its launch indexes.
        unsafe {
            self.gather.launch(gpu, k, None)?;
            self.enqueue_block(gpu, k)
        }
    }

    /// Enqueues the projections and the gate/conv only: the rows were gathered before (on a side
    /// stream by [`enqueue_rows_on_side`], joined back before this).
    ///
    /// # Safety
    /// As for [`enqueue`](Self::enqueue).
    pub unsafe fn enqueue_block(&self, gpu: &Gpu, k: &PleKernels) -> Result<()> {
        // SAFETY: the caller's guarantees, and each buffer has the length its launch indexes.
        unsafe {
            if self.nvfp4 {
                k.proj_nvfp4.launch(gpu, &self.proj_nvfp4)?;
            } else {
                k.proj.launch(gpu, &self.proj)?;
            }
            k.gate_conv.launch(gpu, &self.gate_conv)
        }
    }
}

/// Enqueues the step's ids and every PLE layer's gather (`gathers`, from [`PleLaunches`]) on
/// `side`, forked from the main stream here: call it as soon as the token is on the device (before
/// layer 0), so that hashing and the reads over the bus run beside layer 0; `side.join(gpu)` before
/// the first PLE layer's [`PleLaunches::enqueue_block`]. Nothing waits on the host; in a capture
/// the fork and the join become the graph's branches.
///
/// Why no row is overwritten while a step reads it: the rows land in each layer's own scratch,
/// and the fork orders this step's ids and gathers after everything the main stream enqueued
/// before, including the previous step's projections that read the previous rows; the join
/// orders this step's projections after the gathers. The table itself never changes.
///
/// # Safety
/// As for [`PleLaunches::enqueue`], and nothing on the main stream between the fork and the join
/// may write the token, the history, the ids or the rows.
pub unsafe fn enqueue_rows_on_side(
    gpu: &Gpu,
    side: &SideStream,
    k: &PleKernels,
    ids: &ple_ids::Args,
    gathers: &[Gather],
) -> Result<()> {
    side.fork(gpu)?;
    // SAFETY: the caller's guarantees; the side stream orders the gathers after the ids.
    unsafe {
        k.ids.launch_on(gpu, side.stream(), ids)?;
        for g in gathers {
            g.launch(gpu, k, Some(side))?;
        }
    }
    Ok(())
}

/// How the table's rows are made readable by the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Copied into pinned, device-mapped host memory ([`MappedHostBuffer`]).
    Pinned,
    /// The file's mapping registered in place: its pages locked in RAM and mapped for the device,
    /// no second copy.
    Registered,
    /// The file's mapping read through the host's page tables (the device must support pageable
    /// memory access: HMM or ATS, as on GB10): nothing is locked, rows fault in from the file.
    Pageable,
    /// Pinned when the rows fit in the host's available memory with 4 GiB to spare, pageable
    /// otherwise (an error where the device cannot read pageable memory).
    Auto,
}

/// The PLE table where the device reads it: host memory, never device memory.
#[derive(Debug)]
pub enum PleTableOnHost {
    Pinned { header: TableHeader, rows: MappedHostBuffer<u8> },
    Registered { header: TableHeader, mapping: HostRegistration<Mmap> },
    Pageable { header: TableHeader, mapping: Mmap },
}

/// `MemAvailable` of /proc/meminfo, in bytes; None where it cannot be read.
fn host_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl PleTableOnHost {
    /// Makes the rows of an opened table file readable by the device as `residency` says.
    pub fn load(gpu: &Gpu, file: PleTableFile, residency: Residency) -> Result<PleTableOnHost> {
        let (header, mapping) = file.into_parts();
        let pageable = gpu
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)
            .map(|v| v == 1)
            .unwrap_or(false);
        let residency = match residency {
            Residency::Auto => {
                let fits = host_available_bytes().is_some_and(|a| header.data_bytes() + (4 << 30) <= a);
                if fits || !pageable { Residency::Pinned } else { Residency::Pageable }
            }
            r => r,
        };
        Ok(match residency {
            Residency::Pinned => {
                let mut rows = MappedHostBuffer::<u8>::new(gpu.context(), mapping.len() - HEADER_BYTES)?;
                rows.as_mut_slice().copy_from_slice(&mapping[HEADER_BYTES..]);
                PleTableOnHost::Pinned { header, rows }
            }
            Residency::Registered => {
                PleTableOnHost::Registered { header, mapping: HostRegistration::new(gpu.context(), mapping)? }
            }
            Residency::Pageable | Residency::Auto => {
                if !pageable {
                    return Err(Error::Buffer(format!(
                        "{} cannot read pageable host memory, and the PLE table ({} bytes) must be pinned or registered",
                        gpu.info().name,
                        header.data_bytes()
                    )));
                }
                PleTableOnHost::Pageable { header, mapping }
            }
        })
    }

    pub fn header(&self) -> &TableHeader {
        match self {
            PleTableOnHost::Pinned { header, .. }
            | PleTableOnHost::Registered { header, .. }
            | PleTableOnHost::Pageable { header, .. } => header,
        }
    }

    /// The device address of row 0.
    fn rows_addr(&self) -> u64 {
        match self {
            PleTableOnHost::Pinned { rows, .. } => rows.ptr().addr(),
            PleTableOnHost::Registered { mapping, .. } => mapping.device_addr() + HEADER_BYTES as u64,
            // With pageable memory access the host's addresses are the device's.
            PleTableOnHost::Pageable { mapping, .. } => mapping.as_ptr() as u64 + HEADER_BYTES as u64,
        }
    }

    /// The rows for the gather of PLE layer `layer` (its global scale; the address is the
    /// table's, the ids carry the layer's first row).
    pub fn rows(&self, layer: usize) -> TableRows {
        let h = self.header();
        match h.format {
            RowFormat::Bf16 => TableRows::Bf16(DevPtr::from_addr(self.rows_addr())),
            RowFormat::Nvfp4 => TableRows::Nvfp4 {
                table: DevPtr::from_addr(self.rows_addr()),
                row_words: nvfp4_row_words(h.width as usize) as u32,
                scale_2: h.scale_2.get(layer).copied().unwrap_or(1.0),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED: PleShape =
        PleShape { streams: 4, hidden: 2560, heads: 16, width: 160, conv_kernel: 4, dilation: 3, eps: 1e-6 };

    /// The default tiles run the published shape in both row formats; the NVFP4 gather refuses
    /// rows narrower than its 32-value pieces, the projections a split past their scratch.
    #[test]
    fn tiles_are_checked_against_the_shape_and_format() {
        let t = PleTiles::default();
        t.check(PUBLISHED, RowFormat::Bf16).expect("bf16 rows");
        t.check(PUBLISHED, RowFormat::Nvfp4).expect("NVFP4 rows");
        let narrow = PleShape { width: 16, hidden: 256, ..PUBLISHED };
        t.check(narrow, RowFormat::Bf16).expect("bf16 rows of 16");
        let e = t.check(narrow, RowFormat::Nvfp4).expect_err("NVFP4 rows of 16").to_string();
        assert!(e.contains("ple_gather_nvfp4"), "{e}");
        let split = PleTiles { proj: gemv_bf16::Tiles { k_split: 16, vec: 4, ..TileSet::DEFAULT }, ..t };
        let wide = PleShape { heads: 32, width: 256, ..PUBLISHED };
        let e = split.check(wide, RowFormat::Bf16);
        assert!(e.is_ok(), "{e:?}: 8192 columns split 16 ways");
        assert!(split.check(PUBLISHED, RowFormat::Bf16).is_err(), "2560 columns do not split 16 ways");
    }

    /// Both formats' GEMV arguments address the weights and scratch they were given: the bf16
    /// values or the NVFP4 codes, block scales and global scales, the row boundaries, the rows in
    /// and the projections out, and the published shape's rows and columns.
    #[test]
    fn projection_args_bind_the_weights_and_scratch() {
        let (b, n) = projection_args(PUBLISHED, ([0x100, 0x200, 0x300], [10240, 12800, 12800]), [1, 2, 3, 4]);
        assert_eq!((b.w.addr(), n.packed.addr(), n.scales.addr(), n.scale2.addr()), (0x100, 0x100, 0x200, 0x300));
        assert_eq!((n.seg1, n.seg2, n.seg3), (10240, 12800, 12800));
        for (x, y, partial, counters) in [
            (b.x.addr(), b.y.addr(), b.partial.addr(), b.counters.addr()),
            (n.x.addr(), n.y.addr(), n.partial.addr(), n.counters.addr()),
        ] {
            assert_eq!((x, y, partial, counters), (1, 2, 3, 4));
        }
        assert_eq!((b.rows, b.cols, n.rows, n.cols), (12800, 2560, 12800, 2560));
        let unbound = PleLaunches::unbound(PUBLISHED, RowFormat::Nvfp4).proj_nvfp4;
        assert_eq!((unbound.seg1, unbound.seg2, unbound.seg3), (10240, 12800, 12800), "key rows, then value rows");
    }

    /// The NVFP4 projections: the defaults run the published shape; a narrow embedding (128
    /// columns, as the tiny checkpoints have) gets a GEMV that fits from `fitting`; a split past
    /// the scratch is refused by name.
    #[test]
    fn nvfp4_projections_are_fitted_and_checked() {
        PleTiles::default().check_nvfp4(PUBLISHED).expect("published");
        let narrow = PleShape { hidden: 256, heads: 16, width: 8, ..PUBLISHED };
        assert!(PleTiles::default().check_nvfp4(narrow).is_err(), "16 lanes of 16 values over 128 columns");
        let t = PleTiles::fitting(narrow);
        t.check_nvfp4(narrow).expect("fitted");
        assert_eq!(t.proj_nvfp4.lanes, 8, "{t:?}");
        let wide = PleShape { heads: 32, width: 1024, ..PUBLISHED };
        let split = PleTiles { proj_nvfp4: gemv_nvfp4::Tiles { k_split: 8, ..t.proj_nvfp4 }, ..t };
        split.check_nvfp4(wide).expect("8 splits");
        assert!(split.check_nvfp4(PUBLISHED).is_err(), "2560 columns in 8 splits of 8-lane steps");
    }
}
