//! PLE's critical path on the GPU: from the token known on the device to one PLE layer's 16 rows
//! in device memory, the bf16 table in mapped pinned host memory read zero-copy.
//!
//! Figures, each per step (one token), as the median, p10 and p90 over replays:
//! - `ids`: the hash kernel alone.
//! - `gather`: the gather of 16 rows of 160 values alone, fresh random ids each replay: bf16 rows
//!   (5120 bytes) or NVFP4 rows (96 bytes each, 1536 bytes, dequantised to bf16 on the device).
//! - `ids+gather`: the two in sequence: the time PLE adds from the token to the rows.
//! - `ple critical path` (large pinned table only): layer 0's stand-in alone, with the ids and
//!   the gather beside it on a side stream, and after them on one stream; and the differences:
//!   what PLE adds to the critical path per token, from the token known to the rows ready.
//! - `ple block` (large pinned table only): ids, gather, the key/value GEMV and gate+conv at the
//!   published shape: the token to the PLE layer's output, when nothing overlaps it.
//!
//! Each graph chains CHAIN steps (every step reads its own token or ids, dependent launches as in
//! a decode step), so a replay's time over CHAIN is the per-step latency including the gap
//! between dependent kernels, without the graph launch itself; the `x1` lines time a graph of one
//! step between events (an upper bound, launch included). Tokens and ids are rewritten before
//! each replay, so the rows read are new ones (not in L2 from the previous replay).
//!
//! Tables: 64 MiB, and as large as the machine pins of 29, 16, 8 GB (the line says which), filled
//! with zeros by a host memset at allocation (the bytes do not change the timing); then a table
//! file (sparse, FLASHNEXT_PLE_FILE_GB, default 8, in FLASHNEXT_PLE_FILE_DIR or the temp
//! directory) registered in place and, where the device reads pageable memory, mapped. A 29 GB table
//! is the NVFP4 table's size; in bf16 it holds fewer rows than the model's 320 M (the hash's
//! primes are scaled down to fit it), and a bf16 row is 320 bytes where an NVFP4 row is 96. So the
//! large pinned table is benched again as NVFP4 rows (the same bytes, re-pinned): at 29 GB that is
//! 302 M rows, the full-size table.
//! Lines go to stdout and records (`flashnext::bench::Record`) to $OUT/bench-ple.jsonl (or
//! target/bench-ple.jsonl).

use std::io::Write;

use engine::cuda::{DeviceBuffer, Gpu, Graph, LoadedKernel, MappedHostBuffer, SideStream};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::ple::gather_bf16::ple_gather_bf16;
use engine::kernels::ple::gather_nvfp4::ple_gather_nvfp4;
use engine::kernels::ple::ids::ple_ids;
use engine::layers::ple::{
    PleHashOnDevice, PleKernels, PleLaunches, PleScratch, PleShape, PleStateOnDevice, PleStreams, PleTableOnHost,
    PleTiles, PleWeightsOnDevice, Residency, TableRows, gather_args,
};
use engine::model::config::ModelConfig;
use engine::model::ngram_hash::NgramHash;
use engine::model::ple_table::{HEADER_BYTES, PleTableFile, RowFormat, TableHeader, nvfp4_row_words};
use flashnext::bench::{Recorder, Sample, Unit};
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{DevPtr, DevPtrMut, TileSet};

const WIDTH: usize = 160;
const HEADS: usize = 16;
const CHAIN: usize = 64;
const REPLAYS: usize = 300;
const GB: usize = 1_000_000_000;

/// The published hash geometry (vocab, eos, 2 orders × 8 heads), its primes from `prime_base`.
fn config(prime_base: u64) -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-dense/config.json");
    let mut c = ModelConfig::from_file(std::path::Path::new(path)).expect("tiny config");
    c.vocab_size = 248_320;
    c.eos_token_id = Some(248_044);
    c.ngram_size = 3;
    c.heads_per_ngram = 8;
    c.ngram_vocab_size_base = prime_base;
    c
}

/// Median, p10, p90 of one replay of `g` divided by `steps`; `before` runs before each replay,
/// outside the timed events.
fn replay_times(gpu: &Gpu, g: &Graph, steps: usize, before: impl FnMut()) -> (f64, f64, f64) {
    flashnext::bench::replay_times_with(gpu, g, REPLAYS, steps, before)
}

/// Where records go: the one writer of every bench.
type Sink = Recorder;

/// One record per step (token); the rows' bytes cross the host bus, so the GB/s is the bus's.
fn report(out: &mut Sink, group: &str, case: &str, table_bytes: usize, bytes: usize, t: (f64, f64, f64)) {
    let s =
        Sample::new(group, case, Unit::Token, t).notes(format!("table {:.2} GB on the host", table_bytes as f64 / 1e9));
    out.record(if bytes == 0 { s } else { s.bytes(bytes) });
}

/// The largest table of `sizes` (bytes) that pins, with its size.
fn pin_table(gpu: &Gpu, sizes: &[usize]) -> Option<(MappedHostBuffer<bf16>, usize)> {
    for &bytes in sizes {
        let start = std::time::Instant::now();
        match MappedHostBuffer::<bf16>::new(gpu.context(), bytes / 2) {
            Ok(t) => {
                println!("pinned {:.2} GB in {:.1} s", bytes as f64 / 1e9, start.elapsed().as_secs_f64());
                return Some((t, bytes));
            }
            Err(e) => println!("pinning {:.2} GB failed: {e}", bytes as f64 / 1e9),
        }
    }
    None
}

/// A hash whose rows fit in a table of `table_rows` rows (and nearly fill it).
fn fitting_hash(table_rows: u64) -> (ModelConfig, NgramHash) {
    // 16 primes from this base sum to at most the table's rows once padded.
    let cfg = config(table_rows / HEADS as u64 - 1024);
    let hash = NgramHash::new(&cfg, 0);
    assert!(hash.rows_padded <= table_rows, "hash rows {} > table rows {table_rows}", hash.rows_padded);
    (cfg, hash)
}

/// A table and the gather that reads it.
#[derive(Clone, Copy)]
enum Rows<'a> {
    Bf16 { k: &'a LoadedKernel<ple_gather_bf16::Kernel>, table: DevPtr<bf16> },
    Nvfp4 { k: &'a LoadedKernel<ple_gather_nvfp4::Kernel>, table: DevPtr<u32> },
}

impl Rows<'_> {
    /// Bytes of one table row.
    fn row_bytes(&self) -> usize {
        match self {
            Rows::Bf16 { .. } => 2 * WIDTH,
            Rows::Nvfp4 { .. } => 4 * nvfp4_row_words(WIDTH),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Rows::Bf16 { .. } => "bf16",
            Rows::Nvfp4 { .. } => "nvfp4",
        }
    }

    /// Enqueues the gather of HEADS rows at `ids` into `rows` (bf16) on the side stream, or on
    /// the main one.
    ///
    /// # Safety
    /// The ids address rows of the table; `rows` holds HEADS × WIDTH values.
    unsafe fn launch_on(
        &self,
        gpu: &Gpu,
        side: Option<&SideStream>,
        ids: DevPtr<u64>,
        rows: DevPtrMut<bf16>,
    ) -> engine::Result<()> {
        // SAFETY: the caller's guarantees.
        unsafe {
            match *self {
                Rows::Bf16 { k, table } => {
                    let args = gather_args(table, ids, rows, HEADS, WIDTH);
                    match side {
                        Some(side) => k.launch_on(gpu, side.stream(), &args),
                        None => k.launch(gpu, &args),
                    }
                }
                Rows::Nvfp4 { k, table } => {
                    let args = ple_gather_nvfp4::Args {
                        table,
                        ids,
                        rows,
                        count: HEADS as u32,
                        width: WIDTH as u32,
                        row_words: nvfp4_row_words(WIDTH) as u32,
                        scale2: 1.0,
                    };
                    match side {
                        Some(side) => k.launch_on(gpu, side.stream(), &args),
                        None => k.launch(gpu, &args),
                    }
                }
            }
        }
    }
}

/// The ids, the gather and the two together, from a table of `table_bytes`.
fn bench_rows(
    gpu: &Gpu,
    out: &mut Sink,
    rng: &mut Rng,
    ki: &LoadedKernel<ple_ids::Kernel>,
    source: Rows<'_>,
    table_bytes: usize,
    tag: &str,
) {
    let table_rows = (table_bytes / source.row_bytes()) as u64;
    let (_, hash_host) = fitting_hash(table_rows);
    let mut hash = PleHashOnDevice::new(gpu, std::slice::from_ref(&hash_host)).expect("hash constants");
    let rows_bytes = HEADS * source.row_bytes();
    let tag = format!("{} {tag}", source.name());

    let mut tokens = gpu.alloc::<u32>(CHAIN).expect("alloc");
    let mut ids: DeviceBuffer<u64> = gpu.alloc(CHAIN * HEADS).expect("alloc");
    let mut rows: DeviceBuffer<bf16> = gpu.alloc(CHAIN * HEADS * WIDTH).expect("alloc");
    let fresh_tokens = |rng: &mut Rng| -> Vec<u32> { (0..CHAIN).map(|_| (rng.next_u64() % 248_320) as u32).collect() };
    let fresh_ids = |rng: &mut Rng| -> Vec<u64> { (0..CHAIN * HEADS).map(|_| rng.next_u64() % table_rows).collect() };

    for steps in [CHAIN, 1] {
        let step_args: Vec<_> = (0..steps)
            .map(|s| {
                let i = hash.ids_args(tokens.ptr().offset(s as u64), ids.ptr_mut().offset((s * HEADS) as u64));
                (i, ids.ptr().offset((s * HEADS) as u64), rows.ptr_mut().offset((s * HEADS * WIDTH) as u64))
            })
            .collect();
        let chain = format!("x{steps}");
        for which in ["ids", "gather", "ids+gather"] {
            let graph = gpu
                .capture(|| {
                    for &(ref i, step_ids, step_rows) in &step_args {
                        if which != "gather" {
                            // SAFETY: each step's token, ids and rows are slices of live buffers of
                            // CHAIN steps; the constants and history live in `hash`.
                            unsafe { ki.launch(gpu, i) }?;
                        }
                        if which != "ids" {
                            // SAFETY: ids address rows of the table (the hash's rows fit in it, fresh
                            // ids are drawn below its rows), which outlives the graph.
                            unsafe { source.launch_on(gpu, None, step_ids, step_rows) }?;
                        }
                    }
                    Ok(())
                })
                .expect("capture");
            let t = replay_times(gpu, &graph, steps, || {
                if which == "gather" {
                    gpu.write(&mut ids, &fresh_ids(rng)).expect("ids");
                } else {
                    gpu.write(&mut tokens, &fresh_tokens(rng)).expect("tokens");
                }
            });
            let bytes = if which == "ids" { 0 } else { rows_bytes };
            report(out, which, &format!("{tag} {chain}"), table_bytes, bytes, t);
        }
    }
}

fn main() {
    let Some(gpu) = flashnext::bench::open_gpu("ple") else { return };
    let mut out = Recorder::new(&gpu, "ple", None);
    let mut rng = Rng::fresh("ple bench");
    let ki = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    let kg = gpu.kernel::<ple_gather_bf16::Kernel>(ple_gather_bf16::Tiles::DEFAULT).expect("compile");
    let kn = gpu.kernel::<ple_gather_nvfp4::Kernel>(ple_gather_nvfp4::Tiles::DEFAULT).expect("compile");
    let bf16_rows = |t: &MappedHostBuffer<bf16>| Rows::Bf16 { k: &kg, table: t.ptr() };

    let small = 64 << 20;
    let (table, bytes) = pin_table(&gpu, &[small]).expect("a 64 MiB pinned table");
    bench_rows(&gpu, &mut out, &mut rng, &ki, bf16_rows(&table), bytes, "64MiB");
    drop(table);

    let large: Vec<usize> = match std::env::var("FLASHNEXT_PLE_TABLE_GB").ok().and_then(|s| s.parse::<usize>().ok()) {
        Some(gb) => vec![gb * GB],
        None => vec![29 * GB, 16 * GB, 8 * GB],
    };
    match pin_table(&gpu, &large) {
        Some((table, bytes)) => {
            let tag = format!("{}GB", bytes / GB);
            bench_rows(&gpu, &mut out, &mut rng, &ki, bf16_rows(&table), bytes, &tag);
            bench_block(&gpu, &mut out, &mut rng, table.ptr(), bytes, &tag);
            bench_overlap(&gpu, &mut out, &mut rng, &ki, bf16_rows(&table), bytes, &tag);
            // The same bytes as NVFP4 rows (96 bytes each): at 29 GB, the full-size table.
            let words = bytes / 4;
            drop(table);
            match MappedHostBuffer::<u32>::new(gpu.context(), words) {
                Ok(t) => {
                    let rows = Rows::Nvfp4 { k: &kn, table: t.ptr() };
                    bench_rows(&gpu, &mut out, &mut rng, &ki, rows, bytes, &tag);
                    bench_overlap(&gpu, &mut out, &mut rng, &ki, rows, bytes, &tag);
                }
                Err(e) => println!("pinning the NVFP4 table failed: {e}"),
            }
        }
        None => println!("no large table could be pinned"),
    }

    bench_file(&gpu, &mut out, &mut rng, &ki, &kg);
}

/// The whole PLE block at the published shape (4 streams of 2560, 16 heads of 160), chained
/// CHAIN steps in a graph: ids, gather, the stacked key/value GEMV (65.5 MB of bf16 weights),
/// gate and conv. Weights of 4 layers (zeros: the time does not depend on the values) rotate
/// through the chain, 262 MB, beyond the 60 MB L2.
fn bench_block(gpu: &Gpu, out: &mut Sink, rng: &mut Rng, table: DevPtr<bf16>, table_bytes: usize, tag: &str) {
    const WEIGHT_SETS: usize = 4;
    let (mut cfg, hash_host) = fitting_hash((table_bytes / (2 * WIDTH)) as u64);
    cfg.hc_streams = 4;
    cfg.hidden_size = 2560;
    cfg.ple_embed_dim = 2560;
    cfg.ple_conv_kernel = 4;
    let shape = PleShape::from_config(&cfg).expect("shape");
    let k = PleKernels::load(gpu, PleTiles::default()).expect("compile");
    let zeros = |n: usize| gpu.alloc::<bf16>(n).expect("alloc");
    let nd = shape.residual_width();
    let weights: Vec<PleWeightsOnDevice> = (0..WEIGHT_SETS)
        .map(|_| PleWeightsOnDevice {
            shape,
            proj: engine::layers::matrix::MatrixOnDevice::Bf16(zeros(shape.proj_rows() * shape.embed_dim())),
            norm_key: zeros(nd),
            norm_query: zeros(nd),
            norm_conv: zeros(nd),
            conv: zeros(nd * shape.conv_kernel),
        })
        .collect();
    let mut states: Vec<PleStateOnDevice> =
        (0..WEIGHT_SETS).map(|_| PleStateOnDevice::new(gpu, shape).expect("state")).collect();
    let mut scratch = PleScratch::new(gpu, shape).expect("scratch");
    let mut hash = PleHashOnDevice::new(gpu, std::slice::from_ref(&hash_host)).expect("hash");
    let mut tokens = gpu.alloc::<u32>(CHAIN).expect("alloc");
    let mut ids: DeviceBuffer<u64> = gpu.alloc(CHAIN * HEADS).expect("alloc");
    let x = gpu.alloc::<bf16>(nd).expect("alloc");
    let mut y = gpu.alloc::<bf16>(nd).expect("alloc");
    let steps: Vec<_> = (0..CHAIN)
        .map(|s| {
            let i = hash.ids_args(tokens.ptr().offset(s as u64), ids.ptr_mut().offset((s * HEADS) as u64));
            let l = PleLaunches::new(
                &weights[s % WEIGHT_SETS],
                &mut states[s % WEIGHT_SETS],
                &mut scratch,
                TableRows::Bf16(table),
                ids.ptr().offset((s * HEADS) as u64),
                PleStreams { input: x.ptr(), post: None, output: y.ptr_mut() },
            );
            (i, l)
        })
        .collect();
    let graph = gpu
        .capture(|| {
            for (i, l) in &steps {
                // SAFETY: every buffer lives to the end of this function; the ids address rows of
                // the table (the hash fits it).
                unsafe {
                    k.ids.launch(gpu, i)?;
                    l.enqueue(gpu, &k)?;
                }
            }
            Ok(())
        })
        .expect("capture");
    let t = replay_times(gpu, &graph, CHAIN, || {
        let fresh: Vec<u32> = (0..CHAIN).map(|_| (rng.next_u64() % 248_320) as u32).collect();
        gpu.write(&mut tokens, &fresh).expect("tokens");
    });
    let bytes = HEADS * WIDTH * 2
        + shape.proj_rows() * shape.embed_dim() * 2
        + nd * (3 + shape.conv_kernel) * 2
        + shape.conv_depth() * nd * 4 * 2
        // the streams read and written, bf16
        + nd * 2 * 2;
    report(
        out,
        "block (ids, gather, kv gemv, gate+conv)",
        &format!("published shape {tag} x{CHAIN}"),
        table_bytes,
        bytes,
        t,
    );
}

/// The ids and the gather from a table file: a sparse file of FLASHNEXT_PLE_FILE_GB (default 8)
/// GB in the temp directory (zeros; its pages come from the page cache, never from the disk),
/// registered in place, and read through the host's page tables where the device can.
fn bench_file(
    gpu: &Gpu,
    out: &mut Sink,
    rng: &mut Rng,
    ki: &LoadedKernel<ple_ids::Kernel>,
    kg: &LoadedKernel<ple_gather_bf16::Kernel>,
) {
    let gb = std::env::var("FLASHNEXT_PLE_FILE_GB").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(8);
    let (mut cfg, hash) = fitting_hash((gb * GB / (2 * WIDTH)) as u64);
    cfg.ple_layers = vec![0];
    cfg.ple_embed_dim = HEADS * WIDTH;
    let header = TableHeader::for_config(&cfg, RowFormat::Bf16).expect("header");
    assert_eq!(header.rows, hash.rows_padded);
    let dir =
        std::env::var_os("FLASHNEXT_PLE_FILE_DIR").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("flashnext-ple-bench-{}.bin", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&header.encode())?;
        f.set_len((HEADER_BYTES as u64) + header.data_bytes())
    })();
    if let Err(e) = written {
        println!("table file at {} not written: {e}", path.display());
        return;
    }
    let table_bytes = header.data_bytes() as usize;
    for residency in [Residency::Registered, Residency::Pageable] {
        let file = PleTableFile::open(&path, &cfg).expect("open table");
        let start = std::time::Instant::now();
        match PleTableOnHost::load(gpu, file, residency) {
            Ok(table) => {
                println!(
                    "{residency:?} table file of {:.2} GB ready in {:.1} s",
                    table_bytes as f64 / 1e9,
                    start.elapsed().as_secs_f64()
                );
                let tag = format!("file-{residency:?}-{gb}GB");
                let TableRows::Bf16(rows) = table.rows(0) else { unreachable!("a bf16 table file") };
                bench_rows(gpu, out, rng, ki, Rows::Bf16 { k: kg, table: rows }, table_bytes, &tag);
            }
            Err(e) => println!("{residency:?} table file: {e}"),
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// What the ids and the gather add to the critical path when they run on a side stream beside
/// layer 0. Layer 0's stand-in: a 12800 × 2560 bf16 GEMV (65.5 MB, a GDN input projection's size),
/// two such matrices alternating (131 MB, beyond the L2). Three graphs of CHAIN steps: layer 0
/// alone; the ids and gather forked onto the side stream, layer 0 on the main stream, the join;
/// the ids, the gather and layer 0 one after the other on the main stream. The differences of
/// the medians are what PLE adds per token, overlapped and not.
fn bench_overlap(
    gpu: &Gpu,
    out: &mut Sink,
    rng: &mut Rng,
    ki: &LoadedKernel<ple_ids::Kernel>,
    source: Rows<'_>,
    table_bytes: usize,
    tag: &str,
) {
    const ROWS: usize = 12800;
    const COLS: usize = 2560;
    let (_, hash_host) = fitting_hash((table_bytes / source.row_bytes()) as u64);
    let tag = format!("{} {tag}", source.name());
    let mut hash = PleHashOnDevice::new(gpu, std::slice::from_ref(&hash_host)).expect("hash");
    let kl = gpu.kernel::<gemv_bf16::Kernel>(gemv_bf16::Tiles::DEFAULT).expect("compile");
    let side = SideStream::new(gpu).expect("side stream");
    let weights: Vec<DeviceBuffer<bf16>> = (0..2).map(|_| gpu.alloc(ROWS * COLS).expect("alloc")).collect();
    let x = gpu.alloc::<bf16>(COLS).expect("alloc");
    let mut y = gpu.alloc::<bf16>(ROWS).expect("alloc");
    let mut partial = gpu.alloc::<f32>(16 * ROWS).expect("alloc");
    let mut counters = gpu.alloc::<u32>(ROWS).expect("alloc");
    let mut tokens = gpu.alloc::<u32>(CHAIN).expect("alloc");
    let mut ids: DeviceBuffer<u64> = gpu.alloc(CHAIN * HEADS).expect("alloc");
    let mut rows: DeviceBuffer<bf16> = gpu.alloc(CHAIN * HEADS * WIDTH).expect("alloc");
    let steps: Vec<_> = (0..CHAIN)
        .map(|s| {
            let i = hash.ids_args(tokens.ptr().offset(s as u64), ids.ptr_mut().offset((s * HEADS) as u64));
            let g = (ids.ptr().offset((s * HEADS) as u64), rows.ptr_mut().offset((s * HEADS * WIDTH) as u64));
            let l = gemv_bf16::Args {
                w: weights[s % 2].ptr(),
                x: x.ptr(),
                y: y.ptr_mut(),
                partial: partial.ptr_mut(),
                counters: counters.ptr_mut(),
                rows: ROWS as u32,
                cols: COLS as u32,
            };
            (i, g, l)
        })
        .collect();
    let mut medians = Vec::new();
    for which in ["layer 0 alone", "layer 0 + ids+gather on a side stream", "layer 0 after ids+gather, one stream"] {
        let graph = gpu
            .capture(|| {
                for (i, g, l) in &steps {
                    // SAFETY: every buffer lives to the end of this function; the ids address rows
                    // of the table; layer 0's stand-in touches none of PLE's buffers.
                    unsafe {
                        match which {
                            "layer 0 alone" => {}
                            "layer 0 + ids+gather on a side stream" => {
                                side.fork(gpu)?;
                                ki.launch_on(gpu, side.stream(), i)?;
                                source.launch_on(gpu, Some(&side), g.0, g.1)?;
                            }
                            _ => {
                                ki.launch(gpu, i)?;
                                source.launch_on(gpu, None, g.0, g.1)?;
                            }
                        }
                        kl.launch(gpu, l)?;
                        if which == "layer 0 + ids+gather on a side stream" {
                            side.join(gpu)?;
                        }
                    }
                }
                Ok(())
            })
            .expect("capture");
        let t = replay_times(gpu, &graph, CHAIN, || {
            let fresh: Vec<u32> = (0..CHAIN).map(|_| (rng.next_u64() % 248_320) as u32).collect();
            gpu.write(&mut tokens, &fresh).expect("tokens");
        });
        report(out, "critical path", &format!("{which} {tag} x{CHAIN}"), table_bytes, ROWS * COLS * 2, t);
        medians.push(t.0);
    }
    for (which, m) in [("overlapped", medians[1]), ("serial", medians[2])] {
        let added = (m - medians[0]) * 1e6;
        let what = Sample::median("added to the critical path", format!("{which} {tag}"), Unit::Token, added * 1e-6);
        out.record(what.notes("medians' difference"));
    }
}
