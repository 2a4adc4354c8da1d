//! A bounded mutation fuzzer for the config and safetensors parsers, on stable Rust, run with the
//! other tests: the same targets as `fuzz/` (cargo-fuzz, nightly; `flashnext::fuzz_targets`), fed
//! from the same seed corpus (tests/data's configs and checkpoints, and small safetensors files
//! made here), each input mutated by a deterministic xorshift generator: bits flipped, bytes
//! set, inserted, deleted and duplicated, the file truncated, numbers in the JSON replaced by
//! extreme ones, the safetensors header length edited.
//!
//! Each target runs until its time is up (`FLASHNEXT_FUZZ_SECS`, default 8 s for the config and
//! 12 s for the checkpoint) and stops there: a slow machine runs fewer inputs, never a failure
//! by timeout. A panic in a target fails the test, with the input written to
//! `target/fuzz-crash-<target>.bin` and printed as a byte literal for a regression test (the
//! `regressions` test at the end keeps those found so far). `FLASHNEXT_FUZZ_SEED` replays
//! another sequence of inputs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use flashnext::fuzz_targets;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// xorshift64*: deterministic from its seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, n) (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

fn data(rel: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Numbers and tokens that break naive parsers of sizes.
const EXTREMES: [&[u8]; 16] = [
    b"0",
    b"1",
    b"-1",
    b"2",
    b"3",
    b"255",
    b"256",
    b"65536",
    b"4294967295",
    b"4294967296",
    b"9223372036854775807",
    b"18446744073709551615",
    b"1e309",
    b"null",
    b"[]",
    b"{}",
];

/// One mutation of `input`, in place.
fn mutate_once(rng: &mut XorShift, input: &mut Vec<u8>, json: bool) {
    let len = input.len();
    // Positions in a safetensors file's header are where a mutation changes what parses.
    let header_end = if !json && len >= 8 {
        let n = u64::from_le_bytes(input[..8].try_into().unwrap_or([0; 8]));
        (8 + n.min(len as u64 - 8) as usize).max(8)
    } else {
        len
    };
    let pos = |rng: &mut XorShift, len: usize| {
        if len == 0 {
            0
        } else if rng.chance(4) {
            rng.below(len)
        } else {
            rng.below(header_end.min(len).max(1))
        }
    };
    match rng.below(if json { 9 } else { 8 }) {
        0 if len > 0 => {
            let p = pos(rng, len);
            input[p] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let p = pos(rng, len);
            input[p] = rng.next() as u8;
        }
        2 => {
            let p = pos(rng, len + 1).min(len);
            let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
            input.splice(p..p, bytes);
        }
        3 if len > 0 => {
            let p = pos(rng, len);
            let n = 1 + rng.below(16.min(len - p));
            input.drain(p..p + n);
        }
        4 if len > 0 => {
            let cut = if rng.chance(2) { pos(rng, len) } else { rng.below(len) };
            input.truncate(cut);
        }
        5 if len > 1 => {
            let a = pos(rng, len);
            let n = 1 + rng.below(32.min(len - a));
            let chunk = input[a..a + n].to_vec();
            let b = pos(rng, len + 1).min(len);
            input.splice(b..b, chunk);
        }
        6 if len >= 8 && !json => {
            // The header length: nudged, or anything.
            let n = u64::from_le_bytes(input[..8].try_into().unwrap_or([0; 8]));
            let edited = match rng.below(4) {
                0 => n.wrapping_add(1 + rng.below(16) as u64),
                1 => n.wrapping_sub(1 + rng.below(16) as u64),
                2 => rng.next() >> rng.below(64),
                _ => u64::MAX - rng.below(4) as u64,
            };
            input[..8].copy_from_slice(&edited.to_le_bytes());
        }
        _ => {
            // A number replaced by an extreme value or token (in the JSON, or the header).
            let digits: Vec<usize> = (0..header_end.min(len)).filter(|&i| input[i].is_ascii_digit()).collect();
            if digits.is_empty() {
                return;
            }
            let start = digits[rng.below(digits.len())];
            let mut end = start;
            while end < len && (input[end].is_ascii_digit() || input[end] == b'.' || input[end] == b'e') {
                end += 1;
            }
            let mut start = start;
            while start > 0 && input[start - 1].is_ascii_digit() {
                start -= 1;
            }
            input.splice(start..end, EXTREMES[rng.below(EXTREMES.len())].iter().copied());
        }
    }
}

fn secs(default: f64) -> Duration {
    let s = std::env::var("FLASHNEXT_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    Duration::from_secs_f64(s)
}

fn seed(salt: u64) -> u64 {
    let s = std::env::var("FLASHNEXT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f1a5_0000_0001);
    (s ^ salt) | 1
}

/// Runs `target` on mutations of `corpus` until `budget` is spent; a panic fails with the input.
/// `weight(i)`: how often seed `i` is picked, relative to the others (large files less often).
fn fuzz(name: &str, corpus: &[Vec<u8>], weights: &[usize], json: bool, budget: Duration, target: fn(&[u8]) -> bool) {
    let start = Instant::now();
    let mut rng = XorShift(seed(name.len() as u64 * 0x9e37_79b9));
    let total: usize = weights.iter().sum();
    // The seeds themselves first: each must run clean (and most parse).
    let parsed = corpus.iter().filter(|s| run(name, s, target)).count();
    let (mut runs, mut accepted) = (0usize, 0usize);
    while start.elapsed() < budget {
        let mut pick = rng.below(total);
        let mut i = 0;
        while pick >= weights[i] {
            pick -= weights[i];
            i += 1;
        }
        let mut input = corpus[i].clone();
        for _ in 0..1 + rng.below(4) {
            mutate_once(&mut rng, &mut input, json);
        }
        accepted += usize::from(run(name, &input, target));
        runs += 1;
    }
    println!(
        "fuzz {name}: {} seeds ({parsed} accepted), {runs} mutated inputs in {:.1} s, {accepted} accepted, no panic",
        corpus.len(),
        start.elapsed().as_secs_f64()
    );
}

/// One input through `target`; a panic fails the test with the input saved and printed.
fn run(name: &str, input: &[u8], target: fn(&[u8]) -> bool) -> bool {
    match catch_unwind(AssertUnwindSafe(|| target(input))) {
        Ok(accepted) => accepted,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("target/fuzz-crash-{name}.bin"));
            let _ = std::fs::write(&path, input);
            let shown: String = if input.len() <= 4096 {
                input.iter().map(|b| std::ascii::escape_default(*b).to_string()).collect()
            } else {
                format!("({} bytes: see the file)", input.len())
            };
            panic!("fuzz target `{name}` panicked ({msg}) on the input in {}:\nb\"{shown}\"", path.display());
        }
    }
}

/// The tiny configs, as written by make_goldens.py.
fn config_corpus() -> Vec<Vec<u8>> {
    ["tiny-step", "tiny-sparse", "tiny-sparse-nvfp4", "tiny-dense"]
        .iter()
        .map(|m| data(&format!("{m}/config.json")))
        .chain(
            [br#"{"model_type": "qwen4_exp", "text_config": {"hidden_size": 256, "num_hidden_layers": 2, "layer_types": ["linear_attention", "linear_attention"]}, "vision_config": {}}"#.to_vec()],
        )
        .collect()
}

/// A tensor to write: name, dtype, shape, bytes.
type Tensor<'a> = (&'a str, Dtype, Vec<usize>, &'a [u8]);

/// Small safetensors files of every dtype the loaders meet, named as checkpoints name them.
fn small_files() -> Vec<Vec<u8>> {
    let f32s: Vec<u8> = (0..16).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
    let bf16s: Vec<u8> = (0..16).flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes()).collect();
    let i64s: Vec<u8> = (0..4i64).flat_map(|i| (i * 1_000_003).to_le_bytes()).collect();
    let bytes16: Vec<u8> = (0..16u8).collect();
    let one: Vec<u8> = 0.5f32.to_le_bytes().to_vec();
    let files: Vec<Vec<Tensor<'_>>> = vec![
        vec![("model.language_model.norm.weight", Dtype::F32, vec![16], &f32s)],
        vec![
            ("model.layers.0.mlp.gate.weight", Dtype::BF16, vec![4, 4], &bf16s),
            ("model.layers.0.ple.ple_embedding.layer_multipliers", Dtype::I64, vec![4], &i64s),
            ("mtp.layers.0.weight", Dtype::F16, vec![16], &bf16s),
        ],
        vec![
            ("lm_head.weight", Dtype::U8, vec![2, 8], &bytes16),
            ("lm_head.weight_scale", Dtype::F8_E4M3, vec![2, 1], &bytes16[..2]),
            ("lm_head.weight_scale_2", Dtype::F32, vec![], &one),
        ],
    ];
    files
        .into_iter()
        .map(|tensors| {
            let views = tensors
                .into_iter()
                .map(|(n, dt, shape, bytes)| (n, TensorView::new(dt, shape, bytes).expect("a valid view")));
            safetensors::serialize(views, None).expect("serialise")
        })
        .collect()
}

#[test]
fn fuzz_config() {
    let corpus = config_corpus();
    let weights = vec![1; corpus.len()];
    fuzz("config", &corpus, &weights, true, secs(8.0), fuzz_targets::config);
}

#[test]
fn fuzz_safetensors() {
    let mut corpus = small_files();
    let mut weights = vec![8; corpus.len()];
    // Two shards of a real checkpoint, and a whole one, loaded against its config (less often:
    // a whole model takes milliseconds to load).
    for (file, w) in [
        ("tiny-dense/model-00002-of-00002.safetensors", 4),
        ("tiny-dense/model-00001-of-00002.safetensors", 4),
        ("tiny-sparse/model.safetensors", 1),
    ] {
        corpus.push(data(file));
        weights.push(w);
    }
    fuzz("safetensors", &corpus, &weights, false, secs(12.0), fuzz_targets::safetensors);
}

/// Inputs the fuzzers found that once panicked: each must now be refused cleanly, by name.
#[test]
fn regressions() {
    let configs: [(&[u8], &str); 2] = [
        // `linear_key_head_dim` u64::MAX: the GDN conv's width overflowed in the step's plan.
        (
            br#"{"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "linear_key_head_dim": 18446744073709551615}"#,
            "`linear_key_head_dim` is 18446744073709551615: sizes above 2147483647 are not supported",
        ),
        // `num_hidden_layers` u64::MAX: the list of layer kinds could not be allocated.
        (
            br#"{"model_type": "qwen4_exp", "text_config": {"hidden_size": 256, "num_hidden_layers": 18446744073709551615}}"#,
            "num_hidden_layers 18446744073709551615 is above the 65536 this engine supports",
        ),
    ];
    for (input, want) in configs {
        assert!(!run("config", input, fuzz_targets::config), "accepted");
        let text = std::str::from_utf8(input).expect("UTF-8");
        let e = engine::model::config::ModelConfig::from_json(text).expect_err("refused").to_string();
        assert!(e.contains(want), "{e}");
    }
}
