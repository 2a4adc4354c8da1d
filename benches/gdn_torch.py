#!/usr/bin/env python3
"""The Gated DeltaNet decode step the way a PyTorch user runs it, for comparison with benches/gdn.rs.

Published shape: 16 key heads, 48 value heads, dk = dv = 128, d 2560, fp32 state.

1. The state update alone: transformers' `torch_recurrent_gated_delta_rule` (from the qwen4_exp
   modeling file; a copy of its decode step if the module lacks it) on one token, q and k
   l2-normed inside, the key heads repeated to the value heads as the layer does, and the new
   state copied back into the layer's state buffer (a graph cannot rebind it). 36 layers with
   distinct states (108 MiB, beyond the L2), one CUDA graph.
2. The whole layer in torch ops, as the reference computes it: the four input projections, the
   conv update on a [conv_dim, 4] window, SiLU, the gates, the rule above, the gated RMSNorm and
   out_proj, bf16 weights; 8 layers with distinct weights, one CUDA graph.

Prints one line per variant and writes them to $OUT/bench-gdn-torch.jsonl.

    python3 benches/gdn_torch.py
"""

import json
import os

import torch
import torch.nn.functional as F

try:
    from transformers.models.qwen4_exp import modeling_qwen4_exp as reference
except Exception:  # noqa: BLE001 - any import failure: fall back to the copy below
    reference = None

HK, HV, DK, DV, D, K = 16, 48, 128, 128, 2560, 4
STATE_LAYERS, LAYERS = 36, 8
CONV_DIM = 2 * HK * DK + HV * DV
H200_BYTES_PER_S = 4.27e12


def l2norm(x, dim=-1, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def recurrent_rule_copy(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel=False):
    """transformers' torch_recurrent_gated_delta_rule (Qwen3-Next / qwen4_exp), for a module that lacks it."""
    initial_dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query = l2norm(query, dim=-1, eps=1e-6)
        key = l2norm(key, dim=-1, eps=1e-6)
    query, key, value, beta, g = [x.transpose(1, 2).contiguous().to(torch.float32) for x in (query, key, value, beta, g)]
    batch_size, num_heads, sequence_length, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    query = query * (1 / (query.shape[-1] ** 0.5))
    core_attn_out = torch.zeros(batch_size, num_heads, sequence_length, v_head_dim).to(value)
    state = initial_state.to(value)
    for i in range(sequence_length):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        g_t = g[:, :, i].exp().unsqueeze(-1).unsqueeze(-1)
        beta_t = beta[:, :, i].unsqueeze(-1)
        state = state * g_t
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta_t
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        core_attn_out[:, :, i] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
    core_attn_out = core_attn_out.transpose(1, 2).contiguous().to(initial_dtype)
    return core_attn_out, (state if output_final_state else None)


RULE = getattr(reference, "torch_recurrent_gated_delta_rule", None) or recurrent_rule_copy
RULE_NAME = "transformers" if RULE is not recurrent_rule_copy else "copy"


def rule_step(q, k, v, g, beta, state):
    """One token: q, k [1, 1, HK, DK], v [1, 1, HV, DV] (bf16), g, beta [1, 1, HV]; state updated in place."""
    r = HV // HK
    q = q.repeat_interleave(r, dim=2)
    k = k.repeat_interleave(r, dim=2)
    out, new_state = RULE(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    state.copy_(new_state)
    return out


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


def graphed(step):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        return graph.replay, "graph"
    except Exception as e:  # noqa: BLE001 - report and time eagerly
        torch.cuda.synchronize()
        return step, f"eager (capture failed: {type(e).__name__})"


def copy_bandwidth():
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    median, _, _ = time_ms(lambda: dst.copy_(src), 10)
    return 2 * src.numel() / (median / 1e3)


def state_update_inputs():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return dict(
        q=torch.randn(1, 1, HK, DK, **bf),
        k=torch.randn(1, 1, HK, DK, **bf),
        v=torch.randn(1, 1, HV, DV, **bf),
        g=torch.log(0.5 + 0.5 * torch.rand(1, 1, HV, device="cuda")),
        beta=torch.rand(1, 1, HV, **bf),
        state=torch.randn(1, HV, DK, DV, device="cuda") * 0.1,
    )


class Layer:
    """One GDN layer's weights and carried state, the decode step in torch ops (reference math)."""

    def __init__(self):
        bf = dict(device="cuda", dtype=torch.bfloat16)
        s = D**-0.5
        self.w_qkv = torch.randn(CONV_DIM, D, **bf) * s
        self.w_z = torch.randn(HV * DV, D, **bf) * s
        self.w_b = torch.randn(HV, D, **bf) * s
        self.w_a = torch.randn(HV, D, **bf) * s
        self.conv = torch.randn(CONV_DIM, 1, K, **bf) * 0.5
        self.a_log = torch.log(0.5 + 3.5 * torch.rand(HV, device="cuda"))
        self.dt_bias = -2.5 + 0.5 * torch.randn(HV, device="cuda")
        self.norm = 1 + 0.2 * torch.randn(DV, **bf)
        self.w_out = torch.randn(D, HV * DV, **bf) * (HV * DV) ** -0.5
        self.conv_state = torch.zeros(1, CONV_DIM, K, **bf)
        self.state = torch.zeros(1, HV, DK, DV, device="cuda")
        self.x = torch.randn(1, 1, D, **bf)

    def step(self):
        x = self.x
        qkv = F.linear(x, self.w_qkv)[0, 0]
        z = F.linear(x, self.w_z)
        b = F.linear(x, self.w_b)
        a = F.linear(x, self.w_a)
        # causal_conv1d_update: shift the window, put the new input last, depthwise conv, SiLU.
        self.conv_state.copy_(torch.roll(self.conv_state, shifts=-1, dims=-1))
        self.conv_state[:, :, -1] = qkv
        c = F.silu((self.conv_state * self.conv[:, 0]).sum(dim=-1))[0]
        q, k, v = torch.split(c, [HK * DK, HK * DK, HV * DV])
        beta = b.sigmoid()
        g = -self.a_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        o = rule_step(q.view(1, 1, HK, DK), k.view(1, 1, HK, DK), v.view(1, 1, HV, DV), g, beta, self.state)
        # Gated RMSNorm per head (plain weight), sigmoid gate.
        of = o.float().view(HV, DV)
        h = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = self.norm * h.to(torch.bfloat16)
        h = h * torch.sigmoid(z.float().view(HV, DV))
        return F.linear(h.to(torch.bfloat16).view(1, 1, HV * DV), self.w_out)


@torch.no_grad()
def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    copy_bw = copy_bandwidth()
    global RULE, RULE_NAME
    try:  # the module's function, if its signature is the one above
        i = state_update_inputs()
        rule_step(i["q"], i["k"], i["v"], i["g"], i["beta"], i["state"])
    except Exception as e:  # noqa: BLE001 - report and use the copy
        print(f"transformers' rule not usable here ({type(e).__name__}: {e}); using the copy")
        RULE, RULE_NAME = recurrent_rule_copy, "copy"
    print(f"device {name}: device-to-device copy {copy_bw / 1e12:.2f} TB/s (read + write), rule: {RULE_NAME}")
    out = []

    inputs = [state_update_inputs() for _ in range(STATE_LAYERS)]

    def updates():
        for i in inputs:
            rule_step(i["q"], i["k"], i["v"], i["g"], i["beta"], i["state"])

    run, mode = graphed(updates)
    median, p10, p90 = time_ms(run, 50)
    per = median * 1000 / STATE_LAYERS
    state_bytes = 2 * 4 * HV * DK * DV
    print(
        f"gdn torch state update ({STATE_LAYERS} layers) {per:8.2f} us per layer (p10 {p10 * 1000 / STATE_LAYERS:.2f}, "
        f"p90 {p90 * 1000 / STATE_LAYERS:.2f}), {mode}; the state's {state_bytes / 1e6:.2f} MB at "
        f"{state_bytes / (per / 1e6) / 1e9:.0f} GB/s, {100 * state_bytes / (per / 1e6) / H200_BYTES_PER_S:.1f}% of 4.27 TB/s"
    )
    out.append({"bench": "gdn-torch-state-update", "rule": RULE_NAME, "mode": mode, "us_per_layer": per, "device": name, "torch": torch.__version__, "copy_bw": copy_bw})
    del inputs
    torch.cuda.empty_cache()

    layers = [Layer() for _ in range(LAYERS)]

    def step():
        for layer in layers:
            layer.step()

    run, mode = graphed(step)
    median, p10, p90 = time_ms(run, 50)
    per = median * 1000 / LAYERS
    weight_bytes = 2 * ((CONV_DIM + HV * DV + 2 * HV) * D + D * HV * DV)
    print(
        f"gdn torch layer bf16 ({LAYERS} layers)     {per:8.2f} us per layer (p10 {p10 * 1000 / LAYERS:.2f}, "
        f"p90 {p90 * 1000 / LAYERS:.2f}), {mode}; weights + state {(weight_bytes + state_bytes) / 1e6:.1f} MB"
    )
    out.append({"bench": "gdn-torch-layer", "rule": RULE_NAME, "mode": mode, "us_per_layer": per, "device": name, "torch": torch.__version__, "copy_bw": copy_bw})

    path = os.path.join(os.environ.get("OUT", "target"), "bench-gdn-torch.jsonl")
    with open(path, "a") as f:
        for o in out:
            f.write(json.dumps(o) + "\n")


if __name__ == "__main__":
    main()
