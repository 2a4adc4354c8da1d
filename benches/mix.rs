//! The Gated Residual mix at the published shape (n 4, d 2560, r 320, with the inject) on the
//! GPU: 48 consecutive sites with distinct weights (bf16: 13.2 MB each, 634 MB in all, far past
//! the L2; NVFP4: 3.7 MB each, 178 MB), each folding in the previous block's write, captured as
//! one CUDA graph and replayed; the time per site against the bytes a site must move, the
//! launches per site counted as they are captured. Each of the two kernels is also timed alone,
//! and every candidate tile set of each.
//!
//! The kernels launch overlapped (each starts before its predecessor ends and streams its weights
//! meanwhile); FLASHNEXT_NO_PDL=1 times them as plain launches, for comparison.
//!
//! Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-mix.jsonl (or
//! target/bench-mix.jsonl).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph, LoadedKernel};
use engine::kernels::mix::{mix_down_bf16, mix_down_nvfp4, mix_up_bf16, mix_up_nvfp4};
use engine::layers::mix::{
    MixIo, MixKernels, MixLaunches, MixMatrices, MixScratch, MixShape, MixTiles, MixWeightsOnDevice, Stage,
};
use flashnext::bench::{Recorder, Sample, Unit, replay_times};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{E2m1x2, E4m3, TileSet};

#[path = "common/random_bits.rs"]
mod random_bits;
use random_bits::{fill, fill_bits};

const SHAPE: MixShape = MixShape { streams: 4, hidden: 2560, rank: 320, inject: true };
const SITES: usize = 48;
const EPS: f32 = 1e-6;
/// What streaming kernels reach on a GB10 (ARCHITECTURE.md): the projection's bandwidth.
const GB10_STREAM_BYTES_PER_S: f64 = 230e9;

/// One site's weights, random: bf16 values of magnitude 2^-6 to 2^-5 with random signs and
/// mantissas, or NVFP4 codes of any value with block scales between 2^-2 and 2^2.
fn site_weights(
    gpu: &Gpu,
    fk: &LoadedKernel<fill_bits::Kernel>,
    rng: &mut Rng,
    seed: u32,
    nvfp4: bool,
) -> MixWeightsOnDevice {
    let w = SHAPE.width();
    let (proj_values, up_values) = (SHAPE.proj_rows() * w, w * SHAPE.rank);
    let matrices = if nvfp4 {
        let mut proj_packed = gpu.alloc::<E2m1x2>(proj_values / 2).expect("alloc");
        let mut proj_scales = gpu.alloc::<E4m3>(proj_values / 16).expect("alloc");
        let mut up_packed = gpu.alloc::<E2m1x2>(up_values / 2).expect("alloc");
        let mut up_scales = gpu.alloc::<E4m3>(up_values / 16).expect("alloc");
        // e4m3 bytes 0b0_0101_xxx to 0b0_1000_xxx: 2^-2 to 2^1.875.
        fill(gpu, fk, &mut proj_packed, seed, u32::MAX, 0);
        fill(gpu, fk, &mut proj_scales, seed + 1, 0x1f1f_1f1f, 0x2828_2828);
        fill(gpu, fk, &mut up_packed, seed + 2, u32::MAX, 0);
        fill(gpu, fk, &mut up_scales, seed + 3, 0x1f1f_1f1f, 0x2828_2828);
        let scale2 = gpu.upload(&[0.002f32, 0.002, 0.01]).expect("alloc");
        MixMatrices::Nvfp4 { proj_packed, proj_scales, up_packed, up_scales, scale2 }
    } else {
        let mut proj = gpu.alloc::<bf16>(proj_values).expect("alloc");
        let mut up = gpu.alloc::<bf16>(up_values).expect("alloc");
        fill(gpu, fk, &mut proj, seed, 0x807f_807f, 0x3c80_3c80);
        fill(gpu, fk, &mut up, seed + 1, 0x807f_807f, 0x3c80_3c80);
        MixMatrices::Bf16 { proj, up }
    };
    MixWeightsOnDevice { shape: SHAPE, norm: gpu.upload(&rng.bf16_normal(w, 0.2)).expect("norm"), matrices }
}

/// A graph of the 48 sites' launches of `stages`, and how many launches it holds.
fn capture(gpu: &Gpu, k: &MixKernels, launches: &[MixLaunches], stages: &[Stage]) -> (Graph, usize) {
    let mut count = 0;
    let g = gpu
        .capture(|| {
            for l in launches {
                for &stage in stages {
                    // SAFETY: the buffers behind the launches live in `bench_mix` for the whole bench.
                    unsafe { l.enqueue_stage(gpu, k, stage) }?;
                    count += 1;
                }
            }
            Ok(())
        })
        .expect("capture");
    (g, count)
}

fn bench_mix(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("mix") else { return };
    let mut rec = Recorder::new(&gpu, "mix", Some(copy_bw));
    let mut rng = Rng::fresh("mix bench");
    let fk = gpu.kernel::<fill_bits::Kernel>(fill_bits::Tiles::DEFAULT).expect("fill kernel");
    let kernels = MixKernels::load(&gpu, MixTiles::default()).expect("compile");
    println!("launches overlapped: {}; default tiles {:?}", gpu.overlaps_launches(), MixTiles::default());

    let mut group = c.benchmark_group("mix");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for (format, nvfp4) in [("bf16", false), ("nvfp4", true)] {
        let sites: Vec<MixWeightsOnDevice> =
            (0..SITES).map(|i| site_weights(&gpu, &fk, &mut rng, 1000 * i as u32, nvfp4)).collect();
        // One decode step's buffers: the streams, the block output y, and the two gains buffers the
        // sites alternate between (each site writes one and folds in the other's write).
        let mut residual = gpu.upload(&rng.bf16_normal(SHAPE.width(), 1.0)).expect("streams");
        let y = gpu.upload(&rng.bf16_normal(SHAPE.hidden, 1.0)).expect("y");
        let mut gains: Vec<DeviceBuffer<f32>> = (0..2).map(|_| gpu.upload(&[1.0f32; 4]).expect("gains")).collect();
        let mut x = gpu.alloc::<bf16>(SHAPE.hidden).expect("x");
        let mut scratch = MixScratch::new(&gpu, SHAPE).expect("scratch");
        let launches: Vec<MixLaunches> = (0..SITES)
            .map(|i| {
                let prev = gains[(i + 1) % 2].ptr();
                let io = MixIo {
                    residual: residual.ptr_mut(),
                    post: Some((y.ptr(), prev)),
                    x: x.ptr_mut(),
                    gains: Some(gains[i % 2].ptr_mut()),
                };
                MixLaunches::new(&sites[i], &mut scratch, io, EPS)
            })
            .collect();
        for l in &launches {
            // SAFETY: the buffers behind the launches live to the end of this loop's iteration.
            unsafe { l.enqueue(&gpu, &kernels) }.expect("eager pass");
        }
        gpu.synchronize().expect("sync");
        let (whole, launch_count) = capture(&gpu, &kernels, &launches, &[Stage::Down, Stage::Up]);
        let per_site_launches = launch_count / SITES;
        if std::env::var_os("FLASHNEXT_BENCH_PROFILE").is_some() {
            continue;
        }

        let bytes = SHAPE.bytes_moved(nvfp4);
        let (median, p10, p90) = replay_times(&gpu, &whole, 100);
        let r = rec.record(
            Sample::new("site", format, Unit::Site, (median, p10, p90))
                .per(SITES)
                .bytes(bytes)
                .launches(per_site_launches)
                .notes(format!("launches overlapped: {}", gpu.overlaps_launches())),
        );
        let fraction_of_copy = bytes as f64 / (r.median_us * 1e-6) / copy_bw;
        println!(
            "  {:.2} MB of it weights; GB10 projection {:.1} us (the same fraction of {:.0} GB/s)",
            SHAPE.weight_bytes(nvfp4) as f64 / 1e6,
            bytes as f64 / (fraction_of_copy * GB10_STREAM_BYTES_PER_S) * 1e6,
            GB10_STREAM_BYTES_PER_S / 1e9,
        );
        group.throughput(Throughput::Bytes((bytes * SITES) as u64));
        group.bench_function(format!("{format}/{SITES}-sites"), |b| {
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

        // Each launch alone: launch 1 reads the norm, W_down and W_inj, X and y; launch 2 W_up, the
        // norm, X and y, and writes X and x.
        let w = SHAPE.width();
        let matrix = |values: usize| if nvfp4 { values / 2 + values / 16 } else { 2 * values };
        let parts = [
            (Stage::Down, "down", matrix(SHAPE.proj_rows() * w) + 2 * (w + w + SHAPE.hidden)),
            (Stage::Up, "up", matrix(w * SHAPE.rank) + 2 * (w + 2 * w + 2 * SHAPE.hidden)),
        ];
        for (stage, label, part_bytes) in parts {
            let (g, _) = capture(&gpu, &kernels, &launches, &[stage]);
            let times = replay_times(&gpu, &g, 50);
            rec.record(
                Sample::new("kernel", format!("{format} {label}"), Unit::Site, times)
                    .per(SITES)
                    .bytes(part_bytes)
                    .launches(1),
            );
        }
        // FLASHNEXT_BENCH_NO_SWEEP=1 skips the tile sweep (it compiles every candidate on the device).
        if std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_none() {
            sweep(&gpu, &launches, nvfp4, &mut rec);
        }
    }
    group.finish();
}

/// Every candidate tile set of each kernel of one format (the other kernels at their defaults),
/// timed as the whole 48-site graph: the tile space the autotuner will search, measured.
fn sweep(gpu: &Gpu, launches: &[MixLaunches], nvfp4: bool, rec: &mut Recorder) {
    let base = MixTiles::default();
    let mut variants: Vec<(&str, String, MixTiles)> = Vec::new();
    if nvfp4 {
        for t in mix_down_nvfp4::Tiles::candidates() {
            variants.push(("down", format!("{t:?}"), MixTiles { down_nvfp4: t, ..base }));
        }
        for t in mix_up_nvfp4::Tiles::candidates() {
            variants.push(("up", format!("{t:?}"), MixTiles { up_nvfp4: t, ..base }));
        }
    } else {
        for t in mix_down_bf16::Tiles::candidates() {
            variants.push(("down", format!("{t:?}"), MixTiles { down_bf16: t, ..base }));
        }
        for t in mix_up_bf16::Tiles::candidates() {
            variants.push(("up", format!("{t:?}"), MixTiles { up_bf16: t, ..base }));
        }
    }
    let format = if nvfp4 { "nvfp4" } else { "bf16" };
    let mut results: Vec<(&str, f64, String)> = Vec::new();
    for (kernel, label, tiles) in variants {
        if tiles.check(SHAPE).is_err() {
            continue;
        }
        let Ok(k) = MixKernels::load(gpu, tiles) else { continue };
        let (g, _) = capture(gpu, &k, launches, &[Stage::Down, Stage::Up]);
        let (median, _, _) = replay_times(gpu, &g, 20);
        results.push((kernel, median / SITES as f64 * 1e6, label));
    }
    for kernel in ["down", "up"] {
        let mut r: Vec<&(&str, f64, String)> = results.iter().filter(|x| x.0 == kernel).collect();
        r.sort_by(|a, b| a.1.total_cmp(&b.1));
        println!(
            "  sweep {format} {kernel} (per site, the other kernel at its default): {} tile sets; fastest:",
            r.len()
        );
        for (_, us, label) in r.iter().take(4) {
            println!("    {us:7.2} us  {label}");
        }
        for (_, us, label) in &r {
            let group = format!("sweep {format} {kernel}");
            rec.record_quietly(Sample::median(group, label.as_str(), Unit::Site, us * 1e-6).launches(2));
        }
    }
}

criterion_group!(benches, bench_mix);
criterion_main!(benches);
