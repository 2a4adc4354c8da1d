//! The PLE block's harness: `LAYERS` PLE layers with distinct weights, state and scratch, their
//! n-gram rows in one table in pinned host memory mapped for the device (read zero-copy over the
//! bus, as the step reads its table), in the plan's row format. Timed as the step runs PLE: the
//! ids of every layer and every layer's gather on a side stream forked at the start, joined, then
//! each layer's projections and gate/conv (the previous block's write folded in), all in one graph;
//! each replay hashes a new token (the history advances), so the rows differ from replay to replay.
//!
//! The table: each layer's hash has the published geometry (vocabulary, eos, orders, heads) with
//! its primes scaled down so that a layer holds about 2^17 rows (~42 MB of bf16 rows; 8 layers
//! ~330 MB, far beyond the L2); a gather's cost is the bus's round trip, not the table's size.
//!
//! Checked against `reference::ple` on layer 0 over 4 tokens from a zero conv state (its weights
//! made on the host, its rows decoded from the table as the gather returns them: bf16, or the NVFP4
//! dequantisation rounded to bf16): what the block added within 5e-2 relative L2 of the reference
//! at every token and 1e-2 over the tokens (tests/gpu_ple.rs's bounds: the √|a| gate amplifies
//! the projection's bf16 rounding near a = 0).

use engine::cuda::{DeviceBuffer, Gpu, MappedHostBuffer, SideStream};
use engine::layers::ple::{
    PleHashOnDevice, PleKernels, PleLaunches, PleScratch, PleShape, PleStateOnDevice, PleStreams, PleTiles,
    PleWeightsOnDevice, TableRows, enqueue_rows_on_side, table_row_bases,
};
use engine::model::config::ModelConfig;
use engine::model::ngram_hash::NgramHash;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::ple_table::{RowFormat, nvfp4_row_words};
use engine::model::weights::{Linear, PleWeights};
use engine::reference::ple::{PleState, ple as reference_ple};
use engine::synthetic;
use half::bf16;
use kernel_dsl::DevPtr;

use super::{Harness, LAYERS, Made, Rng, err, f32s, time_chain};

/// Rows of one layer's table, about.
const ROWS_PER_LAYER: u64 = 1 << 17;
/// Tokens of the check.
const TOKENS: usize = 4;

struct Ple<'g> {
    gpu: &'g Gpu,
    /// The model's config with the hash's primes scaled down (`ROWS_PER_LAYER`).
    cfg: ModelConfig,
    shape: PleShape,
    layers: Vec<PleWeightsOnDevice>,
    states: Vec<PleStateOnDevice>,
    scratch: Vec<PleScratch>,
    hash: PleHashOnDevice,
    token: DeviceBuffer<u32>,
    ids: DeviceBuffer<u64>,
    /// The rows of every layer; kept alive while the launches address it.
    _table: MappedHostBuffer<u8>,
    rows: Vec<TableRows>,
    inputs: Vec<DeviceBuffer<bf16>>,
    outputs: Vec<DeviceBuffer<bf16>>,
    write_y: DeviceBuffer<bf16>,
    write_gains: DeviceBuffer<f32>,
    side: SideStream,
    /// Layer 0's weights, its table rows decoded as the gather returns them.
    host: PleWeights,
    rng: Rng,
}

/// Uniform values of standard deviation ~1, four per draw, rounded to bf16.
fn fill_bf16_rows(rng: &mut Rng, out: &mut [u8]) {
    for chunk in out.chunks_mut(8) {
        let r = rng.next();
        for (i, v) in chunk.chunks_exact_mut(2).enumerate() {
            let u = ((r >> (16 * i)) & 0xffff) as f32 / 32768.0 - 1.0;
            v.copy_from_slice(&bf16::from_f32(1.7 * u).to_bits().to_le_bytes());
        }
    }
}

/// NVFP4 rows of `width`: random codes (every e2m1 code is finite) and e4m3 scales in [0.5, 1.9],
/// zeros after them.
fn fill_nvfp4_rows(rng: &mut Rng, out: &mut [u8], width: usize) {
    let row_bytes = 4 * nvfp4_row_words(width);
    let (codes, blocks) = (width / 2, width / 16);
    for row in out.chunks_exact_mut(row_bytes) {
        for b in &mut row[..codes] {
            *b = rng.next() as u8;
        }
        for b in &mut row[codes..codes + blocks] {
            *b = 0x30 + (rng.next() % 16) as u8;
        }
        row[codes + blocks..].fill(0);
    }
}

fn linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    Linear { rows, cols, w: f32s(&rng.bf16_normal(rows * cols, 1.0 / (cols as f32).sqrt())), bias: None }
}

/// The PLE harness for the step's PLE shape with rows in `format` and the projections in NVFP4
/// where `nvfp4_proj`.
pub fn ple<'g>(
    gpu: &'g Gpu,
    cfg: &ModelConfig,
    shape: PleShape,
    format: RowFormat,
    nvfp4_proj: bool,
) -> Made<'g, PleTiles> {
    let mut rng = Rng::fresh();
    let heads = shape.heads as u64;
    let mut small = cfg.clone();
    small.ngram_vocab_size_base = (ROWS_PER_LAYER / heads).saturating_sub(1024).max(1024);
    let hashes: Vec<NgramHash> = (0..LAYERS).map(|l| NgramHash::new(&small, l)).collect();
    let (bases, total_rows) = table_row_bases(&hashes);
    let width = shape.width;
    let row_bytes = format.row_bytes(width);
    let mut table = MappedHostBuffer::<u8>::new(gpu.context(), total_rows as usize * row_bytes).map_err(err)?;
    match format {
        RowFormat::Bf16 => fill_bf16_rows(&mut rng, table.as_mut_slice()),
        RowFormat::Nvfp4 => fill_nvfp4_rows(&mut rng, table.as_mut_slice(), width),
    }
    eprintln!(
        "[ple {}] {LAYERS} layers, {total_rows} rows of {row_bytes} B in pinned host memory ({:.0} MB)",
        if format == RowFormat::Nvfp4 { "nvfp4" } else { "bf16" },
        table.size_bytes() as f64 / 1e6
    );
    let scale_2 = |l: usize| 0.5 + 0.125 * l as f32;
    let rows: Vec<TableRows> = (0..LAYERS)
        .map(|l| match format {
            RowFormat::Bf16 => TableRows::Bf16(DevPtr::from_addr(table.ptr().addr())),
            RowFormat::Nvfp4 => TableRows::Nvfp4 {
                table: DevPtr::from_addr(table.ptr().addr()),
                row_words: nvfp4_row_words(width) as u32,
                scale_2: scale_2(l),
            },
        })
        .collect();
    // Layer 0's rows as the gather returns them.
    let n0 = hashes[0].rows_padded as usize;
    let bytes0 = &table.as_slice()[bases[0] as usize * row_bytes..(bases[0] as usize + n0) * row_bytes];
    let table0: Vec<f32> = match format {
        RowFormat::Bf16 => {
            bytes0.chunks_exact(2).map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()).collect()
        }
        RowFormat::Nvfp4 => {
            let (codes, blocks) = (width / 2, width / 16);
            let m = Nvfp4Matrix {
                rows: n0,
                cols: width,
                packed: bytes0.chunks_exact(row_bytes).flat_map(|r| r[..codes].iter().copied()).collect(),
                scales: bytes0.chunks_exact(row_bytes).flat_map(|r| r[codes..codes + blocks].iter().copied()).collect(),
                scale_2: scale_2(0),
            };
            m.dequantise().into_iter().map(|v| bf16::from_f32(v).to_f32()).collect()
        }
    };
    let (nd, p) = (shape.residual_width(), shape.embed_dim());
    let (mut key, mut value) = (linear(&mut rng, nd, p), linear(&mut rng, shape.hidden, p));
    // NVFP4 projections: the reference takes their dequantised values.
    let quantised = nvfp4_proj.then(|| [key.quantise_in_place(), value.quantise_in_place()]);
    let host = PleWeights {
        hash: hashes[0].clone(),
        table: table0,
        width,
        key,
        value,
        norm_key: f32s(&rng.bf16_normal(nd, 0.2)),
        norm_query: f32s(&rng.bf16_normal(nd, 0.2)),
        norm_conv: f32s(&rng.bf16_normal(nd, 0.2)),
        conv: f32s(&rng.bf16_normal(nd * shape.conv_kernel, 0.5)),
    };
    let nvfp4 = quantised.as_ref().map(|[k, v]| [k, v]);
    let mut layers = vec![PleWeightsOnDevice::upload(gpu, shape, &host, nvfp4).map_err(err)?];
    for l in 1..LAYERS {
        layers.push(synthetic::ple(gpu, shape, nvfp4_proj, 0x91e + l as u64).map_err(err)?);
    }
    let mut states = Vec::new();
    let mut scratch = Vec::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for _ in 0..LAYERS {
        let mut st = PleStateOnDevice::new(gpu, shape).map_err(err)?;
        gpu.fill_bytes(&mut st.conv, 0).map_err(err)?;
        states.push(st);
        scratch.push(PleScratch::new(gpu, shape).map_err(err)?);
        inputs.push(gpu.upload(&rng.bf16_normal(nd, 1.0)).map_err(err)?);
        outputs.push(gpu.alloc(nd).map_err(err)?);
    }
    let hash = PleHashOnDevice::new(gpu, &hashes).map_err(err)?;
    let ids = gpu.alloc(hash.ids_per_step()).map_err(err)?;
    let token = gpu.upload(&[(rng.next() % cfg.vocab_size as u64) as u32]).map_err(err)?;
    let write_y = gpu.upload(&rng.bf16_normal(shape.hidden, 1.0)).map_err(err)?;
    let write_gains = gpu.upload(&vec![0.5f32; shape.streams]).map_err(err)?;
    Ok(Some(Box::new(Ple {
        gpu,
        cfg: small,
        shape,
        layers,
        states,
        scratch,
        hash,
        token,
        ids,
        _table: table,
        rows,
        inputs,
        outputs,
        write_y,
        write_gains,
        side: SideStream::new(gpu).map_err(err)?,
        host,
        rng,
    })))
}

impl Ple<'_> {
    /// The first `n` layers' launches, each layer's ids among the step's.
    fn launches(&mut self, n: usize) -> Vec<PleLaunches> {
        let heads = self.shape.heads;
        (0..n)
            .map(|l| {
                let io = PleStreams {
                    input: self.inputs[l].ptr(),
                    post: Some((self.write_y.ptr(), self.write_gains.ptr())),
                    output: self.outputs[l].ptr_mut(),
                };
                let ids = self.ids.ptr().offset((l * heads) as u64);
                PleLaunches::new(&self.layers[l], &mut self.states[l], &mut self.scratch[l], self.rows[l], ids, io)
            })
            .collect()
    }
}

impl Harness<PleTiles> for Ple<'_> {
    fn measure(&mut self, tiles: &PleTiles) -> Result<f64, String> {
        let k = PleKernels::load(self.gpu, *tiles).map_err(err)?;
        let launches = self.launches(LAYERS);
        let gathers: Vec<_> = launches.iter().map(|l| l.gather).collect();
        let ids_args = self.hash.ids_args(self.token.ptr(), self.ids.ptr_mut());
        let (gpu, side) = (self.gpu, &self.side);
        time_chain(gpu, LAYERS, || {
            // SAFETY: the launches address this harness's weights, states, scratch, streams, ids
            // and table, alive for the graph; the hash's rows fit in the table (`table_row_bases`
            // over the same hashes sized it); inputs and outputs are distinct n·d buffers; nothing
            // on the main stream touches the token, history, ids or rows between fork and join.
            unsafe {
                enqueue_rows_on_side(gpu, side, &k, &ids_args, &gathers)?;
                side.join(gpu)?;
                launches.iter().try_for_each(|l| l.enqueue_block(gpu, &k))
            }
        })
    }

    fn verify(&mut self, tiles: &PleTiles) -> Result<(), String> {
        let k = PleKernels::load(self.gpu, *tiles).map_err(err)?;
        let (g, sh) = (self.gpu, self.shape);
        let (nd, d) = (sh.residual_width(), sh.hidden);
        self.hash.reset(g).map_err(err)?;
        g.fill_bytes(&mut self.states[0].conv, 0).map_err(err)?;
        let mut st = PleState::new(&self.cfg, &self.host);
        let l = self.launches(1).swap_remove(0);
        let ids_args = self.hash.ids_args(self.token.ptr(), self.ids.ptr_mut());
        let (mut err_sq, mut want_sq) = (0.0f64, 0.0f64);
        for step in 0..TOKENS {
            let tok = (self.rng.next() % self.cfg.vocab_size as u64) as u32;
            let x = self.rng.bf16_normal(nd, 1.0);
            let y = self.rng.bf16_normal(d, 1.0);
            let gains: Vec<f32> =
                (0..sh.streams).map(|_| 0.25 + 0.5 * (self.rng.next() % 1024) as f32 / 1024.0).collect();
            g.write(&mut self.token, &[tok]).map_err(err)?;
            g.write(&mut self.inputs[0], &x).map_err(err)?;
            g.write(&mut self.write_y, &y).map_err(err)?;
            g.write(&mut self.write_gains, &gains).map_err(err)?;
            g.fill_bytes(&mut self.outputs[0], 0xff).map_err(err)?;
            g.fill_bytes(&mut self.ids, 0xff).map_err(err)?;
            g.fill_bytes(&mut self.scratch[0].rows, 0xff).map_err(err)?;
            g.fill_bytes(&mut self.scratch[0].proj, 0xff).map_err(err)?;
            // SAFETY: as in `measure`, layer 0 alone, eagerly.
            unsafe {
                k.ids.launch(g, &ids_args).map_err(err)?;
                l.enqueue(g, &k).map_err(err)?;
            }
            let got = f32s(&g.download(&self.outputs[0]).map_err(err)?);
            if let Some(i) = got.iter().position(|v| !v.is_finite()) {
                return Err(format!("token {step}: output[{i}] = {} (unwritten?)", got[i]));
            }
            // The streams after the previous block's write, rounded as the device rounds them.
            let written: Vec<f32> = (0..nd)
                .map(|c| bf16::from_f32(gains[c / d].mul_add(y[c % d].to_f32(), x[c].to_f32())).to_f32())
                .collect();
            let want = reference_ple(&written, tok, &self.host, &self.cfg, &mut st);
            let added: Vec<f32> = got.iter().zip(&written).map(|(a, b)| a - b).collect();
            let e = super::rel_l2(&added, &want);
            if e >= 5e-2 {
                return Err(format!("token {step}: relative L2 {e:.2e} against the reference (5e-2 allowed)"));
            }
            err_sq += added.iter().zip(&want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum::<f64>();
            want_sq += want.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>();
        }
        let overall = (err_sq / want_sq.max(1e-30)).sqrt();
        if overall < 1e-2 {
            Ok(())
        } else {
            Err(format!("relative L2 {overall:.2e} over {TOKENS} tokens against the reference (1e-2 allowed)"))
        }
    }
}
