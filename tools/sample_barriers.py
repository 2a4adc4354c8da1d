#!/usr/bin/env python3
"""How many grid barriers `sample_top_p` takes on the sample bench's logits (a host model).

The kernel (engine/src/kernels/sample.rs) finds two places in the order of the logits by a
radix select over 32-bit order keys: 11, 11 and 10 bits a pass, one grid barrier a pass, a
barrier for the maximum first and one for ties at the pick last. Select 2's first pass reuses
select 1's first histogram, and at top_p >= 1 select 1 is skipped (S = Z). This model runs the
same search over the bench's logits (benches/sample.rs: seed 0x5a3b1e, normal(0, 3), flat,
tied levels) for a few uniforms and prints, for each select, each pass's bin as (pass, keys in
the bin, keys in the bins above), and the barriers that makes.

It is a model, not the kernel: the masses are f32 exp on the host, truncated to 2^40 fixed
point as the kernel does, and numpy's generator is not the bench's (flashnext::rng), so the
logits have the bench's distributions but not its values; a bin edge may fall differently.
Needs numpy. Usage: python3 tools/sample_barriers.py
"""
import numpy as np

VOCAB = 248_320
PASSES = [(21, 2047), (10, 2047), (0, 1023)]  # (shift, digit mask) of passes 0, 1, 2


def order_keys(logits):
    """u32 keys whose unsigned order is the logits' order (NaN would be 0; none here)."""
    b = logits.astype(np.float32).view(np.uint32).astype(np.uint64)
    return np.where(b >= 0x80000000, (~b) & 0xFFFFFFFF, b | 0x80000000)


def masses(logits, temperature):
    """exp((l - max)/T) in f32, times 2^40, truncated, capped at 2^40 - 1 (exact u64 sums)."""
    scaled = np.exp((logits - logits.max()) * np.float32(1.0 / temperature)).astype(np.float64)
    return np.minimum((scaled * 2.0**40).astype(np.uint64), np.uint64(2**40 - 1))


def select(keys, mass, wanted):
    """Where the cumulative mass from the top first reaches `wanted`: the passes taken, each
    (pass, keys in its bin, keys above the bin), then the mass still wanted in the last bin,
    that bin's mass and its count."""
    prefix, mask, passes = 0, 0, []
    for p, (shift, digit_mask) in enumerate(PASSES):
        match = (keys & np.uint64(mask)) == np.uint64(prefix)
        k, q = keys[match], mass[match]
        digit = ((k >> np.uint64(shift)) & np.uint64(digit_mask)).astype(np.int64)
        counts = np.bincount(digit, minlength=2048)
        above = 0
        for b in range(2047, -1, -1):
            if counts[b] == 0:
                continue
            bin_mass = int(q[digit == b].sum())
            if above + bin_mass >= wanted:
                passes.append((p, int(counts[b]), int(counts[b + 1:].sum())))
                wanted -= above
                prefix |= b << shift
                mask |= digit_mask << shift
                if counts[b] == 1 or p == 2:
                    return passes, wanted, bin_mass, int(counts[b])
                break
            above += bin_mass
    raise AssertionError("the search ran past the last pass")


def barriers(logits, temperature, top_p, r):
    keys, mass = order_keys(logits), masses(logits, temperature)
    total = int(mass.sum())
    if top_p >= 1:
        # The kernel skips select 1 here: S = Z, and select 2 starts on the first histogram.
        first, kept = [], total
    else:
        p = int(np.float32(top_p) * np.float32(2.0**32))
        cut = max((total >> 32) * p + (((total & 0xFFFFFFFF) * p + 0xFFFFFFFF) >> 32), 1)
        first, want, bin_mass, count = select(keys, mass, cut)
        q = bin_mass // count
        kept = cut - want + -(-want // q) * q
    pick = (kept >> 32) * r + (((kept & 0xFFFFFFFF) * r) >> 32) + 1
    second, _, _, ties = select(keys, mass, pick)
    # The maximum, the first pass's histogram (shared by the selects), each later pass of
    # either select, the ties.
    return first, second, 1 + 1 + max(len(first) - 1, 0) + len(second) - 1 + (1 if ties > 1 else 0)


def main():
    rng = np.random.default_rng(0x5A3B1E)
    normal = (3.0 * rng.standard_normal(VOCAB)).astype(np.float32)
    flat = (0.05 * rng.standard_normal(VOCAB)).astype(np.float32)
    tied = (np.round(normal * 0.5) * 2.0).astype(np.float32)
    for name, logits in [("normal(0, 3)", normal), ("flat", flat), ("tied levels", tied)]:
        for temperature, top_p in [(0.7, 0.9), (1.0, 1.0)]:
            for r in [0x12345678, 0x9ABCDEF0, 0x40000000]:
                first, second, n = barriers(logits, temperature, top_p, r)
                print(f"{name}, T {temperature}, top_p {top_p}, r {r:#010x}: select 1 {first}, "
                      f"select 2 {second}: {n} barriers")


if __name__ == "__main__":
    main()
