//! The PLE table file: written from the tiny sparse checkpoint's sharded n-gram tables (two PLE
//! layers), mapped back, every row equal to the rows the weights loader reads; and the damaged
//! cases are clear errors: a file with bytes past its rows, a file for another
//! n-gram hash, a file that is not a table, a damaged row (the checksum). (A missing or truncated
//! table: tests/bad_inputs.rs.)

use std::path::{Path, PathBuf};

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::ple_table::{HEADER_BYTES, PleTableFile, RowFormat, write_table};
use engine::model::weights::ModelWeights;

fn checkpoint_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-sparse")
}

fn config() -> ModelConfig {
    ModelConfig::from_file(&checkpoint_dir().join("config.json")).expect("config")
}

/// A freshly written table for `case`.
fn written(case: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("flashnext-ple-table-{case}-{}.bin", std::process::id()));
    let ck = Checkpoint::open(&checkpoint_dir()).expect("checkpoint");
    write_table(&config(), &ck, &path, RowFormat::Bf16).expect("write table");
    path
}

fn open_error(path: &Path, cfg: &ModelConfig) -> String {
    match PleTableFile::open(path, cfg) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rows_are_the_checkpoint_rows() {
    let cfg = config();
    assert!(cfg.ple_layers.len() >= 2, "the tiny checkpoint has two PLE layers");
    let path = written("rows");
    let table = PleTableFile::open(&path, &cfg).expect("open");
    table.verify().expect("checksum");
    let ck = Checkpoint::open(&checkpoint_dir()).expect("checkpoint");
    let weights = ModelWeights::load(&cfg, &ck).expect("weights");
    let mut base = 0u64;
    for layer in weights.layers.iter().filter_map(|l| l.ple.as_ref()) {
        assert_eq!(table.header.width as usize, layer.width);
        for r in 0..layer.hash.rows_padded {
            let want = &layer.table[r as usize * layer.width..(r as usize + 1) * layer.width];
            let got: Vec<f32> =
                table.row(base + r).chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
            assert_eq!(got, want, "row {r} of the PLE layer at base {base}");
        }
        base += layer.hash.rows_padded;
    }
    assert_eq!(base, table.header.rows);
    let _ = std::fs::remove_file(path);
}

#[test]
fn bytes_past_the_rows_are_an_error() {
    let path = written("trailing");
    let len = std::fs::metadata(&path).expect("size").len();
    std::fs::OpenOptions::new().write(true).open(&path).expect("open").set_len(len + 8).expect("extend");
    let e = open_error(&path, &config());
    assert!(e.contains("8 bytes past the last row"), "{e}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_table_for_another_hash_is_an_error() {
    let path = written("mismatch");
    let mut cfg = config();
    cfg.ple_seed += 1;
    let e = open_error(&path, &cfg);
    assert!(e.contains("another n-gram hash") && e.contains("seed"), "{e}");
    let mut cfg = config();
    cfg.ple_layers.pop();
    let e = open_error(&path, &cfg);
    assert!(e.contains("the config needs 1 layers"), "{e}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_file_that_is_not_a_table_is_an_error() {
    let path = written("magic");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[0] = b'X';
    std::fs::write(&path, &bytes).expect("write");
    let e = open_error(&path, &config());
    assert!(e.contains("not a PLE table"), "{e}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_damaged_row_fails_the_checksum() {
    let path = written("damaged");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[HEADER_BYTES + 1000] ^= 0x10;
    std::fs::write(&path, &bytes).expect("write");
    let table = PleTableFile::open(&path, &config()).expect("the header is intact");
    let e = table.verify().expect_err("damaged").to_string();
    assert!(e.contains("checksum") && e.contains("damaged"), "{e}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn nvfp4_needs_rows_of_whole_blocks() {
    // The tiny checkpoint's rows are 4 values: no 16-value block to share a scale.
    let ck = Checkpoint::open(&checkpoint_dir()).expect("checkpoint");
    let path = std::env::temp_dir().join(format!("flashnext-ple-table-nvfp4-{}.bin", std::process::id()));
    let e = write_table(&config(), &ck, &path, RowFormat::Nvfp4).expect_err("4-value rows").to_string();
    assert!(e.contains("cannot be NVFP4"), "{e}");
    let _ = std::fs::remove_file(path);
}

/// A tensor to serialise.
struct Owned {
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Owned {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::BF16
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// The tiny config with 16-value rows, and a checkpoint of its sharded n-gram tables alone
/// (random bf16 values, a different spread per layer), in a scratch directory.
#[test]
fn nvfp4_rows_are_the_checkpoint_rows_quantised_per_layer() {
    use engine::model::nvfp4::Nvfp4Matrix;
    use engine::model::ple_table::{nvfp4_row_words, nvfp4_rows};

    let dir = std::env::temp_dir().join(format!("flashnext-ple-nvfp4-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let text = std::fs::read_to_string(checkpoint_dir().join("config.json")).expect("config");
    assert!(text.contains("\"ple_embed_dim\": 128,"), "the tiny config's PLE width");
    std::fs::write(dir.join("config.json"), text.replace("\"ple_embed_dim\": 128,", "\"ple_embed_dim\": 256,"))
        .expect("write config");
    let cfg = ModelConfig::from_file(&dir.join("config.json")).expect("config");
    let width = 16;
    let parts = cfg.split_ngram_parts;

    let mut tensors = std::collections::HashMap::new();
    let mut layers_f32 = Vec::new();
    let mut seed = 0x1234_5678u64;
    for (k, &layer) in cfg.ple_layers.iter().enumerate() {
        let rows = engine::model::ngram_hash::NgramHash::new(&cfg, k).rows_padded as usize;
        let spread = [0.5f32, 7.0][k % 2];
        let values: Vec<half::bf16> = (0..rows * width)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                half::bf16::from_f32(spread * (((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5))
            })
            .collect();
        layers_f32.push(values.iter().map(|v| v.to_f32()).collect::<Vec<f32>>());
        let per = rows / parts;
        for s in 0..parts {
            let data: &[u8] = bytemuck::cast_slice(&values[s * per * width..(s + 1) * per * width]);
            tensors.insert(
                format!("model.layers.{layer}.ple.ple_embedding.ngram_embedding.shard_{s}.weight"),
                Owned { shape: vec![per, width], data: data.to_vec() },
            );
        }
    }
    let bytes = safetensors::serialize(tensors.iter().map(|(n, o)| (n.clone(), o)), None).expect("serialize");
    std::fs::write(dir.join("model.safetensors"), bytes).expect("write checkpoint");

    let ck = Checkpoint::open(&dir).expect("checkpoint");
    let path = dir.join("table.bin");
    let header = write_table(&cfg, &ck, &path, RowFormat::Nvfp4).expect("write table");
    let table = PleTableFile::open(&path, &cfg).expect("open");
    table.verify().expect("checksum");
    assert_eq!(table.header, header);
    let row_bytes = 4 * nvfp4_row_words(width);
    let mut at = 0;
    for (k, values) in layers_f32.iter().enumerate() {
        let rows = values.len() / width;
        let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(header.scale_2[k], Nvfp4Matrix::scale_2_for(amax), "layer {k}'s global scale");
        let want = nvfp4_rows(&Nvfp4Matrix::quantise_with_scale_2(values, rows, width, header.scale_2[k]));
        let want: &[u8] = bytemuck::cast_slice(&want);
        assert!(table.rows_bytes()[at..at + rows * row_bytes] == *want, "layer {k}'s rows");
        at += rows * row_bytes;
    }
    assert_eq!(at, table.rows_bytes().len());
    let _ = std::fs::remove_dir_all(dir);
}
