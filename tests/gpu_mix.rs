//! The Gated Residual mix on a GPU (two launches, the previous block's write folded in) against
//! the CPU reference, at the published shape (n 4, d 2560, r 320) and a tiny one, bf16 weights and
//! NVFP4 (quantised at load; the reference uses the dequantised values), with and without the
//! inject (the final mixer) and the folded write: the streams after the write equal
//! the reference's bf16 write bit for bit, x is within 1e-2 relative L2 (and every element within
//! a tolerance), every ω within 1e-2, and a second site run gives the same bits. At the tiny
//! shape every candidate tile set of each kernel runs. Sites chained on one stream (the launches
//! overlapped) give the bits of sites run one launch at a time. Fresh random inputs each run;
//! outputs and scratch poisoned first.

use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::mix::{mix_down_bf16, mix_down_nvfp4, mix_up_bf16, mix_up_nvfp4};
use engine::layers::mix::{
    MixIo, MixKernels, MixLaunches, MixScratch, MixShape, MixTiles, MixWeightsOnDevice, Stage, enqueue,
};
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::weights::{Linear, MixWeights};
use engine::reference;
use flashnext::compare::check;
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::TileSet;

const PUBLISHED: MixShape = MixShape { streams: 4, hidden: 2560, rank: 320, inject: true };
const TINY: MixShape = MixShape { streams: 4, hidden: 128, rank: 64, inject: true };
const EPS: f32 = 1e-6;

/// One site's weights and inputs, on the host, bf16 as the device holds them.
struct Site {
    shape: MixShape,
    norm: Vec<bf16>,
    down: Vec<bf16>,
    up: Vec<bf16>,
    inject: Option<Vec<bf16>>,
    residual: Vec<bf16>,
    y: Vec<bf16>,
    gains_prev: Vec<f32>,
    /// The matrices quantised at load (down, up, inject), for the NVFP4 format.
    nvfp4: Option<(Nvfp4Matrix, Nvfp4Matrix, Option<Nvfp4Matrix>)>,
}

impl Site {
    fn new(rng: &mut Rng, shape: MixShape, nvfp4: bool) -> Site {
        let (w, r, n) = (shape.width(), shape.rank, shape.streams);
        let mut site = Site {
            shape,
            norm: rng.bf16_normal(w, 0.2),
            down: rng.bf16_normal(r * w, 2.0 / (w as f32).sqrt()),
            up: rng.bf16_normal(w * r, 2.0 / (r as f32).sqrt()),
            inject: shape.inject.then(|| rng.bf16_normal(n * w, 4.0 / (w as f32).sqrt())),
            residual: rng.bf16_normal(w, 1.0),
            y: rng.bf16_normal(shape.hidden, 1.0),
            gains_prev: (0..n).map(|_| 2.0 * rng.uniform()).collect(),
            nvfp4: None,
        };
        if nvfp4 {
            let q = |v: &[bf16], rows, cols| Nvfp4Matrix::quantise(&to_f32(v), rows, cols);
            site.nvfp4 = Some((q(&site.down, r, w), q(&site.up, w, r), site.inject.as_ref().map(|v| q(v, n, w))));
        }
        site
    }

    fn upload(&self, gpu: &Gpu) -> MixWeightsOnDevice {
        match &self.nvfp4 {
            Some((down, up, inject)) => {
                MixWeightsOnDevice::upload_nvfp4(gpu, self.shape, &self.norm, down, up, inject.as_ref())
            }
            None => MixWeightsOnDevice::upload_bf16(
                gpu,
                self.shape,
                &self.norm,
                &self.down,
                &self.up,
                self.inject.as_deref(),
            ),
        }
        .expect("upload")
    }

    fn weights(&self) -> MixWeights {
        let (w, r, n) = (self.shape.width(), self.shape.rank, self.shape.streams);
        let lin = |v: &[bf16], rows, cols| Linear { rows, cols, w: to_f32(v), bias: None };
        let dq = |m: &Nvfp4Matrix| Linear { rows: m.rows, cols: m.cols, w: m.dequantise(), bias: None };
        match &self.nvfp4 {
            Some((down, up, inject)) => {
                MixWeights { norm: to_f32(&self.norm), down: dq(down), up: dq(up), inject: inject.as_ref().map(dq) }
            }
            None => MixWeights {
                norm: to_f32(&self.norm),
                down: lin(&self.down, r, w),
                up: lin(&self.up, w, r),
                inject: self.inject.as_ref().map(|v| lin(v, n, w)),
            },
        }
    }

    /// The streams after the folded write (if any), and the mix of them.
    fn reference(&self, post: bool) -> (Vec<f32>, reference::mix::Mixed) {
        let mut streams = to_f32(&self.residual);
        if post {
            reference::mix::write_bf16(&mut streams, &self.gains_prev, &to_f32(&self.y));
        }
        let mixed = reference::mix::mix(&streams, &self.weights(), self.shape.streams, EPS);
        (streams, mixed)
    }
}

/// What one site run gives back.
struct Outputs {
    residual: Vec<bf16>,
    x: Vec<bf16>,
    gains: Option<Vec<f32>>,
}

impl Outputs {
    /// Every output as raw bits, one after the other, for a bit-for-bit comparison of two runs.
    fn bits(&self) -> Vec<u32> {
        let halves = self.residual.iter().chain(&self.x).map(|v| u32::from(v.to_bits()));
        let gains = self.gains.iter().flatten().map(|v| v.to_bits());
        halves.chain(gains).collect()
    }
}

/// Runs the site twice on the GPU, from the same streams, outputs poisoned before each run.
fn run(gpu: &Gpu, k: &MixKernels, w: &MixWeightsOnDevice, site: &Site, post: bool) -> (Outputs, bool) {
    let sh = site.shape;
    let mut residual = gpu.upload(&site.residual).expect("residual");
    let y = gpu.upload(&site.y).expect("y");
    let gains_prev = gpu.upload(&site.gains_prev).expect("gains");
    let mut x = gpu.alloc::<bf16>(sh.hidden).expect("x");
    let mut gains: Option<DeviceBuffer<f32>> = sh.inject.then(|| gpu.alloc(sh.streams).expect("gains"));
    let mut s = MixScratch::new(gpu, sh).expect("scratch");
    let mut runs = Vec::new();
    for _ in 0..2 {
        gpu.write(&mut residual, &site.residual).expect("reset the streams");
        gpu.fill_bytes(&mut x, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.partial, 0xff).expect("poison");
        gpu.fill_bytes(&mut s.scale, 0xff).expect("poison");
        if let Some(g) = gains.as_mut() {
            gpu.fill_bytes(g, 0xff).expect("poison");
        }
        let io = MixIo {
            residual: residual.ptr_mut(),
            post: post.then(|| (y.ptr(), gains_prev.ptr())),
            x: x.ptr_mut(),
            gains: gains.as_mut().map(|g| g.ptr_mut()),
        };
        // SAFETY: the buffers hold n·d, d and n elements as the shape says, and none overlaps another.
        unsafe { enqueue(gpu, k, w, &mut s, io, EPS) }.expect("enqueue");
        runs.push(Outputs {
            residual: gpu.download(&residual).expect("residual"),
            x: gpu.download(&x).expect("x"),
            gains: gains.as_ref().map(|g| gpu.download(g).expect("gains")),
        });
    }
    let second = runs.pop().expect("two runs");
    let first = runs.pop().expect("two runs");
    let same = first.bits() == second.bits();
    (first, same)
}

fn check_site(label: &str, site: &Site, post: bool, got: (Outputs, bool)) {
    let (out, same) = got;
    let (want_streams, want) = site.reference(post);
    // The streams: the reference's bf16 write exactly (or untouched without the write).
    check(&format!("{label}: streams"), &to_f32(&out.residual), &want_streams, |_| 0.0)
        .unwrap_or_else(|e| panic!("{e}"));
    let x = to_f32(&out.x);
    let rms = (want.x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / want.x.len() as f64).sqrt() as f32;
    let a = check(&format!("{label}: x"), &x, &want.x, |i| 1e-2 * rms + 2e-2 * want.x[i].abs())
        .unwrap_or_else(|e| panic!("{e}"));
    println!("{label}: x within {:.2e} of the reference (relative L2), max |Δ| {:.2e}", a.rel_l2, a.max_abs);
    assert!(a.rel_l2 < 1e-2, "{label}: x is {:.2e} from the reference (relative L2)", a.rel_l2);
    match (&out.gains, &want.gains) {
        (Some(g), Some(wg)) => {
            let a = check(&format!("{label}: gains"), g, wg, |_| 1e-2).unwrap_or_else(|e| panic!("{e}"));
            println!("{label}: gains within {:.2e} (max |Δ|)", a.max_abs);
        }
        (None, None) => {}
        _ => panic!("{label}: gains where the reference has none, or the other way round"),
    }
    assert!(same, "{label}: a second run gave different bits");
}

fn case(gpu: &Gpu, rng: &mut Rng, shape: MixShape, tiles: &[MixTiles], nvfp4: bool) {
    for inject in [true, false] {
        let shape = MixShape { inject, ..shape };
        let site = Site::new(rng, shape, nvfp4);
        let w = site.upload(gpu);
        for t in tiles {
            let k = MixKernels::load(gpu, *t).expect("compile");
            for post in [true, false] {
                let format = if nvfp4 { "nvfp4" } else { "bf16" };
                let label = format!("{format} {shape:?} post {post} {t:?}");
                check_site(&label, &site, post, run(gpu, &k, &w, &site, post));
            }
        }
    }
}

/// The defaults, and every candidate of each kernel of one format with the others at their
/// defaults.
fn tile_variants(nvfp4: bool) -> Vec<MixTiles> {
    let base = MixTiles::default();
    let candidates: Vec<MixTiles> = if nvfp4 {
        let downs = mix_down_nvfp4::Tiles::candidates().into_iter().map(|t| MixTiles { down_nvfp4: t, ..base });
        downs.chain(mix_up_nvfp4::Tiles::candidates().into_iter().map(|t| MixTiles { up_nvfp4: t, ..base })).collect()
    } else {
        let downs = mix_down_bf16::Tiles::candidates().into_iter().map(|t| MixTiles { down_bf16: t, ..base });
        downs.chain(mix_up_bf16::Tiles::candidates().into_iter().map(|t| MixTiles { up_bf16: t, ..base })).collect()
    };
    let mut v = vec![base];
    for t in candidates {
        if !v.contains(&t) {
            v.push(t);
        }
    }
    for t in &v {
        for inject in [true, false] {
            t.check(MixShape { inject, ..TINY }).unwrap_or_else(|e| panic!("every candidate fits the tiny shape: {e}"));
        }
    }
    println!("tiny shape: {} tile sets", v.len());
    v
}

#[test]
#[ignore = "needs a CUDA device"]
fn mix_bf16_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("mix bf16");
    case(&gpu, &mut rng, TINY, &tile_variants(false), false);
    case(&gpu, &mut rng, PUBLISHED, &[MixTiles::default()], false);
}

#[test]
#[ignore = "needs a CUDA device"]
fn mix_nvfp4_matches_the_reference() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("mix nvfp4");
    case(&gpu, &mut rng, TINY, &tile_variants(true), true);
    case(&gpu, &mut rng, PUBLISHED, &[MixTiles::default()], true);
}

/// Sites chained on one stream with one scratch, as a decode step runs them: each folds in the
/// write of the site before (with the gains that site computed; two gains buffers alternate) and
/// writes its own x. The overlapped launches (each kernel starting before its predecessor
/// ends), eager and captured in a graph, give the bits of the same launches run one at a time with
/// a host synchronisation after each.
#[test]
#[ignore = "needs a CUDA device"]
fn chained_sites_give_the_bits_of_sites_run_apart() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("mix chain");
    let k = MixKernels::load(&gpu, MixTiles::default()).expect("compile");
    for nvfp4 in [false, true] {
        for shape in [TINY, PUBLISHED] {
            let sites: Vec<Site> = (0..4).map(|_| Site::new(&mut rng, shape, nvfp4)).collect();
            let weights: Vec<MixWeightsOnDevice> = sites.iter().map(|s| s.upload(&gpu)).collect();
            let mut s = MixScratch::new(&gpu, shape).expect("scratch");
            let mut residual = gpu.upload(&sites[0].residual).expect("streams");
            let y = gpu.upload(&sites[0].y).expect("y");
            let mut gains: Vec<DeviceBuffer<f32>> = (0..2).map(|_| gpu.alloc(shape.streams).expect("gains")).collect();
            let mut xs: Vec<DeviceBuffer<bf16>> =
                (0..sites.len()).map(|_| gpu.alloc(shape.hidden).expect("x")).collect();
            // Site i writes gains[i % 2] and folds in the write with gains[(i + 1) % 2].
            let launches: Vec<MixLaunches> = (0..sites.len())
                .map(|i| {
                    let io = MixIo {
                        residual: residual.ptr_mut(),
                        post: Some((y.ptr(), gains[(i + 1) % 2].ptr())),
                        x: xs[i].ptr_mut(),
                        gains: Some(gains[i % 2].ptr_mut()),
                    };
                    MixLaunches::new(&weights[i], &mut s, io, EPS)
                })
                .collect();
            let reset =
                |residual: &mut DeviceBuffer<bf16>, gains: &mut [DeviceBuffer<f32>], xs: &mut [DeviceBuffer<bf16>]| {
                    gpu.write(residual, &sites[0].residual).expect("reset the streams");
                    gpu.fill_bytes(&mut gains[0], 0xff).expect("poison");
                    gpu.write(&mut gains[1], &sites[0].gains_prev).expect("the first site's write gains");
                    for x in xs.iter_mut() {
                        gpu.fill_bytes(x, 0xff).expect("poison");
                    }
                    gpu.synchronize().expect("sync");
                };
            let enqueue_all = |sync: bool| {
                for l in &launches {
                    for stage in [Stage::Down, Stage::Up] {
                        // SAFETY: the buffers behind the launches live to the end of this loop's body.
                        unsafe { l.enqueue_stage(&gpu, &k, stage) }.expect("enqueue");
                        if sync {
                            gpu.synchronize().expect("sync");
                        }
                    }
                }
            };
            let bits = |residual: &DeviceBuffer<bf16>, gains: &[DeviceBuffer<f32>], xs: &[DeviceBuffer<bf16>]| {
                let mut v: Vec<u32> =
                    gpu.download(residual).expect("streams").iter().map(|b| u32::from(b.to_bits())).collect();
                for x in xs {
                    v.extend(gpu.download(x).expect("x").iter().map(|b| u32::from(b.to_bits())));
                }
                for g in gains {
                    v.extend(gpu.download(g).expect("gains").iter().map(|f| f.to_bits()));
                }
                v
            };
            let label = format!("{} {shape:?}", if nvfp4 { "nvfp4" } else { "bf16" });
            reset(&mut residual, &mut gains, &mut xs);
            enqueue_all(true);
            let apart = bits(&residual, &gains, &xs);
            let xs_apart: Vec<f32> = xs.iter().flat_map(|x| to_f32(&gpu.download(x).expect("x"))).collect();
            assert!(xs_apart.iter().all(|v| v.is_finite()), "{label}: an x left unwritten");
            let g: Vec<f32> = gains.iter().flat_map(|g| gpu.download(g).expect("gains")).collect();
            assert!(g.iter().all(|v| v.is_finite()), "{label}: gains left unwritten");

            reset(&mut residual, &mut gains, &mut xs);
            enqueue_all(false);
            assert!(bits(&residual, &gains, &xs) == apart, "{label}: chained sites differ from sites run apart");

            reset(&mut residual, &mut gains, &mut xs);
            let graph = gpu
                .capture(|| {
                    enqueue_all(false);
                    Ok(())
                })
                .expect("capture");
            graph.launch().expect("replay");
            assert!(bits(&residual, &gains, &xs) == apart, "{label}: the captured chain differs from sites run apart");
            println!("{label}: {} chained sites, overlapped eager and graph = apart", sites.len());
        }
    }
}

/// The down-projections keep to one block an SM (`max_blocks = MAX_BLOCKS`): the engine's
/// reservation of shared memory leaves room for one of their blocks on an SM, and for a whole
/// grid of 132 at the published shape only on 132 SMs, where without it an SM takes several.
/// The reference tests above run with the reservation (the default), so a block that used it
/// for anything would show there.
#[test]
#[ignore = "needs a CUDA device"]
fn down_projections_keep_to_one_block_an_sm() {
    let gpu = flashnext::gpu::open();
    let sms = gpu.info().sm_count;
    let nvfp4 = mix_down_nvfp4::Tiles::DEFAULT;
    let bf16 = mix_down_bf16::Tiles::DEFAULT;
    assert_eq!((nvfp4.max_blocks, bf16.max_blocks), (1, 1), "the defaults bound the residency");
    let k = gpu.kernel::<mix_down_nvfp4::Kernel>(nvfp4).expect("compile");
    assert!(k.reserved_shared() > 0, "{} reserves nothing", k.key());
    assert_eq!(k.co_resident_blocks(&gpu).expect("occupancy"), sms, "{}: one block an SM", k.key());
    let free = gpu.kernel::<mix_down_nvfp4::Kernel>(mix_down_nvfp4::Tiles { max_blocks: 0, ..nvfp4 }).expect("compile");
    assert_eq!(free.reserved_shared(), 0);
    assert!(free.co_resident_blocks(&gpu).expect("occupancy") > sms, "without the bound an SM holds several");
    let b = gpu.kernel::<mix_down_bf16::Kernel>(bf16).expect("compile");
    assert!(b.reserved_shared() > 0);
    assert_eq!(b.co_resident_blocks(&gpu).expect("occupancy"), sms, "{}: one block an SM", b.key());
    println!(
        "{}: {} bytes of shared memory reserved a block (at most {}); bf16: {}",
        k.key(),
        k.reserved_shared(),
        gpu.info().max_shared_per_block,
        b.reserved_shared()
    );
}
