//! PLE on a GPU: the n-gram row ids hashed on the device from the device-side history against
//! the host hash `model::ngram_hash` (which matches the reference's test vectors), over 80 tokens
//! with single and repeated eos; the row gather from a bf16 table in mapped pinned host memory,
//! ids and gather captured in one graph and replayed token after token, every byte of every row
//! compared with the table (two PLE layers in one table, so the layer bases show; the published
//! hash constants and vocabulary, and a small one), and the same from a table file written in the
//! engine's layout, pinned, registered in place and (where the device reads pageable memory)
//! mapped; the NVFP4 gather against the host's dequantisation, bit for bit, from pinned memory
//! and from an NVFP4 table file (per-layer global scales); and the whole PLE
//! block (ids, gather, the
//! stacked key/value GEMV, norms, gate, dilated conv, sum into the streams) against
//! `reference::ple::ple` over 80 tokens with the conv state carried, at a tiny shape (every tile
//! candidate of the gather and the gate/conv kernel) and the published one, eagerly and as one
//! graph per token with the ids and the gather on a side stream beside a stand-in for layer 0.
//! Fresh tokens, tables,
//! weights and streams each run, outputs and scratch poisoned before each token.

use engine::cuda::{Gpu, MappedHostBuffer, SideStream};
use engine::kernels::gemv_bf16::gemv_bf16;
use engine::kernels::gemv_nvfp4::gemv_nvfp4;
use engine::kernels::ple::gate_conv::ple_gate_conv;
use engine::kernels::ple::gather_bf16::ple_gather_bf16;
use engine::kernels::ple::gather_nvfp4::ple_gather_nvfp4;
use engine::kernels::ple::ids::ple_ids;
use engine::layers::ple::{
    Gather, PleHashOnDevice, PleKernels, PleLaunches, PleScratch, PleShape, PleStateOnDevice, PleStreams,
    PleTableOnHost, PleTiles, PleWeightsOnDevice, Residency, TableRows, enqueue_rows_on_side, gather_args,
    table_row_bases,
};
use engine::model::config::ModelConfig;
use engine::model::ngram_hash::NgramHash;
use engine::model::nvfp4::Nvfp4Matrix;
use engine::model::ple_table::{
    Checksum, PleTableFile, RowFormat, TableHeader, layer_hashes, nvfp4_row_words, nvfp4_rows,
};
use engine::model::weights::{Linear, PleWeights};
use engine::reference::ple::{PleState, ple};
use flashnext::compare::rel_l2;
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::{DevPtr, TileSet};

const TOKENS: usize = 80;
const PLE_LAYERS: usize = 2;
/// The published row width: 2560 values over 16 heads.
const WIDTH: usize = 160;

/// The tiny test config with `vocab` tokens, eos `eos`, and the n-gram primes from `prime_base`.
fn config(vocab: usize, eos: u32, prime_base: u64) -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/tiny-dense/config.json");
    let mut c = ModelConfig::from_file(std::path::Path::new(path)).expect("tiny config");
    c.vocab_size = vocab;
    c.eos_token_id = Some(eos);
    c.ngram_vocab_size_base = prime_base;
    c
}

/// Random tokens below `vocab` with eos at random places, sometimes twice or three times in a
/// row, and once as the very first token.
fn tokens(rng: &mut Rng, vocab: usize, eos: u32) -> Vec<u32> {
    let mut t: Vec<u32> = (0..TOKENS).map(|_| (rng.next_u64() % vocab as u64) as u32).collect();
    t[0] = eos;
    let mut i = 3;
    while i < TOKENS {
        let run = 1 + (rng.next_u64() % 3) as usize;
        t[i..(i + run).min(TOKENS)].fill(eos);
        i += run + 2 + (rng.next_u64() % 9) as usize;
    }
    t
}

/// The ids the host hash gives for each token, each layer's base added: [TOKENS][layers × heads].
fn host_ids(hashes: &[NgramHash], tokens: &[u32]) -> Vec<Vec<u64>> {
    let (bases, _) = table_row_bases(hashes);
    let mut history = hashes[0].initial_history();
    tokens
        .iter()
        .map(|&t| {
            let ids =
                hashes.iter().zip(&bases).flat_map(|(h, &b)| h.ids(&history, t).into_iter().map(move |id| id + b));
            let ids = ids.collect();
            hashes[0].push(&mut history, t);
            ids
        })
        .collect()
}

fn ids_match(cfg: &ModelConfig, label: &str) {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh(label);
    let hashes: Vec<NgramHash> = (0..PLE_LAYERS).map(|l| NgramHash::new(cfg, l)).collect();
    let eos = hashes[0].eos();
    let tokens = tokens(&mut rng, cfg.vocab_size, eos);
    let want = host_ids(&hashes, &tokens);

    let mut hash = PleHashOnDevice::new(&gpu, &hashes).expect("hash constants");
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(hash.ids_per_step()).expect("alloc");
    let k = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    let mut history = hashes[0].initial_history();
    for (step, &t) in tokens.iter().enumerate() {
        gpu.write(&mut token, &[t]).expect("token");
        gpu.fill_bytes(&mut ids, 0xff).expect("poison");
        let args = hash.ids_args(token.ptr(), ids.ptr_mut());
        // SAFETY: the token buffer holds 1 token, ids one per head of each layer, the constants
        // and history their layers × heads and ngram_size − 1 entries.
        unsafe { k.launch(&gpu, &args) }.expect("launch");
        let got = gpu.download(&ids).expect("ids");
        assert_eq!(got, want[step], "{label} token {step} ({t}, history {history:?})");
        hashes[0].push(&mut history, t);
        assert_eq!(hash.history(&gpu).expect("history"), history, "{label}: history after token {step}");
    }
    // Back to the start of a sequence: the first token's ids again.
    hash.reset(&gpu).expect("reset");
    gpu.write(&mut token, &[tokens[0]]).expect("token");
    let args = hash.ids_args(token.ptr(), ids.ptr_mut());
    // SAFETY: as above.
    unsafe { k.launch(&gpu, &args) }.expect("launch");
    assert_eq!(gpu.download(&ids).expect("ids"), want[0], "{label}: after reset");
}

#[test]
#[ignore = "needs a CUDA device"]
fn ids_match_the_host_hash_at_the_published_constants() {
    // vocab 248320, eos 248044, primes from 20 000 000: the reference's own constants.
    ids_match(&config(248_320, 248_044, 20_000_000), "ids-published");
}

#[test]
#[ignore = "needs a CUDA device"]
fn ids_match_the_host_hash_with_a_small_vocabulary() {
    ids_match(&config(384, 7, 1000), "ids-small");
}

/// Replays ids + gather as one graph over the tokens for every gather tile candidate, and checks
/// every byte of every gathered row against `host_rows` (what `table` holds).
fn check_gather(gpu: &Gpu, table: DevPtr<bf16>, host_rows: &[bf16], hashes: &[NgramHash], tokens: &[u32], label: &str) {
    let want_ids = host_ids(hashes, tokens);
    let mut hash = PleHashOnDevice::new(gpu, hashes).expect("hash constants");
    let count = hash.ids_per_step();
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(count).expect("alloc");
    let mut rows = gpu.alloc::<bf16>(count * WIDTH).expect("alloc");
    let ki = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    for tiles in ple_gather_bf16::Tiles::candidates() {
        let kg = gpu.kernel::<ple_gather_bf16::Kernel>(tiles).expect("compile");
        hash.reset(gpu).expect("reset");
        let ids_args = hash.ids_args(token.ptr(), ids.ptr_mut());
        let gather = gather_args(table, ids.ptr(), rows.ptr_mut(), count, WIDTH);
        let graph = gpu
            .capture(|| {
                // SAFETY: ids as in `ids_match`; the table holds every row an id can address
                // (the layers' padded rows), `rows` count × WIDTH values.
                unsafe { ki.launch(gpu, &ids_args) }?;
                // SAFETY: as above.
                unsafe { kg.launch(gpu, &gather) }
            })
            .expect("capture");
        for (step, &t) in tokens.iter().enumerate() {
            gpu.write(&mut token, &[t]).expect("token");
            gpu.fill_bytes(&mut ids, 0xff).expect("poison");
            gpu.fill_bytes(&mut rows, 0xff).expect("poison");
            graph.launch().expect("replay");
            let got_ids = gpu.download(&ids).expect("ids");
            assert_eq!(got_ids, want_ids[step], "{label} {tiles:?} token {step}: ids");
            let got = gpu.download(&rows).expect("rows");
            for (r, &id) in want_ids[step].iter().enumerate() {
                let want = &host_rows[id as usize * WIDTH..(id as usize + 1) * WIDTH];
                let got = &got[r * WIDTH..(r + 1) * WIDTH];
                assert!(
                    got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{label} {tiles:?} token {step} row {r} (id {id}) differs from the table"
                );
            }
        }
    }
}

/// Ids and gather in one graph, replayed per token, from a table in pinned mapped host memory:
/// the rows in the device buffer are the table's rows, byte for byte.
#[test]
#[ignore = "needs a CUDA device"]
fn gathered_rows_are_the_table_rows_through_a_graph() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gather");
    let cfg = config(248_320, 248_044, 1000);
    let hashes: Vec<NgramHash> = (0..PLE_LAYERS).map(|l| NgramHash::new(&cfg, l)).collect();
    let (_, table_rows) = table_row_bases(&hashes);
    let tokens = tokens(&mut rng, cfg.vocab_size, hashes[0].eos());
    let mut table = MappedHostBuffer::<bf16>::new(gpu.context(), table_rows as usize * WIDTH).expect("pinned table");
    for v in table.as_mut_slice() {
        *v = bf16::from_bits(rng.next_u64() as u16);
    }
    println!("table: {table_rows} rows of {WIDTH} bf16 in mapped pinned host memory ({} bytes)", table.size_bytes());
    check_gather(&gpu, table.ptr(), table.as_slice(), &hashes, &tokens, "pinned");
}

/// The NVFP4 gather: a random NVFP4 table (codes anything, scales 2^-3 to 2^3) in the table's
/// row layout in mapped pinned host memory, ids and gather as one graph per token; every gathered
/// value is the host's dequantisation (code · scale · scale_2) rounded to bf16, bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn gathered_nvfp4_rows_are_the_dequantised_table() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gather-nvfp4");
    let cfg = config(248_320, 248_044, 1000);
    let hashes: Vec<NgramHash> = (0..PLE_LAYERS).map(|l| NgramHash::new(&cfg, l)).collect();
    let (_, table_rows) = table_row_bases(&hashes);
    let tokens = tokens(&mut rng, cfg.vocab_size, hashes[0].eos());
    let want_ids = host_ids(&hashes, &tokens);
    let rows_n = table_rows as usize;
    let mut packed = vec![0u8; rows_n * WIDTH / 2];
    for b in packed.iter_mut() {
        *b = rng.next_u64() as u8;
    }
    // e4m3 codes with exponent fields 4..10: 2^-3 to 2^3 times 1.mmm.
    let scales =
        (0..rows_n * WIDTH / 16).map(|_| (((rng.next_u64() % 7 + 4) << 3) | (rng.next_u64() % 8)) as u8).collect();
    let m = Nvfp4Matrix { rows: rows_n, cols: WIDTH, packed, scales, scale_2: 0.37 + rng.uniform() };
    let want_values: Vec<u16> = m.dequantise().into_iter().map(|v| bf16::from_f32(v).to_bits()).collect();
    let words = nvfp4_row_words(WIDTH);
    let mut table = MappedHostBuffer::<u32>::new(gpu.context(), rows_n * words).expect("pinned table");
    table.as_mut_slice().copy_from_slice(&nvfp4_rows(&m));

    let mut hash = PleHashOnDevice::new(&gpu, &hashes).expect("hash constants");
    let count = hash.ids_per_step();
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(count).expect("alloc");
    let mut rows = gpu.alloc::<bf16>(count * WIDTH).expect("alloc");
    let ki = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    for tiles in ple_gather_nvfp4::Tiles::candidates() {
        let kg = gpu.kernel::<ple_gather_nvfp4::Kernel>(tiles).expect("compile");
        hash.reset(&gpu).expect("reset");
        let ids_args = hash.ids_args(token.ptr(), ids.ptr_mut());
        let gather = ple_gather_nvfp4::Args {
            table: table.ptr(),
            ids: ids.ptr(),
            rows: rows.ptr_mut(),
            count: count as u32,
            width: WIDTH as u32,
            row_words: words as u32,
            scale2: m.scale_2,
        };
        let graph = gpu
            .capture(|| {
                // SAFETY: the table holds every row an id can address, `rows` count × WIDTH values.
                unsafe {
                    ki.launch(&gpu, &ids_args)?;
                    kg.launch(&gpu, &gather)
                }
            })
            .expect("capture");
        for (step, &t) in tokens.iter().enumerate() {
            gpu.write(&mut token, &[t]).expect("token");
            gpu.fill_bytes(&mut ids, 0xff).expect("poison");
            gpu.fill_bytes(&mut rows, 0xff).expect("poison");
            graph.launch().expect("replay");
            let got = gpu.download(&rows).expect("rows");
            for (r, &id) in want_ids[step].iter().enumerate() {
                let want = &want_values[id as usize * WIDTH..(id as usize + 1) * WIDTH];
                for (c, (g, w)) in got[r * WIDTH..(r + 1) * WIDTH].iter().zip(want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        *w,
                        "{tiles:?} token {step} row {r} (id {id}) value {c}: got {g}, want {}",
                        bf16::from_bits(*w)
                    );
                }
            }
        }
    }
}

/// A table file written for a config with two PLE layers, opened and made readable by the device
/// each way this device supports (pinned copy, the mapping registered, the mapping read through
/// the host's page tables): ids and gather through a graph read the file's rows exactly.
#[test]
#[ignore = "needs a CUDA device"]
fn gathered_rows_are_the_table_file_rows() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gather-file");
    let mut cfg = config(248_320, 248_044, 1000);
    cfg.ple_layers = vec![1, 3];
    cfg.ple_embed_dim = 16 * WIDTH;
    let hashes = layer_hashes(&cfg);
    assert_eq!(hashes.len(), PLE_LAYERS);
    let tokens = tokens(&mut rng, cfg.vocab_size, hashes[0].eos());
    let mut header = TableHeader::for_config(&cfg, RowFormat::Bf16).expect("header");
    let rows: Vec<bf16> = (0..header.rows as usize * WIDTH).map(|_| bf16::from_bits(rng.next_u64() as u16)).collect();
    let bytes: &[u8] = bytemuck::cast_slice(&rows);
    let mut sum = Checksum::new();
    sum.update(bytes);
    header.checksum = sum.finish();
    let path = std::env::temp_dir().join(format!("flashnext-gpu-ple-table-{}.bin", std::process::id()));
    let mut file = header.encode().to_vec();
    file.extend_from_slice(bytes);
    std::fs::write(&path, &file).expect("write table");

    for residency in [Residency::Pinned, Residency::Registered, Residency::Pageable, Residency::Auto] {
        let opened = PleTableFile::open(&path, &cfg).expect("open table");
        opened.verify().expect("checksum");
        let table = match PleTableOnHost::load(&gpu, opened, residency) {
            Ok(t) => t,
            Err(e) if residency == Residency::Pageable => {
                println!("pageable table skipped: {e}");
                continue;
            }
            Err(e) => panic!("{residency:?}: {e}"),
        };
        let TableRows::Bf16(ptr) = table.rows(0) else { panic!("a bf16 table gives bf16 rows") };
        check_gather(&gpu, ptr, &rows, &hashes, &tokens, &format!("{residency:?}"));
        println!("{residency:?}: rows exact");
    }
    let _ = std::fs::remove_file(path);
}

/// An NVFP4 table file (two PLE layers, each its own global scale) written in the engine's
/// layout, pinned and registered: per layer, the gather from `PleTableOnHost::rows(layer)` gives
/// the host's dequantisation rounded to bf16, bit for bit, for ids hashed on the device over the
/// tokens.
#[test]
#[ignore = "needs a CUDA device"]
fn gathered_rows_are_the_nvfp4_table_file_rows() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gather-nvfp4-file");
    let mut cfg = config(248_320, 248_044, 1000);
    cfg.ple_layers = vec![1, 3];
    cfg.ple_embed_dim = 16 * WIDTH;
    let hashes = layer_hashes(&cfg);
    let tokens = tokens(&mut rng, cfg.vocab_size, hashes[0].eos());
    let want_ids = host_ids(&hashes, &tokens);
    let mut header = TableHeader::for_config(&cfg, RowFormat::Nvfp4).expect("header");
    let mut words = Vec::new();
    let mut want_values: Vec<u16> = Vec::new();
    for (l, h) in hashes.iter().enumerate() {
        let rows_n = h.rows_padded as usize;
        let packed = (0..rows_n * WIDTH / 2).map(|_| rng.next_u64() as u8).collect();
        let scales =
            (0..rows_n * WIDTH / 16).map(|_| (((rng.next_u64() % 7 + 4) << 3) | (rng.next_u64() % 8)) as u8).collect();
        let m = Nvfp4Matrix { rows: rows_n, cols: WIDTH, packed, scales, scale_2: 0.1 + rng.uniform() };
        header.scale_2[l] = m.scale_2;
        words.extend(nvfp4_rows(&m));
        want_values.extend(m.dequantise().into_iter().map(|v| bf16::from_f32(v).to_bits()));
    }
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    let mut sum = Checksum::new();
    sum.update(bytes);
    header.checksum = sum.finish();
    let path = std::env::temp_dir().join(format!("flashnext-gpu-ple-nvfp4-table-{}.bin", std::process::id()));
    let mut file = header.encode().to_vec();
    file.extend_from_slice(bytes);
    std::fs::write(&path, &file).expect("write table");

    let k = PleKernels::load(&gpu, PleTiles::default()).expect("compile");
    let mut hash = PleHashOnDevice::new(&gpu, &hashes).expect("hash constants");
    let count = hash.ids_per_step();
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(count).expect("alloc");
    let mut rows = gpu.alloc::<bf16>(count * WIDTH).expect("alloc");
    for residency in [Residency::Pinned, Residency::Registered] {
        let opened = PleTableFile::open(&path, &cfg).expect("open table");
        opened.verify().expect("checksum");
        let table = PleTableOnHost::load(&gpu, opened, residency).expect("table");
        hash.reset(&gpu).expect("reset");
        let ids_args = hash.ids_args(token.ptr(), ids.ptr_mut());
        let heads = count / PLE_LAYERS;
        let gathers: Vec<Gather> = (0..PLE_LAYERS)
            .map(|l| {
                Gather::new(
                    table.rows(l),
                    ids.ptr().offset((l * heads) as u64),
                    rows.ptr_mut().offset((l * heads * WIDTH) as u64),
                    heads,
                    WIDTH,
                )
            })
            .collect();
        for (step, &t) in tokens.iter().enumerate() {
            gpu.write(&mut token, &[t]).expect("token");
            gpu.fill_bytes(&mut rows, 0xff).expect("poison");
            // SAFETY: ids one per head of each layer; the table holds every row they address;
            // each layer's gather writes its own heads × WIDTH values of `rows`.
            unsafe {
                k.ids.launch(&gpu, &ids_args).expect("ids");
                for g in &gathers {
                    g.launch(&gpu, &k, None).expect("gather");
                }
            }
            let got = gpu.download(&rows).expect("rows");
            for (r, &id) in want_ids[step].iter().enumerate() {
                let want = &want_values[id as usize * WIDTH..(id as usize + 1) * WIDTH];
                let got: Vec<u16> = got[r * WIDTH..(r + 1) * WIDTH].iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{residency:?} token {step} row {r} (id {id})");
            }
        }
        println!("NVFP4 {residency:?}: rows exact");
    }
    let _ = std::fs::remove_file(path);
}

fn bf16_values(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| bf16::from_f32(scale * rng.normal()).to_f32()).collect()
}

/// A PLE config: `streams` streams of `hidden`, a `hidden`-wide embedding over 16 heads, conv
/// kernel 4 with dilation 3, the published vocabulary, small primes (a table of ~16 k rows).
fn block_config(streams: usize, hidden: usize) -> ModelConfig {
    let mut c = config(248_320, 248_044, 1000);
    c.hc_streams = streams;
    c.hidden_size = hidden;
    c.ple_embed_dim = hidden;
    c.ngram_size = 3;
    c.heads_per_ngram = 8;
    c.ple_conv_kernel = 4;
    c.rms_norm_eps = 1e-6;
    c
}

/// Random PLE weights and table, all bf16-representable.
fn ple_weights(rng: &mut Rng, cfg: &ModelConfig) -> PleWeights {
    let hash = NgramHash::new(cfg, 0);
    let (n, d, p) = (cfg.residual_width(), cfg.hidden_size, cfg.ple_embed_dim);
    let width = p / cfg.ngram_heads();
    let linear = |rng: &mut Rng, rows: usize| Linear {
        rows,
        cols: p,
        w: bf16_values(rng, rows * p, 1.0 / (p as f32).sqrt()),
        bias: None,
    };
    PleWeights {
        table: bf16_values(rng, hash.rows_padded as usize * width, 1.0),
        hash,
        width,
        key: linear(rng, n),
        value: linear(rng, d),
        norm_key: bf16_values(rng, n, 0.2),
        norm_query: bf16_values(rng, n, 0.2),
        norm_conv: bf16_values(rng, n, 0.2),
        conv: bf16_values(rng, n * cfg.ple_conv_kernel, 0.5),
    }
}

/// 80 tokens through the PLE block on the device against the reference, the conv state carried.
/// With `overlapped`, each token is one graph replay: the ids and the gather on a side stream
/// forked at the start, a stand-in for layer 0 (a 2048 × 2048 bf16 GEMV) on the main stream
/// meanwhile, the join, then the block.
///
/// The streams are bf16, as the step keeps them. With `post`, the previous block's write comes
/// first inside the block (X ← bf16(fma(ω, y, X)), y and ω fresh each token): the reference gets
/// those streams, computed here exactly as the device rounds them.
///
/// With `nvfp4`, the key and value projections go up quantised to NVFP4 (`gemv_nvfp4` runs them)
/// and the reference takes their dequantised values.
fn block_matches(cfg: &ModelConfig, tiles: &[PleTiles], label: &str, overlapped: bool, post: bool, nvfp4: bool) {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh(label);
    let shape = PleShape::from_config(cfg).expect("shape");
    let mut w = ple_weights(&mut rng, cfg);
    let quantised = nvfp4.then(|| [w.key.quantise_in_place(), w.value.quantise_in_place()]);
    let eos = w.hash.eos();
    let tokens = tokens(&mut rng, cfg.vocab_size, eos);
    let nd = shape.residual_width();
    let d = shape.hidden;
    let streams: Vec<Vec<bf16>> = (0..TOKENS).map(|_| rng.bf16_normal(nd, 1.0)).collect();
    let writes: Vec<(Vec<bf16>, Vec<f32>)> =
        (0..TOKENS).map(|_| (rng.bf16_normal(d, 1.0), (0..nd / d).map(|_| 0.5 * rng.normal()).collect())).collect();
    // The streams the block works on: after the write when there is one, rounded as the device does.
    let written: Vec<Vec<f32>> = streams
        .iter()
        .zip(&writes)
        .map(|(x, (y, g))| {
            (0..nd)
                .map(|c| {
                    let x = x[c].to_f32();
                    if post { bf16::from_f32(g[c / d].mul_add(y[c % d].to_f32(), x)).to_f32() } else { x }
                })
                .collect()
        })
        .collect();

    let mut st = PleState::new(cfg, &w);
    let want: Vec<Vec<f32>> = tokens.iter().zip(&written).map(|(&t, x)| ple(x, t, &w, cfg, &mut st)).collect();
    let want_state: Vec<f32> = st.conv_inputs.concat();

    let mut table = MappedHostBuffer::<bf16>::new(gpu.context(), w.table.len()).expect("pinned table");
    for (dst, &v) in table.as_mut_slice().iter_mut().zip(&w.table) {
        *dst = bf16::from_f32(v);
    }
    let dw = PleWeightsOnDevice::upload(&gpu, shape, &w, quantised.as_ref().map(|[k, v]| [k, v])).expect("weights");
    assert_eq!(dw.proj.is_nvfp4(), nvfp4, "the projections' format");
    let mut hash = PleHashOnDevice::new(&gpu, std::slice::from_ref(&w.hash)).expect("hash");
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(hash.ids_per_step()).expect("alloc");
    let mut x = gpu.alloc::<bf16>(nd).expect("alloc");
    let mut y = gpu.alloc::<bf16>(nd).expect("alloc");
    let mut write_y = gpu.alloc::<bf16>(d).expect("alloc");
    let mut write_gains = gpu.alloc::<f32>(nd / d).expect("alloc");
    for &t in tiles {
        let k = PleKernels::load(&gpu, t).expect("compile");
        let mut dst = PleStateOnDevice::new(&gpu, shape).expect("state");
        let mut s = PleScratch::new(&gpu, shape).expect("scratch");
        hash.reset(&gpu).expect("reset");
        let ids_args = hash.ids_args(token.ptr(), ids.ptr_mut());
        let launches = PleLaunches::new(
            &dw,
            &mut dst,
            &mut s,
            TableRows::Bf16(table.ptr()),
            ids.ptr(),
            PleStreams { input: x.ptr(), post: post.then(|| (write_y.ptr(), write_gains.ptr())), output: y.ptr_mut() },
        );
        let stand_in_w = gpu.upload(&rng.bf16_normal(2048 * 2048, 0.02)).expect("layer 0 stand-in");
        let stand_in_x = gpu.upload(&rng.bf16_normal(2048, 1.0)).expect("layer 0 stand-in");
        let mut stand_in_y = gpu.alloc::<bf16>(2048).expect("alloc");
        let mut stand_in_partial = gpu.alloc::<f32>(16 * 2048).expect("alloc");
        let mut stand_in_counters = gpu.alloc::<u32>(2048).expect("alloc");
        let layer0 = gemv_bf16::Args {
            w: stand_in_w.ptr(),
            x: stand_in_x.ptr(),
            y: stand_in_y.ptr_mut(),
            partial: stand_in_partial.ptr_mut(),
            counters: stand_in_counters.ptr_mut(),
            rows: 2048,
            cols: 2048,
        };
        let side = SideStream::new(&gpu).expect("side stream");
        let graph = overlapped.then(|| {
            gpu.capture(|| {
                // SAFETY: every buffer was sized from `shape`; the table holds the layer's padded
                // rows; x and y are distinct n·d buffers; the stand-in touches none of them.
                unsafe {
                    enqueue_rows_on_side(&gpu, &side, &k, &ids_args, &[launches.gather])?;
                    k.proj.launch(&gpu, &layer0)?;
                    side.join(&gpu)?;
                    launches.enqueue_block(&gpu, &k)
                }
            })
            .expect("capture")
        });
        let mut worst = 0.0f64;
        let (mut err_sq, mut want_sq) = (0.0f64, 0.0f64);
        for (step, (&tok, xs)) in tokens.iter().zip(&streams).enumerate() {
            gpu.write(&mut token, &[tok]).expect("token");
            gpu.write(&mut x, xs).expect("streams");
            gpu.write(&mut write_y, &writes[step].0).expect("y");
            gpu.write(&mut write_gains, &writes[step].1).expect("gains");
            gpu.fill_bytes(&mut y, 0xff).expect("poison");
            gpu.fill_bytes(&mut ids, 0xff).expect("poison");
            gpu.fill_bytes(&mut s.rows, 0xff).expect("poison");
            gpu.fill_bytes(&mut s.proj, 0xff).expect("poison");
            match &graph {
                Some(g) => g.launch().expect("replay"),
                // SAFETY: as above.
                None => unsafe {
                    k.ids.launch(&gpu, &ids_args).expect("ids");
                    launches.enqueue(&gpu, &k).expect("enqueue");
                },
            }
            let got: Vec<f32> = gpu.download(&y).expect("y").iter().map(|v| v.to_f32()).collect();
            assert!(got.iter().all(|v| v.is_finite()), "{label} {t:?} token {step}: non-finite output");
            // What the block added, against the reference's; the output's own bf16 rounding
            // (2^-9 of |X + add|) is part of the error measured.
            let added: Vec<f32> = got.iter().zip(&written[step]).map(|(a, b)| a - b).collect();
            let err = rel_l2(&added, &want[step]);
            worst = worst.max(err);
            err_sq += added.iter().zip(&want[step]).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum::<f64>();
            want_sq += want[step].iter().map(|b| f64::from(*b).powi(2)).sum::<f64>();
            // Per token a looser bound: the gate σ(sign(a)·√|a|) amplifies the bf16 rounding of the
            // projection (the device's GEMV writes bf16, the reference keeps f32) where a is near
            // 0, and one token in several hundred lands there (seen: 1.67e-2 at the published
            // shape). A stale or torn row moves a token by far more; over all tokens, 1e-2.
            assert!(err < 5e-2, "{label} {t:?} token {step} ({tok}): PLE output rel L2 {err:.2e}");
        }
        let overall = (err_sq / want_sq).sqrt();
        assert!(overall < 1e-2, "{label} {t:?}: PLE output rel L2 {overall:.2e} over {TOKENS} tokens");
        let state = gpu.download(&dst.conv).expect("state");
        let err = rel_l2(&state, &want_state);
        assert!(err < 1e-2, "{label} {t:?}: conv state rel L2 {err:.2e} after {TOKENS} tokens");
        println!(
            "{label} {t:?}: output rel L2 {overall:.2e} over {TOKENS} tokens (worst token {worst:.2e}), conv state {err:.2e}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn ple_block_matches_the_reference_tiny_every_tile() {
    let mut tiles = Vec::new();
    for gather in ple_gather_bf16::Tiles::candidates() {
        tiles.push(PleTiles { gather, ..PleTiles::default() });
    }
    for gate_conv in ple_gate_conv::Tiles::candidates() {
        tiles.push(PleTiles { gate_conv, ..PleTiles::default() });
    }
    block_matches(&block_config(4, 256), &tiles, "ple-block-tiny", false, true, false);
}

/// The projections in NVFP4 (`gemv_nvfp4`): at the tiny shape the default GEMV tiles with every
/// split and lane count that fits, and the row path (`tests/gpu_gemv_nvfp4.rs` takes the GEMV
/// through all of its sets); then the plan's tiles at the published shape, and the defaults
/// through a graph beside a stand-in for layer 0.
#[test]
#[ignore = "needs a CUDA device"]
fn ple_block_with_nvfp4_projections_matches_the_reference() {
    let tiny = block_config(4, 256);
    let shape = PleShape::from_config(&tiny).expect("shape");
    let base = PleTiles::default().proj_nvfp4;
    let fits: Vec<PleTiles> = gemv_nvfp4::Tiles::candidates()
        .into_iter()
        .filter(|t| *t == gemv_nvfp4::Tiles { k_split: t.k_split, lanes: t.lanes, ..base })
        .chain([engine::kernels::gemv_nvfp4::ROW_PATH])
        .map(|proj_nvfp4| PleTiles { proj_nvfp4, ..PleTiles::default() })
        .filter(|t| t.check_nvfp4(shape).is_ok())
        .collect();
    // 256 columns: one split of 16 or 8 lanes, or two of 8 (the row path needs more columns).
    assert_eq!(fits.len(), 3, "the GEMV's tile sets that fit the tiny PLE projections: {fits:?}");
    block_matches(&tiny, &fits, "ple-block-nvfp4-tiny", false, true, true);
    let published = block_config(4, 2560);
    block_matches(
        &published,
        &[PleTiles::fitting(PleShape::from_config(&published).expect("shape"))],
        "ple-block-nvfp4-published",
        false,
        true,
        true,
    );
    block_matches(&published, &[PleTiles::default()], "ple-block-nvfp4-overlapped-published", true, false, true);
}

#[test]
#[ignore = "needs a CUDA device"]
fn ple_block_with_rows_gathered_beside_layer_0_in_a_graph_matches_the_reference() {
    block_matches(&block_config(4, 256), &[PleTiles::default()], "ple-block-overlapped-tiny", true, false, false);
    block_matches(&block_config(4, 2560), &[PleTiles::default()], "ple-block-overlapped-published", true, true, false);
}

#[test]
#[ignore = "needs a CUDA device"]
fn ple_block_matches_the_reference_published_shape() {
    block_matches(&block_config(4, 2560), &[PleTiles::default()], "ple-block-published", false, false, false);
    block_matches(
        &block_config(4, 2560),
        &[PleTiles::default()],
        "ple-block-published-after-a-write",
        false,
        true,
        false,
    );
}
