//! The Gated Residual read ("hyper-connection" mix) in two launches, with the previous block's
//! write (`hc_post`, `X_s += ω_s · y`) folded into its reading of the residual streams.
//!
//! Launch 1 ([`mix_down_bf16`], [`mix_down_nvfp4`]) is a split-K GEMV over the n·d inputs of
//! `[W_down; W_inj]`, every SM streaming its share; its last block reduces the splits into u and
//! ω. Launch 2 ([`mix_up_bf16`], [`mix_up_nvfp4`]) is the r → n·d GEMV with the gate, the stream
//! mean and the write-back of the updated streams in its epilogue. The per-stream RMS scale is a
//! factor of each stream's part of a dot product, so launch 1 sums `W·(X ⊙ (1 + w))` per stream
//! slice and applies the scale once, in the reduction: no block needs a whole stream.
//!
//! The residual streams are bf16, as the reference model stores them: the write is
//! `X_s ← bf16(fma(ω_s, y, X_s))`, computed identically (one f32 fma, one rounding) by every
//! thread that reads X, and stored once, by the launch-2 lane that owns the element.

use kernel_macros::kernel;

/// Launch 1 of a mix site: `partial[split, row] = Σ_{k in split} P[row, k] · X'[k] · (1 + w[k])`
/// for the stacked projection P = `[W_down; W_inj]` [rank + inject, n·d] (bf16), where
/// `X' = bf16(fma(gains_prev[s], y, X_s))` when `post` (the previous block's write) and X otherwise.
///
/// Each warp owns ROWS consecutive rows; blockIdx.y takes one of K_SPLIT column slices, each inside
/// one stream (K_SPLIT is a multiple of n), so that every SM streams weights. Lanes take 8 columns
/// (16 bytes of every row) per step, UNROLL steps in flight, and turn X, y and the norm weight into
/// f32 once for all ROWS rows. Block 0's warp 0 also sums X'² over its slice (`sum_sq[split]`).
///
/// The last block to finish (a counter in `counter[0]`, zero before the first launch and put back
/// to zero) adds the partials in split order, each times the RMS scale of its stream
/// `rsqrt(Σ X'² / d + eps)` (the stream's `sum_sq` added in split order): `u = SiLU(v / n)` for the W_down rows, `gains = 2σ(v / n)` for
/// the W_inj rows, and the scales themselves for launch 2. A fixed order throughout: the same bits
/// on every run, and graph replays find the counter as the first launch did.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rank + inject, WARPS * ROWS), K_SPLIT),
    require(
        K_SPLIT % n == 0,
        (n * d) % (K_SPLIT * 8) == 0,
        32 * WARPS >= K_SPLIT,
        rank % ROWS == 0,
        inject % ROWS == 0,
    ),
)]
pub fn mix_down_bf16(
    #[tile(default = 4, candidates = [2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 16, candidates = [4, 8, 16])] K_SPLIT: u32,
    #[tile(default = 4, candidates = [2, 4])] UNROLL: u32,
    residual: &[bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    proj: &[bf16],
    partial: &mut [f32],
    sum_sq: &mut [f32],
    counter: &mut [u32],
    u: &mut [f32],
    gains: &mut [f32],
    scale: &mut [f32],
    n: u32,
    d: u32,
    rank: u32,
    inject: u32,
    post: bool,
    eps: f32,
) {
    let split = block_idx_y();
    let rows = rank + inject;
    let cols = n * d;
    let k_len = cols / K_SPLIT;
    let k_begin = split * k_len;
    let stream = k_begin / d;
    let omega = if post { gains_prev[stream] } else { 0.0 };
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    // Whole warps past the last row still take part in the block's barriers below.
    let active = row0 < rows;

    let mut acc = [0.0; ROWS];
    let mut sq = 0.0;
    let end = k_begin + k_len;
    if active {
        for k0 in (k_begin + lane_id() * 8..end).step_by(256 * UNROLL) {
            // The weights of UNROLL steps first: ROWS·UNROLL 16-byte loads in flight per lane.
            let mut wbuf = [u32x4(0, 0, 0, 0); ROWS * UNROLL];
            #[unroll]
            for t in 0..UNROLL {
                let k = k0 + t * 256;
                if k < end {
                    #[unroll]
                    for r in 0..ROWS {
                        wbuf[t * ROWS + r] = load_stream::<u32x4>(proj, (row0 + r) * cols + k);
                    }
                }
            }
            #[unroll]
            for t in 0..UNROLL {
                let k = k0 + t * 256;
                if k < end {
                    let xv = load_vec::<u32x4>(residual, k);
                    let mut x0 = bf16x2_to_f32x2(xv.x);
                    let mut x1 = bf16x2_to_f32x2(xv.y);
                    let mut x2 = bf16x2_to_f32x2(xv.z);
                    let mut x3 = bf16x2_to_f32x2(xv.w);
                    if post {
                        // The previous block's write, rounded to bf16 as the streams are stored.
                        let yv = load_vec::<u32x4>(y, k - stream * d);
                        let (y0, y1) = (bf16x2_to_f32x2(yv.x), bf16x2_to_f32x2(yv.y));
                        let (y2, y3) = (bf16x2_to_f32x2(yv.z), bf16x2_to_f32x2(yv.w));
                        x0 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y0.x, x0.x), fma(omega, y0.y, x0.y)));
                        x1 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y1.x, x1.x), fma(omega, y1.y, x1.y)));
                        x2 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y2.x, x2.x), fma(omega, y2.y, x2.y)));
                        x3 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y3.x, x3.x), fma(omega, y3.y, x3.y)));
                    }
                    sq += x0.x * x0.x + x0.y * x0.y + x1.x * x1.x + x1.y * x1.y;
                    sq += x2.x * x2.x + x2.y * x2.y + x3.x * x3.x + x3.y * x3.y;
                    // X ⊙ (1 + w): the normed input without its per-stream scale.
                    let wv = load_vec::<u32x4>(norm, k);
                    let (w0, w1) = (bf16x2_to_f32x2(wv.x), bf16x2_to_f32x2(wv.y));
                    let (w2, w3) = (bf16x2_to_f32x2(wv.z), bf16x2_to_f32x2(wv.w));
                    let (h0, h1) = (x0.x * (1.0 + w0.x), x0.y * (1.0 + w0.y));
                    let (h2, h3) = (x1.x * (1.0 + w1.x), x1.y * (1.0 + w1.y));
                    let (h4, h5) = (x2.x * (1.0 + w2.x), x2.y * (1.0 + w2.y));
                    let (h6, h7) = (x3.x * (1.0 + w3.x), x3.y * (1.0 + w3.y));
                    #[unroll]
                    for r in 0..ROWS {
                        let pv = wbuf[t * ROWS + r];
                        let (p0, p1) = (bf16x2_to_f32x2(pv.x), bf16x2_to_f32x2(pv.y));
                        let (p2, p3) = (bf16x2_to_f32x2(pv.z), bf16x2_to_f32x2(pv.w));
                        let mut s = acc[r];
                        s = fma(p0.x, h0, s);
                        s = fma(p0.y, h1, s);
                        s = fma(p1.x, h2, s);
                        s = fma(p1.y, h3, s);
                        s = fma(p2.x, h4, s);
                        s = fma(p2.y, h5, s);
                        s = fma(p3.x, h6, s);
                        acc[r] = fma(p3.y, h7, s);
                    }
                }
            }
        }
    }
    #[unroll]
    for r in 0..ROWS {
        acc[r] = warp_sum(acc[r]);
    }
    let sq_total = warp_sum(sq);
    if active && lane_id() == 0 {
        #[unroll]
        for r in 0..ROWS {
            partial[split * rows + row0 + r] = acc[r];
        }
    }
    if block_idx() == 0 && thread_idx() == 0 {
        sum_sq[split] = sq_total;
    }

    // Publish the partials before counting this block in; the last one reduces.
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        let arrived = atomic_add(counter, 0, 1);
        last[0] = if arrived == grid_dim() * grid_dim_y() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 1 {
        // Each split's RMS scale: that of its stream, from the stream's Σ X'² (split order).
        let per_stream = K_SPLIT / n;
        let factor = shared::<f32, K_SPLIT>();
        if thread_idx() < K_SPLIT {
            let first = thread_idx() / per_stream * per_stream;
            let mut ss = 0.0;
            for i in 0..per_stream {
                ss += load_cg(sum_sq, first + i);
            }
            factor[thread_idx()] = rsqrt(ss / d as f32 + eps);
        }
        sync_threads();
        // A row's K_SPLIT loads are independent (the loop unrolls): one trip to L2 per two rows.
        #[unroll(2)]
        for row in (thread_idx()..rows).step_by(32 * WARPS) {
            let mut v = 0.0;
            #[unroll]
            for j in 0..K_SPLIT {
                v += load_cg(partial, j * rows + row) * factor[j];
            }
            v = v / n as f32;
            if row < rank {
                u[row] = silu(v);
            } else {
                gains[row - rank] = 2.0 * sigmoid(v);
            }
        }
        if thread_idx() < n {
            scale[thread_idx()] = factor[thread_idx() * per_stream];
        }
        if thread_idx() == 0 {
            counter[0] = 0;
        }
    }
}

/// Launch 2 of a mix site: `G = σ(W_up · u)` (W_up bf16 [n·d, rank], u f32 [rank]) and
/// `x[j] = (1/n) Σ_s G[s·d + j] · X'[s·d + j] · scale[s] · (1 + w[s·d + j])`, written in bf16.
/// When `post`, X' = bf16(fma(gains_prev[s], y[j], X)) is also stored back into `residual`.
///
/// A group of LANES lanes takes one row of W_up (lanes stream 8 weights, 16 bytes, per step); the
/// n rows of one column j are n adjacent groups of one warp, so the stream mean is a butterfly
/// over the groups, in a fixed order. Each element of the streams is read and written by its own
/// group only, and written after the warp's last shuffle, when every lane has read it.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(n * d, WARPS * (32 / LANES)),
    require(32 % (n * LANES) == 0, rank % (8 * LANES) == 0),
)]
pub fn mix_up_bf16(
    #[tile(default = 8, candidates = [2, 4, 8])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 8, candidates = [2, 4, 8])] UNROLL: u32,
    residual: &mut [bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    up: &[bf16],
    u: &[f32],
    scale: &[f32],
    x: &mut [bf16],
    n: u32,
    d: u32,
    rank: u32,
    post: bool,
) {
    let group = (block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES;
    let lane = lane_id() % LANES;
    let j = group / n;
    let s = group % n;
    let row = s * d + j;
    let active = j < d;

    // The epilogue's inputs first, so that their loads overlap the weights'.
    let mut stream_value = 0.0;
    let mut norm_scale = 0.0;
    if active {
        stream_value = residual[row] as f32;
        if post {
            stream_value = (fma(gains_prev[s], y[j] as f32, stream_value) as bf16) as f32;
        }
        norm_scale = scale[s] * (1.0 + norm[row] as f32);
    }

    let mut acc = 0.0;
    if active {
        for c0 in (lane * 8..rank).step_by(8 * LANES * UNROLL) {
            // The weights of UNROLL steps first: UNROLL 16-byte loads in flight per lane.
            let mut wbuf = [u32x4(0, 0, 0, 0); UNROLL];
            #[unroll]
            for t in 0..UNROLL {
                let c = c0 + t * 8 * LANES;
                if c < rank {
                    wbuf[t] = load_stream::<u32x4>(up, row * rank + c);
                }
            }
            #[unroll]
            for t in 0..UNROLL {
                let c = c0 + t * 8 * LANES;
                if c < rank {
                    let wv = wbuf[t];
                    let ua = load_vec::<f32x4>(u, c);
                    let ub = load_vec::<f32x4>(u, c + 4);
                    let (a0, a1) = (bf16x2_to_f32x2(wv.x), bf16x2_to_f32x2(wv.y));
                    let (a2, a3) = (bf16x2_to_f32x2(wv.z), bf16x2_to_f32x2(wv.w));
                    acc = fma(a0.x, ua.x, acc);
                    acc = fma(a0.y, ua.y, acc);
                    acc = fma(a1.x, ua.z, acc);
                    acc = fma(a1.y, ua.w, acc);
                    acc = fma(a2.x, ub.x, acc);
                    acc = fma(a2.y, ub.y, acc);
                    acc = fma(a3.x, ub.z, acc);
                    acc = fma(a3.y, ub.w, acc);
                }
            }
        }
    }
    // The row's dot product over its LANES lanes (offsets below LANES stay inside the group).
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < LANES {
            acc += shfl_xor(acc, offset);
        }
    }

    let mut term = 0.0;
    if active {
        term = sigmoid(acc) * (stream_value * norm_scale);
    }
    // Σ over the n groups of column j: adjacent groups, offsets LANES .. n·LANES/2 (n is a power of
    // two and n·LANES divides 32, so the sum stays inside the column's lanes; the same on every
    // lane of the warp, so every lane takes part in every shuffle).
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset >= LANES && offset < n * LANES {
            term += shfl_xor(term, offset);
        }
    }
    if active && lane == 0 {
        if post {
            residual[row] = stream_value as bf16;
        }
        if s == 0 {
            x[j] = (term / n as f32) as bf16;
        }
    }
}

/// Launch 1 with NVFP4 weights: the same partial sums and reduction as [`mix_down_bf16`], the
/// stacked projection in ModelOpt's layout (`packed` [rank + inject, n·d / 2], `scales` e4m3
/// [rank + inject, n·d / 16]; W_down and W_inj quantised apart, their global scales in
/// `scale2[0]` and `scale2[1]`).
///
/// Lanes take 16 columns (8 bytes of codes and one block scale per row) per step; the codes and
/// scales of UNROLL steps are loaded before any is used. The codes decode to f32 and meet f32
/// activations: the only rounding besides the f32 sums is the weights' own.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rank + inject, WARPS * ROWS), K_SPLIT),
    require(
        K_SPLIT % n == 0,
        (n * d) % (K_SPLIT * 16) == 0,
        32 * WARPS >= K_SPLIT,
        rank % ROWS == 0,
        inject % ROWS == 0,
    ),
)]
pub fn mix_down_nvfp4(
    #[tile(default = 4, candidates = [2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 8, candidates = [4, 8, 16])] K_SPLIT: u32,
    #[tile(default = 4, candidates = [2, 4])] UNROLL: u32,
    residual: &[bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    partial: &mut [f32],
    sum_sq: &mut [f32],
    counter: &mut [u32],
    u: &mut [f32],
    gains: &mut [f32],
    scale: &mut [f32],
    n: u32,
    d: u32,
    rank: u32,
    inject: u32,
    post: bool,
    eps: f32,
) {
    let split = block_idx_y();
    let rows = rank + inject;
    let cols = n * d;
    let k_len = cols / K_SPLIT;
    let k_begin = split * k_len;
    let stream = k_begin / d;
    let omega = if post { gains_prev[stream] } else { 0.0 };
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    let active = row0 < rows;

    let mut acc = [0.0; ROWS];
    let mut sq = 0.0;
    let end = k_begin + k_len;
    if active {
        for k0 in (k_begin + lane_id() * 16..end).step_by(512 * UNROLL) {
            // Codes and block scales of UNROLL steps first.
            let mut wbuf = [u32x2(0, 0); ROWS * UNROLL];
            let mut sbuf = [0.0; ROWS * UNROLL];
            #[unroll]
            for t in 0..UNROLL {
                let k = k0 + t * 512;
                if k < end {
                    #[unroll]
                    for r in 0..ROWS {
                        let v = (row0 + r) * cols + k;
                        wbuf[t * ROWS + r] = load_stream::<u32x2>(packed, v / 2);
                        sbuf[t * ROWS + r] = scales[v / 16] as f32;
                    }
                }
            }
            #[unroll]
            for t in 0..UNROLL {
                let k = k0 + t * 512;
                if k < end {
                    // The 16 inputs X' ⊙ (1 + w), two halves of 8.
                    let mut h = [0.0; 16];
                    #[unroll]
                    for half in 0..2 {
                        let kk = k + half * 8;
                        let xv = load_vec::<u32x4>(residual, kk);
                        let mut x0 = bf16x2_to_f32x2(xv.x);
                        let mut x1 = bf16x2_to_f32x2(xv.y);
                        let mut x2 = bf16x2_to_f32x2(xv.z);
                        let mut x3 = bf16x2_to_f32x2(xv.w);
                        if post {
                            let yv = load_vec::<u32x4>(y, kk - stream * d);
                            let (y0, y1) = (bf16x2_to_f32x2(yv.x), bf16x2_to_f32x2(yv.y));
                            let (y2, y3) = (bf16x2_to_f32x2(yv.z), bf16x2_to_f32x2(yv.w));
                            x0 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y0.x, x0.x), fma(omega, y0.y, x0.y)));
                            x1 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y1.x, x1.x), fma(omega, y1.y, x1.y)));
                            x2 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y2.x, x2.x), fma(omega, y2.y, x2.y)));
                            x3 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y3.x, x3.x), fma(omega, y3.y, x3.y)));
                        }
                        sq += x0.x * x0.x + x0.y * x0.y + x1.x * x1.x + x1.y * x1.y;
                        sq += x2.x * x2.x + x2.y * x2.y + x3.x * x3.x + x3.y * x3.y;
                        let wv = load_vec::<u32x4>(norm, kk);
                        let (w0, w1) = (bf16x2_to_f32x2(wv.x), bf16x2_to_f32x2(wv.y));
                        let (w2, w3) = (bf16x2_to_f32x2(wv.z), bf16x2_to_f32x2(wv.w));
                        h[half * 8] = x0.x * (1.0 + w0.x);
                        h[half * 8 + 1] = x0.y * (1.0 + w0.y);
                        h[half * 8 + 2] = x1.x * (1.0 + w1.x);
                        h[half * 8 + 3] = x1.y * (1.0 + w1.y);
                        h[half * 8 + 4] = x2.x * (1.0 + w2.x);
                        h[half * 8 + 5] = x2.y * (1.0 + w2.y);
                        h[half * 8 + 6] = x3.x * (1.0 + w3.x);
                        h[half * 8 + 7] = x3.y * (1.0 + w3.y);
                    }
                    #[unroll]
                    for r in 0..ROWS {
                        let wv = wbuf[t * ROWS + r];
                        let (f0, f1) = (e2m1x4_to_f32x4(wv.x), e2m1x4_to_f32x4(wv.x >> 16));
                        let (f2, f3) = (e2m1x4_to_f32x4(wv.y), e2m1x4_to_f32x4(wv.y >> 16));
                        let mut s = f0.x * h[0];
                        s = fma(f0.y, h[1], s);
                        s = fma(f0.z, h[2], s);
                        s = fma(f0.w, h[3], s);
                        s = fma(f1.x, h[4], s);
                        s = fma(f1.y, h[5], s);
                        s = fma(f1.z, h[6], s);
                        s = fma(f1.w, h[7], s);
                        s = fma(f2.x, h[8], s);
                        s = fma(f2.y, h[9], s);
                        s = fma(f2.z, h[10], s);
                        s = fma(f2.w, h[11], s);
                        s = fma(f3.x, h[12], s);
                        s = fma(f3.y, h[13], s);
                        s = fma(f3.z, h[14], s);
                        s = fma(f3.w, h[15], s);
                        acc[r] = fma(s, sbuf[t * ROWS + r], acc[r]);
                    }
                }
            }
        }
    }
    #[unroll]
    for r in 0..ROWS {
        acc[r] = warp_sum(acc[r]);
    }
    let sq_total = warp_sum(sq);
    if active && lane_id() == 0 {
        // The matrix's global scale: W_down's rows first, then W_inj's (rank % ROWS == 0).
        let global = if row0 < rank { scale2[0] } else { scale2[1] };
        #[unroll]
        for r in 0..ROWS {
            partial[split * rows + row0 + r] = acc[r] * global;
        }
    }
    if block_idx() == 0 && thread_idx() == 0 {
        sum_sq[split] = sq_total;
    }

    // Publish the partials before counting this block in; the last one reduces.
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        let arrived = atomic_add(counter, 0, 1);
        last[0] = if arrived == grid_dim() * grid_dim_y() - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 1 {
        let per_stream = K_SPLIT / n;
        let factor = shared::<f32, K_SPLIT>();
        if thread_idx() < K_SPLIT {
            let first = thread_idx() / per_stream * per_stream;
            let mut ss = 0.0;
            for i in 0..per_stream {
                ss += load_cg(sum_sq, first + i);
            }
            factor[thread_idx()] = rsqrt(ss / d as f32 + eps);
        }
        sync_threads();
        #[unroll(2)]
        for row in (thread_idx()..rows).step_by(32 * WARPS) {
            let mut v = 0.0;
            #[unroll]
            for j in 0..K_SPLIT {
                v += load_cg(partial, j * rows + row) * factor[j];
            }
            v = v / n as f32;
            if row < rank {
                u[row] = silu(v);
            } else {
                gains[row - rank] = 2.0 * sigmoid(v);
            }
        }
        if thread_idx() < n {
            scale[thread_idx()] = factor[thread_idx() * per_stream];
        }
        if thread_idx() == 0 {
            counter[0] = 0;
        }
    }
}

/// Launch 2 with NVFP4 weights: as [`mix_up_bf16`], W_up in ModelOpt's layout (`packed`
/// [n·d, rank / 2], `scales` e4m3 [n·d, rank / 16], its global scale in `scale2[2]`). Lanes take
/// 16 values (8 bytes of codes and one block scale) per step.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(n * d, WARPS * (32 / LANES)),
    require(32 % (n * LANES) == 0, rank % (16 * LANES) == 0),
)]
pub fn mix_up_nvfp4(
    #[tile(default = 4, candidates = [2, 4])] LANES: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 8, candidates = [2, 4, 8])] UNROLL: u32,
    residual: &mut [bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
    u: &[f32],
    scale: &[f32],
    x: &mut [bf16],
    n: u32,
    d: u32,
    rank: u32,
    post: bool,
) {
    let group = (block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES;
    let lane = lane_id() % LANES;
    let j = group / n;
    let s = group % n;
    let row = s * d + j;
    let active = j < d;

    let mut stream_value = 0.0;
    let mut norm_scale = 0.0;
    if active {
        stream_value = residual[row] as f32;
        if post {
            stream_value = (fma(gains_prev[s], y[j] as f32, stream_value) as bf16) as f32;
        }
        norm_scale = scale[s] * (1.0 + norm[row] as f32);
    }

    let mut acc = 0.0;
    if active {
        for c0 in (lane * 16..rank).step_by(16 * LANES * UNROLL) {
            let mut wbuf = [u32x2(0, 0); UNROLL];
            let mut sbuf = [0.0; UNROLL];
            #[unroll]
            for t in 0..UNROLL {
                let c = c0 + t * 16 * LANES;
                if c < rank {
                    let v = row * rank + c;
                    wbuf[t] = load_stream::<u32x2>(packed, v / 2);
                    sbuf[t] = scales[v / 16] as f32;
                }
            }
            #[unroll]
            for t in 0..UNROLL {
                let c = c0 + t * 16 * LANES;
                if c < rank {
                    let wv = wbuf[t];
                    let (f0, f1) = (e2m1x4_to_f32x4(wv.x), e2m1x4_to_f32x4(wv.x >> 16));
                    let (f2, f3) = (e2m1x4_to_f32x4(wv.y), e2m1x4_to_f32x4(wv.y >> 16));
                    let (u0, u1) = (load_vec::<f32x4>(u, c), load_vec::<f32x4>(u, c + 4));
                    let (u2, u3) = (load_vec::<f32x4>(u, c + 8), load_vec::<f32x4>(u, c + 12));
                    let mut b = f0.x * u0.x;
                    b = fma(f0.y, u0.y, b);
                    b = fma(f0.z, u0.z, b);
                    b = fma(f0.w, u0.w, b);
                    b = fma(f1.x, u1.x, b);
                    b = fma(f1.y, u1.y, b);
                    b = fma(f1.z, u1.z, b);
                    b = fma(f1.w, u1.w, b);
                    b = fma(f2.x, u2.x, b);
                    b = fma(f2.y, u2.y, b);
                    b = fma(f2.z, u2.z, b);
                    b = fma(f2.w, u2.w, b);
                    b = fma(f3.x, u3.x, b);
                    b = fma(f3.y, u3.y, b);
                    b = fma(f3.z, u3.z, b);
                    b = fma(f3.w, u3.w, b);
                    acc = fma(b, sbuf[t], acc);
                }
            }
        }
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < LANES {
            acc += shfl_xor(acc, offset);
        }
    }

    let mut term = 0.0;
    if active {
        term = sigmoid(acc * scale2[2]) * (stream_value * norm_scale);
    }
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset >= LANES && offset < n * LANES {
            term += shfl_xor(term, offset);
        }
    }
    if active && lane == 0 {
        if post {
            residual[row] = stream_value as bf16;
        }
        if s == 0 {
            x[j] = (term / n as f32) as bf16;
        }
    }
}
