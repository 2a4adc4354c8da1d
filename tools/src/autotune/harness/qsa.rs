//! The QSA layer's harness: `LAYERS` layers with distinct weights and their own caches, decoding
//! at the last position of the plan's caches (32,768 tokens by default: 8,192 complete blocks
//! against a budget of 512, so the top-k selects), one shared scratch and context as in the step.
//! Timed: the seven launches of every layer in one graph. The projections are in the format the
//! step runs them in: bf16 (`gemv_bf16`) or NVFP4 (`gemv_nvfp4` at `QsaTiles::{in_proj_nvfp4,
//! o_proj_nvfp4}`, the four stacked matrices with their own global scales).
//!
//! Checked against `reference::qsa` on layer 0: its weights made on the host (the index
//! projection four ±1 or ±½ a row, inputs on a grid of quarter integers, so the index scores are
//! exact on both sides, as tests/gpu_qsa_layer.rs has them), its caches filled on the device and
//! read back as the reference's state. In NVFP4 the host's matrices are quantised, uploaded as
//! such, and the reference runs on their dequantised values; the index rows quantise exactly (±1
//! and ±½ are codes 6 and 3 under block scales 448 and 224), and every 16 inputs hold a ±2, so
//! the GEMV's f16 staging of x (each 16 divided by their largest magnitude) is exact too and the
//! index scores stay exact up to f32 rounding. The token completes a block, so prepare's pooled key is
//! checked too. The block scores within 1e-4 relative L2 of the reference's, the selection exactly
//! the top-k of the device's own scores, the output within 1e-2 of the reference's when the
//! selections agree; where they differ only at a near tie of the k-th score, a fresh input is
//! tried (three at most).

use engine::cuda::{DeviceBuffer, Gpu};
use engine::layers::qsa::{
    QsaCaches, QsaContext, QsaKernels, QsaLaunches, QsaScratch, QsaShape, QsaTiles, QsaWeightsOnDevice,
};
use engine::model::config::ModelConfig;
use engine::model::weights::{Linear, QsaWeights};
use engine::reference::fill::Uniform;
use engine::reference::qsa::{QsaState, block_scores, qsa_traced, top_blocks};
use engine::reference::rope::Rope;
use engine::synthetic::{self, Fills};
use half::bf16;

use super::{Harness, LAYERS, Made, Rng, err, f32s, rel_l2, time_chain};

struct Qsa<'g> {
    gpu: &'g Gpu,
    cfg: ModelConfig,
    shape: QsaShape,
    position: usize,
    layers: Vec<QsaWeightsOnDevice>,
    ctx: QsaContext,
    caches: Vec<QsaCaches>,
    scratch: QsaScratch,
    xs: Vec<DeviceBuffer<bf16>>,
    ys: Vec<DeviceBuffer<bf16>>,
    /// Layer 0's weights and caches (tokens before `position`) on the host.
    host: QsaWeights,
    state: QsaState,
    rope: Rope,
    rng: Rng,
}

/// Four nonzeros a row, each ±1 or ±½.
fn sparse_linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    let mut w = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for _ in 0..4 {
            let c = (rng.next() % cols as u64) as usize;
            let v = if rng.next().is_multiple_of(2) { 1.0 } else { 0.5 };
            w[r * cols + c] = if rng.next().is_multiple_of(2) { v } else { -v };
        }
    }
    Linear { rows, cols, w, bias: None }
}

fn linear(rng: &mut Rng, rows: usize, cols: usize) -> Linear {
    Linear { rows, cols, w: f32s(&rng.bf16_normal(rows * cols, 1.0 / (cols as f32).sqrt())), bias: None }
}

fn host_weights(rng: &mut Rng, sh: QsaShape) -> QsaWeights {
    let d = sh.hidden;
    QsaWeights {
        q: linear(rng, 2 * sh.attn_dim(), d),
        k: linear(rng, sh.kv_dim(), d),
        v: linear(rng, sh.kv_dim(), d),
        o: linear(rng, d, sh.attn_dim()),
        q_norm: f32s(&rng.bf16_normal(sh.head_dim, 0.2)),
        k_norm: f32s(&rng.bf16_normal(sh.head_dim, 0.2)),
        index_qk: sparse_linear(rng, (sh.index_heads + 1) * sh.index_dim, d),
        index_q_norm: f32s(&rng.bf16_normal(sh.index_dim, 0.2)),
        index_k_norm: f32s(&rng.bf16_normal(sh.index_dim, 0.2)),
    }
}

/// Inputs on a grid of quarter integers in [−2, 2], each 16 of them (one chunk of the NVFP4
/// GEMV's staging) holding a ±2 at a random place.
fn grid_input(rng: &mut Rng, n: usize) -> Vec<bf16> {
    let mut x: Vec<f32> = (0..n).map(|_| ((rng.next() % 17) as f32 - 8.0) / 4.0).collect();
    for chunk in x.chunks_mut(16) {
        let i = (rng.next() % chunk.len() as u64) as usize;
        chunk[i] = if rng.next().is_multiple_of(2) { 2.0 } else { -2.0 };
    }
    x.into_iter().map(bf16::from_f32).collect()
}

/// Layer 0's weights on the device: bf16, or NVFP4 quantised from `host`, whose projections then
/// become the dequantised values (what the device multiplies by).
fn upload_layer0(gpu: &Gpu, shape: QsaShape, host: &mut QsaWeights, nvfp4: bool) -> Result<QsaWeightsOnDevice, String> {
    if !nvfp4 {
        return QsaWeightsOnDevice::upload_bf16(gpu, shape, host).map_err(err);
    }
    // The reference takes the dequantised values (uploading reads only the NVFP4 forms).
    let [wq, wk, wv, wi, wo] =
        [&mut host.q, &mut host.k, &mut host.v, &mut host.index_qk, &mut host.o].map(Linear::quantise_in_place);
    QsaWeightsOnDevice::upload(gpu, shape, host, Some(([&wq, &wk, &wv, &wi], &wo))).map_err(err)
}

/// The QSA harness for caches of `capacity` tokens (the plan's), decoding at `capacity − 1`, the
/// projections in NVFP4 where `nvfp4`.
pub fn qsa<'g>(gpu: &'g Gpu, cfg: &ModelConfig, shape: QsaShape, capacity: usize, nvfp4: bool) -> Made<'g, QsaTiles> {
    let mut rng = Rng::fresh();
    let ctx = QsaContext::new(gpu, shape, capacity).map_err(err)?;
    let position = ctx.capacity() - 1;
    let c = shape.block_tokens;
    if position / c <= shape.top {
        return Err(format!(
            "QSA: {} tokens of cache hold {} blocks, within the budget of {}: the top-k would not select",
            ctx.capacity(),
            position / c,
            shape.top
        ));
    }
    eprintln!(
        "[qsa {}] {LAYERS} layers, caches of {} tokens, decoding at position {position} ({} blocks, {} kept)",
        if nvfp4 { "nvfp4" } else { "bf16" },
        ctx.capacity(),
        (position + 1) / c,
        shape.top
    );
    let mut host = host_weights(&mut rng, shape);
    let mut layers = vec![upload_layer0(gpu, shape, &mut host, nvfp4)?];
    for l in 1..LAYERS {
        layers.push(synthetic::qsa(gpu, shape, nvfp4, 0x95a + l as u64).map_err(err)?);
    }
    // Caches: keys and values of standard deviation 1, raw index keys likewise, pooled keys
    // leaning positive (as normed keys do), every layer its own.
    let fills = Fills::load(gpu).map_err(err)?;
    let mut caches = Vec::new();
    for l in 0..LAYERS {
        let mut cc = QsaCaches::new(gpu, shape, &ctx).map_err(err)?;
        let seed = 0xcac4e + 16 * l as u64 + (rng.next() << 8);
        fills.bf16(gpu, &mut cc.k, seed, Uniform::with_std(1.0)).map_err(err)?;
        fills.bf16(gpu, &mut cc.v, seed + 1, Uniform::with_std(1.0)).map_err(err)?;
        fills.f32(gpu, &mut cc.index_keys, seed + 2, Uniform::with_std(1.0)).map_err(err)?;
        fills.f32(gpu, &mut cc.block_keys, seed + 3, Uniform::new(-1.5, 1.9)).map_err(err)?;
        caches.push(cc);
    }
    let (kv, di) = (shape.kv_dim(), shape.index_dim);
    let k = f32s(&gpu.download(&caches[0].k).map_err(err)?);
    let v = f32s(&gpu.download(&caches[0].v).map_err(err)?);
    let index_keys = gpu.download(&caches[0].index_keys).map_err(err)?;
    let block_keys = gpu.download(&caches[0].block_keys).map_err(err)?;
    let state = QsaState {
        keys: k[..position * kv].chunks(kv).map(<[f32]>::to_vec).collect(),
        values: v[..position * kv].chunks(kv).map(<[f32]>::to_vec).collect(),
        index_keys: index_keys[..position * di].chunks(di).map(<[f32]>::to_vec).collect(),
        block_keys: block_keys[..position / c * di].chunks(di).map(<[f32]>::to_vec).collect(),
    };
    let scratch = QsaScratch::new(gpu, shape, &ctx).map_err(err)?;
    let xs = (0..LAYERS)
        .map(|_| gpu.upload(&grid_input(&mut rng, shape.hidden)))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let ys = (0..LAYERS).map(|_| gpu.alloc(shape.hidden)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    Ok(Some(Box::new(Qsa {
        gpu,
        cfg: cfg.clone(),
        shape,
        position,
        layers,
        ctx,
        caches,
        scratch,
        xs,
        ys,
        host,
        state,
        rope: Rope::new(shape.rope_theta, shape.rotary),
        rng,
    })))
}

impl Qsa<'_> {
    fn launches(&mut self, k: &QsaKernels, n: usize) -> Result<Vec<QsaLaunches>, String> {
        self.ctx.set_position(self.gpu, self.position).map_err(err)?;
        (0..n)
            .map(|l| {
                QsaLaunches::new(
                    k,
                    &self.layers[l],
                    &mut self.ctx,
                    &mut self.caches[l],
                    &mut self.scratch,
                    self.xs[l].ptr(),
                    self.ys[l].ptr_mut(),
                )
                .map_err(err)
            })
            .collect()
    }

    /// One token through layer 0 on a fresh input: Ok(true) when it matches the reference,
    /// Ok(false) at a near tie of the selection (no verdict), Err when wrong.
    fn check_once(&mut self, k: &QsaKernels) -> Result<bool, String> {
        let (g, sh, pos) = (self.gpu, self.shape, self.position);
        let x = grid_input(&mut self.rng, sh.hidden);
        g.write(&mut self.xs[0], &x).map_err(err)?;
        g.fill_bytes(&mut self.ys[0], 0xff).map_err(err)?;
        let s = &mut self.scratch;
        for b in [&mut s.scores, &mut s.q, &mut s.gate, &mut s.index_q, &mut s.partial_acc, &mut s.partial_ml] {
            g.fill_bytes(b, 0xff).map_err(err)?;
        }
        for b in [&mut s.selected, &mut s.count, &mut s.n_blocks] {
            g.fill_bytes(b, 0xff).map_err(err)?;
        }
        let l = self.launches(k, 1)?.swap_remove(0);
        // SAFETY: the launches address this harness's weights, caches, context and scratch, alive
        // for the call; x and y are separate buffers of `hidden` values; the position is below the
        // capacity (`set_position` checked it).
        unsafe { l.enqueue(g, k) }.map_err(err)?;
        let y = f32s(&g.download(&self.ys[0]).map_err(err)?);
        let scores = g.download(&self.scratch.scores).map_err(err)?;
        let selected = g.download(&self.scratch.selected).map_err(err)?;
        let count = g.download(&self.scratch.count).map_err(err)?[0] as usize;

        let st = &mut self.state;
        let lens = (st.keys.len(), st.values.len(), st.index_keys.len(), st.block_keys.len());
        let trace = qsa_traced(&f32s(&x), pos, &self.host, &self.cfg, &self.rope, st);
        let complete = (pos + 1) / sh.block_tokens;
        let want_scores = block_scores(&trace.index_q, &st.block_keys[..complete]);
        st.keys.truncate(lens.0);
        st.values.truncate(lens.1);
        st.index_keys.truncate(lens.2);
        st.block_keys.truncate(lens.3);

        if let Some(i) = y.iter().position(|v| !v.is_finite()) {
            return Err(format!("y[{i}] = {} (unwritten?)", y[i]));
        }
        if count != sh.top {
            return Err(format!("{count} blocks selected, {} wanted", sh.top));
        }
        let e = rel_l2(&scores[..complete], &want_scores);
        if e >= 1e-4 {
            return Err(format!("block scores: relative L2 {e:.2e} against the reference (1e-4 allowed)"));
        }
        let got: Vec<usize> = selected[..count].iter().map(|&b| b as usize).collect();
        if got != top_blocks(&scores[..complete], sh.top) {
            return Err("the selection is not the top-k of the device's own scores".into());
        }
        let want = top_blocks(&want_scores, sh.top);
        if got != want {
            // Only a near tie at the k-th score may differ.
            let mut sorted = want_scores.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let (kth, scale) = (sorted[sh.top - 1], sorted[0].abs().max(1.0));
            let differ = got.iter().filter(|b| !want.contains(b)).chain(want.iter().filter(|b| !got.contains(b)));
            for &b in differ {
                if (want_scores[b] - kth).abs() > 1e-5 * scale {
                    return Err(format!("block {b} is in one selection only, not at a near tie"));
                }
            }
            return Ok(false);
        }
        let e = rel_l2(&y, &trace.y);
        if e < 1e-2 { Ok(true) } else { Err(format!("y: relative L2 {e:.2e} against the reference (1e-2 allowed)")) }
    }
}

impl Harness<QsaTiles> for Qsa<'_> {
    fn measure(&mut self, tiles: &QsaTiles) -> Result<f64, String> {
        let k = QsaKernels::load(self.gpu, *tiles).map_err(err)?;
        let launches = self.launches(&k, LAYERS)?;
        let gpu = self.gpu;
        // SAFETY: as in `check_once`, for every layer (each its own caches, x and y; the scratch
        // shared as the step shares it, the layers in order on one stream).
        time_chain(gpu, LAYERS, || launches.iter().try_for_each(|l| unsafe { l.enqueue(gpu, &k) }))
    }

    fn verify(&mut self, tiles: &QsaTiles) -> Result<(), String> {
        let k = QsaKernels::load(self.gpu, *tiles).map_err(err)?;
        for _ in 0..3 {
            if self.check_once(&k)? {
                return Ok(());
            }
        }
        Err("three inputs in a row selected differently at a near tie: no verdict".into())
    }
}
