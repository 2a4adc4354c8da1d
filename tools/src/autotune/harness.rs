//! The timed side of the autotuner (needs a GPU): per family, layers with distinct weights made
//! on the device beyond the L2, captured as one graph and replayed (CUDA events, the median), and
//! one layer's output checked against the CPU reference (`engine::reference`) with fresh inputs.
//! QSA ([`qsa`]) and PLE ([`ple`]) have their own modules.

use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::layers::gdn::{
    GdnKernels, GdnLaunches, GdnScratch, GdnShape, GdnStateOnDevice, GdnTiles, GdnWeightsOnDevice,
};
use engine::layers::lm_head::{LmHead, LmHeadTiles, LmHeadWeights};
use engine::layers::mix::{
    MixIo, MixKernels, MixLaunches, MixMatrices, MixScratch, MixShape, MixTiles, MixWeightsOnDevice,
};
use engine::layers::moe::{
    ExpertsOnDevice, MoeKernels, MoeLaunches, MoeScratch, MoeShape, MoeTiles, MoeWeightsOnDevice,
};
use engine::layers::paired_codes;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::{Linear, MixWeights};
use engine::{reference, synthetic};
use half::bf16;

use super::Harness;

mod ple;
mod qsa;

pub use ple::ple;
pub use qsa::qsa;

type Made<'g, S> = Result<Option<Box<dyn Harness<S> + 'g>>, String>;

/// Layers with distinct weights in one timed graph: 8 MoE layers are ~11 GB of NVFP4 experts, far
/// beyond the 60 MB L2, as the benches have them.
const LAYERS: usize = 8;
/// Timed replays per candidate; the median counts.
const SAMPLES: usize = 30;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The median device time of `SAMPLES` replays of `g` (one untimed first), seconds.
/// µs per unit of the `units` chained launches `record` enqueues: run once eagerly (modules load
/// at their first launch, which a capture cannot do), then captured and replayed.
fn time_chain(gpu: &Gpu, units: usize, mut record: impl FnMut() -> engine::Result<()>) -> Result<f64, String> {
    record().map_err(err)?;
    let g = gpu.capture(&mut record).map_err(err)?;
    Ok(median_replay(gpu, &g)? / units as f64 * 1e6)
}

fn median_replay(gpu: &Gpu, g: &Graph) -> Result<f64, String> {
    let t = EventTimer::new(gpu).map_err(err)?;
    g.launch().map_err(err)?;
    let mut v = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        t.start(gpu).map_err(err)?;
        g.launch().map_err(err)?;
        v.push(t.stop(gpu).map_err(err)?.as_secs_f64());
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Fresh random inputs for each check: a splitmix64 seeded from the clock.
struct Rng(u64);

impl Rng {
    fn fresh() -> Rng {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        Rng(t | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Roughly normal (sum of four uniforms), standard deviation `std`, rounded to bf16.
    fn bf16_normal(&mut self, n: usize, std: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| {
                let s: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).sum();
                bf16::from_f32(s * std * 1.732)
            })
            .collect()
    }
}

fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// ‖a − b‖ / ‖b‖, infinite when a has a value that is not finite.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() || a.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The MoE block: `LAYERS` layers of synthetic weights; the check downloads layer 0's weights
/// once and runs the reference on the experts the CPU router picks (tests/gpu_moe.rs's tolerance:
/// the bf16 output within 1e-2 relative L2).
struct Moe<'g> {
    gpu: &'g Gpu,
    shape: MoeShape,
    layers: Vec<MoeWeightsOnDevice>,
    scratch: Vec<MoeScratch>,
    xs: Vec<DeviceBuffer<bf16>>,
    ys: Vec<DeviceBuffer<bf16>>,
    host: Option<MoeHost>,
    rng: Rng,
}

/// Layer 0's weights on the host, as stored on the device.
struct MoeHost {
    router: Linear,
    shared_gate: Vec<f32>,
    /// NVFP4: codes, scales, global scales of gate/up and of down; bf16: values in `codes` as f32.
    gate_up: Stacked,
    down: Stacked,
}

enum Stacked {
    Nvfp4 { packed: Vec<u8>, scales: Vec<u8>, scale2: Vec<f32> },
    Bf16(Vec<bf16>),
}

impl Stacked {
    /// Rows `row0..row0 + rows` of `cols` values (global scale `s2`) as a linear map.
    fn linear(&self, row0: usize, rows: usize, cols: usize, s2: usize) -> Linear {
        let w = match self {
            Stacked::Nvfp4 { packed, scales, scale2 } => Nvfp4Matrix {
                rows,
                cols,
                packed: packed[row0 * cols / 2..(row0 + rows) * cols / 2].to_vec(),
                scales: scales[row0 * cols / 16..(row0 + rows) * cols / 16].to_vec(),
                scale_2: scale2[s2],
            }
            .dequantise(),
            Stacked::Bf16(v) => f32s(&v[row0 * cols..(row0 + rows) * cols]),
        };
        Linear { rows, cols, w, bias: None }
    }
}

pub fn moe(gpu: &Gpu, shape: MoeShape, nvfp4: bool) -> Made<'_, MoeTiles> {
    let layers = (0..LAYERS)
        .map(|l| synthetic::moe(gpu, shape, nvfp4, 0x7e57 + l as u64))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let scratch = (0..LAYERS).map(|_| MoeScratch::new(gpu, shape)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    let mut rng = Rng::fresh();
    let xs = (0..LAYERS)
        .map(|_| gpu.upload(&rng.bf16_normal(shape.hidden, 1.0)))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let ys = (0..LAYERS).map(|_| gpu.alloc(shape.hidden)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    Ok(Some(Box::new(Moe { gpu, shape, layers, scratch, xs, ys, host: None, rng })))
}

impl Moe<'_> {
    fn launches(&mut self) -> Vec<MoeLaunches> {
        (0..LAYERS)
            .map(|l| MoeLaunches::new(&self.layers[l], &mut self.scratch[l], self.xs[l].ptr(), self.ys[l].ptr_mut()))
            .collect()
    }

    fn host(&mut self) -> Result<&MoeHost, String> {
        if self.host.is_none() {
            let (g, w, sh) = (self.gpu, &self.layers[0], self.shape);
            let (gate_up, down) = match &w.experts {
                ExpertsOnDevice::Nvfp4 {
                    gate_up_packed,
                    gate_up_scales,
                    gate_up_scale2,
                    down_packed,
                    down_scales,
                    down_scale2,
                } => {
                    let bytes = |v: Vec<kernel_dsl::E2m1x2>| v.into_iter().map(|b| b.0).collect::<Vec<u8>>();
                    let codes = |v: Vec<kernel_dsl::E4m3>| v.into_iter().map(|b| b.0).collect::<Vec<u8>>();
                    (
                        Stacked::Nvfp4 {
                            packed: paired_codes::download(g, gate_up_packed).map_err(err)?,
                            scales: codes(g.download(gate_up_scales).map_err(err)?),
                            scale2: g.download(gate_up_scale2).map_err(err)?,
                        },
                        Stacked::Nvfp4 {
                            packed: bytes(g.download(down_packed).map_err(err)?),
                            scales: codes(g.download(down_scales).map_err(err)?),
                            scale2: g.download(down_scale2).map_err(err)?,
                        },
                    )
                }
                ExpertsOnDevice::Bf16 { gate_up, down } => {
                    (Stacked::Bf16(g.download(gate_up).map_err(err)?), Stacked::Bf16(g.download(down).map_err(err)?))
                }
            };
            self.host = Some(MoeHost {
                router: Linear {
                    rows: sh.experts,
                    cols: sh.hidden,
                    w: f32s(&g.download(&w.router).map_err(err)?),
                    bias: None,
                },
                shared_gate: f32s(&g.download(&w.shared_gate).map_err(err)?),
                gate_up,
                down,
            });
        }
        self.host.as_ref().ok_or_else(|| "no host copy".to_owned())
    }

    /// y for `x` from layer 0's weights on the CPU.
    fn reference(&mut self, x: &[f32]) -> Result<Vec<f32>, String> {
        let sh = self.shape;
        let h = self.host()?;
        let route = reference::moe::route(x, &h.router, sh.top_k, sh.renormalise);
        let d = sh.hidden;
        let mut y = vec![0.0f32; d];
        let mut expert = |e: usize, weight: f32| {
            let (inter, row0) = if e < sh.experts {
                (sh.inter, 2 * e * sh.inter)
            } else {
                (sh.shared_inter, 2 * sh.experts * sh.inter)
            };
            let gate = h.gate_up.linear(row0, inter, d, 2 * e);
            let up = h.gate_up.linear(row0 + inter, inter, d, 2 * e + 1);
            let act: Vec<f32> =
                gate.apply(x).iter().zip(up.apply(x)).map(|(&g, u)| reference::norm::silu(g) * u).collect();
            // Down: expert e's [hidden, inter_e] after the others, as rows of inter_e values.
            let first = if e < sh.experts { e * d } else { sh.experts * d };
            let down = match &h.down {
                Stacked::Nvfp4 { .. } if inter != sh.inter => {
                    // Rows of another width: offset by values, not rows.
                    let values0 = sh.experts * d * sh.inter;
                    let rows0 = values0 / inter;
                    h.down.linear(rows0, d, inter, e)
                }
                _ => h.down.linear(first, d, inter, e),
            };
            down.apply(&act).iter().zip(y.iter_mut()).for_each(|(v, acc)| *acc += weight * v);
        };
        for &(e, w) in &route {
            expert(e, w);
        }
        let sg = reference::norm::sigmoid(h.shared_gate.iter().zip(x).map(|(a, b)| a * b).sum());
        expert(sh.experts, sg);
        Ok(y)
    }
}

impl Harness<MoeTiles> for Moe<'_> {
    fn measure(&mut self, tiles: &MoeTiles) -> Result<f64, String> {
        let k = MoeKernels::load(self.gpu, *tiles).map_err(err)?;
        let launches = self.launches();
        let gpu = self.gpu;
        // SAFETY: the launches address this harness's weights, scratch, x and y,
        // which outlive the graph; x and y are separate buffers of `hidden` values.
        time_chain(gpu, LAYERS, || launches.iter().try_for_each(|l| unsafe { l.enqueue(gpu, &k) }))
    }

    fn verify(&mut self, tiles: &MoeTiles) -> Result<(), String> {
        let k = MoeKernels::load(self.gpu, *tiles).map_err(err)?;
        let x = self.rng.bf16_normal(self.shape.hidden, 1.0);
        self.gpu.write(&mut self.xs[0], &x).map_err(err)?;
        self.gpu.fill_bytes(&mut self.ys[0], 0xff).map_err(err)?;
        let l = self.launches().swap_remove(0);
        // SAFETY: as in `measure`.
        unsafe { l.enqueue(self.gpu, &k) }.map_err(err)?;
        let y = f32s(&self.gpu.download(&self.ys[0]).map_err(err)?);
        let want = self.reference(&f32s(&x))?;
        let e = rel_l2(&y, &want);
        if e < 1e-2 { Ok(()) } else { Err(format!("relative L2 {e:.2e} against the reference (1e-2 allowed)")) }
    }
}

/// The lm_head: `LAYERS` copies with distinct weights in one graph (8 × 318 MB NVFP4, beyond the
/// L2); the check compares the logits of one with the CPU's (relative L2 1e-2) and the token with
/// their argmax.
struct Head<'g> {
    gpu: &'g Gpu,
    vocab: usize,
    hidden: usize,
    nvfp4: bool,
    x: DeviceBuffer<bf16>,
    logits: Vec<DeviceBuffer<f32>>,
    tokens: Vec<DeviceBuffer<u32>>,
    /// Layer 0's weights on the host, f32.
    host: Option<Vec<f32>>,
    rng: Rng,
}

pub fn lm_head(gpu: &Gpu, vocab: usize, hidden: usize, nvfp4: bool) -> Made<'_, LmHeadTiles> {
    let mut rng = Rng::fresh();
    Ok(Some(Box::new(Head {
        gpu,
        vocab,
        hidden,
        nvfp4,
        x: gpu.upload(&rng.bf16_normal(hidden, 1.0)).map_err(err)?,
        logits: (0..LAYERS).map(|_| gpu.alloc(vocab)).collect::<engine::Result<Vec<_>>>().map_err(err)?,
        tokens: (0..LAYERS).map(|_| gpu.alloc(1)).collect::<engine::Result<Vec<_>>>().map_err(err)?,
        host: None,
        rng,
    })))
}

impl Head<'_> {
    /// The heads at `tiles` (the same seeds each time: the same weights).
    fn heads(&self, tiles: &LmHeadTiles, n: usize) -> Result<Vec<LmHead>, String> {
        (0..n)
            .map(|l| {
                synthetic::lm_head(self.gpu, self.vocab, self.hidden, self.nvfp4, 0x4ead + l as u64, *tiles)
                    .map_err(err)
            })
            .collect()
    }
}

impl Harness<LmHeadTiles> for Head<'_> {
    fn measure(&mut self, tiles: &LmHeadTiles) -> Result<f64, String> {
        let mut heads = self.heads(tiles, LAYERS)?;
        let gpu = self.gpu;
        let (x, logits, tokens) = (&self.x, &mut self.logits, &mut self.tokens);
        time_chain(gpu, LAYERS, || {
            for ((h, l), t) in heads.iter_mut().zip(logits.iter_mut()).zip(tokens.iter_mut()) {
                h.launch(gpu, x, l, t)?;
            }
            Ok(())
        })
    }

    fn verify(&mut self, tiles: &LmHeadTiles) -> Result<(), String> {
        let mut head = self.heads(tiles, 1)?.swap_remove(0);
        if self.host.is_none() {
            let w = match head.weights() {
                LmHeadWeights::Bf16(w) => f32s(&self.gpu.download(w).map_err(err)?),
                LmHeadWeights::Nvfp4 { packed, scales, scale2 } => Nvfp4Matrix {
                    rows: self.vocab,
                    cols: self.hidden,
                    packed: paired_codes::download(self.gpu, packed).map_err(err)?,
                    scales: self.gpu.download(scales).map_err(err)?.into_iter().map(|b| b.0).collect(),
                    scale_2: self.gpu.download(scale2).map_err(err)?[0],
                }
                .dequantise(),
            };
            self.host = Some(w);
        }
        let x = self.rng.bf16_normal(self.hidden, 1.0);
        self.gpu.write(&mut self.x, &x).map_err(err)?;
        self.gpu.fill_bytes(&mut self.logits[0], 0xff).map_err(err)?;
        self.gpu.fill_bytes(&mut self.tokens[0], 0xff).map_err(err)?;
        head.launch(self.gpu, &self.x, &mut self.logits[0], &mut self.tokens[0]).map_err(err)?;
        let got = self.gpu.download(&self.logits[0]).map_err(err)?;
        let token = self.gpu.download(&self.tokens[0]).map_err(err)?[0] as usize;
        let w = self.host.as_ref().ok_or("no host copy")?;
        let want = reference::gemv::gemv(w, &f32s(&x), self.vocab, self.hidden);
        let e = rel_l2(&got[..self.vocab], &want);
        if e >= 1e-2 {
            return Err(format!("logits: relative L2 {e:.2e} against the reference (1e-2 allowed)"));
        }
        // The token is the argmax of the device's own logits (lowest id on ties), and its logit
        // within the reference's tolerance of the reference's maximum.
        let best = got[..self.vocab].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let first = got[..self.vocab].iter().position(|&v| v == best);
        if first != Some(token) {
            return Err(format!("token {token}, the logits' argmax {first:?}"));
        }
        Ok(())
    }
}

/// Mix sites in one graph: a site's NVFP4 matrices are ~3.3 MB, so 40 sites (130 MB) to be
/// beyond the L2; each site folds in the previous block's write, as in the step.
const SITES: usize = 40;

/// One mix site's buffers besides its weights.
struct SiteIo {
    residual: DeviceBuffer<bf16>,
    y: DeviceBuffer<bf16>,
    gains_prev: DeviceBuffer<f32>,
    x: DeviceBuffer<bf16>,
    gains: DeviceBuffer<f32>,
    scratch: MixScratch,
}

/// The Gated Residual: `SITES` sites with distinct weights; the check runs site 0 from fresh
/// streams against `reference::mix` (x and the gains within 1e-2 relative L2).
struct Mix<'g> {
    gpu: &'g Gpu,
    shape: MixShape,
    eps: f32,
    sites: Vec<MixWeightsOnDevice>,
    io: Vec<SiteIo>,
    host: Option<MixWeights>,
    rng: Rng,
}

pub fn mix(gpu: &Gpu, shape: MixShape, eps: f32, nvfp4: bool) -> Made<'_, MixTiles> {
    let mut rng = Rng::fresh();
    let sites = (0..SITES)
        .map(|l| synthetic::mix(gpu, shape, nvfp4, 0x319 + l as u64))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let (n, d) = (shape.streams, shape.hidden);
    let mut io = Vec::new();
    for _ in 0..SITES {
        io.push(SiteIo {
            residual: gpu.upload(&rng.bf16_normal(n * d, 1.0)).map_err(err)?,
            y: gpu.upload(&rng.bf16_normal(d, 1.0)).map_err(err)?,
            gains_prev: gpu.upload(&vec![0.5f32; n]).map_err(err)?,
            x: gpu.alloc(d).map_err(err)?,
            gains: gpu.alloc(n).map_err(err)?,
            scratch: MixScratch::new(gpu, shape).map_err(err)?,
        });
    }
    Ok(Some(Box::new(Mix { gpu, shape, eps, sites, io, host: None, rng })))
}

impl Mix<'_> {
    fn launches(&mut self) -> Vec<MixLaunches> {
        let eps = self.eps;
        let inject = self.shape.inject;
        self.sites
            .iter()
            .zip(self.io.iter_mut())
            .map(|(w, b)| {
                let io = MixIo {
                    residual: b.residual.ptr_mut(),
                    post: Some((b.y.ptr(), b.gains_prev.ptr())),
                    x: b.x.ptr_mut(),
                    gains: inject.then(|| b.gains.ptr_mut()),
                };
                MixLaunches::new(w, &mut b.scratch, io, eps)
            })
            .collect()
    }

    fn host(&mut self) -> Result<&MixWeights, String> {
        if self.host.is_none() {
            let (g, w, sh) = (self.gpu, &self.sites[0], self.shape);
            let (width, r, n) = (sh.width(), sh.rank, sh.streams);
            let (proj, up) = match &w.matrices {
                MixMatrices::Bf16 { proj, up } => {
                    (Stacked::Bf16(g.download(proj).map_err(err)?), Stacked::Bf16(g.download(up).map_err(err)?))
                }
                MixMatrices::Nvfp4 { proj_packed, proj_scales, up_packed, up_scales, scale2 } => {
                    let s2 = g.download(scale2).map_err(err)?;
                    (
                        Stacked::Nvfp4 {
                            packed: g.download(proj_packed).map_err(err)?.into_iter().map(|b| b.0).collect(),
                            scales: g.download(proj_scales).map_err(err)?.into_iter().map(|b| b.0).collect(),
                            scale2: s2.clone(),
                        },
                        Stacked::Nvfp4 {
                            packed: g.download(up_packed).map_err(err)?.into_iter().map(|b| b.0).collect(),
                            scales: g.download(up_scales).map_err(err)?.into_iter().map(|b| b.0).collect(),
                            scale2: s2,
                        },
                    )
                }
            };
            self.host = Some(MixWeights {
                norm: f32s(&g.download(&w.norm).map_err(err)?),
                down: proj.linear(0, r, width, 0),
                up: up.linear(0, width, r, 2),
                inject: sh.inject.then(|| proj.linear(r, n, width, 1)),
            });
        }
        self.host.as_ref().ok_or_else(|| "no host copy".to_owned())
    }
}

impl Harness<MixTiles> for Mix<'_> {
    fn measure(&mut self, tiles: &MixTiles) -> Result<f64, String> {
        let k = MixKernels::load(self.gpu, *tiles).map_err(err)?;
        let launches = self.launches();
        let gpu = self.gpu;
        // SAFETY: the launches address this harness's weights, scratch and site
        // buffers (n·d streams, d for x and y, n gains), which outlive the graph and do not overlap.
        time_chain(gpu, SITES, || launches.iter().try_for_each(|l| unsafe { l.enqueue(gpu, &k) }))
    }

    fn verify(&mut self, tiles: &MixTiles) -> Result<(), String> {
        let k = MixKernels::load(self.gpu, *tiles).map_err(err)?;
        let sh = self.shape;
        let streams = self.rng.bf16_normal(sh.streams * sh.hidden, 1.0);
        let y = self.rng.bf16_normal(sh.hidden, 1.0);
        let gains_prev: Vec<f32> = (0..sh.streams).map(|i| 0.25 + 0.5 * i as f32 / sh.streams as f32).collect();
        {
            let (g, b) = (self.gpu, &mut self.io[0]);
            g.write(&mut b.residual, &streams).map_err(err)?;
            g.write(&mut b.y, &y).map_err(err)?;
            g.write(&mut b.gains_prev, &gains_prev).map_err(err)?;
            g.fill_bytes(&mut b.x, 0xff).map_err(err)?;
            g.fill_bytes(&mut b.gains, 0xff).map_err(err)?;
        }
        let l = self.launches().swap_remove(0);
        // SAFETY: as in `measure`.
        unsafe { l.enqueue(self.gpu, &k) }.map_err(err)?;
        let x = f32s(&self.gpu.download(&self.io[0].x).map_err(err)?);
        let gains = self.gpu.download(&self.io[0].gains).map_err(err)?;
        let (n, eps) = (sh.streams, self.eps);
        let w = self.host()?;
        let mut want_streams = f32s(&streams);
        reference::mix::write_bf16(&mut want_streams, &gains_prev, &f32s(&y));
        let want = reference::mix::mix(&want_streams, w, n, eps);
        let e = rel_l2(&x, &want.x);
        if e >= 1e-2 {
            return Err(format!("x: relative L2 {e:.2e} against the reference (1e-2 allowed)"));
        }
        if let Some(wg) = &want.gains {
            let e = rel_l2(&gains, wg);
            if e >= 1e-2 {
                return Err(format!("gains: relative L2 {e:.2e} against the reference (1e-2 allowed)"));
            }
        }
        Ok(())
    }
}

/// The GDN layer: `LAYERS` layers with distinct weights and their own state, the input projection
/// and out_proj each in the format the step runs it in (an NVFP4 out_proj is `gemv_nvfp4` at
/// `GdnTiles::out_proj_nvfp4`, which is then what the out_proj knob varies). Its check is weaker
/// than the others': a candidate's output on one layer (fresh x, zero state) must match the
/// plan's tiles' output within 1e-2 relative L2, the plan's tiles being the ones
/// tests/gpu_gdn.rs checks against the CPU reference (a direct CPU reference here is still to do).
struct Gdn<'g> {
    gpu: &'g Gpu,
    shape: GdnShape,
    layers: Vec<GdnWeightsOnDevice>,
    states: Vec<GdnStateOnDevice>,
    scratch: Vec<GdnScratch>,
    xs: Vec<DeviceBuffer<bf16>>,
    ys: Vec<DeviceBuffer<bf16>>,
    plan: GdnKernels,
    rng: Rng,
}

pub fn gdn(
    gpu: &Gpu,
    shape: GdnShape,
    nvfp4_in_proj: bool,
    nvfp4_out_proj: bool,
    plan_tiles: GdnTiles,
) -> Made<'_, GdnTiles> {
    let layers = (0..LAYERS)
        .map(|l| synthetic::gdn(gpu, shape, nvfp4_in_proj, nvfp4_out_proj, 0x6d + l as u64))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let states =
        (0..LAYERS).map(|_| GdnStateOnDevice::new(gpu, shape)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    let scratch = (0..LAYERS).map(|_| GdnScratch::new(gpu, shape)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    let mut rng = Rng::fresh();
    let xs = (0..LAYERS)
        .map(|_| gpu.upload(&rng.bf16_normal(shape.hidden, 1.0)))
        .collect::<engine::Result<Vec<_>>>()
        .map_err(err)?;
    let ys = (0..LAYERS).map(|_| gpu.alloc(shape.hidden)).collect::<engine::Result<Vec<_>>>().map_err(err)?;
    let plan = GdnKernels::load(gpu, plan_tiles).map_err(err)?;
    Ok(Some(Box::new(Gdn { gpu, shape, layers, states, scratch, xs, ys, plan, rng })))
}

impl Gdn<'_> {
    /// The first `layers` layers' NVFP4 input-projection codes in the layout `k` reads (the
    /// tensor-core path reads the paired layout, the f32 path ModelOpt's): a round trip through
    /// the host where a candidate reads another layout than the last one.
    fn codes_for(&mut self, k: Option<&GdnKernels>, layers: usize) -> Result<(), String> {
        let layout = k.unwrap_or(&self.plan).in_proj_layout(self.gpu.arch());
        self.layers[..layers].iter_mut().try_for_each(|w| w.set_in_proj_layout(self.gpu, layout)).map_err(err)
    }

    fn launches(&mut self) -> Vec<GdnLaunches> {
        (0..LAYERS)
            .map(|l| {
                GdnLaunches::new(
                    &self.layers[l],
                    &mut self.states[l],
                    &mut self.scratch[l],
                    self.xs[l].ptr(),
                    self.ys[l].ptr_mut(),
                )
            })
            .collect()
    }

    /// Layer 0 from a zero state on `x` with kernels `k`: its output.
    fn run_one(&mut self, k: Option<&GdnKernels>, x: &[bf16]) -> Result<Vec<f32>, String> {
        let g = self.gpu;
        self.states[0].reset(g).map_err(err)?;
        g.write(&mut self.xs[0], x).map_err(err)?;
        g.fill_bytes(&mut self.ys[0], 0xff).map_err(err)?;
        // Only layer 0 runs here: a check alternates the plan's kernel and the candidate's.
        self.codes_for(k, 1)?;
        let l = self.launches().swap_remove(0);
        let k = k.unwrap_or(&self.plan);
        // SAFETY: the launches address this harness's weights, state, scratch, x and y, alive for
        // the call; x and y are separate buffers of `hidden` values.
        unsafe { l.enqueue(g, k) }.map_err(err)?;
        Ok(f32s(&g.download(&self.ys[0]).map_err(err)?))
    }
}

impl Harness<GdnTiles> for Gdn<'_> {
    fn measure(&mut self, tiles: &GdnTiles) -> Result<f64, String> {
        let k = GdnKernels::load(self.gpu, *tiles).map_err(err)?;
        self.codes_for(Some(&k), LAYERS)?;
        let launches = self.launches();
        let gpu = self.gpu;
        // SAFETY: as in `run_one`, for every layer.
        time_chain(gpu, LAYERS, || launches.iter().try_for_each(|l| unsafe { l.enqueue(gpu, &k) }))
    }

    fn verify(&mut self, tiles: &GdnTiles) -> Result<(), String> {
        let k = GdnKernels::load(self.gpu, *tiles).map_err(err)?;
        let x = self.rng.bf16_normal(self.shape.hidden, 1.0);
        let want = self.run_one(None, &x)?;
        if want.iter().any(|v| !v.is_finite()) {
            return Err("the plan's tiles gave values that are not finite".into());
        }
        let got = self.run_one(Some(&k), &x)?;
        let e = rel_l2(&got, &want);
        if e < 1e-2 { Ok(()) } else { Err(format!("relative L2 {e:.2e} against the plan's tiles (1e-2 allowed)")) }
    }
}
