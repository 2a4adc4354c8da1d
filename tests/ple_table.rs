//! The PLE table file: written from the tiny sparse checkpoint's sharded n-gram tables (two PLE
//! layers), mapped back, every row equal to the rows the weights loader reads; and the damaged
//! cases are clear errors: a truncated file, a file with bytes past its rows, a file for another
//! n-gram hash, a file that is not a table, a damaged row (the checksum).

use std::path::{Path, PathBuf};

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::ple_table::{HEADER_BYTES, PleTableFile, write_table};
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
    write_table(&config(), &ck, &path).expect("write table");
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
fn a_truncated_table_is_an_error() {
    let path = written("truncated");
    let len = std::fs::metadata(&path).expect("size").len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    f.set_len(len - 320).expect("truncate");
    let e = open_error(&path, &config());
    assert!(e.contains("truncated") && e.contains(&format!("{}", len - 320)), "{e}");
    f.set_len(100).expect("truncate");
    let e = open_error(&path, &config());
    assert!(e.contains("truncated") && e.contains("header"), "{e}");
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
