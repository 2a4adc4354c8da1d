//! The step's first kernel, `embed_streams`, on the GPU at the published shape: the token's row of
//! the 248,320 × 2560 bf16 embedding (1.27 GB, twenty times the L2) copied into the 4 residual
//! streams.
//!
//! Bytes one launch must move: the token (4 B), its row of the table (2560 × 2 = 5,120 B) and the
//! 4 streams it writes (4 × 2560 × 2 = 20,480 B): 25,604 B, 6 ns at 4.27 TB/s. The kernel is 3
//! blocks of 128 threads (one 16-byte vector of the row per thread): its time is a launch's
//! latency and one DRAM round trip, not bandwidth. The fraction of 4.27 TB/s is reported all the
//! same: it says how far a latency-bound launch is from its bytes' floor.
//!
//! Each case is a CUDA graph of CHAIN launches, each reading its own token slot and writing its
//! own streams, CUDA events around each replay; median, p10 and p90 per launch over REPLAYS
//! replays. Cases:
//! - `fresh tokens`: the slots rewritten with random tokens before every replay (outside the
//!   events), so every launch's row comes from DRAM, as in the step, where the table is not read
//!   between two tokens.
//! - `one token`: every slot the same (random) token, so all launches but the replay's first find
//!   the row in L2: the difference from `fresh tokens` is what DRAM's latency adds.
//!
//! Every tile candidate (THREADS) is timed; `FLASHNEXT_BENCH_NO_SWEEP` keeps the default only.
//! Each case is one record (`flashnext::bench::Recorder`), printed and appended to
//! $OUT/bench-embed.jsonl (or target/), with the copy bandwidth measured in the same run.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::DeviceBuffer;
use engine::kernels::embed::embed_streams;
use engine::model::config::ModelConfig;
use engine::tuned::{tile_choices, tiles_string};
use flashnext::bench::{Recorder, Sample, Unit, capture_chain, replay_times_with, replays_duration_with};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::TileSet;

/// Launches in one graph.
const CHAIN: usize = 64;
/// Timed replays per case.
const REPLAYS: usize = 200;

/// The published embedding's geometry.
#[derive(Clone, Copy)]
struct Shape {
    vocab: usize,
    d: usize,
    n: usize,
}

impl Shape {
    fn published() -> Shape {
        let c = ModelConfig::published();
        Shape { vocab: c.vocab_size, d: c.hidden_size, n: c.hc_streams }
    }

    /// What one launch must move: the token, its row (d bf16), the n streams written (n·d bf16).
    fn bytes(&self) -> usize {
        4 + self.d * 2 + self.n * self.d * 2
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Tokens {
    Fresh,
    One,
}

impl Tokens {
    fn name(self) -> &'static str {
        match self {
            Tokens::Fresh => "fresh tokens (rows from DRAM)",
            Tokens::One => "one token (row from L2)",
        }
    }

    fn draw(self, rng: &mut Rng, vocab: usize) -> Vec<u32> {
        match self {
            Tokens::Fresh => (0..CHAIN).map(|_| (rng.next_u64() % vocab as u64) as u32).collect(),
            Tokens::One => vec![(rng.next_u64() % vocab as u64) as u32; CHAIN],
        }
    }
}

fn bench_embed(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("embed") else { return };
    let mut rec = Recorder::new(&gpu, "embed", Some(copy_bw));
    let mut rng = Rng::fresh("embed bench");
    let shape = Shape::published();
    let (vocab, d, n) = (shape.vocab, shape.d, shape.n);
    let bytes = shape.bytes();

    // The values do not change the time; a non-zero byte pattern all the same.
    let mut table: DeviceBuffer<bf16> = gpu.alloc(vocab * d).expect("alloc the embedding");
    gpu.fill_bytes(&mut table, 0x3c).expect("fill the embedding");
    let mut tokens: DeviceBuffer<u32> = gpu.alloc(CHAIN).expect("alloc tokens");
    let mut streams: DeviceBuffer<bf16> = gpu.alloc(CHAIN * n * d).expect("alloc streams");
    let (token_slots, outputs) = (tokens.ptr(), streams.ptr_mut());
    let args = |s: usize| embed_streams::Args {
        embed: table.ptr(),
        token: token_slots.offset(s as u64),
        streams: outputs.offset((s * n * d) as u64),
        vocab: vocab as u32,
        d: d as u32,
        n: n as u32,
    };

    let tiles = if std::env::var_os("FLASHNEXT_BENCH_NO_SWEEP").is_some() {
        vec![embed_streams::Tiles::DEFAULT]
    } else {
        tile_choices::<embed_streams::Tiles>()
    };
    let mut group = c.benchmark_group("embed");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    group.throughput(Throughput::Bytes(bytes as u64));
    for t in tiles {
        let k = gpu.kernel::<embed_streams::Kernel>(t).expect("compile");
        let label =
            format!("{}{}", tiles_string(&t), if t == embed_streams::Tiles::DEFAULT { " (default)" } else { "" });
        let dims = k.dims(&args(0)).expect("the published shape fits every candidate");
        gpu.write(&mut tokens, &Tokens::Fresh.draw(&mut rng, vocab)).expect("tokens");
        // SAFETY: the table holds vocab·d values, every token slot and streams slice lies in its
        // buffer (CHAIN of each), and the buffers outlive the graph.
        let graph = unsafe { capture_chain(&gpu, &k, CHAIN, &args) };
        for mode in [Tokens::Fresh, Tokens::One] {
            let mut before = || gpu.write(&mut tokens, &mode.draw(&mut rng, vocab)).expect("tokens");
            let times = replay_times_with(&gpu, &graph, REPLAYS, CHAIN, &mut before);
            rec.record(
                Sample::new(
                    "embed_streams",
                    format!("{vocab}x{d} to {n} streams, {}, {label}", mode.name()),
                    Unit::Launch,
                    times,
                )
                .bytes(bytes)
                .launches(1)
                .notes(format!("grid {:?}, block {:?}, {CHAIN} launches a graph", dims.grid, dims.block)),
            );
            let id = format!("embed_streams/{}/{}", if mode == Tokens::Fresh { "fresh" } else { "one" }, label);
            group.bench_function(id.replace(' ', "_"), |bench| {
                bench.iter_custom(|iters| {
                    let replays = (iters as usize).div_ceil(CHAIN);
                    let total = replays_duration_with(&gpu, &graph, replays, &mut before);
                    total.mul_f64(iters as f64 / (replays * CHAIN) as f64)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_embed);
criterion_main!(benches);
