#!/usr/bin/env python3
"""The Gated Residual mix the way a PyTorch user writes it, for comparison with benches/mix.rs.

The same math and the same work per site as the Rust bench: the previous block's write
`X_s += ω_s · y`, the per-stream zero-centred RMSNorm, `u = SiLU(W_down · vec(X̂) / n)`,
`G = σ(W_up · u)`, `x = mean_s G_s ⊙ X̂_s`, `ω = 2σ(W_inj · vec(X̂) / n)`, in bf16 (the model
dtype, as transformers runs it) with F.linear; n 4, d 2560, r 320; 48 consecutive sites with
distinct weights (634 MB, far past the L2), the sites alternating between two gains buffers as in
a decode step, captured in one CUDA graph and replayed. With FLASHNEXT_TORCH_COMPILE=1 the site
function is also tried under torch.compile (mode "max-autotune-no-cudagraphs", then captured the
same way). Prints one line per variant and writes them to $OUT/bench-mix-torch.jsonl.

    python3 benches/mix_torch.py
"""

import json
import os

import torch
import torch.nn.functional as F

N, D, R = 4, 2560, 320
SITES = 48
EPS = 1e-6
H200_BYTES_PER_S = 4.27e12
# Weights (norm, W_down, W_inj, W_up) plus X read and written, y read, x written; bf16.
BYTES_PER_SITE = 2 * (N * D + (R + N) * N * D + N * D * R) + 2 * 2 * N * D + 2 * 2 * D


def site(X, y, gains_prev, norm, down, inject, up, gains_out, x_out):
    """One site: the folded write, then the mix; X [n, d] in place, ω into gains_out."""
    X.add_(gains_prev[:, None] * y)
    xf = X.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(X.dtype) * (1 + norm)
    flat = normed.reshape(1, N * D)
    u = F.silu(F.linear(flat, down) / N)
    gates = torch.sigmoid(F.linear(u, up)).view(N, D)
    x_out.copy_((gates * normed).mean(0))
    gains_out.copy_(2 * torch.sigmoid(F.linear(flat, inject) / N).view(N))


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


def copy_bandwidth():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    median, _, _ = time_ms(lambda: b.copy_(a), 20)
    return 2 * a.numel() / (median / 1000)


@torch.no_grad()
def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    name = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    print(f"device {name}: device-to-device copy {copy_bw / 1e12:.2f} TB/s (read + write)")
    torch.manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    weights = [
        (
            (0.2 * torch.randn(N, D, **bf)),
            torch.randn(R, N * D, **bf) * (N * D) ** -0.5,
            torch.randn(N, N * D, **bf) * (N * D) ** -0.5,
            torch.randn(N * D, R, **bf) * R**-0.5,
        )
        for _ in range(SITES)
    ]
    X = torch.randn(N, D, **bf)
    y = torch.randn(D, **bf)
    gains = [torch.ones(N, **bf), torch.ones(N, **bf)]
    x_out = torch.empty(D, **bf)

    variants = [("F.linear", site)]
    if os.environ.get("FLASHNEXT_TORCH_COMPILE"):
        variants.append(("torch.compile", torch.compile(site, mode="max-autotune-no-cudagraphs")))
    out = []
    for label, fn in variants:

        def step():
            for i, (norm, down, inject, up) in enumerate(weights):
                fn(X, y, gains[(i + 1) % 2], norm, down, inject, up, gains[i % 2], x_out)

        try:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            graph.replay()
        except Exception as e:  # a variant this installation cannot run
            print(f"mix torch {label}: not available ({type(e).__name__}: {e})")
            continue
        median, p10, p90 = time_ms(graph.replay, 50)
        per = median * 1000 / SITES
        rate = BYTES_PER_SITE / (per / 1e6)
        line = (
            f"mix torch {label:<13} {per:8.2f} us per site (p10 {p10 * 1000 / SITES:.2f}, p90 {p90 * 1000 / SITES:.2f}), "
            f"CUDA graph, bf16, {rate / 1e9:.0f} GB/s, {100 * rate / H200_BYTES_PER_S:.1f}% of 4.27 TB/s, "
            f"{100 * rate / copy_bw:.1f}% of measured copy BW; floor {BYTES_PER_SITE / H200_BYTES_PER_S * 1e6:.2f} us, {name}"
        )
        print(line)
        out.append(
            {
                "bench": "mix-torch",
                "variant": label,
                "us_per_site": per,
                "p10": p10 * 1000 / SITES,
                "p90": p90 * 1000 / SITES,
                "bytes": BYTES_PER_SITE,
                "copy_bw": copy_bw,
                "device": name,
                "torch": torch.__version__,
            }
        )
        del graph
    path = os.path.join(os.environ.get("OUT", "target"), "bench-mix-torch.jsonl")
    with open(path, "a") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")


if __name__ == "__main__":
    main()
