//! PLE's two device-memory kernels alone at the published shape, each its own group: `ple_ids`
//! (the n-gram row ids of the newest token for every PLE layer) and `ple_gate_conv` (norms, gate,
//! dilated conv with its state, the sum into the 4 streams of 2560). `benches/ple.rs` times what
//! crosses the host bus (the gather of rows from host memory) and the block around it; the bytes
//! here are all in device memory, so this bench's floors and fractions of 4.27 TB/s mean what they
//! do for the other per-kernel benches (`bench-report` treats it as bytes-bound).
//!
//! Bytes one launch must move:
//! - `ple_ids`: the token (4 B), the history read and written ((ngram_size − 1) u32 each way),
//!   the hash multipliers (layers × ngram_size u64), the primes and offsets (layers × heads u64
//!   each) and the ids written (layers × heads u64): 428 B for the published model's one PLE layer
//!   (3-grams, 16 heads). One block of 128 threads: pure latency.
//! - `ple_gate_conv`: reads the projections ((n + 1)·d bf16), the streams (n·d bf16), the three
//!   norms' weights (3·n·d bf16), the conv's weights (n·d·K bf16), its state (depth·n·d f32, every
//!   row: the taps' and the shift's), with the previous block's write (as in the step, where PLE's
//!   layer takes it) its y (d bf16) and gains (n f32); writes the state shifted by one row
//!   (depth·n·d f32) and the output streams (n·d bf16). At n 4, d 2560, K 4, depth 9: 952,336 B
//!   (947,200 B without the write), 0.22 µs at 4.27 TB/s; the state's read and rewrite are 77% of
//!   it. Each block re-reads its stream's key, query and value (SPLIT times, from L2): counted once.
//!
//! Each case is a CUDA graph of launches, CUDA events around each replay; median, p10 and p90 per
//! launch over the replays. Where the bytes come from:
//! - `ple_ids`, `cold`: CHAIN launches, each with its own hash constants and history, and a
//!   memset of 4× the L2 before every replay, outside the events, so every launch reads
//!   its constants from DRAM, as in the step, where gigabytes of weights pass through the L2
//!   between two tokens. `hot`: one hash state for all CHAIN launches, its constants in L2. Tokens
//!   are fresh random ones every replay.
//! - `ple_gate_conv`: launches rotate through sets of inputs, weights, state and outputs that
//!   together hold 4× the L2 (one set per launch, each set once a replay), so every launch streams
//!   its bytes from DRAM.
//!
//! Every tile candidate of `ple_gate_conv` is timed (`ple_ids` has no tiles);
//! `FLASHNEXT_BENCH_NO_SWEEP` keeps the defaults only. Each case is one record
//! (`flashnext::bench::Recorder`), printed and appended to $OUT/bench-ple_kernels.jsonl (or
//! target/), with the copy bandwidth measured in the same run.

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::kernels::ple::gate_conv::ple_gate_conv;
use engine::kernels::ple::ids::ple_ids;
use engine::layers::ple::{PleHashOnDevice, PleShape};
use engine::model::config::ModelConfig;
use engine::model::ngram_hash::NgramHash;
use engine::tuned::{tile_choices, tiles_string};
use flashnext::bench::{Recorder, Sample, Unit, capture_chain, replay_times_with, replays_duration_with};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{DevPtr, TileSet};

/// Launches in one `ple_ids` graph (and the fewest in a `ple_gate_conv` graph).
const CHAIN: usize = 64;
/// Timed replays per case.
const REPLAYS: usize = 200;

/// Records `times` (per launch) and times the graph again under criterion, `before` ahead of
/// every replay in both.
#[allow(clippy::too_many_arguments)]
fn measure(
    gpu: &Gpu,
    rec: &mut Recorder,
    group: &mut BenchmarkGroup<'_, WallTime>,
    graph: &Graph,
    launches: usize,
    sample: impl FnOnce((f64, f64, f64)) -> Sample,
    id: &str,
    mut before: impl FnMut(),
) {
    let times = replay_times_with(gpu, graph, REPLAYS, launches, &mut before);
    rec.record(sample(times));
    group.bench_function(id.replace(' ', "_"), |bench| {
        bench.iter_custom(|iters| {
            let replays = (iters as usize).div_ceil(launches);
            let total = replays_duration_with(gpu, graph, replays, &mut before);
            total.mul_f64(iters as f64 / (replays * launches) as f64)
        })
    });
}

/// The bytes one `ple_ids` launch must move (the module's doc lists them).
fn ids_bytes(layers: usize, heads: usize, ngram_size: usize) -> usize {
    4 + 2 * (ngram_size - 1) * 4 + layers * ngram_size * 8 + 3 * layers * heads * 8
}

/// The bytes one `ple_gate_conv` launch must move (the module's doc lists them).
fn gate_conv_bytes(s: PleShape, post: bool) -> usize {
    let (nd, d) = (s.residual_width(), s.hidden);
    let reads = s.proj_rows() * 2 + nd * 2 + 3 * nd * 2 + nd * s.conv_kernel * 2 + s.conv_depth() * nd * 4;
    let write_before = if post { d * 2 + s.streams * 4 } else { 0 };
    let writes = s.conv_depth() * nd * 4 + nd * 2;
    reads + write_before + writes
}

fn bench_ids(gpu: &Gpu, rec: &mut Recorder, group: &mut BenchmarkGroup<'_, WallTime>, rng: &mut Rng) {
    let cfg = ModelConfig::published();
    let hashes: Vec<NgramHash> = (0..cfg.ple_layers.len()).map(|i| NgramHash::new(&cfg, i)).collect();
    let (layers, heads) = (hashes.len(), cfg.ngram_heads());
    let bytes = ids_bytes(layers, heads, cfg.ngram_size);
    let vocab = cfg.vocab_size as u64;
    let mut states: Vec<PleHashOnDevice> =
        (0..CHAIN).map(|_| PleHashOnDevice::new(gpu, &hashes).expect("hash constants")).collect();
    let per_step = states[0].ids_per_step();
    let mut tokens: DeviceBuffer<u32> = gpu.alloc(CHAIN).expect("alloc tokens");
    let mut ids: DeviceBuffer<u64> = gpu.alloc(CHAIN * per_step).expect("alloc ids");
    let mut flush: DeviceBuffer<u8> = gpu.alloc(4 * gpu.info().l2_bytes as usize).expect("alloc the L2 flush");
    let k = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    let (token_slots, id_slots) = (tokens.ptr(), ids.ptr_mut());
    group.throughput(Throughput::Bytes(bytes as u64));
    for cold in [true, false] {
        let args: Vec<ple_ids::Args> = (0..CHAIN)
            .map(|s| {
                let state = if cold { &mut states[s] } else { &mut states[0] };
                state.ids_args(token_slots.offset(s as u64), id_slots.offset((s * per_step) as u64))
            })
            .collect();
        let dims = k.dims(&args[0]).expect("the published hash fits the kernel");
        let fresh = |rng: &mut Rng| -> Vec<u32> { (0..CHAIN).map(|_| (rng.next_u64() % vocab) as u32).collect() };
        gpu.write(&mut tokens, &fresh(rng)).expect("tokens");
        // SAFETY: every token slot, ids slice and hash state lies in a live buffer that outlives the
        // graph; the constants hold layers × heads primes and offsets, as `args` says.
        let graph = unsafe { capture_chain(gpu, &k, args.len(), |i| args[i]) };
        let (case, id) = if cold {
            ("cold: a hash state a launch, L2 flushed before each replay", "ple_ids/cold")
        } else {
            ("hot: one hash state, constants in L2", "ple_ids/hot")
        };
        let sample = |t| {
            Sample::new("ple_ids", format!("published ({layers} PLE layer, {heads} heads), {case}"), Unit::Launch, t)
                .bytes(bytes)
                .launches(1)
                .notes(format!("grid {:?}, block {:?}, {CHAIN} launches a graph", dims.grid, dims.block))
        };
        measure(gpu, rec, group, &graph, CHAIN, sample, id, || {
            if cold {
                gpu.fill_bytes(&mut flush, 0).expect("flush the L2");
            }
            gpu.write(&mut tokens, &fresh(rng)).expect("tokens");
        });
    }
}

/// `sets` copies of one gate/conv layer's inputs, weights, state and outputs, each kind in one
/// buffer, set after set.
struct GateConvSets {
    shape: PleShape,
    proj: DeviceBuffer<bf16>,
    streams_in: DeviceBuffer<bf16>,
    y: DeviceBuffer<bf16>,
    gains: DeviceBuffer<f32>,
    norm_key: DeviceBuffer<bf16>,
    norm_query: DeviceBuffer<bf16>,
    norm_conv: DeviceBuffer<bf16>,
    conv_w: DeviceBuffer<bf16>,
    state: DeviceBuffer<f32>,
    streams_out: DeviceBuffer<bf16>,
}

impl GateConvSets {
    /// Random values of one set (the state at zero, as at a sequence's start), repeated: the
    /// values do not change the time.
    fn new(gpu: &Gpu, rng: &mut Rng, shape: PleShape, sets: usize) -> GateConvSets {
        let (nd, d) = (shape.residual_width(), shape.hidden);
        let mut up = |len: usize, scale: f32| gpu.upload(&rng.bf16_normal(len, scale).repeat(sets)).expect("upload");
        let (proj, streams_in, y) = (up(shape.proj_rows(), 1.0), up(nd, 1.0), up(d, 1.0));
        let (norm_key, norm_query, norm_conv) = (up(nd, 0.1), up(nd, 0.1), up(nd, 0.1));
        let conv_w = up(nd * shape.conv_kernel, 0.5);
        let gains: Vec<f32> = (0..shape.streams * sets).map(|i| 0.25 + 0.125 * (i % 4) as f32).collect();
        GateConvSets {
            shape,
            proj,
            streams_in,
            y,
            gains: gpu.upload(&gains).expect("upload"),
            norm_key,
            norm_query,
            norm_conv,
            conv_w,
            state: gpu.alloc(shape.conv_depth() * nd * sets).expect("alloc state"),
            streams_out: gpu.alloc(nd * sets).expect("alloc streams"),
        }
    }

    /// The launch on set `i`, with or without the previous block's write.
    fn args(&mut self, i: usize, post: bool) -> ple_gate_conv::Args {
        let sh = self.shape;
        let (nd, d) = (sh.residual_width(), sh.hidden);
        let at = |p: DevPtr<bf16>, len: usize| p.offset((i * len) as u64);
        ple_gate_conv::Args {
            proj: at(self.proj.ptr(), sh.proj_rows()),
            streams_in: at(self.streams_in.ptr(), nd),
            y: at(self.y.ptr(), d),
            gains_prev: self.gains.ptr().offset((i * sh.streams) as u64),
            norm_key: at(self.norm_key.ptr(), nd),
            norm_query: at(self.norm_query.ptr(), nd),
            norm_conv: at(self.norm_conv.ptr(), nd),
            conv_w: at(self.conv_w.ptr(), nd * sh.conv_kernel),
            conv_state: self.state.ptr_mut().offset((i * sh.conv_depth() * nd) as u64),
            streams_out: self.streams_out.ptr_mut().offset((i * nd) as u64),
            streams: sh.streams as u32,
            d: d as u32,
            kernel_size: sh.conv_kernel as u32,
            dilation: sh.dilation as u32,
            eps: sh.eps,
            post,
        }
    }
}

fn bench_gate_conv(gpu: &Gpu, rec: &mut Recorder, group: &mut BenchmarkGroup<'_, WallTime>, rng: &mut Rng) {
    let shape = PleShape::from_config(&ModelConfig::published()).expect("published PLE shape");
    let set_bytes = gate_conv_bytes(shape, true);
    let sets = (4 * gpu.info().l2_bytes as usize).div_ceil(set_bytes).max(CHAIN);
    println!("ple_gate_conv: {sets} sets of {:.2} MB, one a launch", set_bytes as f64 / 1e6);
    let mut b = GateConvSets::new(gpu, rng, shape, sets);
    let default = ple_gate_conv::Tiles::DEFAULT;
    let tiles = if std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_some() {
        vec![default]
    } else {
        tile_choices::<ple_gate_conv::Tiles>()
    };
    // The step's launch (with the previous block's write) at every tile set, without it at the
    // defaults.
    let cases = tiles.into_iter().map(|t| (t, true)).chain(std::iter::once((default, false)));
    for (t, post) in cases {
        let bytes = gate_conv_bytes(shape, post);
        let k = gpu.kernel::<ple_gate_conv::Kernel>(t).expect("compile");
        let args: Vec<ple_gate_conv::Args> = (0..sets).map(|i| b.args(i, post)).collect();
        let dims = match k.dims(&args[0]) {
            Ok(d) => d,
            Err(e) => {
                println!("ple_gate_conv {} does not fit the published shape: {e}", tiles_string(&t));
                continue;
            }
        };
        // SAFETY: every set's slices lie in buffers of `sets` sets that outlive the graph, sized
        // as the kernel reads and writes them at this shape; input and output streams are
        // different buffers.
        let graph = unsafe { capture_chain(gpu, &k, args.len(), |i| args[i]) };
        let label = format!("{}{}", tiles_string(&t), if t == default { " (default)" } else { "" });
        let write = if post { "with the previous block's write" } else { "no write before" };
        let (n, d, kk) = (shape.streams, shape.hidden, shape.conv_kernel);
        let r = k.resources();
        let sample = |times| {
            Sample::new("ple_gate_conv", format!("{n}x{d} K{kk}, {write}, {label}"), Unit::Launch, times)
                .bytes(bytes)
                .launches(1)
                .notes(format!(
                    "grid {:?}, block {:?}, {} registers; {sets} sets rotated",
                    dims.grid, dims.block, r.registers
                ))
        };
        group.throughput(Throughput::Bytes(bytes as u64));
        let id = format!("ple_gate_conv/{}/{label}", if post { "post" } else { "plain" });
        measure(gpu, rec, group, &graph, sets, sample, &id, || {});
    }
}

fn bench_ple_kernels(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("ple_kernels") else { return };
    let mut rec = Recorder::new(&gpu, "ple_kernels", Some(copy_bw));
    let mut rng = Rng::fresh("ple_kernels bench");
    let mut group = c.benchmark_group("ple_kernels");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    bench_ids(&gpu, &mut rec, &mut group, &mut rng);
    bench_gate_conv(&gpu, &mut rec, &mut group, &mut rng);
    group.finish();
}

criterion_group!(benches, bench_ple_kernels);
criterion_main!(benches);
