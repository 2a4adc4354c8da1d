//! The Gated Residual read ("hyper-connection" mix) in two launches, with the previous block's
//! write (`hc_post`, `X_s += ω_s · y`) folded into its reading of the residual streams.
//!
//! Launch 1 ([`mix_down_bf16`], [`mix_down_nvfp4`]) is a split-K GEMV over the n·d inputs of
//! `[W_down; W_inj]`, every SM streaming its share. Launch 2 ([`mix_up_bf16`], [`mix_up_nvfp4`]) is
//! the r → n·d GEMV with the gate, the stream mean and the write-back of the updated streams in
//! its epilogue. The per-stream RMS scale is a factor of each stream's part of a dot product, so
//! launch 1 sums `W·(X ⊙ (1 + w))` per stream slice and applies the scale once per slice: no
//! block needs the whole input (the bf16 launch 1 takes one stream a block).
//!
//! The bf16 pair is built for overlapped launches: each kernel loads all of its weights into
//! registers before its grid dependency wait, while its predecessor still runs, and after the wait
//! does only the math that depends on it; launch 2 adds launch 1's per-stream partials itself (every
//! block needs all of u anyway), so no counter and no last block sit in the chain. The NVFP4 pair
//! is the earlier design: plain launches, launch 1's last block (a counter) reducing the splits
//! into u and ω.
//!
//! The residual streams are bf16, as the reference model stores them: the write is
//! `X_s ← bf16(fma(ω_s, y, X_s))`, computed identically (one f32 fma, one rounding) by every
//! thread that reads X, and stored once, by the launch-2 lane that owns the element.

use kernel_macros::kernel;

/// Launch 1 of a mix site, bf16 weights: `partial[s, row] = scale_s · Σ_{k in stream s} P[row, k]
/// · X'[k] · (1 + w[k])` for the stacked projection P = `[W_down; W_inj]` [rank + inject, n·d],
/// where `X' = bf16(fma(gains_prev[s], y, X_s))` when `post` (the previous block's write) and X
/// otherwise, and `scale_s = rsqrt(Σ X'_s² / d + eps)` is stream s's RMS scale (also stored, in
/// `scale[s]`, for launch 2's epilogue). Launch 2 adds the n partials of a row.
///
/// Built for overlapped launches with the weights in registers: blockIdx.y takes one stream, each
/// warp ROWS rows of it, each lane CHUNKS 16-byte pieces of every row, 256 columns apart. Before
/// the grid dependency wait a block puts `1 + w` of its stream into shared memory and loads all
/// of its weights into registers (both immutable), so the weight stream overlaps the previous
/// kernel's tail. After the wait it reads the stream (from L2, every load in flight at once),
/// stages `X' ⊙ (1 + w)` in shared memory over the `1 + w`, sums Σ X'² over the block (every block
/// of a stream the same sum, in the same order), and does the dot products. No counter and no last
/// block: launch 2 adds the streams' partials.
///
/// A block is a fraction of an SM (the defaults: 160 threads of two rows, one block per SM at the
/// published shape; the candidates hold at most 12,800 weight registers a block, a fifth of an
/// SM's), so that launch 2's blocks are resident beside it and start their own weight stream. Two
/// rows a warp also halve the reads of the staged inputs.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rank + inject, WARPS * ROWS), n),
    require(ROWS * CHUNKS * WARPS <= 100, d % 8 == 0, d <= 256 * CHUNKS),
)]
pub fn mix_down_bf16(
    #[tile(default = 2, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 5, candidates = [5, 10, 20])] WARPS: u32,
    #[tile(default = 10, candidates = [10])] CHUNKS: u32,
    residual: &[bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    proj: &[bf16],
    partial: &mut [f32],
    scale: &mut [f32],
    n: u32,
    d: u32,
    rank: u32,
    inject: u32,
    post: bool,
    eps: f32,
) {
    // The next kernel may start as soon as every block of this one runs: it waits in turn.
    launch_dependents();
    let stream = block_idx_y();
    let rows = rank + inject;
    let cols = n * d;
    let base = stream * d;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;

    // Before the wait, immutable data only. The norm's pieces this thread stages after the wait
    // (8 columns, 256·WARPS apart) are loaded first, then the weights; `1 + w` goes to shared
    // memory, where only this thread reads it back.
    let h = shared::<f32, { 256 * CHUNKS }>();
    let mut nbuf = [u32x4(0, 0, 0, 0); (CHUNKS + WARPS - 1) / WARPS];
    #[unroll]
    for t in 0..(CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            nbuf[t] = load_vec::<u32x4>(norm, base + i);
        }
    }
    let mut wbuf = [u32x4(0, 0, 0, 0); ROWS * CHUNKS];
    #[unroll]
    for c in 0..CHUNKS {
        let k = lane_id() * 8 + c * 256;
        if k < d {
            #[unroll]
            for r in 0..ROWS {
                if row0 + r < rows {
                    wbuf[c * ROWS + r] = load_stream::<u32x4>(proj, (row0 + r) * cols + base + k);
                }
            }
        }
    }
    #[unroll]
    for t in 0..(CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            let wv = nbuf[t];
            let (w0, w1) = (bf16x2_to_f32x2(wv.x), bf16x2_to_f32x2(wv.y));
            let (w2, w3) = (bf16x2_to_f32x2(wv.z), bf16x2_to_f32x2(wv.w));
            store_vec(h, i, f32x4(1.0 + w0.x, 1.0 + w0.y, 1.0 + w1.x, 1.0 + w1.y));
            store_vec(h, i + 4, f32x4(1.0 + w2.x, 1.0 + w2.y, 1.0 + w3.x, 1.0 + w3.y));
        }
    }
    grid_dependency_wait();

    // The stream through the previous block's write: every load first, then X' ⊙ (1 + w) into
    // shared memory and Σ X'².
    let omega = if post { gains_prev[stream] } else { 0.0 };
    let mut xbuf = [u32x4(0, 0, 0, 0); (CHUNKS + WARPS - 1) / WARPS];
    let mut ybuf = [u32x4(0, 0, 0, 0); (CHUNKS + WARPS - 1) / WARPS];
    #[unroll]
    for t in 0..(CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            xbuf[t] = load_vec::<u32x4>(residual, base + i);
            if post {
                ybuf[t] = load_vec::<u32x4>(y, i);
            }
        }
    }
    let scratch = shared::<f32, WARPS>();
    let mut sq = 0.0;
    #[unroll]
    for t in 0..(CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            let xv = xbuf[t];
            let mut x0 = bf16x2_to_f32x2(xv.x);
            let mut x1 = bf16x2_to_f32x2(xv.y);
            let mut x2 = bf16x2_to_f32x2(xv.z);
            let mut x3 = bf16x2_to_f32x2(xv.w);
            if post {
                // The previous block's write, rounded to bf16 as the streams are stored.
                let yv = ybuf[t];
                let (y0, y1) = (bf16x2_to_f32x2(yv.x), bf16x2_to_f32x2(yv.y));
                let (y2, y3) = (bf16x2_to_f32x2(yv.z), bf16x2_to_f32x2(yv.w));
                x0 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y0.x, x0.x), fma(omega, y0.y, x0.y)));
                x1 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y1.x, x1.x), fma(omega, y1.y, x1.y)));
                x2 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y2.x, x2.x), fma(omega, y2.y, x2.y)));
                x3 = bf16x2_to_f32x2(pack_bf16x2(fma(omega, y3.x, x3.x), fma(omega, y3.y, x3.y)));
            }
            sq += x0.x * x0.x + x0.y * x0.y + x1.x * x1.x + x1.y * x1.y;
            sq += x2.x * x2.x + x2.y * x2.y + x3.x * x3.x + x3.y * x3.y;
            let a = load_vec::<f32x4>(h, i);
            let b = load_vec::<f32x4>(h, i + 4);
            store_vec(h, i, f32x4(x0.x * a.x, x0.y * a.y, x1.x * a.z, x1.y * a.w));
            store_vec(h, i + 4, f32x4(x2.x * b.x, x2.y * b.y, x3.x * b.z, x3.y * b.w));
        }
    }
    // The block sum's barriers also publish h to the whole block.
    let factor = rsqrt(block_sum(sq, scratch) / d as f32 + eps);

    let mut acc = [0.0; ROWS];
    #[unroll]
    for c in 0..CHUNKS {
        let k = lane_id() * 8 + c * 256;
        if k < d {
            let ha = load_vec::<f32x4>(h, k);
            let hb = load_vec::<f32x4>(h, k + 4);
            #[unroll]
            for r in 0..ROWS {
                let pv = wbuf[c * ROWS + r];
                let (p0, p1) = (bf16x2_to_f32x2(pv.x), bf16x2_to_f32x2(pv.y));
                let (p2, p3) = (bf16x2_to_f32x2(pv.z), bf16x2_to_f32x2(pv.w));
                let mut s = acc[r];
                s = fma(p0.x, ha.x, s);
                s = fma(p0.y, ha.y, s);
                s = fma(p1.x, ha.z, s);
                s = fma(p1.y, ha.w, s);
                s = fma(p2.x, hb.x, s);
                s = fma(p2.y, hb.y, s);
                s = fma(p3.x, hb.z, s);
                acc[r] = fma(p3.y, hb.w, s);
            }
        }
    }
    #[unroll]
    for r in 0..ROWS {
        acc[r] = warp_sum(acc[r]);
    }
    if lane_id() == 0 {
        #[unroll]
        for r in 0..ROWS {
            if row0 + r < rows {
                partial[stream * rows + row0 + r] = acc[r] * factor;
            }
        }
    }
    if block_idx() == 0 && thread_idx() == 0 {
        scale[stream] = factor;
    }
}

/// Launch 2 of a mix site, bf16 weights: `u = SiLU(Σ_s partial[s] / n)` and the write gains
/// `gains = 2σ(Σ_s partial[s] / n)` (the W_inj rows), then `G = σ(W_up · u)` (W_up [n·d, rank])
/// and `x[j] = (1/n) Σ_s G[s·d + j] · X'[s·d + j] · scale[s] · (1 + w[s·d + j])`, written in bf16.
/// When `post`, X' = bf16(fma(gains_prev[s], y[j], X)) is also stored back into `residual`.
///
/// A group of LANES lanes takes one row of W_up, each lane CHUNKS 16-byte pieces of it; the n rows
/// of one column j are n adjacent groups of one warp, so the stream mean is a butterfly over the
/// groups, in a fixed order. Before the grid dependency wait the block loads its weights and norm
/// values into registers (immutable); after it, every block adds launch 1's partials of all rows
/// (a thread a row or two, the streams in order, from L2) into u in shared memory, block 0 also
/// storing the gains, and the dot products need no more memory than u. Each element of the streams
/// is read and written by its own group only, after the warp's last shuffle.
///
/// A row of the published rank (320 = 8 · LANES · CHUNKS) fills a lane's registers exactly; a
/// block holds at most 12,800 weight registers, as launch 1's do.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(n * d, WARPS * (32 / LANES)),
    require(
        LANES * CHUNKS == 40,
        WARPS * CHUNKS <= 100,
        32 % (n * LANES) == 0,
        rank % (8 * LANES) == 0,
        rank <= 8 * LANES * CHUNKS,
        rank + inject <= 64 * WARPS,
    ),
)]
pub fn mix_up_bf16(
    #[tile(default = 4, candidates = [4, 8])] LANES: u32,
    #[tile(default = 10, candidates = [10, 20])] WARPS: u32,
    #[tile(default = 10, candidates = [5, 10])] CHUNKS: u32,
    residual: &mut [bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    up: &[bf16],
    partial: &[f32],
    scale: &[f32],
    x: &mut [bf16],
    gains: &mut [f32],
    n: u32,
    d: u32,
    rank: u32,
    inject: u32,
    post: bool,
) {
    // The next kernel may start as soon as every block of this one runs: it waits in turn.
    launch_dependents();
    let group = (block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES;
    let lane = lane_id() % LANES;
    let j = group / n;
    let s = group % n;
    let row = s * d + j;
    let active = j < d;

    // Before the wait, immutable data only: the norm value and the row's weights into registers.
    let mut norm_w = 0.0;
    let mut wbuf = [u32x4(0, 0, 0, 0); CHUNKS];
    if active {
        norm_w = 1.0 + norm[row] as f32;
        #[unroll]
        for c in 0..CHUNKS {
            let k = (lane + c * LANES) * 8;
            if k < rank {
                wbuf[c] = load_stream::<u32x4>(up, row * rank + k);
            }
        }
    }
    grid_dependency_wait();

    // The epilogue's inputs, from L2, in flight with the partials.
    let mut stream_value = 0.0;
    let mut norm_scale = 0.0;
    if active {
        stream_value = residual[row] as f32;
        if post {
            stream_value = (fma(gains_prev[s], y[j] as f32, stream_value) as bf16) as f32;
        }
        norm_scale = load_cg(scale, s) * norm_w;
    }
    // u (and the gains) from the streams' partials: rows `thread` and `thread + block`, the n
    // partials of both in flight together, added in stream order.
    let rows = rank + inject;
    let u = shared::<f32, { 8 * LANES * CHUNKS }>();
    let ra = thread_idx();
    let rb = thread_idx() + 32 * WARPS;
    let mut va = 0.0;
    let mut vb = 0.0;
    #[unroll(4)]
    for i in 0..n {
        if ra < rows {
            va += load_cg(partial, i * rows + ra);
        }
        if rb < rows {
            vb += load_cg(partial, i * rows + rb);
        }
    }
    va = va / n as f32;
    vb = vb / n as f32;
    if ra < rank {
        u[ra] = silu(va);
    } else if ra < rows && block_idx() == 0 {
        gains[ra - rank] = 2.0 * sigmoid(va);
    }
    if rb < rank {
        u[rb] = silu(vb);
    } else if rb < rows && block_idx() == 0 {
        gains[rb - rank] = 2.0 * sigmoid(vb);
    }
    sync_threads();

    let mut acc = 0.0;
    #[unroll]
    for c in 0..CHUNKS {
        let k = (lane + c * LANES) * 8;
        if k < rank {
            let wv = wbuf[c];
            let ua = load_vec::<f32x4>(u, k);
            let ub = load_vec::<f32x4>(u, k + 4);
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
