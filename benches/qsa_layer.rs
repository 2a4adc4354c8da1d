//! The whole QSA layer (engine::layers::qsa: the stacked projection GEMV, prepare, block scores,
//! top-k, attention, combine, o_proj: seven launches) at the published shape (d 2560, 24 query
//! heads on 2 key/value heads of 256, 4 index heads of 128, blocks of 4, 512 blocks kept, bf16
//! weights), decoding the last token of a 32k and of a 128k context.
//!
//! 12 layers (the model's count) with distinct weights and caches (filled on the device with
//! random bits: ~5.5 GB at 128k, far beyond the 60 MB L2, so each layer reads its weights, pooled
//! keys and selected K/V from DRAM), one scratch, one graph of 84 launches replayed; and each of
//! the seven launches alone (a graph of its 12 launches). The position sits in the context's
//! device word, as in a decode step.
//!
//! Each line gives the time per layer (median, p10, p90 of the replays), the bytes it must move
//! (`QsaShape::layer_bytes`: weights, x and y, the cache appends, every complete block's pooled
//! key, the scores written and read, the selected tokens' K and V), the floor at 4.27 TB/s and
//! the fraction reached, and the GB10 projection of the same bytes at 230 GB/s (a projection, not
//! a measurement). Lines go to stdout and records (`flashnext::bench::Record`) to
//! $OUT/bench-qsa_layer.jsonl (or target/).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph, LoadedKernel};
use engine::layers::matrix::MatrixOnDevice;
use engine::layers::qsa::{
    QsaCaches, QsaContext, QsaKernels, QsaLaunches, QsaScratch, QsaShape, QsaTiles, QsaWeightsOnDevice, Stage, TopK,
};
use flashnext::bench::{Recorder, Sample, Unit, replay_times_with};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::TileSet;

#[path = "common/random_bits.rs"]
mod random_bits;
use random_bits::{fill, fill_bits};

const SHAPE: QsaShape = QsaShape::PUBLISHED;
const LAYERS: usize = 12;
const CONTEXTS: [usize; 2] = [32_768, 131_072];

/// Random bf16 pairs with exponents near 2^-6, random signs and mantissas.
fn fill_bf16(gpu: &Gpu, k: &LoadedKernel<fill_bits::Kernel>, buf: &mut DeviceBuffer<bf16>, seed: u32) {
    fill(gpu, k, buf, seed, 0x807f_807f, 0x3c80_3c80);
}

/// Random f32 of magnitude in [0.5, 1), random signs.
fn fill_f32(gpu: &Gpu, k: &LoadedKernel<fill_bits::Kernel>, buf: &mut DeviceBuffer<f32>, seed: u32) {
    fill(gpu, k, buf, seed, 0x807f_ffff, 0x3f00_0000);
}

fn layer_weights(gpu: &Gpu, fk: &LoadedKernel<fill_bits::Kernel>, rng: &mut Rng, seed: u32) -> QsaWeightsOnDevice {
    let sh = SHAPE;
    let mut in_proj = gpu.alloc(sh.in_rows() * sh.hidden).expect("alloc");
    let mut o_proj = gpu.alloc(sh.hidden * sh.attn_dim()).expect("alloc");
    fill_bf16(gpu, fk, &mut in_proj, seed);
    fill_bf16(gpu, fk, &mut o_proj, seed + 1);
    QsaWeightsOnDevice {
        shape: sh,
        in_proj: MatrixOnDevice::Bf16(in_proj),
        o_proj: MatrixOnDevice::Bf16(o_proj),
        q_norm: gpu.upload(&rng.bf16_normal(sh.head_dim, 0.2)).expect("norm"),
        k_norm: gpu.upload(&rng.bf16_normal(sh.head_dim, 0.2)).expect("norm"),
        index_q_norm: gpu.upload(&rng.bf16_normal(sh.index_dim, 0.2)).expect("norm"),
        index_k_norm: gpu.upload(&rng.bf16_normal(sh.index_dim, 0.2)).expect("norm"),
    }
}

/// Where records go: the one writer of every bench.
struct Sink(Recorder);

impl Sink {
    /// One record per layer; `bytes` 0 where a launch's bytes are not what bounds it.
    fn record(&mut self, group: &str, case: &str, t: (f64, f64, f64), bytes: usize, launches: usize) {
        let s = Sample::new(group, case, Unit::Layer, t).launches(launches);
        self.0.record(if bytes == 0 { s } else { s.bytes(bytes) });
    }
}

/// One graph of `stages` of every layer, layer by layer.
fn capture(gpu: &Gpu, launches: &[QsaLaunches], k: &QsaKernels, stages: &[Stage]) -> Graph {
    gpu.capture(|| {
        for l in launches {
            for &s in stages {
                // SAFETY: every buffer behind the launches lives until the graphs are dropped;
                // x and y are per layer, apart from the rest; the position is below the capacity.
                unsafe { l.enqueue_stage(gpu, k, s) }?;
            }
        }
        Ok(())
    })
    .expect("capture")
}

/// Bytes one launch alone must move, roughly: its big reads.
fn stage_bytes(stage: Stage, position: usize) -> usize {
    let sh = SHAPE;
    let complete = (position + 1) / sh.block_tokens;
    let attended = complete.min(sh.top) * sh.block_tokens + (position + 1 - complete * sh.block_tokens);
    match stage {
        Stage::InProj => 2 * (sh.in_rows() * sh.hidden + sh.hidden + sh.in_rows()),
        Stage::BlockScores => 4 * (complete * sh.index_dim + complete),
        Stage::Attention => 2 * 2 * attended * sh.kv_dim(),
        Stage::OProj => 2 * (sh.hidden * sh.attn_dim() + sh.attn_dim() + sh.hidden),
        Stage::Prepare | Stage::TopBlocks | Stage::Combine => 0,
    }
}

fn bench_qsa_layer(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("qsa layer") else { return };
    let mut sink = Sink(Recorder::new(&gpu, "qsa_layer", Some(copy_bw)));
    let mut rng = Rng::fresh("qsa layer bench");
    let fk = gpu.kernel::<fill_bits::Kernel>(fill_bits::Tiles::DEFAULT).expect("compile");
    let tiles = QsaTiles::default();
    let k = QsaKernels::load(&gpu, tiles).expect("kernels");
    // The same layer with the multi-block top-k, timed beside it.
    let grid_tiles = QsaTiles { top_k: TopK::Grid(TileSet::DEFAULT), ..tiles };
    let k_grid = QsaKernels::load(&gpu, grid_tiles).expect("kernels (multi-block top-k)");
    let weights: Vec<QsaWeightsOnDevice> =
        (0..LAYERS).map(|l| layer_weights(&gpu, &fk, &mut rng, 100 * l as u32 + 1)).collect();
    let mut xs: Vec<DeviceBuffer<bf16>> = (0..LAYERS).map(|_| gpu.alloc(SHAPE.hidden).expect("x")).collect();
    let mut ys: Vec<DeviceBuffer<bf16>> = (0..LAYERS).map(|_| gpu.alloc(SHAPE.hidden).expect("y")).collect();
    for (l, x) in xs.iter_mut().enumerate() {
        // Inputs of magnitude ~1 (exponents 2^0 with random signs and mantissas).
        fill(&gpu, &fk, x, 7 + l as u32, 0x807f_807f, 0x3f80_3f80);
    }
    println!(
        "QSA layer, published shape: {:.1} MB of bf16 weights a layer, tiles {tiles:?}",
        SHAPE.weight_bytes(false) as f64 / 1e6
    );

    let mut group = c.benchmark_group("qsa-layer");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for context in CONTEXTS {
        let position = context - 1;
        let mut ctx = QsaContext::new(&gpu, SHAPE, context).expect("context");
        ctx.set_position(&gpu, position).expect("position");
        let mut scratch = QsaScratch::new(&gpu, SHAPE, &ctx).expect("scratch");
        let mut caches: Vec<QsaCaches> = (0..LAYERS)
            .map(|l| {
                let mut c = QsaCaches::new(&gpu, SHAPE, &ctx).expect("caches");
                let seed = 1000 * (l as u32 + 1) + context as u32;
                fill_bf16(&gpu, &fk, &mut c.k, seed);
                fill_bf16(&gpu, &fk, &mut c.v, seed + 1);
                fill_f32(&gpu, &fk, &mut c.index_keys, seed + 2);
                fill_f32(&gpu, &fk, &mut c.block_keys, seed + 3);
                c
            })
            .collect();
        let launches: Vec<QsaLaunches> = (0..LAYERS)
            .map(|l| {
                QsaLaunches::new(&k, &weights[l], &mut ctx, &mut caches[l], &mut scratch, xs[l].ptr(), ys[l].ptr_mut())
                    .expect("launches")
            })
            .collect();
        gpu.synchronize().expect("fills");

        let whole = capture(&gpu, &launches, &k, &Stage::ALL);
        let t = replay_times_with(&gpu, &whole, 30, LAYERS, || {});
        let bytes = SHAPE.layer_bytes(position, false);
        let count = gpu.download(&scratch.count).expect("count")[0];
        let case = format!("{}k tokens ({count} blocks selected, {LAYERS} layers)", context / 1024);
        sink.record("layer", &case, t, bytes, 7);
        group.throughput(Throughput::Bytes((bytes * LAYERS) as u64));
        group.bench_function(format!("layer/{}k/{LAYERS}-layers", context / 1024), |b| {
            let timer = EventTimer::new(&gpu).expect("events");
            b.iter_custom(|iters| {
                timer.start(&gpu).expect("start");
                for _ in 0..iters {
                    whole.launch().expect("replay");
                }
                timer.stop(&gpu).expect("stop")
            })
        });
        drop(whole);

        for stage in Stage::ALL {
            let g = capture(&gpu, &launches, &k, &[stage]);
            let t = replay_times_with(&gpu, &g, 30, LAYERS, || {});
            let bytes = stage_bytes(stage, position);
            sink.record("launch", &format!("{stage:?} at {}k tokens", context / 1024), t, bytes, 1);
        }
        let launches_grid: Vec<QsaLaunches> = (0..LAYERS)
            .map(|l| {
                QsaLaunches::new(
                    &k_grid,
                    &weights[l],
                    &mut ctx,
                    &mut caches[l],
                    &mut scratch,
                    xs[l].ptr(),
                    ys[l].ptr_mut(),
                )
                .expect("launches")
            })
            .collect();
        let whole = capture(&gpu, &launches_grid, &k_grid, &Stage::ALL);
        let t = replay_times_with(&gpu, &whole, 30, LAYERS, || {});
        let case = format!("{}k tokens, multi-block top-k ({LAYERS} layers)", context / 1024);
        sink.record("layer", &case, t, SHAPE.layer_bytes(position, false), 7);
        drop(whole);
        let g = capture(&gpu, &launches_grid, &k_grid, &[Stage::TopBlocks]);
        let t = replay_times_with(&gpu, &g, 30, LAYERS, || {});
        let case = format!("TopBlocks (multi-block) at {}k tokens", context / 1024);
        sink.record("launch", &case, t, 0, 1);
        gpu.synchronize().expect("sync");
    }
    group.finish();
}

criterion_group!(benches, bench_qsa_layer);
criterion_main!(benches);
