//! The MoE block at the published shape (d 2560, 512 experts, top 10, intermediate 640, shared
//! expert 640) on the GPU: eight layers with distinct weights (each in its own memory, filled on
//! the device), captured as one CUDA graph of 24 launches and replayed; the time per layer against
//! the bytes a layer must read. Each kernel is also timed alone, in a graph of its eight launches.
//!
//! Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-moe.jsonl (or
//! target/bench-moe.jsonl).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu};
use engine::layers::moe::{
    ExpertsOnDevice, MoeKernels, MoeLaunches, MoeScratch, MoeShape, MoeTiles, MoeWeightsOnDevice, Stage,
};
use flashnext::bench::{Recorder, Sample, Unit, replay_times};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{E2m1x2, E4m3, TileSet};

#[path = "common/random_bits.rs"]
mod random_bits;
use random_bits::{fill, fill_bits};

const SHAPE: MoeShape =
    MoeShape { hidden: 2560, experts: 512, top_k: 10, inter: 640, shared_inter: 640, renormalise: true };
const LAYERS: usize = 8;

/// One layer's weights, random, NVFP4: codes anything, block scales between 2^-2 and 2^2.
fn nvfp4_layer(
    gpu: &Gpu,
    fk: &engine::cuda::LoadedKernel<fill_bits::Kernel>,
    rng: &mut Rng,
    seed: u32,
) -> MoeWeightsOnDevice {
    let (d, e, i, is) = (SHAPE.hidden, SHAPE.experts, SHAPE.inter, SHAPE.shared_inter);
    let gate_up_values = 2 * (e * i + is) * d;
    let down_values = (e * i + is) * d;
    let mut w = MoeWeightsOnDevice {
        shape: SHAPE,
        router: gpu.upload(&rng.bf16_normal(e * d, 1.0 / (d as f32).sqrt())).expect("router"),
        shared_gate: gpu.upload(&rng.bf16_normal(d, 1.0 / (d as f32).sqrt())).expect("shared gate"),
        experts: ExpertsOnDevice::Nvfp4 {
            gate_up_packed: gpu.alloc::<E2m1x2>(gate_up_values / 2).expect("alloc"),
            gate_up_scales: gpu.alloc::<E4m3>(gate_up_values / 16).expect("alloc"),
            gate_up_scale2: gpu.upload(&vec![0.01f32; 2 * (e + 1)]).expect("alloc"),
            down_packed: gpu.alloc::<E2m1x2>(down_values / 2).expect("alloc"),
            down_scales: gpu.alloc::<E4m3>(down_values / 16).expect("alloc"),
            down_scale2: gpu.upload(&vec![0.01f32; e + 1]).expect("alloc"),
        },
    };
    if let ExpertsOnDevice::Nvfp4 { gate_up_packed, gate_up_scales, down_packed, down_scales, .. } = &mut w.experts {
        // e4m3 bytes 0b0_0101_xxx to 0b0_1000_xxx: 2^-2 to 2^1.875.
        let scale_and = 0x1f1f_1f1f;
        let scale_or = 0x2828_2828;
        fill(gpu, fk, gate_up_packed, seed, u32::MAX, 0);
        fill(gpu, fk, gate_up_scales, seed + 1, scale_and, scale_or);
        fill(gpu, fk, down_packed, seed + 2, u32::MAX, 0);
        fill(gpu, fk, down_scales, seed + 3, scale_and, scale_or);
    }
    w
}

fn bf16_layer(
    gpu: &Gpu,
    fk: &engine::cuda::LoadedKernel<fill_bits::Kernel>,
    rng: &mut Rng,
    seed: u32,
) -> MoeWeightsOnDevice {
    let (d, e, i, is) = (SHAPE.hidden, SHAPE.experts, SHAPE.inter, SHAPE.shared_inter);
    let values = (e * i + is) * d;
    let mut gate_up = gpu.alloc::<bf16>(2 * values).expect("alloc");
    let mut down = gpu.alloc::<bf16>(values).expect("alloc");
    // bf16 pairs with exponents near 2^-6 and random signs and mantissas: 0x3c80..0x3cff.
    fill(gpu, fk, &mut gate_up, seed, 0x807f_807f, 0x3c80_3c80);
    fill(gpu, fk, &mut down, seed + 1, 0x807f_807f, 0x3c80_3c80);
    MoeWeightsOnDevice {
        shape: SHAPE,
        router: gpu.upload(&rng.bf16_normal(e * d, 1.0 / (d as f32).sqrt())).expect("router"),
        shared_gate: gpu.upload(&rng.bf16_normal(d, 1.0 / (d as f32).sqrt())).expect("shared gate"),
        experts: ExpertsOnDevice::Bf16 { gate_up, down },
    }
}

fn bench_moe(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("moe") else { return };
    let mut rec = Recorder::new(&gpu, "moe", Some(copy_bw));
    let mut rng = Rng::fresh("moe bench");
    let fk = gpu.kernel::<fill_bits::Kernel>(fill_bits::Tiles::DEFAULT).expect("fill kernel");
    let kernels = MoeKernels::load(&gpu, MoeTiles::default()).expect("compile");

    let mut group = c.benchmark_group("moe");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for (format, nvfp4) in [("nvfp4", true), ("bf16", false)] {
        let layers: Vec<MoeWeightsOnDevice> = (0..LAYERS)
            .map(|l| {
                if nvfp4 {
                    nvfp4_layer(&gpu, &fk, &mut rng, 1000 * l as u32)
                } else {
                    bf16_layer(&gpu, &fk, &mut rng, 1000 * l as u32)
                }
            })
            .collect();
        let xs: Vec<DeviceBuffer<bf16>> =
            (0..LAYERS).map(|_| gpu.upload(&rng.bf16_normal(SHAPE.hidden, 1.0)).expect("x")).collect();
        let mut ys: Vec<DeviceBuffer<bf16>> = (0..LAYERS).map(|_| gpu.alloc(SHAPE.hidden).expect("y")).collect();
        let mut scratch: Vec<MoeScratch> =
            (0..LAYERS).map(|_| MoeScratch::new(&gpu, SHAPE).expect("scratch")).collect();
        let launches: Vec<MoeLaunches> =
            (0..LAYERS).map(|l| MoeLaunches::new(&layers[l], &mut scratch[l], xs[l].ptr(), ys[l].ptr_mut())).collect();
        // One eager pass first: valid launches, and ids and h in the scratch for the per-kernel graphs.
        for l in &launches {
            // SAFETY: the buffers behind the launches live to the end of this function.
            unsafe { l.enqueue(&gpu, &kernels) }.expect("pass");
        }
        gpu.synchronize().expect("sync");
        let whole = gpu
            .capture(|| {
                for l in &launches {
                    // SAFETY: as above.
                    unsafe { l.enqueue(&gpu, &kernels) }?;
                }
                Ok(())
            })
            .expect("capture");
        // FLASHNEXT_BENCH_PROFILE=1: one eager pass per layer only, for a profiler to attach to;
        // `=graph`: three replays of the graph too, for a timeline of the graph's nodes.
        if let Some(mode) = std::env::var_os("FLASHNEXT_BENCH_PROFILE") {
            if mode == "graph" {
                for _ in 0..3 {
                    whole.launch().expect("replay");
                }
            }
            gpu.synchronize().expect("sync");
            return;
        }
        let bytes = SHAPE.bytes_read(nvfp4);
        let (median, p10, p90) = replay_times(&gpu, &whole, 50);
        rec.record(Sample::new("layer", format, Unit::Layer, (median, p10, p90)).per(LAYERS).bytes(bytes).launches(3));
        // The same graph with every launch serialised (no programmatic dependent launch): what the
        // overlap buys, in the same run.
        gpu.set_overlap_launches(false);
        let serial = gpu
            .capture(|| {
                for l in &launches {
                    // SAFETY: as above.
                    unsafe { l.enqueue(&gpu, &kernels) }?;
                }
                Ok(())
            })
            .expect("capture");
        gpu.set_overlap_launches(true);
        let times = replay_times(&gpu, &serial, 50);
        drop(serial);
        rec.record(
            Sample::new("layer", format!("{format}, launches serialised"), Unit::Layer, times)
                .per(LAYERS)
                .bytes(bytes)
                .launches(3),
        );
        group.throughput(Throughput::Bytes((bytes * LAYERS) as u64));
        group.bench_function(format!("{format}/{LAYERS}-layers"), |b| {
            let t = EventTimer::new(&gpu).expect("events");
            b.iter_custom(|iters| {
                t.start(&gpu).expect("start");
                for _ in 0..iters {
                    whole.launch().expect("replay");
                }
                t.stop(&gpu).expect("stop")
            })
        });
        drop(whole);
        per_kernel(&gpu, &kernels, &launches, nvfp4, &mut rec);
        // FLASHNEXT_BENCH_NO_SWEEP=1 skips the tile sweep (it compiles every candidate on the device).
        if nvfp4 && std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_none() {
            sweep(&gpu, &launches, &mut rec);
        }
    }
    group.finish();
}

/// Each kernel alone: a graph of its eight launches (the scratch holds the ids and h of the eager
/// pass, so the later kernels read real routes).
fn per_kernel(gpu: &Gpu, k: &MoeKernels, launches: &[MoeLaunches], nvfp4: bool, rec: &mut Recorder) {
    let sh = SHAPE;
    let d = sh.hidden;
    let values = |n_experts: usize| n_experts * sh.inter * d;
    let expert_bytes = |v: usize| if nvfp4 { v / 2 + v / 16 } else { 2 * v };
    let stages = [
        (Stage::Router, "router", 2 * (sh.experts * d + 2 * d)),
        (Stage::GateUp, "gate_up", expert_bytes(2 * values(sh.top_k + 1)) + 2 * d),
        (Stage::Down, "down", expert_bytes(values(sh.top_k + 1)) + 2 * d),
    ];
    for (stage, label, bytes) in stages {
        let g = gpu
            .capture(|| {
                for l in launches {
                    // SAFETY: the launches' buffers live in `bench_moe` for the whole bench.
                    unsafe { l.enqueue_stage(gpu, k, stage) }?;
                }
                Ok(())
            })
            .expect("capture");
        let times = replay_times(gpu, &g, 50);
        let format = if nvfp4 { "nvfp4" } else { "bf16" };
        rec.record(
            Sample::new("kernel", format!("{format} {label}"), Unit::Layer, times).per(LAYERS).bytes(bytes).launches(1),
        );
    }
}

/// Every candidate tile set of each NVFP4 kernel (the others at their defaults), timed as that
/// kernel's graph of eight launches: the tile space the autotuner will search, measured.
fn sweep(gpu: &Gpu, launches: &[MoeLaunches], rec: &mut Recorder) {
    use engine::kernels::moe::{down, gate_up, router};
    let base = MoeTiles::default();
    let mut variants: Vec<(Stage, String, MoeTiles)> = Vec::new();
    for t in router::moe_router::Tiles::candidates() {
        variants.push((Stage::Router, format!("{t:?}"), MoeTiles { router: t, ..base }));
    }
    for t in gate_up::moe_gate_up_nvfp4::Tiles::candidates() {
        variants.push((Stage::GateUp, format!("{t:?}"), MoeTiles { gate_up_nvfp4: t, ..base }));
    }
    for t in down::moe_down_nvfp4::Tiles::candidates() {
        variants.push((Stage::Down, format!("{t:?}"), MoeTiles { down_nvfp4: t, ..base }));
    }
    // FLASHNEXT_BENCH_SWEEP_ONLY=a|b keeps the tile sets whose label contains a or b.
    if let Some(only) = std::env::var_os("FLASHNEXT_BENCH_SWEEP_ONLY") {
        let only = only.to_string_lossy().into_owned();
        variants.retain(|(_, label, _)| only.split('|').any(|part| label.contains(part)));
    }
    let mut results: Vec<(Stage, f64, String)> = Vec::new();
    for (stage, label, tiles) in variants {
        if tiles.check(SHAPE).is_err() {
            continue;
        }
        let Ok(k) = MoeKernels::load(gpu, tiles) else { continue };
        let g = gpu
            .capture(|| {
                for l in launches {
                    // SAFETY: the launches' buffers live in `bench_moe` for the whole bench.
                    unsafe { l.enqueue_stage(gpu, &k, stage) }?;
                }
                Ok(())
            })
            .expect("capture");
        let (median, _, _) = replay_times(gpu, &g, 20);
        results.push((stage, median / LAYERS as f64 * 1e6, label));
    }
    for stage in [Stage::Router, Stage::GateUp, Stage::Down] {
        let mut r: Vec<&(Stage, f64, String)> = results.iter().filter(|x| x.0 == stage).collect();
        r.sort_by(|a, b| a.1.total_cmp(&b.1));
        println!("  sweep {stage:?}: {} tile sets; fastest:", r.len());
        for (_, us, label) in r.iter().take(4) {
            println!("    {us:7.2} us  {label}");
        }
        for (_, us, label) in &r {
            rec.record_quietly(
                Sample::median(format!("sweep {stage:?}"), label.as_str(), Unit::Layer, us * 1e-6).launches(1),
            );
        }
    }
}

criterion_group!(benches, bench_moe);
criterion_main!(benches);
