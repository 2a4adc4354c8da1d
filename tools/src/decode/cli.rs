//! The decode binary's options.

use std::path::PathBuf;

use clap::Parser;

/// Decodes a prompt with Qwen3.8-Flash-Next (`qwen4_exp`), streaming the text, then prints the
/// speed; or scores a token sequence (teacher forcing) and writes every position's logits.
///
/// With no --model it runs the model embedded in the binary: tests/data/tiny-step (3 layers at the
/// step's shapes, random weights, vocabulary 512, no tokenizer.json: text is byte-level, UTF-8
/// bytes are ids and ids ≥ 256 print as <id>). With a CUDA device the GPU engine runs the step (one
/// CUDA graph replayed per token); without one, or with --cpu, the CPU reference does (f32, exact,
/// slow on a full model), and it says which on stderr. Diagnostics, progress and timing go to
/// stderr, the generated text (or ids) to stdout.
#[derive(Parser, Debug, Clone)]
#[command(version, about, long_about, name = "decode")]
pub struct Cli {
    /// A Hugging Face checkpoint directory: config.json, model.safetensors or its shards with
    /// model.safetensors.index.json (bf16 or NVFP4), and tokenizer.json for text in and out.
    /// Without it, the embedded tiny model.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,

    /// Random weights at the published shapes, no checkpoint: GPU only (for speed measurements);
    /// the CPU backend refuses it.
    #[arg(long, conflicts_with = "model")]
    pub synthetic: bool,

    /// Run the CPU reference even when a GPU backend is available.
    #[arg(long)]
    pub cpu: bool,

    /// The prompt as text (needs tokenizer.json, or the byte-level fallback of a model without
    /// one). Default: "Once upon a time" when no --prompt-ids is given either.
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,

    /// The prompt as token ids, comma-separated: 1,2,3. Each must be below the vocabulary size.
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Option<String>,

    /// Tokens to generate after the prompt (0: only run the prompt).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub max_new_tokens: usize,

    /// Sample instead of greedy: softmax(logits / T). 0 (or leaving it out) is greedy, the argmax
    /// with ties to the lower id.
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f64>,

    /// With --temperature: sample from the smallest set of ids, taken in order of higher logit then
    /// lower id, whose probability reaches P.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f64,

    /// With --temperature: the seed. Each position's uniform is output number `position` of a
    /// splitmix64 generator seeded with S, so a run replays exactly.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,

    /// Keep generating past the end-of-sequence token (config.json's eos_token_id), which
    /// otherwise stops generation.
    #[arg(long)]
    pub ignore_eos: bool,

    /// The most tokens in the sequence (prompt plus new tokens, or the scored ids): the GPU engine
    /// sizes its attention caches for it. Asking for more is an error before anything runs.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub context: usize,

    /// GPU only: launch the step's kernels one by one instead of replaying the CUDA graph (no
    /// effect on the CPU reference).
    #[arg(long)]
    pub eager: bool,

    /// GPU only: time each kernel of the step and print the breakdown (no effect on the CPU
    /// reference).
    #[arg(long)]
    pub profile: bool,

    /// Score instead of generating: decode these ids teacher-forced (a list 1,2,3, a text file of
    /// ids, or a safetensors file with a `tokens` tensor, like the goldens) and write every
    /// position's logits to --out.
    #[arg(long, value_name = "IDS_FILE_OR_LIST", conflicts_with_all = ["prompt", "prompt_ids", "temperature", "print_ids"])]
    pub score: Option<String>,

    /// With --score: the safetensors file to write: `logits` [T, V] f32 (position t scores the token
    /// after ids[t]) and `tokens` [T] i64.
    #[arg(long, value_name = "FILE", requires = "score")]
    pub out: Option<PathBuf>,

    /// Print the generated token ids (one comma-separated line) instead of the text.
    #[arg(long)]
    pub print_ids: bool,

    /// The memory bandwidth, in GB/s, for the byte floor the timing report compares against when
    /// the backend reports its bytes per token (default: on the GPU its copy bandwidth, measured
    /// at load; elsewhere GB10's LPDDR5X, 273).
    #[arg(long, value_name = "GB_PER_S")]
    pub peak_gbs: Option<f64>,

    /// GPU only: run every projection that has an NVFP4 kernel in NVFP4 (the experts, the Gated
    /// Residual's, GDN's, QSA's and PLE's projections, the lm_head), quantising a bf16
    /// checkpoint's at load; the routers, norms, convs and the attention stay bf16 (a bf16
    /// checkpoint otherwise runs in bf16). --synthetic is always NVFP4.
    #[arg(long)]
    pub nvfp4: bool,
}
