#!/usr/bin/env python3
"""Tiny random qwen4_exp models and the goldens the transformers reference computes for them.

This is the oracle the CPU reference (engine/src/reference) is tested against. It needs torch and
transformers with the qwen4_exp model (5.17 on the GPU machine):

    python3 tools/goldens/make_goldens.py --out tests/data

For each model it writes tests/data/<name>/: config.json, the checkpoint (bf16 safetensors, or
NVFP4 in the ModelOpt layout), and goldens.safetensors holding
  tokens         int64 [T]      the prompt followed by the greedy continuation
  prompt_len     int64 []       how many of `tokens` are the prompt
  logits         f32   [T, V]   teacher-forced logits at every position of `tokens`
  hidden         f32   [L, P, n*d]  the residual streams after each layer, prompt positions (for debugging)
All logits are computed in fp32 (TF32 off) from the weights exactly as stored, reloaded from disk.

Models (every one a model the GPU step takes: hidden 256, head and intermediate sizes its kernels
tile; engine/src/step/plan.rs checks each kernel's requirements, and tests/gpu_step.rs runs each
model on the device against its goldens):
  tiny-sparse        QSA budget of 2 blocks of 4 tokens, so sparse selection happens within the
                     prompt; PLE on two linear-attention layers (1 and 3), 2 value heads a key
                     head; eos inside the prompt; sigmoid GDN gate; the flat text config.
  tiny-dense         another geometry (2 streams, 3 value heads per key head, half rotary, SiLU GDN
                     gate, explicit layer_types with `full_attention`), dense attention, no PLE;
                     written as the vision-language checkpoint does it: nested text_config,
                     `model.language_model.` names, two shards with an index. (Three streams, as
                     it once had, are not a shape the Gated Residual's kernels take: the stream
                     count must divide 32.)
  tiny-sparse-nvfp4  tiny-sparse with its linear weights quantised to NVFP4 (ModelOpt layout); the
                     goldens are computed on the dequantised weights.
  tiny-step          a geometry every GPU kernel of the step takes at its tiny tiles (hidden 256,
                     head sizes of 64 and 128, 32-aligned intermediates, GDN heads whose output width is a multiple of 128): the model the whole decode
                     step on the device is checked against. QSA budget of 3 blocks, PLE on layer 2
                     (1-indexed, as the config counts; transformers allows PLE on linear attention
                     layers only).

`--only NAME` makes one model and leaves the others as they are.
Every parameter gets real random values (norm weights and convs are zero at init, which would hide
bugs).
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

import transformers
from transformers.models.qwen4_exp import modeling_qwen4_exp as reference
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

PROMPT_LEN = 48
NEW_TOKENS = 40
EOS = 7

# Every model here is one the GPU step takes (engine/src/step/plan.rs checks each kernel's
# requirements; tiny-step's comment below gives the rules): hidden 256, head sizes the kernels tile.
TINY_SPARSE = dict(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    output_gate_type="sigmoid",
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    hc_count=4,
    hc_lowrank=32,
    ple_layer_ids=[1, 3],
    ple_embed_dim=128,
    ngram_vocab_size_base=1000,
    split_ngram_parts=4,
    indexer_n_heads=4,
    indexer_kv_heads=1,
    indexer_head_dim=32,
    indexer_budget=8,
    indexer_compress_ratio=4,
    eos_token_id=EOS,
    rms_norm_eps=1e-6,
)

# Two streams where the published model has four: the Gated Residual's kernels need the stream
# count to divide 32 (a warp's lanes split evenly over the streams), so three cannot run on the GPU.
TINY_DENSE = dict(
    vocab_size=384,
    hidden_size=256,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "qwen_sparse_attention"],
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=6,
    num_experts_per_tok=3,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    hc_count=2,
    hc_lowrank=32,
    indexer_n_heads=3,
    indexer_kv_heads=1,
    indexer_head_dim=64,
    indexer_budget=256,
    indexer_compress_ratio=4,
    eos_token_id=EOS,
    rms_norm_eps=1e-5,
)

# The published model's shape rules at a tiny size: hidden a multiple of 256 (the GEMVs' 16-byte
# lanes over a warp), GDN heads of 64 with four value heads per key head (out_proj's GEMV takes
# 4·64 = 256 columns; three heads' 192 do not divide into its 128-column steps), QSA heads of 128
# with 32 rotary dims and index heads of 32, intermediates multiples of 32 (the MoE kernels'
# tiles: 16 and 48 are refused), a Gated Residual rank of at least 32.
TINY_STEP = dict(
    vocab_size=512,
    hidden_size=256,
    num_hidden_layers=3,
    layer_types=["linear_attention", "linear_attention", "qwen_sparse_attention"],
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=128,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    linear_num_key_heads=1,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    output_gate_type="sigmoid",
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=64,
    hc_count=4,
    hc_lowrank=64,
    ple_layer_ids=[2],
    ple_embed_dim=256,
    ngram_vocab_size_base=1000,
    split_ngram_parts=4,
    indexer_n_heads=3,
    indexer_kv_heads=1,
    indexer_head_dim=32,
    indexer_budget=12,
    indexer_compress_ratio=4,
    eos_token_id=EOS,
    rms_norm_eps=1e-6,
)


def randomise(model, seed):
    """Real random values for every parameter: each kind scaled so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "ngram_embedding" in name or "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g)
            elif leaf == "A_log":
                v = torch.log(torch.empty(p.shape).uniform_(0.01, 16, generator=g))
            elif leaf == "dt_bias":
                v = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
            elif "conv1d" in name:
                v = 0.5 * torch.randn(p.shape, generator=g)
            elif name.endswith("linear_attn.norm.weight"):
                # The gated norm multiplies by its weight directly: values around 1.
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif p.dim() == 1:
                # Zero-centred norms multiply by 1 + w: values around 0.
                v = 0.2 * torch.randn(p.shape, generator=g)
            else:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=g) / fan_in**0.5
            # Exactly representable in bf16, so that the stored checkpoint is the model.
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def prompt(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (PROMPT_LEN,), generator=g)
    ids[ids == EOS] = EOS + 1
    # An eos, two in a row, and another: the PLE history resets after each.
    for pos in (10, 11, 30):
        ids[pos] = EOS
    return ids


def load(dirname):
    model = reference.Qwen4ExpForCausalLM.from_pretrained(dirname, dtype=torch.float32)
    model.eval()
    return model


class TopKTie(Exception):
    pass


class NoTopKTies:
    """Fails a forward in which a top-k (the router's or the indexer's) has a tie at its boundary.
    torch.topk orders ties arbitrarily, the engine by the lower index: a golden with such a tie
    would pin down an arbitrary choice, so the script draws another model instead."""

    def __enter__(self):
        self.original = torch.Tensor.topk
        original = self.original

        def topk(t, k, dim=-1, *args, **kwargs):
            if 0 < k < t.shape[dim]:
                ordered = t.float().sort(dim=dim, descending=True).values
                if torch.any(ordered.narrow(dim, k - 1, 1) == ordered.narrow(dim, k, 1)):
                    raise TopKTie(f"a tie at the boundary of a top-{k} over {t.shape[dim]}")
            return original(t, k, dim, *args, **kwargs)

        torch.Tensor.topk = topk
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self.original
        return False


@torch.no_grad()
def goldens(model, prompt_ids):
    with NoTopKTies():
        return goldens_unchecked(model, prompt_ids)


def goldens_unchecked(model, prompt_ids):
    """Greedy continuation (full teacher-forced forward per step, no cache, no eos stop), then the
    logits of every position and the per-layer streams of the prompt."""
    ids = prompt_ids.clone()
    for _ in range(NEW_TOKENS):
        logits = model(input_ids=ids[None], use_cache=False).logits[0, -1]
        ids = torch.cat([ids, logits.argmax().reshape(1)])
    hidden = []
    hooks = [layer.register_forward_hook(lambda m, i, o: hidden.append(o[0] if isinstance(o, tuple) else o)) for layer in model.model.layers]
    logits = model(input_ids=ids[None], use_cache=False).logits[0]
    for h in hooks:
        h.remove()
    hidden = torch.stack([h[0, :PROMPT_LEN] for h in hidden]).float()
    # Decode with the cache must give the same tokens; a check of the oracle itself.
    out = model.generate(prompt_ids[None], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(out[0], ids), "cached decode and teacher forcing disagree in the oracle"
    return dict(tokens=ids, prompt_len=torch.tensor(PROMPT_LEN), logits=logits.float().contiguous(), hidden=hidden.contiguous())


def make_model(config_kwargs, seed, out_dir):
    config = Qwen4ExpTextConfig(**config_kwargs)
    torch.manual_seed(seed)
    model = reference.Qwen4ExpForCausalLM(config)
    randomise(model, seed)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(out_dir, extra)
        if os.path.exists(path):
            os.remove(path)
    return config


# ---- NVFP4 (ModelOpt layout and rules) ----

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def round_e2m1(x):
    """Nearest E2M1 code (sign in bit 3); a tie goes to the even code, as a hardware round-to-
    nearest-even conversion does."""
    mag = x.abs().clamp(max=6.0)
    d = (mag[..., None] - E2M1_VALUES).abs()
    best = d.min(dim=-1, keepdim=True).values
    # Among equally near codes take the even one (lowest code among ties if none is even: never happens).
    codes = torch.arange(8)
    tie_rank = torch.where(d == best, (codes % 2) * 8 + codes, torch.full_like(d, 99, dtype=torch.long))
    code = tie_rank.argmin(dim=-1)
    sign = (x < 0) & (code != 0)
    return code + 8 * sign.long()


def quantise_nvfp4(w):
    """ModelOpt NVFP4: global scale amax/(6·448); per 16-value block scale amax_block/(6·global)
    rounded to e4m3; values divided by the rounded block scale times the global, rounded to e2m1."""
    w = w.float()
    rows, cols = w.shape
    assert cols % 16 == 0
    amax = w.abs().max()
    scale_2 = (amax / (6.0 * 448.0)).float()
    blocks = w.reshape(rows, cols // 16, 16)
    if scale_2 == 0:
        block_scale = torch.zeros(rows, cols // 16)
    else:
        block_scale = blocks.abs().amax(dim=-1) / (6.0 * scale_2)
    block_scale_e4m3 = block_scale.clamp(max=448.0).to(torch.float8_e4m3fn)
    denom = block_scale_e4m3.float()[..., None] * scale_2
    scaled = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(blocks))
    codes = round_e2m1(scaled).reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, block_scale_e4m3, scale_2.reshape(())


def dequantise_nvfp4(packed, block_scale, scale_2):
    lo = (packed & 0xF).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(packed.shape[0], -1)
    mag = E2M1_VALUES[codes & 7]
    vals = torch.where(codes >= 8, -mag, mag)
    rows, cols = vals.shape
    scales = block_scale.float() * scale_2
    return (vals.reshape(rows, cols // 16, 16) * scales[..., None]).reshape(rows, cols)


def quantised(name, t):
    """Linear weights that go to NVFP4: experts, shared expert, GDN and attention projections,
    PLE projections, lm_head. Embeddings, router, Gated Residual, norms and convs stay bf16."""
    if t.dim() != 2 or t.shape[1] % 16 != 0 or not name.endswith(".weight"):
        return False
    keep = ("embed_tokens", "ngram_embedding", "mlp.gate.weight", "shared_expert_gate", "hyper_connection", "norm", "conv1d")
    return not any(k in name for k in keep)


def make_nvfp4(src_dir, out_dir, prompt_ids):
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(src_dir, "config.json"), out_dir)
    stored = load_file(os.path.join(src_dir, "model.safetensors"))
    nvfp4, dequantised = {}, {}
    for name, t in stored.items():
        if quantised(name, t):
            packed, scale, scale_2 = quantise_nvfp4(t)
            nvfp4[name] = packed
            nvfp4[name + "_scale"] = scale
            nvfp4[name + "_scale_2"] = scale_2
            dequantised[name] = dequantise_nvfp4(packed, scale, scale_2)
        else:
            nvfp4[name] = t
            dequantised[name] = t.float() if t.is_floating_point() else t
    save_file(nvfp4, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(src_dir, "config.json"), tmp)
        save_file(dequantised, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        return goldens(load(tmp), prompt_ids)


def as_vision_language(out_dir):
    """Rewrites a text-only checkpoint the way the published one is laid out: nested config,
    `model.language_model.` names, two shards and an index."""
    with open(os.path.join(out_dir, "config.json")) as f:
        text = json.load(f)
    text["model_type"] = "qwen4_exp_text"
    nested = {"model_type": "qwen4_exp", "architectures": ["Qwen4ExpForConditionalGeneration"], "text_config": text, "vision_config": {}}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(nested, f, indent=2)
    tensors = load_file(os.path.join(out_dir, "model.safetensors"))
    os.remove(os.path.join(out_dir, "model.safetensors"))
    renamed = {("model.language_model." + n[len("model."):] if n.startswith("model.") else n): t for n, t in tensors.items()}
    names = sorted(renamed)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map = {}
    for i, part in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: renamed[n] for n in part}, os.path.join(out_dir, file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data", help="where the model folders go")
    ap.add_argument("--only", help="make this model only (tiny-sparse with tiny-sparse-nvfp4, tiny-dense or tiny-step)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    src = reference.__file__
    with open(src, "rb") as f:
        provenance = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "modeling_qwen4_exp.py sha256": hashlib.sha256(f.read()).hexdigest(),
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
        }

    plan = [("tiny-sparse", TINY_SPARSE, 11), ("tiny-dense", TINY_DENSE, 12), ("tiny-step", TINY_STEP, 13)]
    if args.only:
        plan = [p for p in plan if p[0] == args.only]
        if not plan:
            ap.error(f"--only: no model named {args.only}")
    for name, cfg, first_seed in plan:
        out = os.path.join(args.out, name)
        for seed in range(first_seed, first_seed + 1000, 100):
            shutil.rmtree(out, ignore_errors=True)
            make_model(cfg, seed, out)
            ids = prompt(cfg["vocab_size"], seed)
            try:
                g = goldens(load(out), ids)
                break
            except TopKTie as tie:
                print(f"{name}: seed {seed} gives {tie}; drawing another model")
        provenance[name + " seed"] = seed
        save_file(g, os.path.join(out, "goldens.safetensors"), metadata={k: str(v) for k, v in provenance.items()})
        if name == "tiny-sparse":
            q = os.path.join(args.out, "tiny-sparse-nvfp4")
            shutil.rmtree(q, ignore_errors=True)
            gq = make_nvfp4(out, q, ids)  # raises TopKTie if quantisation created one: rerun with other seeds
            save_file(gq, os.path.join(q, "goldens.safetensors"), metadata={k: str(v) for k, v in provenance.items()})
        if name == "tiny-dense":
            as_vision_language(out)
        print(f"{name}: {g['tokens'].numel()} tokens, continuation {g['tokens'][PROMPT_LEN:].tolist()}")
    print(json.dumps(provenance, indent=2))


if __name__ == "__main__":
    main()
