//! A damaged checkpoint is a clear error that names what is wrong: the file, the tensor, the shape
//! found and the shape expected, the dtype. Each case starts from a good tiny checkpoint and breaks
//! one thing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::model::weights::ModelWeights;
use safetensors::{Dtype, SafeTensors, View};

fn good() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-sparse")
}

/// A scratch folder, removed when the case ends (passing or not).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch copy of the good checkpoint's config.
fn scratch(case: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("flashnext-ckpt-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::copy(good().join("config.json"), dir.join("config.json")).expect("copy config");
    Scratch(dir)
}

struct Owned {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Owned {
    fn dtype(&self) -> Dtype {
        self.dtype
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

/// The good checkpoint's tensors, to be edited and written back.
fn tensors() -> HashMap<String, Owned> {
    let bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("parse");
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, Owned { dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() }))
        .collect()
}

fn write(dir: &Path, t: &HashMap<String, Owned>) {
    let bytes = safetensors::serialize(t.iter().map(|(n, o)| (n.clone(), o)), None).expect("serialize");
    std::fs::write(dir.join("model.safetensors"), bytes).expect("write");
}

fn load_error(dir: &Path) -> String {
    match ModelWeights::load_dir(dir) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

const ROUTER: &str = "model.layers.0.mlp.gate.weight";

#[test]
fn truncated_file() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() - 1000]).expect("write");
    let e = load_error(&dir);
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
}

#[test]
fn bad_header() {
    let dir = scratch("header");
    let mut bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    bytes[10] = b'!';
    std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
    let e = load_error(&dir);
    assert!(e.contains("not a valid safetensors file"), "{e}");
}

#[test]
fn missing_tensor() {
    let dir = scratch("missing");
    let mut t = tensors();
    t.remove(ROUTER);
    write(&dir, &t);
    let e = load_error(&dir);
    assert!(e.contains(ROUTER) && e.contains("missing"), "{e}");
}

#[test]
fn misshapen_tensor() {
    let dir = scratch("shape");
    let mut t = tensors();
    let r = t.get_mut(ROUTER).expect("router");
    r.shape = vec![4, 128];
    write(&dir, &t);
    let e = load_error(&dir);
    assert!(e.contains(ROUTER) && e.contains("[4, 128]") && e.contains("expected [8, 64]"), "{e}");
}

#[test]
fn unsupported_dtype() {
    let dir = scratch("dtype");
    let mut t = tensors();
    let r = t.get_mut(ROUTER).expect("router");
    r.dtype = Dtype::I16;
    write(&dir, &t);
    let e = load_error(&dir);
    assert!(e.contains(ROUTER) && e.contains("I16") && e.contains("BF16, F16 or F32"), "{e}");
}

#[test]
fn hash_buffers_that_disagree_with_the_config() {
    let dir = scratch("hash");
    let mut config = std::fs::read_to_string(dir.join("config.json")).expect("config");
    config = config.replace("\"seed\": 1234", "\"seed\": 4321");
    std::fs::write(dir.join("config.json"), config).expect("write config");
    std::fs::copy(good().join("model.safetensors"), dir.join("model.safetensors")).expect("copy");
    let e = load_error(&dir);
    assert!(e.contains("layer_multipliers") && e.contains("do not match this checkpoint"), "{e}");
}

#[test]
fn no_checkpoint_at_all() {
    let dir = scratch("empty");
    let e = load_error(&dir);
    assert!(e.contains("no model.safetensors"), "{e}");
}

#[test]
fn token_out_of_range() {
    let w = ModelWeights::load_dir(&good()).expect("good checkpoint");
    let mut d = engine::reference::decoder::Decoder::new(&w);
    let e = d.step(512).expect_err("vocab is 512").to_string();
    assert!(e.contains("512") && e.contains("out of range"), "{e}");
    assert_eq!(d.position(), 0, "a refused token leaves the state as it was");
}
