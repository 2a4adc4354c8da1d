//! PLE on a GPU: the n-gram row ids hashed on the device from the device-side history against
//! the host hash `model::ngram_hash` (which matches the reference's test vectors), over 80 tokens
//! with single and repeated eos; and the row gather from a bf16 table in mapped pinned host
//! memory, ids and gather captured in one graph and replayed token after token, every byte of
//! every row compared with the table. Two PLE layers in one table, so the layer bases show; the
//! published hash constants and vocabulary, and a small one. Fresh tokens and table each run,
//! outputs poisoned before each token.

use engine::cuda::MappedHostBuffer;
use engine::kernels::ple::gather_bf16::ple_gather_bf16;
use engine::kernels::ple::ids::ple_ids;
use engine::layers::ple::{PleHashOnDevice, gather_args, table_row_bases};
use engine::model::config::ModelConfig;
use engine::model::ngram_hash::NgramHash;
use flashnext::rng::Rng;
use half::bf16;
use kernel_dsl::TileSet;

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
        for j in i..(i + run).min(TOKENS) {
            t[j] = eos;
        }
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

/// Ids and gather in one graph, replayed per token: the rows in the device buffer are the table's
/// rows, byte for byte, for every tile candidate of the gather.
#[test]
#[ignore = "needs a CUDA device"]
fn gathered_rows_are_the_table_rows_through_a_graph() {
    let gpu = flashnext::gpu::open();
    let mut rng = Rng::fresh("gather");
    let cfg = config(248_320, 248_044, 1000);
    let hashes: Vec<NgramHash> = (0..PLE_LAYERS).map(|l| NgramHash::new(&cfg, l)).collect();
    let (_, table_rows) = table_row_bases(&hashes);
    let tokens = tokens(&mut rng, cfg.vocab_size, hashes[0].eos());
    let want_ids = host_ids(&hashes, &tokens);

    let mut table = MappedHostBuffer::<bf16>::new(gpu.context(), table_rows as usize * WIDTH).expect("pinned table");
    for v in table.as_mut_slice() {
        *v = bf16::from_bits(rng.next_u64() as u16);
    }
    println!("table: {table_rows} rows of {WIDTH} bf16 in mapped pinned host memory ({} bytes)", table.size_bytes());

    let mut hash = PleHashOnDevice::new(&gpu, &hashes).expect("hash constants");
    let count = hash.ids_per_step();
    let mut token = gpu.alloc::<u32>(1).expect("alloc");
    let mut ids = gpu.alloc::<u64>(count).expect("alloc");
    let mut rows = gpu.alloc::<bf16>(count * WIDTH).expect("alloc");
    let ki = gpu.kernel::<ple_ids::Kernel>(ple_ids::Tiles::DEFAULT).expect("compile");
    for tiles in ple_gather_bf16::Tiles::candidates() {
        let kg = gpu.kernel::<ple_gather_bf16::Kernel>(tiles).expect("compile");
        hash.reset(&gpu).expect("reset");
        let ids_args = hash.ids_args(token.ptr(), ids.ptr_mut());
        let gather = gather_args(table.ptr(), ids.ptr(), rows.ptr_mut(), count, WIDTH);
        let graph = gpu
            .capture(|| {
                // SAFETY: ids as in `ids_match`; the table holds every row an id can address
                // (the layers' padded rows), `rows` count × WIDTH values.
                unsafe { ki.launch(&gpu, &ids_args) }?;
                // SAFETY: as above.
                unsafe { kg.launch(&gpu, &gather) }
            })
            .expect("capture");
        for (step, &t) in tokens.iter().enumerate() {
            gpu.write(&mut token, &[t]).expect("token");
            gpu.fill_bytes(&mut ids, 0xff).expect("poison");
            gpu.fill_bytes(&mut rows, 0xff).expect("poison");
            graph.launch().expect("replay");
            let got_ids = gpu.download(&ids).expect("ids");
            assert_eq!(got_ids, want_ids[step], "{tiles:?} token {step}: ids");
            let got = gpu.download(&rows).expect("rows");
            let host = table.as_slice();
            for (r, &id) in want_ids[step].iter().enumerate() {
                let want = &host[id as usize * WIDTH..(id as usize + 1) * WIDTH];
                let got = &got[r * WIDTH..(r + 1) * WIDTH];
                assert!(
                    got.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{tiles:?} token {step} row {r} (id {id}) differs from the table"
                );
            }
        }
    }
}
