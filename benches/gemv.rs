//! The bf16 GEMV on the GPU: criterion timings from CUDA events (`iter_custom`), launches replayed
//! from a CUDA graph so that host launch cost does not hide in small kernels, and weights rotated
//! through copies that together exceed the L2 four times over, so every launch streams from DRAM.
//!
//! Besides criterion's report, each case prints one line: median and spread per launch, the
//! bytes it must move, GB/s, and the fraction of the device's copy bandwidth measured in the same
//! run. The records also go to $OUT/bench-gemv.jsonl (or target/bench-gemv.jsonl), in the schema of
//! `flashnext::bench::Record`.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::kernels::gemv_bf16::gemv_bf16;
use flashnext::bench::{Recorder, Sample, Unit, percentile};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::TileSet;

struct Case {
    rows: usize,
    cols: usize,
    variants: Vec<(&'static str, gemv_bf16::Tiles)>,
}

fn cases() -> Vec<Case> {
    let d = gemv_bf16::Tiles::DEFAULT;
    vec![
        Case {
            rows: 10240,
            cols: 2560,
            variants: vec![
                ("default", d),
                ("unroll1", gemv_bf16::Tiles { unroll: 1, ..d }),
                ("unroll4", gemv_bf16::Tiles { unroll: 4, ..d }),
                ("rows1", gemv_bf16::Tiles { rows: 1, ..d }),
                ("warps8", gemv_bf16::Tiles { warps: 8, ..d }),
            ],
        },
        Case {
            rows: 320,
            cols: 10240,
            variants: vec![
                ("default", d),
                ("split4", gemv_bf16::Tiles { k_split: 4, ..d }),
                ("split8", gemv_bf16::Tiles { k_split: 8, ..d }),
                ("split16v4", gemv_bf16::Tiles { k_split: 16, vec: 4, ..d }),
                ("split8r1", gemv_bf16::Tiles { k_split: 8, rows: 1, ..d }),
            ],
        },
    ]
}

/// Copies of W, x, y and the split-K workspace for one shape.
struct Buffers {
    weights: Vec<DeviceBuffer<bf16>>,
    x: DeviceBuffer<bf16>,
    y: DeviceBuffer<bf16>,
    partial: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
}

fn buffers(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize) -> Buffers {
    let bytes = rows * cols * 2;
    let rotate_over = 4 * gpu.info().l2_bytes as usize;
    let copies = rotate_over.div_ceil(bytes).max(2);
    let w = rng.bf16_normal(rows * cols, 1.0);
    Buffers {
        weights: (0..copies).map(|_| gpu.upload(&w).expect("upload W")).collect(),
        x: gpu.upload(&rng.bf16_normal(cols, 1.0)).expect("upload x"),
        y: gpu.alloc(rows).expect("alloc y"),
        partial: gpu.alloc(16 * rows).expect("alloc partials"),
        counters: gpu.alloc(rows).expect("alloc counters"),
    }
}

/// A graph of `launches` GEMVs cycling through the weight copies.
fn graph(gpu: &Gpu, b: &mut Buffers, tiles: gemv_bf16::Tiles, rows: usize, cols: usize, launches: usize) -> Graph {
    let k = gpu.kernel::<gemv_bf16::Kernel>(tiles).expect("compile");
    let r = k.resources();
    println!("  {} : {} registers, {} B spilled", k.key(), r.registers, r.spill_store_bytes);
    // One eager launch first: it must be valid before it is captured.
    let args = |b: &mut Buffers, i: usize| gemv_bf16::Args {
        w: b.weights[i % b.weights.len()].ptr(),
        x: b.x.ptr(),
        y: b.y.ptr_mut(),
        partial: b.partial.ptr_mut(),
        counters: b.counters.ptr_mut(),
        rows: rows as u32,
        cols: cols as u32,
    };
    let a = args(b, 0);
    // SAFETY: every W copy is rows×cols, x cols, y rows, partial 16·rows, counters rows.
    unsafe { k.launch(gpu, &a) }.expect("launch");
    gpu.synchronize().expect("sync");
    gpu.capture(|| {
        for i in 0..launches {
            let a = args(b, i);
            // SAFETY: as above.
            unsafe { k.launch(gpu, &a) }?;
        }
        Ok(())
    })
    .expect("capture")
}

fn bench_gemv(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("gemv") else { return };
    let mut rec = Recorder::new(&gpu, "gemv", Some(copy_bw));
    let mut rng = Rng::fresh("gemv bench");

    let mut group = c.benchmark_group("gemv_bf16");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for case in cases() {
        let (rows, cols) = (case.rows, case.cols);
        let mut b = buffers(&gpu, &mut rng, rows, cols);
        let launches = b.weights.len() * 32usize.div_ceil(b.weights.len());
        // The bytes a GEMV must move: W once, x once, y once.
        let bytes = (rows * cols + cols + rows) * 2;
        for (label, tiles) in &case.variants {
            let g = graph(&gpu, &mut b, *tiles, rows, cols, launches);
            let timer = EventTimer::new(&gpu).expect("events");
            // Our own samples: one graph replay each, per-launch time.
            let mut per_launch: Vec<f64> = (0..60)
                .map(|_| {
                    timer.start(&gpu).expect("start");
                    g.launch().expect("replay");
                    timer.stop(&gpu).expect("stop").as_secs_f64() / launches as f64
                })
                .collect();
            per_launch.sort_by(f64::total_cmp);
            let median = percentile(&per_launch, 0.5);
            let times = (median, percentile(&per_launch, 0.1), percentile(&per_launch, 0.9));
            rec.record(
                Sample::new("gemv_bf16", format!("{rows}x{cols} {label}"), Unit::Launch, times)
                    .bytes(bytes)
                    .launches(1)
                    .notes(format!("{tiles:?}")),
            );
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(format!("{rows}x{cols}/{label}"), |bench| {
                bench.iter_custom(|iters| {
                    let replays = (iters as usize).div_ceil(launches);
                    timer.start(&gpu).expect("start");
                    for _ in 0..replays {
                        g.launch().expect("replay");
                    }
                    let t = timer.stop(&gpu).expect("stop");
                    t.mul_f64(iters as f64 / (replays * launches) as f64)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_gemv);
criterion_main!(benches);
