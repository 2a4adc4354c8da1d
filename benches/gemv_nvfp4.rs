//! The step's plain projections in NVFP4 against bf16 on the GPU: GDN's out_proj, QSA's stacked
//! input projection and o_proj at the published geometry, each a CUDA graph of 32+ launches
//! cycling through weight copies that together exceed the L2 four times over (so every launch
//! streams from DRAM), CUDA events around each replay.
//!
//! Each case is one record (`flashnext::bench::Recorder`): median and spread per launch, the bytes
//! it must move, GB/s, the fraction of 4.27 TB/s and of the copy bandwidth measured in the same
//! run, the GB10 floor; printed and appended to $OUT/bench-gemv_nvfp4.jsonl.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use engine::cuda::timing::EventTimer;
use engine::cuda::{DeviceBuffer, Gpu, Graph};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::gemv_nvfp4::gemv_nvfp4;
use engine::layers::gdn::GdnShape;
use engine::layers::qsa::QsaShape;
use engine::model::config::ModelConfig;
use engine::model::nvfp4::Nvfp4Matrix;
use flashnext::bench::{Recorder, Sample, Unit, capture_chain, percentile};
use flashnext::rng::{Rng, to_f32};
use half::bf16;
use kernel_dsl::{E2m1x2, KernelDef, TileSet};

/// One weight format's copies of W.
enum Weights {
    Bf16(Vec<DeviceBuffer<bf16>>),
    Nvfp4 { packed: Vec<DeviceBuffer<E2m1x2>>, scales: Vec<DeviceBuffer<u8>>, scale2: DeviceBuffer<f32> },
}

struct Buffers {
    x: DeviceBuffer<bf16>,
    y: DeviceBuffer<bf16>,
    partial: DeviceBuffer<f32>,
    counters: DeviceBuffer<u32>,
}

fn copies(gpu: &Gpu, bytes: usize) -> usize {
    (4 * gpu.info().l2_bytes as usize).div_ceil(bytes).max(2)
}

fn weights(gpu: &Gpu, rng: &mut Rng, rows: usize, cols: usize, nvfp4: bool) -> Weights {
    let w = rng.bf16_normal(rows * cols, 1.0);
    if !nvfp4 {
        let n = copies(gpu, rows * cols * 2);
        return Weights::Bf16((0..n).map(|_| gpu.upload(&w).expect("upload W")).collect());
    }
    let m = Nvfp4Matrix::quantise(&to_f32(&w), rows, cols);
    let packed: Vec<E2m1x2> = m.packed.iter().map(|&b| E2m1x2(b)).collect();
    let n = copies(gpu, packed.len() + m.scales.len());
    Weights::Nvfp4 {
        packed: (0..n).map(|_| gpu.upload(&packed).expect("upload codes")).collect(),
        // The kernel reads the e4m3 block scales as their bits.
        scales: (0..n).map(|_| gpu.upload(&m.scales).expect("upload scales")).collect(),
        scale2: gpu.upload(&[m.scale_2]).expect("upload scale"),
    }
}

/// A graph of `launches` GEMVs cycling through the copies.
fn graph(gpu: &Gpu, w: &Weights, b: &mut Buffers, tiles: Tiles, rows: usize, cols: usize, launches: usize) -> Graph {
    let (rows, cols) = (rows as u32, cols as u32);
    let (x, y, partial, counters) = (b.x.ptr(), b.y.ptr_mut(), b.partial.ptr_mut(), b.counters.ptr_mut());
    match (w, tiles) {
        (Weights::Bf16(ws), Tiles::Bf16(t)) => {
            let k = gpu.kernel::<gemv_bf16::Kernel>(t).expect("compile");
            let args = |i: usize| gemv_bf16::Args { w: ws[i % ws.len()].ptr(), x, y, partial, counters, rows, cols };
            // SAFETY: every W copy is rows×cols, x cols, y rows, partial 16·rows, counters rows.
            unsafe { capture_chain(gpu, &k, launches, args) }
        }
        (Weights::Nvfp4 { packed, scales, scale2 }, Tiles::Nvfp4(t)) => {
            let k = gpu.kernel::<gemv_nvfp4::Kernel>(t).expect("compile");
            let r = k.resources();
            println!("  {} : {} registers, {} B spilled", k.key(), r.registers, r.spill_store_bytes);
            let args = |i: usize| gemv_nvfp4::Args {
                packed: packed[i % packed.len()].ptr(),
                scales: scales[i % scales.len()].ptr(),
                scale2: scale2.ptr(),
                x,
                y,
                partial,
                counters,
                rows,
                cols,
                seg1: rows,
                seg2: rows,
                seg3: rows,
            };
            // SAFETY: every copy holds rows×cols/2 code bytes and rows×cols/16 scales; x cols,
            // y rows, partial 16·rows, counters rows.
            unsafe { capture_chain(gpu, &k, launches, args) }
        }
        _ => unreachable!("a variant's tiles match its weights' format"),
    }
}

/// Unbound arguments of a shape, for checking tiles against it.
fn bf16_args(rows: usize, cols: usize) -> gemv_bf16::Args {
    use kernel_dsl::{DevPtr, DevPtrMut};
    gemv_bf16::Args {
        w: DevPtr::from_addr(0),
        x: DevPtr::from_addr(0),
        y: DevPtrMut::from_addr(0),
        partial: DevPtrMut::from_addr(0),
        counters: DevPtrMut::from_addr(0),
        rows: rows as u32,
        cols: cols as u32,
    }
}

fn nvfp4_args(rows: usize, cols: usize) -> gemv_nvfp4::Args {
    use kernel_dsl::{DevPtr, DevPtrMut};
    gemv_nvfp4::Args {
        packed: DevPtr::from_addr(0),
        scales: DevPtr::from_addr(0),
        scale2: DevPtr::from_addr(0),
        x: DevPtr::from_addr(0),
        y: DevPtrMut::from_addr(0),
        partial: DevPtrMut::from_addr(0),
        counters: DevPtrMut::from_addr(0),
        rows: rows as u32,
        cols: cols as u32,
        seg1: rows as u32,
        seg2: rows as u32,
        seg3: rows as u32,
    }
}

#[derive(Clone, Copy, Debug)]
enum Tiles {
    Bf16(gemv_bf16::Tiles),
    Nvfp4(gemv_nvfp4::Tiles),
}

struct Case {
    name: &'static str,
    rows: usize,
    cols: usize,
    variants: Vec<(&'static str, Tiles)>,
}

fn cases() -> Vec<Case> {
    let cfg = ModelConfig::published();
    let gdn = GdnShape::from_config(&cfg).expect("published GDN shape");
    let qsa = QsaShape::from_config(&cfg).expect("published QSA shape");
    let b = gemv_bf16::Tiles::DEFAULT;
    let n = gemv_nvfp4::Tiles::DEFAULT;
    let nvfp4_variants = vec![
        ("nvfp4", Tiles::Nvfp4(n)),
        ("nvfp4 lanes8", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 8, ..n })),
        ("nvfp4 lanes32", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 32, ..n })),
        ("nvfp4 warps8", Tiles::Nvfp4(gemv_nvfp4::Tiles { warps: 8, ..n })),
        ("nvfp4 split2", Tiles::Nvfp4(gemv_nvfp4::Tiles { k_split: 2, ..n })),
        ("nvfp4 split4", Tiles::Nvfp4(gemv_nvfp4::Tiles { k_split: 4, ..n })),
        ("nvfp4 unroll2", Tiles::Nvfp4(gemv_nvfp4::Tiles { unroll: 2, ..n })),
        ("nvfp4 w8 split2", Tiles::Nvfp4(gemv_nvfp4::Tiles { warps: 8, k_split: 2, ..n })),
        ("nvfp4 w8 split4", Tiles::Nvfp4(gemv_nvfp4::Tiles { warps: 8, k_split: 4, ..n })),
        ("nvfp4 l32 w8", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 32, warps: 8, ..n })),
        // The tensor-core path (a warp's 16 rows through mma.m16n8k16), at the splits that fill
        // the SMs: 16 rows a warp leave 2560-row matrices 40 blocks of 4 warps without a K split.
        // On 2560 columns (QSA's in_proj) only `mma` and `mma split4 unroll1` fit: the path needs
        // cols % (K_SPLIT·128·UNROLL) == 0, and the others are reported as not fitting.
        ("mma", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, ..n })),
        ("mma split2", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, k_split: 2, ..n })),
        ("mma split4", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, k_split: 4, unroll: 2, ..n })),
        ("mma split8", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, k_split: 8, unroll: 2, ..n })),
        ("mma w2 split4", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, warps: 2, k_split: 4, unroll: 2, ..n })),
        ("mma w8 split4", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, warps: 8, k_split: 4, unroll: 2, ..n })),
        ("mma split4 unroll1", Tiles::Nvfp4(gemv_nvfp4::Tiles { lanes: 2, mma: 1, k_split: 4, unroll: 1, ..n })),
    ];
    // The row path (a block's warps share ROWS rows and split their columns, every weight load
    // in flight at once, no split-K tail), each fitting WARPS × STEPS with its loads after the
    // wait and before it (EARLY), x read by the lanes or copied by the copy engine (XBULK);
    // those that do not fit a shape are reported and left out.
    let mut nvfp4_variants = nvfp4_variants;
    for (warps, steps) in [(2, 3), (4, 2), (4, 3), (8, 1), (8, 2)] {
        for rows in [2, 4] {
            for (early, xbulk) in [(0, 0), (8, 0), (0, 1), (8, 1)] {
                let label = format!(
                    "rows{rows} w{warps} steps{steps}{}{}",
                    if early > 0 { " early" } else { "" },
                    if xbulk > 0 { " xbulk" } else { "" }
                );
                let tiles = gemv_nvfp4::Tiles { rows, warps, steps, early, xbulk, ..n };
                nvfp4_variants.push((String::leak(label), Tiles::Nvfp4(tiles)));
            }
        }
    }
    let with = |bf16: Vec<(&'static str, Tiles)>| bf16.into_iter().chain(nvfp4_variants.clone()).collect();
    vec![
        Case {
            name: "gdn out_proj",
            rows: gdn.hidden,
            cols: gdn.z_dim(),
            // The step's tiles for it: split K four ways.
            variants: with(vec![("bf16 split4", Tiles::Bf16(gemv_bf16::Tiles { k_split: 4, ..b }))]),
        },
        Case {
            name: "qsa in_proj",
            rows: qsa.in_rows(),
            cols: qsa.hidden,
            variants: with(vec![("bf16", Tiles::Bf16(b))]),
        },
        Case {
            name: "qsa o_proj",
            rows: qsa.hidden,
            cols: qsa.attn_dim(),
            variants: with(vec![("bf16 split4", Tiles::Bf16(gemv_bf16::Tiles { k_split: 4, ..b }))]),
        },
    ]
}

fn bench_gemv_nvfp4(c: &mut Criterion) {
    let Some((gpu, copy_bw)) = flashnext::bench::open_gpu_with_copy_bandwidth("gemv_nvfp4") else { return };
    let mut rec = Recorder::new(&gpu, "gemv_nvfp4", Some(copy_bw));
    let mut rng = Rng::fresh("gemv_nvfp4 bench");

    let mut group = c.benchmark_group("gemv_nvfp4");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for case in cases() {
        let (rows, cols) = (case.rows, case.cols);
        let bf16_w = weights(&gpu, &mut rng, rows, cols, false);
        let nvfp4_w = weights(&gpu, &mut rng, rows, cols, true);
        let mut b = Buffers {
            x: gpu.upload(&rng.bf16_normal(cols, 1.0)).expect("upload x"),
            y: gpu.alloc(rows).expect("alloc y"),
            partial: gpu.alloc(16 * rows).expect("alloc partials"),
            counters: gpu.alloc(rows).expect("alloc counters"),
        };
        for (label, tiles) in &case.variants {
            let (w, bytes) = match tiles {
                // W once (codes and block scales for NVFP4), x and y once.
                Tiles::Bf16(_) => (&bf16_w, (rows * cols + cols + rows) * 2),
                Tiles::Nvfp4(_) => (&nvfp4_w, rows * cols / 2 + rows * cols / 16 + (cols + rows) * 2),
            };
            let launches = match w {
                Weights::Bf16(ws) => ws.len() * 32usize.div_ceil(ws.len()),
                Weights::Nvfp4 { packed, .. } => packed.len() * 32usize.div_ceil(packed.len()),
            };
            // A variant whose tiles cannot cover the shape is named and left out.
            let fits = match tiles {
                Tiles::Bf16(t) => gemv_bf16::Kernel::launch_dims(t, &bf16_args(rows, cols)).err(),
                Tiles::Nvfp4(t) => gemv_nvfp4::Kernel::launch_dims(t, &nvfp4_args(rows, cols)).err(),
            };
            if let Some(e) = fits {
                println!("{} {rows}x{cols} {label:<14} does not fit: {e}", case.name);
                continue;
            }
            let g = graph(&gpu, w, &mut b, *tiles, rows, cols, launches);
            let timer = EventTimer::new(&gpu).expect("events");
            let mut per_launch: Vec<f64> = (0..40)
                .map(|_| {
                    timer.start(&gpu).expect("start");
                    g.launch().expect("replay");
                    timer.stop(&gpu).expect("stop").as_secs_f64() / launches as f64
                })
                .collect();
            per_launch.sort_by(f64::total_cmp);
            let times = (percentile(&per_launch, 0.5), percentile(&per_launch, 0.1), percentile(&per_launch, 0.9));
            rec.record(
                Sample::new(case.name, format!("{rows}x{cols} {label}"), Unit::Launch, times)
                    .bytes(bytes)
                    .launches(1)
                    .notes(format!("{tiles:?}")),
            );
            group.throughput(Throughput::Bytes(bytes as u64));
            group.bench_function(format!("{}/{label}", case.name.replace(' ', "_")), |bench| {
                bench.iter_custom(|iters| {
                    let replays = (iters as usize).div_ceil(launches);
                    timer.start(&gpu).expect("start");
                    for _ in 0..replays {
                        g.launch().expect("replay");
                    }
                    timer.stop(&gpu).expect("stop").mul_f64(iters as f64 / (replays * launches) as f64)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_gemv_nvfp4);
criterion_main!(benches);
