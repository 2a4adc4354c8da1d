//! QSA's per-token preparation after the projections: norms, RoPE, the cache appends, and the
//! indexer's pooled key of a block that completes.

use kernel_macros::kernel;

/// From `proj`, the output of the stacked projection GEMV [q_proj; k_proj; v_proj; index_qk_proj]
/// (bf16: per query head D query values then D gate values, then the key heads, the value
/// heads, the index query heads and the index key), for the token at p = position[0]:
///
/// ```text
/// q_h       = RoPE_p(ZC(q_h; q_norm))               → q [q_heads, head_dim] f32
/// gate_h                                            → gate [q_heads, head_dim] f32
/// k_j       = RoPE_p(ZC(k_j; k_norm))               → k_cache[p] [kv_heads, head_dim] bf16
/// v_j                                               → v_cache[p] bf16
/// iq_j      = RoPE_p(ZC(iq_j; index_q_norm))        → index_q [index_heads, index_dim] f32
/// k_raw                                             → index_keys[p] [index_dim] f32
/// if (p + 1) % c == 0, b = p / c:
///   K̄_b = RoPE_{c·b}(ZC(mean of index_keys[c·b .. c·b + c]; index_k_norm)) → block_keys[b]
/// ```
///
/// ZC(x; w) = x · rsqrt(mean x² + eps) · (1 + w); RoPE rotates pairs (i, i + rotary/2) of the
/// first `rotary` dimensions with the cosines and sines of `rope` [positions, rotary/2, 2], the
/// table `reference::rope::Rope::table` computes at load. Each pooled key is computed once, by
/// the token that completes its block.
///
/// One block per vector: the query heads, the key heads, one for the values, the index query
/// heads, and one for the index key. A block stages its vector times (1 + w) in shared memory
/// (f32), sums the squares with a block reduction (fixed order), rotates and scales.
#[kernel(
    block = 32 * WARPS,
    grid = q_heads + kv_heads + 1 + index_heads + 1,
    require(
        head_dim <= 256,
        index_dim <= 256,
        rotary % 2 == 0,
        rotary <= head_dim,
        rotary <= index_dim,
        block_tokens >= 1,
    ),
)]
pub fn qsa_prepare(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    proj: &[bf16],
    q_norm: &[bf16],
    k_norm: &[bf16],
    index_q_norm: &[bf16],
    index_k_norm: &[bf16],
    rope: &[f32],
    position: &[u32],
    q: &mut [f32],
    gate: &mut [f32],
    k_cache: &mut [bf16],
    v_cache: &mut [bf16],
    index_q: &mut [f32],
    index_keys: &mut [f32],
    block_keys: &mut [f32],
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    index_heads: u32,
    index_dim: u32,
    rotary: u32,
    block_tokens: u32,
    eps: f32,
) {
    // Launched to overlap its predecessor (programmatic dependent launch). Before the wait, only
    // what no kernel writes: the position (the host's copy precedes the step) and, from it, this
    // thread's cosines and sines of the rotation (`rope`, a table made at load), so that after
    // the wait the only loads are the vector's, its norm weights' and a query head's gate values,
    // all of a thread's elements issued before any is used: one round trip (it was one an element
    // while each element's uses followed its own loads, and the weights and the rotation each
    // added one after a barrier before that).
    let buf = shared::<f32, 256>();
    let scratch = shared::<f32, WARPS>();
    let threads = 32 * WARPS;
    /// The elements a thread holds: at most 256 (the longest head) over the block, rounded up.
    const PER_THREAD: u32 = (256 + 32 * WARPS - 1) / (32 * WARPS);
    let pos = load_cg(position, 0);
    let b = block_idx();
    let tid = thread_idx();
    let k_base = q_heads * 2 * head_dim;
    let v_base = k_base + kv_heads * head_dim;
    let iq_base = v_base + kv_heads * head_dim;
    let ik_base = iq_base + index_heads * index_dim;
    let values = b == q_heads + kv_heads;
    // 0: a query head, 1: a key head, 2: an index query head, 3: the index key.
    let kind = if b < q_heads {
        0
    } else if b < q_heads + kv_heads {
        1
    } else if b < q_heads + kv_heads + 1 + index_heads {
        2
    } else {
        3
    };
    let head = if kind == 0 {
        b
    } else if kind == 1 {
        b - q_heads
    } else if kind == 2 {
        b - q_heads - kv_heads - 1
    } else {
        0
    };
    let len = if kind < 2 { head_dim } else { index_dim };
    let src = if kind == 0 {
        head * 2 * head_dim
    } else if kind == 1 {
        k_base + head * head_dim
    } else if kind == 2 {
        iq_base + head * index_dim
    } else {
        ik_base
    };
    let block = pos / block_tokens;
    // RoPE: element i < rotary/2 pairs with i + rotary/2; the pooled key rotates at its block's
    // first token. Thread t holds elements t, t + threads, … (PER_THREAD of them at most).
    let half = rotary / 2;
    let at = if kind == 3 { block * block_tokens } else { pos };
    let mut rot = [u32x2(0, 0); PER_THREAD];
    if !values {
        #[unroll]
        for e in 0..PER_THREAD {
            let i = tid + e * threads;
            if i < rotary {
                let j = if i < half { i } else { i - half };
                rot[e] = load_early::<u32x2>(rope, (at * half + j) * 2);
            }
        }
    }
    grid_dependency_wait();
    launch_dependents();

    if values {
        // Four loads a thread before their stores (a store may alias a later load, so a load
        // after it waits): one round trip for the published 2 heads of 256 at 4 warps.
        let count = kv_heads * head_dim;
        for i0 in (tid..count).step_by(4 * threads) {
            let mut vals = [0.0 as bf16; 4];
            #[unroll]
            for t in 0..4 {
                let i = i0 + t * threads;
                if i < count {
                    vals[t] = proj[v_base + i];
                }
            }
            #[unroll]
            for t in 0..4 {
                let i = i0 + t * threads;
                if i < count {
                    v_cache[pos * count + i] = vals[t];
                }
            }
        }
        return;
    }

    // Each thread stages its own elements: x·(1 + w) in shared memory and Σ x² in a register, so
    // the norm weights' loads go out beside the vector's. A query head also takes its gate values
    // now, for the stores at the end.
    let mut sum_sq = 0.0;
    let mut gate_v = [0.0; PER_THREAD];
    if kind == 3 {
        for i in (tid..len).step_by(threads) {
            index_keys[pos * index_dim + i] = proj[src + i] as f32;
        }
        // Nothing more unless this token completes a block (the same for the whole block).
        if (pos + 1) % block_tokens != 0 {
            return;
        }
        #[unroll]
        for e in 0..PER_THREAD {
            let i = tid + e * threads;
            if i < len {
                let mut sum = 0.0;
                for t in 0..block_tokens {
                    sum += index_keys[(block * block_tokens + t) * index_dim + i];
                }
                let x = sum / block_tokens as f32;
                sum_sq += x * x;
                buf[i] = x * (1.0 + index_k_norm[i] as f32);
            }
        }
    } else {
        // Every element's loads first, held raw, then their uses: a use between two elements'
        // loads would end the round trip there.
        let mut xs = [0.0 as bf16; PER_THREAD];
        let mut ws = [0.0 as bf16; PER_THREAD];
        let mut gs = [0.0 as bf16; PER_THREAD];
        #[unroll]
        for e in 0..PER_THREAD {
            let i = tid + e * threads;
            if i < len {
                xs[e] = proj[src + i];
                ws[e] = if kind == 0 {
                    q_norm[i]
                } else if kind == 1 {
                    k_norm[i]
                } else {
                    index_q_norm[i]
                };
                if kind == 0 {
                    gs[e] = proj[src + head_dim + i];
                }
            }
        }
        #[unroll]
        for e in 0..PER_THREAD {
            let i = tid + e * threads;
            if i < len {
                let x = xs[e] as f32;
                gate_v[e] = gs[e] as f32;
                sum_sq += x * x;
                buf[i] = x * (1.0 + ws[e] as f32);
            }
        }
    }
    // The block sum's barriers also publish buf to the whole block.
    let total = block_sum(sum_sq, scratch);
    let scale = rsqrt(total / len as f32 + eps);

    #[unroll]
    for e in 0..PER_THREAD {
        let i = tid + e * threads;
        if i < len {
            let mut out = buf[i];
            if i < rotary {
                let cs = rot[e];
                let (cos_a, sin_a) = (f32_from_bits(cs.x), f32_from_bits(cs.y));
                out = if i < half {
                    buf[i] * cos_a - buf[i + half] * sin_a
                } else {
                    buf[i] * cos_a + buf[i - half] * sin_a
                };
            }
            out = out * scale;
            if kind == 0 {
                q[head * head_dim + i] = out;
                gate[head * head_dim + i] = gate_v[e];
            } else if kind == 1 {
                k_cache[(pos * kv_heads + head) * head_dim + i] = out as bf16;
            } else if kind == 2 {
                index_q[head * index_dim + i] = out;
            } else {
                block_keys[block * index_dim + i] = out;
            }
        }
    }
}
