#!/usr/bin/env python3
"""The MoE block the way a PyTorch user runs it, for comparison with benches/moe.rs.

transformers' own `Qwen4ExpTextSparseMoeBlock` at the published shape (d 2560, 512 experts,
top 10, intermediate 640, shared expert 640), bf16 weights (the form PyTorch users hold them in),
one token, eight layers with distinct weights. Each of transformers' experts implementations is
tried; the eight layers are captured in one CUDA graph where the implementation allows it
(`eager` syncs on the host and cannot be captured: it is timed eagerly). Prints one line per
implementation and writes them to $OUT/bench-moe-torch.jsonl.

    python3 benches/moe_torch.py
"""

import json
import os

import torch
from transformers.models.qwen4_exp import modeling_qwen4_exp as reference
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig

LAYERS = 8


def config(implementation):
    c = Qwen4ExpTextConfig(
        hidden_size=2560,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=640,
        shared_expert_intermediate_size=640,
        num_hidden_layers=4,
    )
    c._experts_implementation = implementation
    return c


def layers(implementation):
    torch.manual_seed(0)
    blocks = []
    for _ in range(LAYERS):
        b = reference.Qwen4ExpTextSparseMoeBlock(config(implementation)).to("cuda", torch.bfloat16)
        with torch.no_grad():
            for p in b.parameters():
                p.normal_(0, p.shape[-1] ** -0.5)
        blocks.append(b.eval())
    return blocks


def time_ms(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2], times[len(times) // 10], times[(9 * len(times)) // 10]


@torch.no_grad()
def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name()
    out = []
    for implementation in ("grouped_mm", "batched_mm", "eager"):
        try:
            blocks = layers(implementation)
        except Exception as e:  # an implementation this version lacks
            print(f"moe torch {implementation}: not available ({type(e).__name__}: {e})")
            continue
        xs = [torch.randn(1, 1, 2560, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]

        def step():
            for b, x in zip(blocks, xs):
                b(x)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        mode = "graph"
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run = graph.replay
            run()
        except Exception as e:
            mode = f"eager (capture failed: {type(e).__name__})"
            torch.cuda.synchronize()
            run = step
        median, p10, p90 = time_ms(run, 50)
        per = median * 1000 / LAYERS
        line = f"moe torch {implementation:<10} {per:8.2f} us per layer (p10 {p10 * 1000 / LAYERS:.2f}, p90 {p90 * 1000 / LAYERS:.2f}), {mode}, bf16, {name}"
        print(line)
        out.append({"bench": "moe-torch", "implementation": implementation, "mode": mode, "us_per_layer": per, "device": name, "torch": torch.__version__})
        del blocks
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "target"), "bench-moe-torch.jsonl")
    with open(path, "a") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")


if __name__ == "__main__":
    main()
