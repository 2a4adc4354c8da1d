//! Bad inputs, one test per case (the README's "Bad inputs" table lists them with the message the
//! user sees): each is refused with an error that names the problem (the file, the tensor, the
//! shape found and the shape expected, the dtype, the config field, the token, the kernel and its
//! line, the bytes asked for and free), and nothing is left half-done: a failed load returns
//! nothing, and a refused token or position leaves the decoder where it was, so that the next
//! valid token gives what a fresh decoder gives. No case panics.
//!
//! The checkpoint cases start from a good tiny checkpoint and break one thing. The decode
//! binary's own up-front checks (a prompt past `--context`, an id past the vocabulary, a missing
//! or broken `--model`) are in tools/tests/decode.rs, since they run the binary. The GPU cases are
//! `#[ignore = "needs a CUDA device"]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use engine::model::checkpoint::Checkpoint;
use engine::model::config::ModelConfig;
use engine::model::ple_table::{PleTableFile, RowFormat, write_table};
use engine::model::weights::ModelWeights;
use engine::reference::decoder::Decoder;
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
    let dir = std::env::temp_dir().join(format!("flashnext-bad-input-{case}-{}", std::process::id()));
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

/// The error of loading `dir`; a load that succeeds fails the case (nothing may come back).
fn load_error(dir: &Path) -> String {
    match ModelWeights::load_dir(dir) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// `config.json` in `dir` with `from` replaced by `to` (which must be there).
fn edit_config(dir: &Path, from: &str, to: &str) {
    let config = std::fs::read_to_string(dir.join("config.json")).expect("config");
    assert!(config.contains(from), "the tiny config has no `{from}`");
    std::fs::write(dir.join("config.json"), config.replace(from, to)).expect("write config");
}

const ROUTER: &str = "model.layers.0.mlp.gate.weight";

#[test]
fn truncated_safetensors_file() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() - 1000]).expect("write");
    let e = load_error(&dir);
    assert!(e.contains("model.safetensors") && e.contains("truncated"), "{e}");
    // Cut inside the header too, and before the header's length: the same error, from bytes.
    for cut in [100, 5] {
        let e = Checkpoint::from_bytes("cut/model.safetensors", bytes[..cut].to_vec()).expect_err("cut").to_string();
        assert!(e.starts_with("cut/model.safetensors: not a valid safetensors file"), "{e}");
    }
}

#[test]
fn bad_safetensors_header() {
    let dir = scratch("header");
    let mut bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    bytes[10] = b'!';
    std::fs::write(dir.join("model.safetensors"), &bytes).expect("write");
    let e = load_error(&dir);
    assert!(e.contains("not a valid safetensors file"), "{e}");
    // A header length past the file.
    let mut bytes = std::fs::read(good().join("model.safetensors")).expect("read");
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = Checkpoint::from_bytes("len/model.safetensors", bytes).expect_err("length").to_string();
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
    r.shape = vec![4, 512];
    write(&dir, &t);
    let e = load_error(&dir);
    assert!(e.contains(ROUTER) && e.contains("[4, 512]") && e.contains("expected [8, 256]"), "{e}");
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

/// The reference's `validate_architecture` rules, and the sizes the engine can address, through a
/// checkpoint directory's config.json: the error names the file and the field. (Every rule is
/// checked one by one in engine/src/model/config.rs's unit tests.)
#[test]
fn config_that_breaks_the_reference_rules() {
    let cases = [
        ("\"hc_count\": 4", "\"hc_count\": 1", "Qwen4-Exp requires hc_count > 1, found 1"),
        ("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "num_experts_per_tok must be in [1, num_experts]"),
        ("\"indexer_kv_heads\": 1", "\"indexer_kv_heads\": 2", "indexer_kv_heads must be 1"),
        ("\"ple_layer_ids\": [", "\"ple_layer_ids\": [4, ", "PLE is only supported on linear_attention layers"),
        ("\"hidden_size\": 256", "\"hidden_size\": 4294967296", "`hidden_size` is 4294967296: sizes above"),
        ("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 1000000", "num_hidden_layers 1000000 is above"),
        ("\"num_experts\": 8", "\"num_experts\": 2000000000", "parameters, more than the"),
    ];
    for (from, to, want) in cases {
        let dir = scratch("config");
        edit_config(&dir, from, to);
        std::fs::copy(good().join("model.safetensors"), dir.join("model.safetensors")).expect("copy");
        let e = load_error(&dir);
        assert!(e.starts_with("config.json: ") && e.contains(want), "{to}: {e}");
    }
}

/// A valid config that does not describe the checkpoint beside it: the first tensor it disagrees
/// on is named, with both shapes; the n-gram hash's buffers, which the config derives, likewise.
#[test]
fn config_and_tensors_disagree() {
    let dir = scratch("disagree");
    edit_config(&dir, "\"hc_lowrank\": 32", "\"hc_lowrank\": 64");
    std::fs::copy(good().join("model.safetensors"), dir.join("model.safetensors")).expect("copy");
    let e = load_error(&dir);
    assert!(e.contains("input_mix_weight_down") && e.contains("has shape [32, 1024], expected [64, 1024]"), "{e}");

    let dir = scratch("hash");
    edit_config(&dir, "\"seed\": 1234", "\"seed\": 4321");
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

/// The CPU reference refuses a token id ≥ vocab_size before touching its state: the position
/// stays, and the next valid token gives exactly what a decoder that never saw the bad one gives.
/// (The GPU engine: [`engine_refuses_a_token_past_the_vocabulary`]; the decode binary:
/// tools/tests/decode.rs `a_token_id_past_the_vocabulary_is_refused`.)
#[test]
fn token_id_past_the_vocabulary() {
    let w = ModelWeights::load_dir(&good()).expect("good checkpoint");
    let vocab = w.config.vocab_size as u32;
    let mut d = Decoder::new(&w);
    d.step(3).expect("a valid token");
    for bad in [vocab, vocab + 1, u32::MAX] {
        let e = d.step(bad).expect_err("past the vocabulary").to_string();
        assert_eq!(e, format!("token id {bad} is out of range: the vocabulary has {vocab} tokens"));
        assert_eq!(d.position(), 1, "a refused token leaves the position as it was");
    }
    let after = d.step(5).expect("a valid token");
    let mut fresh = Decoder::new(&w);
    fresh.step(3).expect("a valid token");
    assert_eq!(after, fresh.step(5).expect("a valid token"), "the refused tokens left no trace in the state");
    assert_eq!(d.position(), 2);
}

/// A missing PLE table file, and one cut short (in its rows, and in its header): the path and
/// the problem are named, and nothing is opened.
#[test]
fn missing_or_truncated_ple_table_file() {
    let cfg = ModelConfig::from_file(&good().join("config.json")).expect("config");
    let dir = scratch("ple-table");
    let missing = dir.join("no-such-table.bin");
    let e = PleTableFile::open(&missing, &cfg).expect_err("missing").to_string();
    assert!(e.contains("no-such-table.bin") && e.contains("No such file"), "{e}");

    let path = dir.join("table.bin");
    let ck = Checkpoint::open(&good()).expect("checkpoint");
    write_table(&cfg, &ck, &path, RowFormat::Bf16).expect("write table");
    PleTableFile::open(&path, &cfg).expect("the whole table opens");
    let len = std::fs::metadata(&path).expect("size").len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).expect("open");
    f.set_len(len - 320).expect("truncate");
    let e = PleTableFile::open(&path, &cfg).expect_err("truncated").to_string();
    assert!(e.contains("table.bin") && e.contains("truncated") && e.contains(&format!("{}", len - 320)), "{e}");
    f.set_len(100).expect("truncate");
    let e = PleTableFile::open(&path, &cfg).expect_err("no header").to_string();
    assert!(e.contains("truncated") && e.contains("header"), "{e}");
}

/// A kernel NVRTC rejects: the error names the kernel, NVRTC's message points at the line, and
/// the excerpt shows that line of the source. Needs NVRTC (tools/test.sh installs it), not a GPU.
#[test]
fn nvrtc_compile_failure_names_the_kernel_and_line() {
    let source = "extern \"C\" __global__ void broken_kernel(float* y) {\n    \
                  int i = threadIdx.x;\n    \
                  y[i] = undefined_value * 2.0f;\n\
                  }\n";
    let err = engine::cuda::nvrtc::compile(source, "broken_kernel", kernel_dsl::Arch::Sm90)
        .expect_err("a kernel that uses an undefined name");
    let engine::Error::Compile { kernel, log, excerpt } = &err else { panic!("not a compile error: {err}") };
    assert_eq!(kernel, "broken_kernel");
    assert!(log.contains("broken_kernel.cu(3)") && log.contains("undefined_value"), "{log}");
    assert!(excerpt.contains(">    3 |     y[i] = undefined_value * 2.0f;"), "{excerpt}");
    let shown = err.to_string();
    assert!(shown.starts_with("NVRTC could not compile kernel broken_kernel:"), "{shown}");
    assert!(shown.contains("in the generated source:"), "{shown}");
}

/// The tiny-step model on the GPU (its shapes fit every kernel) with caches for `context` tokens.
fn engine_for(weights: &ModelWeights, context: usize) -> engine::step::Engine {
    use engine::step::{Engine, Formats, ModelOnDevice, StepPlan};
    let gpu = flashnext::gpu::open();
    let plan = StepPlan::new(&weights.config, Formats::BF16, context).expect("plan");
    let model = ModelOnDevice::upload(&gpu, weights, &plan, &mut |_, _| {}).expect("upload");
    Engine::new(gpu, plan, model).expect("engine")
}

fn tiny_step() -> ModelWeights {
    ModelWeights::load_dir(&flashnext::goldens::data("tiny-step")).expect("tiny-step weights")
}

/// The GPU engine refuses a token id ≥ vocab before enqueuing anything: the position and the
/// last logits stay, and the next valid token gives the same token and logits as an engine that
/// never saw the bad one.
#[test]
#[ignore = "needs a CUDA device"]
fn engine_refuses_a_token_past_the_vocabulary() {
    let weights = tiny_step();
    let vocab = weights.config.vocab_size as u32;
    let mut e = engine_for(&weights, 64);
    e.step(3).expect("a valid token");
    let before = e.logits().expect("logits");
    for bad in [vocab, u32::MAX] {
        let err = e.step(bad).expect_err("a token past the vocabulary").to_string();
        assert_eq!(err, format!("token id {bad} is out of range: the vocabulary has {vocab} tokens"));
        assert_eq!(e.position(), 1, "a refused token does not advance the sequence");
        assert_eq!(e.logits().expect("logits"), before, "a refused token runs nothing");
    }
    let next = e.step(5).expect("a valid token");
    let mut fresh = engine_for(&weights, 64);
    fresh.step(3).expect("a valid token");
    assert_eq!(next, fresh.step(5).expect("a valid token"));
    assert_eq!(e.logits().expect("logits"), fresh.logits().expect("logits"), "the refusal left no trace");
}

/// A sequence past the context the engine was loaded for (the QSA caches' capacity) is refused
/// at the first position past it, naming both numbers; nothing runs (the position and the last
/// logits stay), and after a reset the engine decodes the same tokens again. (The decode binary refuses a prompt past
/// `--context` before loading: tools/tests/decode.rs `a_prompt_longer_than_the_context_is_refused`.)
#[test]
#[ignore = "needs a CUDA device"]
fn engine_refuses_a_position_past_its_context() {
    let weights = tiny_step();
    let mut e = engine_for(&weights, 16);
    let capacity = e.capacity();
    println!("context 16 asked for: capacity {capacity} tokens");
    let tokens: Vec<u32> = (0..capacity as u32).map(|i| (i * 37 + 11) % 512).collect();
    let mut first = Vec::new();
    for &t in &tokens {
        first.push(e.step(t).expect("within the capacity"));
    }
    let last = e.logits().expect("logits");
    let err = e.step(1).expect_err("past the caches");
    assert!(
        matches!(err, engine::Error::ContextTooLong { needed, capacity: c } if needed == capacity + 1 && c == capacity)
    );
    let shown = err.to_string();
    assert!(shown.contains(&format!("sized for {capacity} at load")), "{shown}");
    assert_eq!(e.position(), capacity, "the refused token does not advance the sequence");
    assert_eq!(e.logits().expect("logits"), last, "the refused token runs nothing");
    e.reset().expect("reset");
    let again: Vec<u32> = tokens.iter().map(|&t| e.step(t).expect("within the capacity")).collect();
    assert_eq!(again, first, "after the refusal and a reset the engine decodes as before");
}

/// More device memory than the GPU has: `Gpu::alloc` refuses it with the bytes asked for and
/// free, allocating nothing; the device then works as before.
#[test]
#[ignore = "needs a CUDA device"]
fn device_allocation_larger_than_the_gpu() {
    let gpu = flashnext::gpu::open();
    let total = gpu.info().total_memory as usize;
    let (free_before, _) = gpu.memory().expect("memory");
    let err = gpu.alloc::<u8>(total + 1).expect_err("more than the device has").to_string();
    assert!(err.contains(&format!("asked for {} bytes of device memory", total + 1)), "{err}");
    assert!(err.contains("free on"), "{err}");
    let err = gpu.alloc::<f32>(usize::MAX / 2).expect_err("an overflowing size").to_string();
    assert!(err.contains("overflow"), "{err}");
    let (free_after, _) = gpu.memory().expect("memory");
    assert!(free_before.abs_diff(free_after) < 64 << 20, "free {free_before} before, {free_after} after");
    let buf = gpu.upload(&[1.0f32, 2.0, 3.0]).expect("a small buffer still allocates");
    assert_eq!(gpu.download(&buf).expect("download"), [1.0, 2.0, 3.0]);
}

/// A synthetic model larger than the device (the published geometry with three times its
/// layers: ~200 GB in NVFP4) is refused before anything is allocated, saying how much it needs
/// and how much is free.
#[test]
#[ignore = "needs a CUDA device"]
fn synthetic_model_larger_than_the_gpu_is_refused() {
    use engine::step::{Formats, ModelOnDevice, StepPlan};
    let gpu = flashnext::gpu::open();
    let mut cfg = ModelConfig::published();
    cfg.layer_kinds = cfg.layer_kinds.repeat(3);
    cfg.num_layers = cfg.layer_kinds.len();
    let plan = StepPlan::new(&cfg, Formats::NVFP4, 4096).expect("plan");
    let (free_before, _) = gpu.memory().expect("memory");
    let err = match ModelOnDevice::synthetic(&gpu, &cfg, &plan, 1, &mut |_, _, _| {}) {
        Ok(_) => panic!("a model of {} layers fit in {free_before} bytes", cfg.num_layers),
        Err(e) => e.to_string(),
    };
    println!("refused: {err}");
    assert!(err.contains("needs") && err.contains("GB of device memory") && err.contains("free on"), "{err}");
    let (free_after, _) = gpu.memory().expect("memory");
    assert!(free_before.abs_diff(free_after) < 64 << 20, "free {free_before} before, {free_after} after");
}
