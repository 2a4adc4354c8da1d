//! The Gated DeltaNet layer at the published shape (d 2560, 16 key heads, 48 value heads, dk = dv
//! = 128, bf16 weights) on the GPU, and its state update alone.
//!
//! - The state update: 36 layers (the model's count) with distinct 3 MiB states and distinct
//!   inputs, captured as one graph of 36 launches and replayed: 108 MiB of state, beyond the
//!   60 MB L2, so every launch reads and writes its state in DRAM, as in a decode step (where
//!   ~100 MB of other weights pass between two GDN layers). Its bytes: the state read and written
//!   plus q, k, v, z, the gates and y.
//! - The whole layer: 8 layers with distinct weights (filled on the device), states and scratch,
//!   one graph of 24 launches; and each of its three kernels alone (a graph of its 8 launches).
//!   Once with a bf16 input projection, once with an NVFP4 one (out_proj is bf16 in both).
//! - Every tile candidate of the GDN kernels at the published shape, and out_proj's GEMV one
//!   tile off its default, each kernel's graph alone; the input projection's candidates also in
//!   the whole layer's graph (with EARLY its weights load before its grid dependency wait, so
//!   what it overlaps matters).
//!
//! Each line gives the time per layer (median, p10, p90 of the replays), the bytes, the rate,
//! its fraction of 4.27 TB/s and of the device-to-device copy bandwidth measured in the same run,
//! and the byte floor; the GB10 projection divides the same bytes by 230 GB/s (a projection, not a
//! measurement). Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-gdn.jsonl
//! (or target/bench-gdn.jsonl).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::kernels::gdn::delta_rule_normed::gdn_delta_rule_normed;
use engine::kernels::gdn::in_proj::{gdn_in_proj_bf16, gdn_in_proj_nvfp4};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::layers::gdn::{
    CONV_KERNEL, GdnKernels, GdnLaunches, GdnScratch, GdnShape, GdnStateOnDevice, GdnTiles, GdnWeightsOnDevice,
    InProjOnDevice, Stage,
};
use engine::layers::matrix::MatrixOnDevice;
use flashnext::bench::{GB10_STREAMING_BYTES_PER_S, H200_REFERENCE_BYTES_PER_S, Recorder, Sample, Unit, replay_times};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::e2m1_pairs::Layout;
use kernel_dsl::{E2m1x2, E4m3, TileSet};

#[path = "common/random_bits.rs"]
mod random_bits;
use random_bits::{fill, fill_bits};

const SHAPE: GdnShape = GdnShape {
    hidden: 2560,
    key_heads: 16,
    value_heads: 48,
    key_dim: 128,
    value_dim: 128,
    eps: 1e-6,
    sigmoid_gate: true,
};
const LAYERS: usize = 8;
const STATE_LAYERS: usize = 36;

/// Random bf16 pairs with exponents near 2^-6, random signs and mantissas (0x3c80..0x3cff).
fn fill_bf16(gpu: &Gpu, k: &engine::cuda::LoadedKernel<fill_bits::Kernel>, buf: &mut DeviceBuffer<bf16>, seed: u32) {
    fill(gpu, k, buf, seed, 0x807f_807f, 0x3c80_3c80);
}

fn layer_weights(
    gpu: &Gpu,
    fk: &engine::cuda::LoadedKernel<fill_bits::Kernel>,
    rng: &mut Rng,
    seed: u32,
    nvfp4: bool,
) -> GdnWeightsOnDevice {
    let sh = SHAPE;
    let hv = sh.value_heads;
    let values = sh.in_rows() * sh.hidden;
    let in_proj = if nvfp4 {
        let mut packed = gpu.alloc::<E2m1x2>(values / 2).expect("alloc");
        let mut scales = gpu.alloc::<E4m3>(values / 16).expect("alloc");
        fill(gpu, fk, &mut packed, seed + 3, u32::MAX, 0);
        // e4m3 bytes 0b0_0101_xxx to 0b0_1000_xxx: 2^-2 to 2^1.875.
        fill(gpu, fk, &mut scales, seed + 4, 0x1f1f_1f1f, 0x2828_2828);
        // Random bits are codes in either layout (`reading_as` says which a graph's kernel reads).
        InProjOnDevice::Nvfp4 {
            packed,
            scales,
            scale2: gpu.upload(&[0.01f32; 4]).expect("alloc"),
            layout: Layout::Nibbles,
        }
    } else {
        let mut b = gpu.alloc(values).expect("alloc");
        fill_bf16(gpu, fk, &mut b, seed);
        InProjOnDevice::Bf16(b)
    };
    let mut w = GdnWeightsOnDevice {
        shape: sh,
        in_proj,
        conv: gpu.alloc(CONV_KERNEL * sh.conv_dim()).expect("alloc"),
        a_log: gpu.upload(&(0..hv).map(|_| (0.5 + 3.5 * rng.uniform()).ln()).collect::<Vec<f32>>()).expect("A_log"),
        dt_bias: gpu.upload(&(0..hv).map(|_| -2.5 + 0.5 * rng.normal()).collect::<Vec<f32>>()).expect("dt_bias"),
        norm: gpu.upload(&rng.bf16_normal(sh.value_dim, 1.0)).expect("norm"),
        out_proj: MatrixOnDevice::Bf16(gpu.alloc(sh.hidden * sh.z_dim()).expect("alloc")),
    };
    fill_bf16(gpu, fk, &mut w.conv, seed + 1);
    if let MatrixOnDevice::Bf16(o) = &mut w.out_proj {
        fill_bf16(gpu, fk, o, seed + 2);
    }
    w
}

/// What one timed graph measured, per layer.
struct Line<'a> {
    bench: &'a str,
    label: String,
    layers: usize,
    launches_per_layer: usize,
    bytes: usize,
    times: (f64, f64, f64),
}

/// Where records go: the one writer of every bench.
type Sink = Recorder;

/// One record a line: the group from the line's bench ("gdn-layer" → "layer"; a sweep's from
/// what it times, "sweep InProj"), the case its label.
fn report(l: &Line<'_>, out: &mut Sink) {
    let mut group = l.bench.trim_start_matches("gdn-").replace('-', " ");
    let mut case = l.label.trim().trim_start_matches("gdn ");
    if let ("sweep", Some((what, tiles))) = (group.as_str(), case.split_once(": ")) {
        group = format!("sweep {what}");
        case = tiles;
    }
    out.record(
        Sample::new(group, case, Unit::Layer, l.times).per(l.layers).bytes(l.bytes).launches(l.launches_per_layer),
    );
}

/// The launches with their input projection's codes declared in the layout `k`'s kernel reads.
/// The benches' codes are random bits, as good in one layout as in the other (the paired one
/// for the tensor-core path, the default since 2026-12-06, ModelOpt's otherwise), so every graph
/// takes the layout of the kernels it runs.
fn reading_as(gpu: &Gpu, launches: &[GdnLaunches], k: &GdnKernels) -> Vec<GdnLaunches> {
    let layout = k.in_proj_layout(gpu.arch());
    launches.iter().map(|l| GdnLaunches { in_proj_layout: layout, ..*l }).collect()
}

fn capture(gpu: &Gpu, launches: &[GdnLaunches], k: &GdnKernels, stages: &[Stage]) -> Graph {
    let launches = reading_as(gpu, launches, k);
    gpu.capture(|| {
        for l in &launches {
            for &s in stages {
                // SAFETY: the launches' buffers live in `bench_gdn` for the whole bench.
                unsafe { l.enqueue_stage(gpu, k, s) }?;
            }
        }
        Ok(())
    })
    .expect("capture")
}

/// Inputs of the state update that in_proj would have written: q, k, v and z normal, β in
/// (0, 1), α in (0.5, 1).
fn random_proj(rng: &mut Rng) -> Vec<f32> {
    let sh = SHAPE;
    let mut p: Vec<f32> = (0..sh.conv_dim() + sh.z_dim()).map(|_| rng.normal()).collect();
    p.extend((0..sh.value_heads).map(|_| rng.uniform()));
    p.extend((0..sh.value_heads).map(|_| 0.5 + 0.5 * rng.uniform()));
    p
}

fn bench_gdn(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("gdn") else { return };
    let mut out = Recorder::new(&gpu, "gdn", Some(copy_bw));
    let mut rng = Rng::fresh("gdn bench");
    let fk = gpu.kernel::<fill_bits::Kernel>(fill_bits::Tiles::DEFAULT).expect("fill kernel");
    let kernels = GdnKernels::load(&gpu, GdnTiles::default()).expect("compile");
    let mut group = c.benchmark_group("gdn");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));

    // The state update alone, 36 layers. Its launches only need the state update's buffers; the
    // weights are the (unread) in_proj and out_proj of one small stand-in layer.
    let stand_in = layer_weights(&gpu, &fk, &mut rng, 7, false);
    let mut states: Vec<GdnStateOnDevice> =
        (0..STATE_LAYERS).map(|_| GdnStateOnDevice::new(&gpu, SHAPE).expect("state")).collect();
    let mut scratch: Vec<GdnScratch> =
        (0..STATE_LAYERS).map(|_| GdnScratch::new(&gpu, SHAPE).expect("scratch")).collect();
    for s in &mut scratch {
        gpu.write(&mut s.proj, &random_proj(&mut rng)).expect("proj");
    }
    let x = gpu.upload(&rng.bf16_normal(SHAPE.hidden, 1.0)).expect("x");
    let mut y = gpu.alloc::<bf16>(SHAPE.hidden).expect("y");
    let state_launches: Vec<GdnLaunches> = states
        .iter_mut()
        .zip(scratch.iter_mut())
        .map(|(st, s)| GdnLaunches::new(&stand_in, st, s, x.ptr(), y.ptr_mut()))
        .collect();
    // A few eager updates first: a state that is not zero (decayed, not blowing up).
    for _ in 0..4 {
        for l in &state_launches {
            // SAFETY: the buffers behind the launches live to the end of this function.
            unsafe { l.enqueue_stage(&gpu, &kernels, Stage::StateUpdate) }.expect("update");
        }
    }
    gpu.synchronize().expect("sync");
    let update_bytes = SHAPE.state_update_bytes();
    let g = capture(&gpu, &state_launches, &kernels, &[Stage::StateUpdate]);
    report(
        &Line {
            bench: "gdn-state-update",
            label: format!(
                "gdn state update with the gated norm in whole-head blocks, gdn_delta_rule_normed ({STATE_LAYERS} layers)"
            ),
            layers: STATE_LAYERS,
            launches_per_layer: 1,
            bytes: update_bytes,
            times: replay_times(&gpu, &g, 50),
        },
        &mut out,
    );
    group.throughput(Throughput::Bytes((update_bytes * STATE_LAYERS) as u64));
    group.bench_function(format!("state-update/{STATE_LAYERS}-layers"), |b| {
        let t = EventTimer::new(&gpu).expect("events");
        b.iter_custom(|iters| {
            t.start(&gpu).expect("start");
            for _ in 0..iters {
                g.launch().expect("replay");
            }
            t.stop(&gpu).expect("stop")
        })
    });
    drop(g);
    let variants = gdn_delta_rule_normed::Tiles::candidates()
        .into_iter()
        .map(|t| (format!("{t:?}"), GdnTiles { delta_rule_normed: t, ..GdnTiles::default() }));
    sweep(&gpu, &state_launches, &[Stage::StateUpdate], false, variants.collect(), update_bytes, &mut out);
    drop(state_launches);
    drop(scratch);
    drop(states);
    for (format, nvfp4) in [("bf16", false), ("nvfp4", true)] {
        whole_layer(&gpu, &kernels, &fk, &mut rng, &mut group, format, nvfp4, &mut out);
    }
    group.finish();
}

/// The whole layer, 8 layers with distinct weights, the input projection in `format`.
#[allow(clippy::too_many_arguments)]
fn whole_layer(
    gpu: &Gpu,
    kernels: &GdnKernels,
    fk: &engine::cuda::LoadedKernel<fill_bits::Kernel>,
    rng: &mut Rng,
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    format: &str,
    nvfp4: bool,
    out: &mut Sink,
) {
    let base = GdnTiles::default();

    let layers: Vec<GdnWeightsOnDevice> =
        (0..LAYERS).map(|l| layer_weights(gpu, fk, rng, 1000 * l as u32 + 11, nvfp4)).collect();
    let mut lstates: Vec<GdnStateOnDevice> =
        (0..LAYERS).map(|_| GdnStateOnDevice::new(gpu, SHAPE).expect("state")).collect();
    let mut lscratch: Vec<GdnScratch> = (0..LAYERS).map(|_| GdnScratch::new(gpu, SHAPE).expect("scratch")).collect();
    let xs: Vec<DeviceBuffer<bf16>> =
        (0..LAYERS).map(|_| gpu.upload(&rng.bf16_normal(SHAPE.hidden, 1.0)).expect("x")).collect();
    let mut ys: Vec<DeviceBuffer<bf16>> = (0..LAYERS).map(|_| gpu.alloc(SHAPE.hidden).expect("y")).collect();
    let launches: Vec<GdnLaunches> = (0..LAYERS)
        .map(|l| GdnLaunches::new(&layers[l], &mut lstates[l], &mut lscratch[l], xs[l].ptr(), ys[l].ptr_mut()))
        .collect();
    for l in &reading_as(gpu, &launches, kernels) {
        // SAFETY: the buffers behind the launches live to the end of this function.
        unsafe { l.enqueue(gpu, kernels) }.expect("pass");
    }
    gpu.synchronize().expect("sync");
    let all = [Stage::InProj, Stage::StateUpdate, Stage::OutProj];
    let whole = capture(gpu, &launches, kernels, &all);
    if std::env::var_os("FLASHNEXT_BENCH_PROFILE").is_some() {
        return;
    }
    let layer_bytes = SHAPE.layer_bytes(nvfp4, false);
    report(
        &Line {
            bench: "gdn-layer",
            label: format!(
                "gdn layer, {format} in_proj, bf16 out_proj, norm in the delta rule's whole-head blocks ({LAYERS} layers)"
            ),
            layers: LAYERS,
            launches_per_layer: 3,
            bytes: layer_bytes,
            times: replay_times(gpu, &whole, 50),
        },
        out,
    );
    if nvfp4 {
        let all_nvfp4 = SHAPE.layer_bytes(true, true);
        println!(
            "  with out_proj in NVFP4 too (gemv_nvfp4: benches/gemv_nvfp4.rs times it alone, benches/step.rs in the step) the layer moves {:.1} MB: H200 floor {:.2} us, GB10 floor {:.1} us (projection)",
            all_nvfp4 as f64 / 1e6,
            all_nvfp4 as f64 / H200_REFERENCE_BYTES_PER_S * 1e6,
            all_nvfp4 as f64 / GB10_STREAMING_BYTES_PER_S * 1e6
        );
    }
    group.throughput(Throughput::Bytes((layer_bytes * LAYERS) as u64));
    group.bench_function(format!("layer-{format}/{LAYERS}-layers"), |b| {
        let t = EventTimer::new(gpu).expect("events");
        b.iter_custom(|iters| {
            t.start(gpu).expect("start");
            for _ in 0..iters {
                whole.launch().expect("replay");
            }
            t.stop(gpu).expect("stop")
        })
    });
    drop(whole);
    let d = SHAPE.hidden;
    let in_proj_bytes =
        SHAPE.in_proj_weight_bytes(nvfp4) + 2 * (CONV_KERNEL * SHAPE.conv_dim() + d) + 4 * 3 * SHAPE.conv_dim();
    let out_proj_bytes = 2 * (d * SHAPE.z_dim() + SHAPE.z_dim() + d);
    let stages = [
        (Stage::InProj, "in_proj", in_proj_bytes),
        (Stage::StateUpdate, "delta_rule_normed (whole-head blocks, gated norm)", SHAPE.state_update_bytes()),
        (Stage::OutProj, "out_proj (gemv_bf16)", out_proj_bytes),
    ];
    for (stage, label, bytes) in stages {
        let g = capture(gpu, &launches, kernels, &[stage]);
        report(
            &Line {
                bench: "gdn-stage",
                label: format!("  gdn {format} {label}"),
                layers: LAYERS,
                launches_per_layer: 1,
                bytes,
                times: replay_times(gpu, &g, 50),
            },
            out,
        );
    }
    let variants: Vec<(String, GdnTiles)> = if nvfp4 {
        gdn_in_proj_nvfp4::Tiles::candidates()
            .into_iter()
            .map(|t| (format!("{t:?}"), GdnTiles { in_proj_nvfp4: t, ..base }))
            .collect()
    } else {
        gdn_in_proj_bf16::Tiles::candidates()
            .into_iter()
            .map(|t| (format!("{t:?}"), GdnTiles { in_proj: t, ..base }))
            .collect()
    };
    sweep(gpu, &launches, &[Stage::InProj], nvfp4, variants.clone(), in_proj_bytes, out);
    if nvfp4 {
        // The tensor-core input projection in the whole layer too, against the default: what its
        // loads before the wait overlap there.
        let layer = variants
            .into_iter()
            .filter(|(_, t)| t.in_proj_nvfp4.mma == 1 || t.in_proj_nvfp4 == base.in_proj_nvfp4)
            .collect();
        sweep(gpu, &launches, &all, true, layer, SHAPE.layer_bytes(true, false), out);
    } else {
        // The bf16 input projection's candidates in the whole layer too: with EARLY > 0 its first
        // weights load before its wait, overlapping the previous layer's out_proj.
        sweep(gpu, &launches, &all, false, variants, layer_bytes, out);
        // The delta rule in the whole layer (where it launches its successor matters there).
        let variants: Vec<(String, GdnTiles)> = gdn_delta_rule_normed::Tiles::candidates()
            .into_iter()
            .map(|t| (format!("{t:?}"), GdnTiles { delta_rule_normed: t, ..base }))
            .collect();
        sweep(gpu, &launches, &all, false, variants, layer_bytes, out);
        // out_proj: the GEMV's candidates one tile off its default (its whole space is gemv's bench).
        let d = gemv_bf16::Tiles::DEFAULT.values();
        let variants = gemv_bf16::Tiles::candidates()
            .into_iter()
            .filter(|t| t.values().iter().zip(&d).filter(|(a, b)| a != b).count() <= 1)
            .map(|t| (format!("{t:?}"), GdnTiles { out_proj: t, ..base }));
        sweep(gpu, &launches, &[Stage::OutProj], false, variants.collect(), out_proj_bytes, out);
    }
}

/// Each tile set of `variants` (one kernel's candidates, the others at their defaults) that fits
/// the published shape, timed as a graph of that kernel's launches.
fn sweep(
    gpu: &Gpu,
    launches: &[GdnLaunches],
    stages: &[Stage],
    nvfp4: bool,
    variants: Vec<(String, GdnTiles)>,
    bytes: usize,
    out: &mut Sink,
) {
    // FLASHNEXT_BENCH_NO_SWEEP=1 skips the tile sweeps (they compile every candidate on the device);
    // FLASHNEXT_BENCH_SWEEP=NAME runs only those whose stage and format contain NAME (`InProj
    // nvfp4`, `whole layer`, ...).
    if std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_some() {
        return;
    }
    let what = if stages.len() == 1 { format!("{:?}", stages[0]) } else { "whole layer".to_owned() };
    let format = if nvfp4 { "nvfp4" } else { "bf16" };
    if let Ok(only) = std::env::var("FLASHNEXT_BENCH_SWEEP")
        && !format!("{what} {format}").contains(&only)
    {
        return;
    }
    for (label, tiles) in variants {
        if tiles.check(SHAPE, nvfp4).is_err() {
            continue;
        }
        let Ok(k) = GdnKernels::load(gpu, tiles) else { continue };
        let g = capture(gpu, launches, &k, stages);
        report(
            &Line {
                bench: "gdn-sweep",
                label: format!("{what}: {label}"),
                layers: launches.len(),
                launches_per_layer: stages.len(),
                bytes,
                times: replay_times(gpu, &g, 20),
            },
            out,
        );
    }
}

criterion_group!(benches, bench_gdn);
criterion_main!(benches);
