//! The PLE block after its projections: grouped zero-centred norms of the key and the streams,
//! the per-stream gate, the norm of the gated value, the dilated causal depthwise conv with its
//! state, and the sum into the residual streams. One launch.

use kernel_macros::kernel;

/// For each stream s (d channels each), from `proj` = [key (n·d) | value (d)] (the two
/// projections of the gathered rows) and the residual streams x [n·d] (bf16, as the step keeps
/// them):
///
/// - with `post`, the previous block's write first, as the mix sites do it: x_c ←
///   bf16(fma(ω_s, y_i, x_c)) (`y` [d], `gains_prev` [n]); PLE's layer is where that write lands
///   when the layer has PLE, so the mix site after it takes no post;
/// - a_s = ⟨ZC(key_s; norm_key), ZC(x_s; norm_query)⟩ / √d, g_s = σ(sign(a_s)·√max(|a_s|, 1e-6))
///   (g_s = ½ when a_s = 0),
/// - gated_s = g_s · value, normed_s = ZC(gated_s; norm_conv),
/// - conv_c = w[c, K−1]·normed_c + Σ_{j<K−1} w[c, j]·state[depth − dilation·(K−1−j), c],
/// - `streams_out`_c = bf16(x_c + gated_c + SiLU(conv_c)), and the state shifts by one, normed
///   last.
///
/// `conv_state` [depth = (K−1)·dilation, n·d] holds the previous normed values, oldest first.
/// Sums in f32; the ZC norms and the gate as `reference::ple` computes them.
///
/// Grid (n, SPLIT): every block reduces its stream's whole key, query and value (a few KB, read
/// by SPLIT blocks at once from L2) for the gate and the norm scales, then takes d / SPLIT
/// channels for the conv, the state and the output, so that the state's 9 rows spread over
/// n·SPLIT SMs. Each channel is one thread's alone: the state needs no barrier. `streams_out`
/// must not overlap `streams_in`: every block reads its whole stream while the others write.
/// The state's rows a thread shifts live in registers between their loads and stores, 16 at
/// most: the state holds at most 17 rows (the published one 9).
#[kernel(
    block = 32 * WARPS,
    grid = (streams, SPLIT),
    require(d % SPLIT == 0, kernel_size >= 2, (kernel_size - 1) * dilation <= 17),
)]
pub fn ple_gate_conv(
    #[tile(default = 8, candidates = [4, 8])] WARPS: u32,
    #[tile(default = 4, candidates = [1, 4, 8])] SPLIT: u32,
    proj: &[bf16],
    streams_in: &[bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm_key: &[bf16],
    norm_query: &[bf16],
    norm_conv: &[bf16],
    conv_w: &[bf16],
    conv_state: &mut [f32],
    streams_out: &mut [bf16],
    streams: u32,
    d: u32,
    kernel_size: u32,
    dilation: u32,
    eps: f32,
    post: bool,
) {
    let scratch = shared::<f32, WARPS>();
    let s = block_idx();
    let nd = streams * d;
    let base = s * d;
    let omega = if post { gains_prev[s] } else { 0.0 };

    let mut kk = 0.0;
    let mut qq = 0.0;
    let mut kq = 0.0;
    let mut vv = 0.0;
    for i in (thread_idx()..d).step_by(block_dim()) {
        let k = proj[base + i] as f32;
        let q = if post {
            (fma(omega, y[i] as f32, streams_in[base + i] as f32) as bf16) as f32
        } else {
            streams_in[base + i] as f32
        };
        let v = proj[nd + i] as f32;
        kk += k * k;
        qq += q * q;
        kq += k * (1.0 + norm_key[base + i] as f32) * (q * (1.0 + norm_query[base + i] as f32));
        vv += v * v;
    }
    let kk = block_sum(kk, scratch);
    let qq = block_sum(qq, scratch);
    let kq = block_sum(kq, scratch);
    let vv = block_sum(vv, scratch);
    let len = d as f32;
    let a = rsqrt(kk / len + eps) * rsqrt(qq / len + eps) * kq / sqrt(len);
    let root = if a > 0.0 {
        sqrt(max(a, 0.000001))
    } else if a < 0.0 {
        -sqrt(max(-a, 0.000001))
    } else {
        0.0
    };
    let g = sigmoid(root);
    let conv_scale = rsqrt(g * g * vv / len + eps);

    let depth = (kernel_size - 1) * dilation;
    let slice = d / SPLIT;
    let begin = block_idx_y() * slice;
    for i in (begin + thread_idx()..begin + slice).step_by(block_dim()) {
        let c = base + i;
        // The rows that shift, all loaded before anything is stored: the store of row t and the
        // load of row t + 2 are `nd` elements apart in the same buffer, `nd` known only at run
        // time, so the compiler keeps them in order, and a shift written as load, store, load, ...
        // waits a memory round trip per row (23.7 µs a launch on the H200 for a 9-row state).
        let mut kept = [0.0; 16];
        #[unroll]
        for t in 0..16 {
            if t + 1 < depth {
                kept[t] = conv_state[(t + 1) * nd + c];
            }
        }
        let gated = g * (proj[nd + i] as f32);
        let normed = gated * conv_scale * (1.0 + norm_conv[c] as f32);
        let mut acc = (conv_w[c * kernel_size + kernel_size - 1] as f32) * normed;
        for j in 0..kernel_size - 1 {
            let back = dilation * (kernel_size - 1 - j);
            acc += (conv_w[c * kernel_size + j] as f32) * conv_state[(depth - back) * nd + c];
        }
        let x =
            if post { (fma(omega, y[i] as f32, streams_in[c] as f32) as bf16) as f32 } else { streams_in[c] as f32 };
        streams_out[c] = (x + (gated + silu(acc))) as bf16;
        #[unroll]
        for t in 0..16 {
            if t + 1 < depth {
                conv_state[t * nd + c] = kept[t];
            }
        }
        conv_state[(depth - 1) * nd + c] = normed;
    }
}
