#!/usr/bin/env python3
"""The QSA indexer's top-k and block scores the way a PyTorch user runs them, for comparison with
benches/qsa.rs: torch.topk over 65,536 block scores (k 512, sorted=False, then the indices sorted
ascending as the engine's selection is), and the scores ReLU(Q·K̄ᵀ).sum(heads)/√d over every
pooled key (4 heads of 128 dims, f32) at 32k and 128k tokens of context. Each is captured in a
CUDA graph of 48 launches (the scores over distinct keys per launch, more than the L2 holds) and
replayed; median, p10, p90 per launch. Prints one line per figure and writes them to
$OUT/bench-qsa-torch.jsonl.

    python3 benches/qsa_torch.py
"""

import json
import os

import torch

BLOCKS, TOP, HEADS, DIM, LAUNCHES = 65536, 512, 4, 128, 48


def time_per_launch(fn, per_graph, reps=50):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / per_graph)
    times.sort()
    return times[len(times) // 2], times[len(times) // 10], times[(9 * len(times)) // 10]


@torch.no_grad()
def main():
    name = torch.cuda.get_device_name()
    out = []

    def record(what, t, nbytes):
        median, p10, p90 = t
        print(f"qsa torch {what}: {median:.2f} us (p10 {p10:.2f}, p90 {p90:.2f}), {nbytes / 1e6:.2f} MB, {nbytes / median / 1e3:.0f} GB/s, {name}")
        out.append({"bench": "qsa-torch", "what": what, "us": median, "p10": p10, "p90": p90, "bytes": nbytes, "device": name, "torch": torch.__version__})

    scores = [torch.rand(BLOCKS, device="cuda") for _ in range(LAUNCHES)]

    def topk():
        for s in scores:
            torch.topk(s, TOP, sorted=False)

    def topk_ascending():
        for s in scores:
            torch.sort(torch.topk(s, TOP, sorted=False).indices)

    record(f"torch.topk of {BLOCKS} scores, k {TOP}", time_per_launch(topk, LAUNCHES), BLOCKS * 4)
    record(f"torch.topk of {BLOCKS} scores, k {TOP}, indices sorted", time_per_launch(topk_ascending, LAUNCHES), BLOCKS * 4)

    q = torch.randn(HEADS, DIM, device="cuda")
    for context in (32768, 131072):
        n = context // 4
        layers = max(12, 120_000_000 // (n * DIM * 4))
        keys = [torch.randn(n, DIM, device="cuda") for _ in range(layers)]

        def block_scores():
            for k in keys:
                torch.relu(k @ q.T).sum(dim=1) / DIM**0.5

        def scores_and_topk():
            for k in keys:
                s = torch.relu(k @ q.T).sum(dim=1) / DIM**0.5
                torch.sort(torch.topk(s, TOP, sorted=False).indices)

        nbytes = n * DIM * 4 + HEADS * DIM * 4
        record(f"block scores at {context // 1024}k tokens ({n} blocks)", time_per_launch(block_scores, layers), nbytes)
        record(f"block scores + top-k at {context // 1024}k tokens ({n} blocks)", time_per_launch(scores_and_topk, layers), nbytes)
        del keys
        torch.cuda.empty_cache()

    path = os.path.join(os.environ.get("OUT", "target"), "bench-qsa-torch.jsonl")
    with open(path, "a") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")


if __name__ == "__main__":
    main()
