//! The QSA indexer's device kernels on the GPU, each in a CUDA graph of many launches:
//!
//! - the top-k over 65,536 block scores (a 262k-token context), budget 512 blocks, on scores
//!   of every magnitude (as ReLU sums are), on scores of 64 levels (many ties), and all zero
//!   (the worst case of the shared histogram: every key in one bin);
//! - the block scores (4 index heads of 128 dims against every pooled key, f32) at 32k and 128k
//!   tokens of context, against the bytes they must read (the pooled keys and the queries), with
//!   the keys of several layers rotated through more memory than the L2 holds;
//! - the multi-block top-k (`qsa_top_blocks_grid`) at every tile set whose grid the device holds
//!   at once, at 65,536 scores (the three distributions) and at 8,192 (32k tokens, continuous),
//!   beside the one-block kernel at its default tiles;
//! - both chained, as a layer runs them (with either top-k);
//! - the gated attention (24 query heads on 2 key/value heads of 256, bf16 caches), the split
//!   attention and the combine of its splits timed together, through a full selection (512
//!   blocks spread over the context, plus a tail of 3 tokens) at 32k and 128k tokens, against
//!   the K/V rows it must read, the caches of 12 layers in device memory; at 32k also every
//!   other tile set of either kernel with the other at its defaults.
//!
//! benches/qsa_torch.py times torch.topk and the scores in PyTorch the same way.
//! Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-qsa.jsonl (or
//! target/bench-qsa.jsonl).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::kernels::qsa::attention::qsa_attention;
use engine::kernels::qsa::block_scores::qsa_block_scores;
use engine::kernels::qsa::combine::qsa_attention_combine;
use engine::kernels::qsa::top_blocks::qsa_top_blocks;
use engine::kernels::qsa::top_blocks_grid::{self, qsa_top_blocks_grid};
use engine::tuned::tile_choices;
use flashnext::bench::{Recorder, Sample, Unit};
use flashnext::rng::Rng;
use kernel_dsl::TileSet;

/// GB10's LPDDR5X as the projections take it.
const BLOCKS: usize = 65_536;
const TOP: usize = 512;
const HEADS: usize = 4;
const DIM: usize = 128;
const BLOCK_TOKENS: usize = 4;
/// Launches per graph.
const LAUNCHES: usize = 48;

/// Draws one score.
type Draw = Box<dyn Fn(&mut Rng) -> f32>;

/// Median, p10 and p90 of one launch of the graph's `per_graph`, over `samples` replays.
fn replay_times(gpu: &Gpu, g: &Graph, per_graph: usize, samples: usize) -> (f64, f64, f64) {
    flashnext::bench::replay_times_with(gpu, g, samples, per_graph, || {})
}

/// Where records go: the one writer of every bench.
struct Sink(Recorder);

impl Sink {
    fn record(&mut self, group: &str, what: &str, t: (f64, f64, f64), bytes: usize, _copy_bw: f64) {
        self.0.record(Sample::new(group, what, Unit::Launch, t).bytes(bytes).launches(1));
    }
}

fn bench_qsa(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("qsa") else { return };
    let mut sink = Sink(Recorder::new(&gpu, "qsa", Some(copy_bw)));
    let mut rng = Rng::fresh("qsa bench");
    let profile = std::env::var_os("FLASHNEXT_BENCH_PROFILE").is_some();

    // The top-k: LAUNCHES launches, each on its own scores (256 KB each: the set stays in L2, as
    // the scores the kernel before has just written do).
    let distributions: [(&str, Draw); 3] = [
        ("continuous", Box::new(|r: &mut Rng| r.uniform() * 2f32.powi((r.next_u64() % 16) as i32 - 8))),
        ("64 levels", Box::new(|r: &mut Rng| (r.next_u64() % 64) as f32 * 0.125)),
        ("all zero", Box::new(|_: &mut Rng| 0.0)),
    ];
    let d_n = gpu.upload(&[BLOCKS as u32]).expect("n");
    let mut selected: Vec<DeviceBuffer<u32>> = (0..LAUNCHES).map(|_| gpu.alloc(TOP).expect("selected")).collect();
    let mut count: Vec<DeviceBuffer<u32>> = (0..LAUNCHES).map(|_| gpu.alloc(1).expect("count")).collect();
    for tiles in qsa_top_blocks::Tiles::candidates() {
        let k = gpu.kernel::<qsa_top_blocks::Kernel>(tiles).expect("compile");
        for (label, draw) in &distributions {
            if tiles != TileSet::DEFAULT && *label != "continuous" {
                continue;
            }
            let scores: Vec<DeviceBuffer<f32>> = (0..LAUNCHES)
                .map(|_| gpu.upload(&(0..BLOCKS).map(|_| draw(&mut rng)).collect::<Vec<f32>>()).expect("scores"))
                .collect();
            let args: Vec<qsa_top_blocks::Args> = (0..LAUNCHES)
                .map(|i| qsa_top_blocks::Args {
                    scores: scores[i].ptr(),
                    n_blocks: d_n.ptr(),
                    selected: selected[i].ptr_mut(),
                    count: count[i].ptr_mut(),
                    capacity: BLOCKS as u32,
                    top: TOP as u32,
                })
                .collect();
            let g = gpu
                .capture(|| {
                    for a in &args {
                        // SAFETY: scores hold BLOCKS values, selected TOP, count and n one; all
                        // live until the graph is dropped below.
                        unsafe { k.launch(&gpu, a) }?;
                    }
                    Ok(())
                })
                .expect("capture");
            if profile {
                g.launch().expect("replay");
                gpu.synchronize().expect("sync");
                continue;
            }
            let t = replay_times(&gpu, &g, LAUNCHES, 50);
            let what = format!("{BLOCKS} scores, {TOP} kept, {label}, {tiles:?}");
            let group = if tiles == TileSet::DEFAULT { "top-k one block" } else { "sweep top-k one block" };
            sink.record(group, &what, t, BLOCKS * 4, copy_bw);
        }
    }

    // The same top-k, and the multi-block one at every tile set whose grid is co-resident, at
    // 65,536 scores (each distribution) and at 8,192 (32k tokens of context, continuous): the
    // one-block kernel at its default tiles beside it. One scratch for every launch.
    let mut scratch = gpu.alloc::<u32>(top_blocks_grid::SCRATCH_WORDS).expect("scratch");
    let k1 = gpu.kernel::<qsa_top_blocks::Kernel>(TileSet::DEFAULT).expect("compile");
    let grid_tiles: Vec<qsa_top_blocks_grid::Tiles> = qsa_top_blocks_grid::Tiles::candidates()
        .into_iter()
        .filter(|&t| {
            let k = gpu.kernel::<qsa_top_blocks_grid::Kernel>(t).expect("compile");
            let resident = k.co_resident_blocks(&gpu).expect("occupancy");
            let grid = t.blocks;
            println!(
                "qsa grid top-k {t:?}: {grid} blocks, {resident} co-resident, {} registers",
                k.resources().registers
            );
            grid <= resident
        })
        .collect();
    for n in [BLOCKS, 8_192] {
        let d_len = gpu.upload(&[n as u32]).expect("n");
        for (label, draw) in &distributions {
            if n != BLOCKS && *label != "continuous" {
                continue;
            }
            let scores: Vec<DeviceBuffer<f32>> = (0..LAUNCHES)
                .map(|_| gpu.upload(&(0..n).map(|_| draw(&mut rng)).collect::<Vec<f32>>()).expect("scores"))
                .collect();
            // None: the one-block kernel; Some: the multi-block one at those tiles.
            let variants = std::iter::once(None).chain(grid_tiles.iter().map(|&t| Some(t)));
            for variant in variants {
                let g = match variant {
                    None => {
                        let args: Vec<qsa_top_blocks::Args> = (0..LAUNCHES)
                            .map(|i| qsa_top_blocks::Args {
                                scores: scores[i].ptr(),
                                n_blocks: d_len.ptr(),
                                selected: selected[i].ptr_mut(),
                                count: count[i].ptr_mut(),
                                capacity: n as u32,
                                top: TOP as u32,
                            })
                            .collect();
                        gpu.capture(|| {
                            for a in &args {
                                // SAFETY: scores hold n values, selected TOP, count and n one; all
                                // live until the graph is dropped below.
                                unsafe { k1.launch(&gpu, a) }?;
                            }
                            Ok(())
                        })
                    }
                    Some(t) => {
                        let k = gpu.kernel::<qsa_top_blocks_grid::Kernel>(t).expect("compile");
                        let scratch_ptr = scratch.ptr_mut();
                        let args: Vec<qsa_top_blocks_grid::Args> = (0..LAUNCHES)
                            .map(|i| qsa_top_blocks_grid::Args {
                                scores: scores[i].ptr(),
                                n_blocks: d_len.ptr(),
                                selected: selected[i].ptr_mut(),
                                count: count[i].ptr_mut(),
                                scratch: scratch_ptr,
                                capacity: n as u32,
                                top: TOP as u32,
                            })
                            .collect();
                        gpu.capture(|| {
                            for a in &args {
                                // SAFETY: as above, and scratch holds SCRATCH_WORDS; the launches
                                // of one stream share it one after another; the grid is
                                // co-resident (checked above).
                                unsafe { k.launch(&gpu, a) }?;
                            }
                            Ok(())
                        })
                    }
                }
                .expect("capture");
                if profile {
                    g.launch().expect("replay");
                    gpu.synchronize().expect("sync");
                    continue;
                }
                let t = replay_times(&gpu, &g, LAUNCHES, 50);
                let which = match variant {
                    None => "one block, default tiles".to_owned(),
                    Some(t) => format!("grid {t:?}"),
                };
                // The one-block kernel and the grid's default in the group; the other grids a sweep.
                let group = match variant {
                    Some(t) if t != TileSet::DEFAULT => format!("sweep top-k grid, {n} scores, {label}"),
                    _ => "top-k".to_owned(),
                };
                let what = format!("{n} scores, {TOP} kept, {label}, {which}");
                sink.record(&group, &what, t, n * 4, copy_bw);
            }
        }
    }

    // The block scores, and the scores then the top-k, at 32k and 128k tokens of context.
    let q_host: Vec<f32> = (0..HEADS * DIM).map(|_| rng.normal()).collect();
    let ks = gpu.kernel::<qsa_block_scores::Kernel>(TileSet::DEFAULT).expect("compile");
    let kt = gpu.kernel::<qsa_top_blocks::Kernel>(TileSet::DEFAULT).expect("compile");
    let kg = gpu.kernel::<qsa_top_blocks_grid::Kernel>(TileSet::DEFAULT).expect("compile");
    for context in [32_768usize, 131_072] {
        let n = context / BLOCK_TOKENS;
        let key_bytes = n * DIM * 4;
        // Enough layers' keys to pass 2 × the 60 MB L2, at least 12 (the model's QSA layers).
        let layers = (120_000_000 / key_bytes).max(12);
        let host_keys: Vec<f32> = (0..n * DIM).map(|_| rng.normal()).collect();
        let keys: Vec<DeviceBuffer<f32>> = (0..layers).map(|_| gpu.upload(&host_keys).expect("keys")).collect();
        let qs: Vec<DeviceBuffer<f32>> = (0..layers).map(|_| gpu.upload(&q_host).expect("q")).collect();
        let pos = gpu.upload(&[(context - 1) as u32]).expect("position");
        let mut scores: Vec<DeviceBuffer<f32>> = (0..layers).map(|_| gpu.alloc(n).expect("scores")).collect();
        let mut n_blocks: Vec<DeviceBuffer<u32>> = (0..layers).map(|_| gpu.alloc(1).expect("n")).collect();
        let mut sel: Vec<DeviceBuffer<u32>> = (0..layers).map(|_| gpu.alloc(TOP).expect("selected")).collect();
        let mut cnt: Vec<DeviceBuffer<u32>> = (0..layers).map(|_| gpu.alloc(1).expect("count")).collect();
        let score_args: Vec<qsa_block_scores::Args> = (0..layers)
            .map(|l| qsa_block_scores::Args {
                index_q: qs[l].ptr(),
                block_keys: keys[l].ptr(),
                position: pos.ptr(),
                scores: scores[l].ptr_mut(),
                n_blocks: n_blocks[l].ptr_mut(),
                heads: HEADS as u32,
                dim: DIM as u32,
                block_tokens: BLOCK_TOKENS as u32,
                capacity: n as u32,
                top: TOP as u32,
            })
            .collect();
        let top_args: Vec<qsa_top_blocks::Args> = (0..layers)
            .map(|l| qsa_top_blocks::Args {
                scores: scores[l].ptr(),
                n_blocks: n_blocks[l].ptr(),
                selected: sel[l].ptr_mut(),
                count: cnt[l].ptr_mut(),
                capacity: n as u32,
                top: TOP as u32,
            })
            .collect();
        let scratch_ptr = scratch.ptr_mut();
        let grid_args: Vec<qsa_top_blocks_grid::Args> = top_args
            .iter()
            .map(|a| qsa_top_blocks_grid::Args {
                scores: a.scores,
                n_blocks: a.n_blocks,
                selected: a.selected,
                count: a.count,
                scratch: scratch_ptr,
                capacity: a.capacity,
                top: a.top,
            })
            .collect();
        // The scores alone; then the one-block top-k; then the multi-block one at its defaults.
        for chained in 0..3 {
            if chained == 2 && !grid_tiles.contains(&TileSet::DEFAULT) {
                continue;
            }
            let g = gpu
                .capture(|| {
                    for l in 0..layers {
                        // SAFETY: each layer's buffers hold what the kernels index for n blocks
                        // (keys n·DIM, q HEADS·DIM, scores n, selection TOP) and outlive the graph;
                        // the grid top-k's scratch holds SCRATCH_WORDS, its grid is co-resident.
                        unsafe {
                            ks.launch(&gpu, &score_args[l])?;
                            if chained == 1 {
                                kt.launch(&gpu, &top_args[l])?;
                            } else if chained == 2 {
                                kg.launch(&gpu, &grid_args[l])?;
                            }
                        }
                    }
                    Ok(())
                })
                .expect("capture");
            if profile {
                g.launch().expect("replay");
                gpu.synchronize().expect("sync");
                continue;
            }
            let t = replay_times(&gpu, &g, layers, 30);
            let bytes = key_bytes + HEADS * DIM * 4;
            let what = ["block scores", "block scores + top-k", "block scores + grid top-k"][chained];
            sink.record(what, &format!("{}k tokens ({n} blocks, {layers} layers)", context / 1024), t, bytes, copy_bw);
        }
    }

    // The attention (the split attention then the combine, at its default tiles) through a full
    // selection, 12 layers' caches (zero-filled: the values do not
    // change the work), each layer's selection spread at random over its context.
    let (q_heads, kv_heads, head_dim) = (24usize, 2usize, 256usize);
    // Both kernels at their defaults first; at 32k then every other attention tile set (the
    // combine at its defaults) and every other combine tile set (the attention at its defaults).
    let tile_pairs: Vec<(qsa_attention::Tiles, qsa_attention_combine::Tiles)> = tile_choices::<qsa_attention::Tiles>()
        .into_iter()
        .map(|t| (t, TileSet::DEFAULT))
        .chain(tile_choices::<qsa_attention_combine::Tiles>().into_iter().skip(1).map(|t| (TileSet::DEFAULT, t)))
        .collect();
    let splits_max = (TOP * BLOCK_TOKENS + BLOCK_TOKENS).div_ceil(16);
    for context in [32_768usize, 131_072] {
        let layers = 12;
        let n = context / BLOCK_TOKENS;
        let tail = 3;
        let position = n * BLOCK_TOKENS + tail - 1;
        let caches: Vec<(DeviceBuffer<half::bf16>, DeviceBuffer<half::bf16>)> = (0..layers)
            .map(|_| {
                let len = (position + 1) * kv_heads * head_dim;
                (gpu.alloc(len).expect("k cache"), gpu.alloc(len).expect("v cache"))
            })
            .collect();
        let selections: Vec<DeviceBuffer<u32>> = (0..layers)
            .map(|_| {
                let mut blocks: Vec<u32> = Vec::with_capacity(TOP);
                while blocks.len() < TOP {
                    let b = (rng.next_u64() % n as u64) as u32;
                    if !blocks.contains(&b) {
                        blocks.push(b);
                    }
                }
                blocks.sort_unstable();
                gpu.upload(&blocks).expect("selection")
            })
            .collect();
        let pos = gpu.upload(&[position as u32]).expect("position");
        let q = gpu.upload(&(0..q_heads * head_dim).map(|_| rng.normal()).collect::<Vec<f32>>()).expect("q");
        let gate = gpu.upload(&(0..q_heads * head_dim).map(|_| rng.normal()).collect::<Vec<f32>>()).expect("gate");
        let mut acc: Vec<DeviceBuffer<f32>> =
            (0..layers).map(|_| gpu.alloc(q_heads * splits_max * head_dim).expect("partials")).collect();
        let mut ml: Vec<DeviceBuffer<f32>> =
            (0..layers).map(|_| gpu.alloc(q_heads * splits_max * 2).expect("partials")).collect();
        let mut o: Vec<DeviceBuffer<half::bf16>> =
            (0..layers).map(|_| gpu.alloc(q_heads * head_dim).expect("o")).collect();
        let args: Vec<qsa_attention::Args> = (0..layers)
            .map(|l| qsa_attention::Args {
                q: q.ptr(),
                k_cache: caches[l].0.ptr(),
                v_cache: caches[l].1.ptr(),
                selected: selections[l].ptr(),
                position: pos.ptr(),
                partial_acc: acc[l].ptr_mut(),
                partial_ml: ml[l].ptr_mut(),
                q_heads: q_heads as u32,
                kv_heads: kv_heads as u32,
                head_dim: head_dim as u32,
                block_tokens: BLOCK_TOKENS as u32,
                top: TOP as u32,
                scale: 1.0 / (head_dim as f32).sqrt(),
            })
            .collect();
        for (i, (tiles, combine_tiles)) in tile_pairs.iter().enumerate() {
            if i > 0 && context != 32_768 {
                break;
            }
            let Ok(dims) = <qsa_attention::Kernel as kernel_dsl::KernelDef>::launch_dims(tiles, &args[0]) else {
                continue;
            };
            // The combine over the splits this chunk size makes.
            let combine_args: Vec<qsa_attention_combine::Args> = (0..layers)
                .map(|l| qsa_attention_combine::Args {
                    partial_acc: acc[l].ptr(),
                    partial_ml: ml[l].ptr(),
                    gate: gate.ptr(),
                    position: pos.ptr(),
                    o: o[l].ptr_mut(),
                    q_heads: q_heads as u32,
                    head_dim: head_dim as u32,
                    splits: dims.grid[1],
                    chunk: tiles.chunk,
                    block_tokens: BLOCK_TOKENS as u32,
                    top: TOP as u32,
                })
                .collect();
            let ka = gpu.kernel::<qsa_attention::Kernel>(*tiles).expect("compile");
            let kc = gpu.kernel::<qsa_attention_combine::Kernel>(*combine_tiles).expect("compile");
            let g = gpu
                .capture(|| {
                    for (a, ca) in args.iter().zip(&combine_args) {
                        // SAFETY: each layer's caches hold position + 1 tokens, its selection TOP
                        // blocks below n, its partials the most splits (read by the combine at
                        // the attention's split count); all outlive the graph.
                        unsafe {
                            ka.launch(&gpu, a)?;
                            kc.launch(&gpu, ca)?;
                        }
                    }
                    Ok(())
                })
                .expect("capture");
            if profile {
                g.launch().expect("replay");
                gpu.synchronize().expect("sync");
                continue;
            }
            let t = replay_times(&gpu, &g, layers, 30);
            let tokens = TOP * BLOCK_TOKENS + tail;
            let bytes = 2 * tokens * kv_heads * head_dim * 2 + 2 * q_heads * head_dim * 4 + TOP * 4;
            let label = format!("{}k tokens ({tokens} attended), {tiles:?}, {combine_tiles:?}", context / 1024);
            let group = if i == 0 { "attention".to_owned() } else { format!("sweep attention {}k", context / 1024) };
            sink.record(&group, &label, t, bytes, copy_bw);
        }
    }

    // A criterion line for the headline: the top-k of 65,536 continuous scores.
    let k = gpu.kernel::<qsa_top_blocks::Kernel>(TileSet::DEFAULT).expect("compile");
    let scores = gpu.upload(&(0..BLOCKS).map(|_| rng.uniform()).collect::<Vec<f32>>()).expect("scores");
    let args = qsa_top_blocks::Args {
        scores: scores.ptr(),
        n_blocks: d_n.ptr(),
        selected: selected[0].ptr_mut(),
        count: count[0].ptr_mut(),
        capacity: BLOCKS as u32,
        top: TOP as u32,
    };
    let mut group = c.benchmark_group("qsa");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    group.bench_function("top-k/65536", |b| {
        let t = EventTimer::new(&gpu).expect("events");
        b.iter_custom(|iters| {
            t.start(&gpu).expect("start");
            for _ in 0..iters {
                // SAFETY: as above; the buffers live to the end of this function.
                unsafe { k.launch(&gpu, &args) }.expect("launch");
            }
            t.stop(&gpu).expect("stop")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_qsa);
criterion_main!(benches);
