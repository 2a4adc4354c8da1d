//! Temperature / top-p sampling on the device at the published vocabulary (248,320 f32 logits),
//! timed with CUDA events over graph replays: a graph of one launch (what a decode step adds,
//! launch included) and a graph of 48 launches back to back (per launch), a new position
//! written before every replay.
//!
//! Logits: normal with standard deviation 3 (a nucleus of thousands of tokens at top_p 0.9),
//! nearly flat (standard deviation 0.05: the nucleus is most of the vocabulary), and rounded to
//! a few levels (thousands of exact ties: the kernel's tie path, one barrier more). The groups
//! hold the tiles `Sampler::new` takes on the device; every other tile set runs as a sweep
//! unless FLASHNEXT_BENCH_NO_SWEEP is set. Lines go to stdout and records
//! (`flashnext::bench::Record`) to $OUT/bench-sample.jsonl (or target/bench-sample.jsonl).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::sample::sample_top_p;
use engine::layers::sample::{SampleParams, Sampler};
use flashnext::bench::{Recorder, Sample, Unit, replay_times_with};
use flashnext::rng::Rng;
use kernel_dsl::TileSet;

const VOCAB: usize = 248_320;
/// Launches in the chained graph.
const LAUNCHES: usize = 48;

/// Times one sampler: (one launch per graph, per launch of a graph of LAUNCHES), each (median, p10, p90).
fn time(gpu: &Gpu, s: &mut Sampler, logits: &DeviceBuffer<f32>) -> [(f64, f64, f64); 2] {
    let mut position = gpu.alloc::<u32>(1).expect("position");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let mut next = 0u32;
    let mut times = [(0.0, 0.0, 0.0); 2];
    for (i, launches) in [1, LAUNCHES].into_iter().enumerate() {
        let g = gpu
            .capture(|| {
                for _ in 0..launches {
                    s.launch(gpu, logits, &position, &mut token)?;
                }
                Ok(())
            })
            .expect("capture");
        // The position lives in device memory: rewriting it between replays is what the engine does.
        times[i] = replay_times_with(gpu, &g, 50, launches, || {
            next += 1;
            gpu.write(&mut position, &[next]).expect("position");
        });
    }
    times
}

fn bench_sample(c: &mut Criterion) {
    let Some(gpu) = flashnext::bench::open_gpu("sample") else { return };
    let device = gpu.info().name.clone();
    println!("device {device}: sampling over {VOCAB} logits");
    let mut rec = Recorder::new(&gpu, "sample", None);
    let sweep = std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_none();
    let mut rng = Rng::new(0x5a3b1e);
    let normal: Vec<f32> = (0..VOCAB).map(|_| 3.0 * rng.normal()).collect();
    let flat: Vec<f32> = (0..VOCAB).map(|_| 0.05 * rng.normal()).collect();
    let tied: Vec<f32> = normal.iter().map(|v| (v * 0.5).round() * 2.0).collect();
    // The tiles `Sampler::new` takes here head the groups; every other set is the sweep's.
    let chosen = Sampler::tiles_for(&gpu).expect("the sampler's tiles");
    println!("the sampler's tiles on this device: {chosen:?}");
    let tile_sets = if sweep { sample_top_p::Tiles::candidates() } else { vec![chosen] };

    for (name, host) in [("normal(0, 3)", &normal), ("flat", &flat), ("tied levels", &tied)] {
        let logits = gpu.upload(host).expect("logits");
        for (temperature, top_p) in [(0.7f32, 0.9f32), (1.0, 1.0)] {
            for &tiles in &tile_sets {
                let params = SampleParams { temperature, top_p, seed: 42 };
                let mut s = match Sampler::load(&gpu, VOCAB, params, tiles) {
                    Ok(s) => s,
                    Err(e) => {
                        println!("sample {name} {tiles:?}: skipped ({e})");
                        continue;
                    }
                };
                let [one, chained] = time(&gpu, &mut s, &logits);
                let what = format!("{name}, T {temperature}, top_p {top_p}, {tiles:?}");
                let prefix = if tiles == chosen { "" } else { "sweep " };
                let group = format!("{prefix}graph of one launch");
                rec.record(Sample::new(group, what.as_str(), Unit::Launch, one).launches(1));
                let group = format!("{prefix}chain of {LAUNCHES}");
                rec.record(Sample::new(group, what, Unit::Launch, chained).launches(1));
            }
        }
    }

    // A criterion line for the headline: `Sampler::new`'s tiles, normal logits, T 0.7, top_p 0.9.
    let logits = gpu.upload(&normal).expect("logits");
    let params = SampleParams { temperature: 0.7, top_p: 0.9, seed: 42 };
    let mut s = Sampler::new(&gpu, VOCAB, params).expect("sampler");
    let position = gpu.upload(&[7u32]).expect("position");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let mut group = c.benchmark_group("sample");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    group.bench_function("top_p/248320", |b| {
        let t = EventTimer::new(&gpu).expect("events");
        b.iter_custom(|iters| {
            t.start(&gpu).expect("start");
            for _ in 0..iters {
                s.launch(&gpu, &logits, &position, &mut token).expect("launch");
            }
            t.stop(&gpu).expect("stop")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_sample);
criterion_main!(benches);
