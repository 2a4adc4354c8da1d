//! The lm_head with its fused greedy choice at the published shape (248,320 × 2,560), bf16 and
//! NVFP4, on the GPU: one launch per replay of a captured graph (the matrix alone is 25× the
//! H200's L2 in bf16, 7× in NVFP4, so every launch streams it from DRAM), timed with CUDA events.
//!
//! Each line: median and spread per launch, the bytes it must read (weights, x) and write
//! (logits), GB/s, the fraction of 4.27 TB/s and of the copy bandwidth measured in the same run,
//! and the floors on the H200 and on the GB10 (230 GB/s; a projection, not a measurement). Every
//! tile candidate and grid size runs unless FLASHNEXT_BENCH_NO_SWEEP is set. Records
//! (`flashnext::bench::Record`) also go to $OUT/bench-lm_head.jsonl (or target/bench-lm_head.jsonl).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu};
use engine::kernels::lm_head::{lm_head_argmax_bf16, lm_head_argmax_nvfp4};
use engine::layers::lm_head::{LmHead, LmHeadTiles};
use engine::model::nvfp4::Nvfp4Matrix;
use flashnext::bench::{Recorder, Sample, Unit, replay_times};
use half::bf16;
use kernel_dsl::TileSet;

const VOCAB: usize = 248_320;
const HIDDEN: usize = 2560;

/// A fast generator for a gigabyte of weights (the bench's values only need to be finite and
/// varied): xorshift64*.
struct Fast(u64);

impl Fast {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn bf16_weights(n: usize) -> Vec<bf16> {
    let mut r = Fast(0x9e37_79b9_7f4a_7c15);
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let bits = r.next();
        for i in 0..4 {
            // Magnitudes in [2^-9, 2^-4), either sign.
            let b = (bits >> (16 * i)) as u16;
            v.push(bf16::from_bits((0x3b00 + (b & 0x03ff)) | (b & 0x8000)));
        }
    }
    v.truncate(n);
    v
}

fn nvfp4_weights() -> Nvfp4Matrix {
    let mut r = Fast(0x1234_5678_9abc_def1);
    let packed: Vec<u8> = (0..VOCAB * HIDDEN / 2).map(|_| r.next() as u8).collect();
    // e4m3 codes 0x20..0x3f: scales in [2^-4, 1), never NaN.
    let scales: Vec<u8> = (0..VOCAB * HIDDEN / 16).map(|_| 0x20 + (r.next() % 32) as u8).collect();
    Nvfp4Matrix { rows: VOCAB, cols: HIDDEN, packed, scales, scale_2: 0.01 }
}

/// Where records go: the one writer of every bench.
type Sink = Recorder;

/// The record of one lm_head: group `default` at the default tiles and grid, `sweep <format>`
/// otherwise.
fn record(sink: &mut Sink, format: &str, default: bool, tiles: String, times: (f64, f64, f64), bytes: usize) {
    // A sweep's candidates are cases of their own (bench-report keeps the latest record of each
    // case and shows a sweep's fastest), so their case names carry the tiles.
    let (group, case) = if default {
        ("default".to_owned(), format.to_owned())
    } else {
        (format!("sweep {format}"), format!("{format} {tiles}"))
    };
    sink.record(Sample::new(group, case, Unit::Launch, times).bytes(bytes).launches(1).notes(tiles));
}

/// Times one lm_head: replays of a graph of one launch; the bytes it must move.
fn time(gpu: &Gpu, head: &mut LmHead, x: &DeviceBuffer<bf16>) -> ((f64, f64, f64), usize) {
    let mut logits = gpu.alloc::<f32>(VOCAB).expect("logits");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let g = gpu.capture(|| head.launch(gpu, x, &mut logits, &mut token)).expect("capture");
    let t = replay_times(gpu, &g, 30);
    (t, head.weight_bytes() + 2 * HIDDEN + 4 * VOCAB)
}

fn bench_lm_head(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("lm_head") else { return };
    let mut sink = Recorder::new(&gpu, "lm_head", Some(copy_bw));
    let sweep = std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_none();
    let x = gpu.upload(&bf16_weights(HIDDEN)).expect("x");
    let waves: &[u32] = if sweep { &[1, 2, 4, 8, 16] } else { &[8] };

    {
        let w = bf16_weights(VOCAB * HIDDEN);
        let mut tile_sets = vec![lm_head_argmax_bf16::Tiles::DEFAULT];
        if sweep {
            tile_sets = lm_head_argmax_bf16::Tiles::candidates();
        }
        for tiles in tile_sets {
            for &wv in waves {
                if tiles != lm_head_argmax_bf16::Tiles::DEFAULT && wv != 8 {
                    continue;
                }
                let t = LmHeadTiles { bf16: tiles, waves: wv, ..LmHeadTiles::default() };
                let mut head = LmHead::bf16(&gpu, &w, VOCAB, HIDDEN, t).expect("lm_head");
                let (times, bytes) = time(&gpu, &mut head, &x);
                let default = tiles == lm_head_argmax_bf16::Tiles::DEFAULT && wv == LmHeadTiles::default().waves;
                record(&mut sink, "bf16", default, format!("{tiles:?} {} blocks", head.blocks()), times, bytes);
            }
        }
    }
    let m = nvfp4_weights();
    // Without the sweep, the defaults and the defaults with each DYNAMIC candidate (the share of
    // rows handed out at run time).
    let base = lm_head_argmax_nvfp4::Tiles::DEFAULT;
    let mut tile_sets = vec![base];
    for t in lm_head_argmax_nvfp4::Tiles::candidates() {
        let with = lm_head_argmax_nvfp4::Tiles { dynamic: t.dynamic, ..base };
        if !tile_sets.contains(&with) {
            tile_sets.push(with);
        }
    }
    if sweep {
        tile_sets = lm_head_argmax_nvfp4::Tiles::candidates();
    }
    for tiles in tile_sets {
        for &wv in waves {
            if tiles != lm_head_argmax_nvfp4::Tiles::DEFAULT && wv != 8 {
                continue;
            }
            let t = LmHeadTiles { nvfp4: tiles, waves: wv, ..LmHeadTiles::default() };
            // A set whose STEPS cannot hold the published row is not a candidate at this shape;
            // the reason is printed, so that any other refusal shows too.
            let mut head = match LmHead::nvfp4(&gpu, &m, t) {
                Ok(head) => head,
                Err(e) => {
                    println!("lm_head nvfp4 {tiles:?}: skipped at {VOCAB} x {HIDDEN}: {e}");
                    continue;
                }
            };
            let (times, bytes) = time(&gpu, &mut head, &x);
            let default = tiles == lm_head_argmax_nvfp4::Tiles::DEFAULT && wv == LmHeadTiles::default().waves;
            record(&mut sink, "nvfp4", default, format!("{tiles:?} {} blocks", head.blocks()), times, bytes);
        }
    }

    // A criterion line for the headline: the NVFP4 lm_head at its defaults.
    let mut head = LmHead::nvfp4(&gpu, &m, LmHeadTiles::default()).expect("lm_head");
    let mut logits = gpu.alloc::<f32>(VOCAB).expect("logits");
    let mut token = gpu.alloc::<u32>(1).expect("token");
    let mut group = c.benchmark_group("lm_head");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    group.bench_function("nvfp4/248320x2560", |b| {
        let t = EventTimer::new(&gpu).expect("events");
        b.iter_custom(|iters| {
            t.start(&gpu).expect("start");
            for _ in 0..iters {
                head.launch(&gpu, &x, &mut logits, &mut token).expect("launch");
            }
            t.stop(&gpu).expect("stop")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_lm_head);
criterion_main!(benches);
