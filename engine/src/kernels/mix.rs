//! The Gated Residual read ("hyper-connection" mix) in two launches, with the previous block's
//! write (`hc_post`, `X_s += ω_s · y`) folded into its reading of the residual streams.
//!
//! Launch 1 ([`mix_down_bf16`], [`mix_down_nvfp4`]) is a GEMV over the n·d inputs of
//! `[W_down; W_inj]` split by stream (one stream a block), every SM streaming its share. Launch 2
//! ([`mix_up_bf16`], [`mix_up_nvfp4`]) is the r → n·d GEMV with the gate, the stream mean and the
//! write-back of the updated streams in its epilogue. The per-stream RMS scale is a factor of each
//! stream's part of a dot product, so launch 1 sums `W·(X ⊙ (1 + w))` over a stream and applies
//! that stream's scale once: no block needs more than its stream.
//!
//! Both pairs are built for overlapped launches: each kernel loads all of its weights into
//! registers before its grid dependency wait, while its predecessor still runs, and after the wait
//! does only the math that depends on it; launch 2 adds launch 1's per-stream partials itself
//! (every block needs all of u anyway), so no counter and no last block sit in the chain. Each
//! lets its successor launch only once its own wait is over, so at most one kernel ahead of the
//! running one is loading weights: with both triggers at the kernels' top, the next kernel and,
//! through it, the one after started their weight loads and took SM room while the site's
//! predecessor still ran, and the H200 step was 1.6% slower (2026-12-01, BENCHMARKS.md step
//! section). Launch 1 is meant one block an SM, and it is launched while its predecessor (an
//! output projection, the MoE's down projection) still runs: the block scheduler would place its
//! blocks on the few SMs with room, several on one. Its tile MAX_BLOCKS (`max_blocks`, default 1)
//! has the engine reserve shared memory so that no two of its blocks share an SM, and the
//! predecessors let it launch right after their own wait. One NVIDIA H100, 2026-12-06: the step
//! 3.7% to 4.4% faster at 1k and 32k than with the predecessors letting it in only when they end
//! (which they did from 2026-12-02 to keep its blocks apart; BENCHMARKS.md, step section). Both
//! launch-1 kernels use nothing they load before their wait: with bf16 mix weights the H200 step
//! was 1.8% faster for it (2026-12-02), though the bf16 site alone is 2% slower.
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
/// the grid dependency wait a block loads its pieces of the norm and all of its weights into
/// registers (both immutable), so the weight stream overlaps the previous kernel's tail. After
/// the wait it reads the stream (from L2, every load in flight at once), stages `X' ⊙ (1 + w)` in
/// shared memory, sums Σ X'² over the block (every block
/// of a stream the same sum, in the same order), and does the dot products. No counter and no last
/// block: launch 2 adds the streams' partials.
///
/// A block is a fraction of an SM (the defaults: 160 threads of two rows, one block per SM at the
/// published shape; the candidates hold at most 12,800 weight registers a block, a fifth of an
/// SM's), so that launch 2's blocks are resident beside it and start their own weight stream. Two
/// rows a warp also halve the reads of the staged inputs. MAX_BLOCKS 1 (`max_blocks`) keeps a
/// second block off an SM that holds one, for a launch that overlaps its predecessor (the module
/// docs say why); 0 lets the scheduler place blocks where it likes.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rank + inject, WARPS * ROWS), n),
    max_blocks = MAX_BLOCKS,
    helpers = "src/kernels/helpers/mix.rs",
    require(ROWS * CHUNKS * WARPS <= 100, d % 8 == 0, d <= 256 * CHUNKS),
)]
pub fn mix_down_bf16(
    #[tile(default = 2, candidates = [1, 2])] ROWS: u32,
    #[tile(default = 5, candidates = [5, 10, 20])] WARPS: u32,
    #[tile(default = 10, candidates = [10])] CHUNKS: u32,
    #[tile(default = 1, candidates = [0, 1], step)] MAX_BLOCKS: u32,
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
    let stream = block_idx_y();
    let rows = rank + inject;
    let cols = n * d;
    let base = stream * d;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;

    // Before the wait, immutable data only: the norm's pieces this thread stages after the wait
    // (8 columns, 256·WARPS apart), then the weights. Nothing loaded here is used before the
    // wait (as in `mix_down_nvfp4`, whose doc says why).
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
    grid_dependency_wait();
    // Only now may the next kernel launch (the module docs say why not earlier).
    launch_dependents();

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
    let sq = stage_stream(h, xbuf, ybuf, nbuf, (CHUNKS + WARPS - 1) / WARPS, d, omega, post, 1.0);
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
    helpers = "src/kernels/helpers/mix.rs",
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
    // Only now may the next kernel launch (the module docs say why not earlier).
    launch_dependents();

    // The streams' partials of rows `thread` and `thread + block`, then the epilogue's inputs,
    // from L2, held raw: nothing is used before every load is issued, so that they are one round
    // trip (a use before them would end the round).
    let rows = rank + inject;
    let mut pa = [0.0; 32 / LANES];
    let mut pb = [0.0; 32 / LANES];
    load_partials(pa, pb, partial, n, rows);
    let mut x_raw = 0.0 as bf16;
    let mut y_raw = 0.0 as bf16;
    let mut omega = 0.0;
    let mut stream_scale = 0.0;
    if active {
        x_raw = residual[row];
        if post {
            y_raw = y[j];
            omega = gains_prev[s];
        }
        stream_scale = load_cg(scale, s);
    }
    // u (and the gains) from the streams' partials, added in stream order.
    let u = shared::<f32, { 8 * LANES * CHUNKS }>();
    u_from_partials(u, gains, pa, pb, n, rank, rows, 1.0);
    let stream_value = epilogue_stream(x_raw, y_raw, omega, post);
    let norm_scale = stream_scale * norm_w;
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
    write_mix(residual, x, acc, 1.0, stream_value, norm_scale, active, lane, n, s, j, row, post);
}

/// Launch 1 with NVFP4 weights: the partials of [`mix_down_bf16`], the stacked projection in
/// ModelOpt's layout (`packed` [rank + inject, n·d / 2], `scales` e4m3 bytes [rank + inject, n·d / 16];
/// W_down and W_inj quantised apart, their global scales in `scale2[0]` and `scale2[1]`).
///
/// The same design: one stream a block, overlapped launch, the weights in registers before the
/// wait. Lanes take 16 columns (8 bytes of codes and one block scale a row) per chunk, 512 columns
/// apart; the codes decode to f32 and meet f32 activations: the only rounding besides the f32
/// sums is the weights' own.
///
/// Unlike the bf16 kernel, it applies `1 + w` after the wait, from registers: nothing it loads
/// before the wait is used there. Measured when 96 of this kernel's 97 launches in the NVFP4 step
/// found their predecessor ended (its predecessors then let nothing in early), so that the wait
/// returned at once and a norm's round trip before it only delayed the stream's loads after it.
/// NVIDIA H200, 2026-12-02 (the earlier form as a tile, since removed): in the traced step the
/// hand-off 1.60 → 0.99 µs a launch and the work after the wait 2.64 → 2.94 (−0.31 µs); the site
/// alone 6.46 → 5.78 µs. Its predecessors now let it in after their wait (MAX_BLOCKS, as in the
/// bf16 kernel).
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rank + inject, WARPS * ROWS), n),
    max_blocks = MAX_BLOCKS,
    helpers = "src/kernels/helpers/mix.rs",
    require(ROWS * CHUNKS * WARPS <= 100, d % 16 == 0, d <= 512 * CHUNKS),
)]
pub fn mix_down_nvfp4(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 5, candidates = [5, 10])] WARPS: u32,
    #[tile(default = 5, candidates = [5])] CHUNKS: u32,
    #[tile(default = 1, candidates = [0, 1], step)] MAX_BLOCKS: u32,
    residual: &[bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    packed: &[e2m1x2],
    scales: &[u8],
    scale2: &[f32],
    partial: &mut [f32],
    scale: &mut [f32],
    n: u32,
    d: u32,
    rank: u32,
    inject: u32,
    post: bool,
    eps: f32,
) {
    let stream = block_idx_y();
    let rows = rank + inject;
    let cols = n * d;
    let base = stream * d;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;

    // Before the wait, immutable data only: the norm's pieces this thread stages, the global
    // scales, then the codes and block scales.
    let h = shared::<f32, { 512 * CHUNKS }>();
    let mut nbuf = [u32x4(0, 0, 0, 0); (2 * CHUNKS + WARPS - 1) / WARPS];
    #[unroll]
    for t in 0..(2 * CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            nbuf[t] = load_vec::<u32x4>(norm, base + i);
        }
    }
    // Raw decode, as in `gdn_in_proj_nvfp4` (the reason is there): h is staged lifted, through
    // `1 + w`, and the global scales carry the rest of the gap.
    let lift = e2m1_raw_lift();
    let drop = e2m1_raw_gap() / lift;
    let global_down = scale2[0] * drop;
    let global_inject = scale2[1] * drop;
    let mut wbuf = [u32x2(0, 0); ROWS * CHUNKS];
    // The block scales' raw e4m3 bytes, decoded after the wait: a decode here would hold each
    // chunk's loads until the previous chunk's scale arrived.
    let mut sbuf = [0u32; ROWS * CHUNKS];
    #[unroll]
    for c in 0..CHUNKS {
        let k = lane_id() * 16 + c * 512;
        if k < d {
            #[unroll]
            for r in 0..ROWS {
                if row0 + r < rows {
                    let v = (row0 + r) * cols + base + k;
                    wbuf[c * ROWS + r] = load_stream::<u32x2>(packed, v / 2);
                    sbuf[c * ROWS + r] = scales[v / 16] as u32;
                }
            }
        }
    }
    grid_dependency_wait();
    // Only now may the next kernel launch (the module docs say why not earlier).
    launch_dependents();

    // The stream through the previous block's write, as in the bf16 kernel.
    let omega = if post { gains_prev[stream] } else { 0.0 };
    let mut xbuf = [u32x4(0, 0, 0, 0); (2 * CHUNKS + WARPS - 1) / WARPS];
    let mut ybuf = [u32x4(0, 0, 0, 0); (2 * CHUNKS + WARPS - 1) / WARPS];
    #[unroll]
    for t in 0..(2 * CHUNKS + WARPS - 1) / WARPS {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            xbuf[t] = load_vec::<u32x4>(residual, base + i);
            if post {
                ybuf[t] = load_vec::<u32x4>(y, i);
            }
        }
    }
    let scratch = shared::<f32, WARPS>();
    let sq = stage_stream(h, xbuf, ybuf, nbuf, (2 * CHUNKS + WARPS - 1) / WARPS, d, omega, post, lift);
    // The block sum's barriers also publish h to the whole block.
    let factor = rsqrt(block_sum(sq, scratch) / d as f32 + eps);

    let mut acc = [0.0; ROWS];
    #[unroll]
    for c in 0..CHUNKS {
        let k = lane_id() * 16 + c * 512;
        if k < d {
            let h0 = load_vec::<f32x4>(h, k);
            let h1 = load_vec::<f32x4>(h, k + 4);
            let h2 = load_vec::<f32x4>(h, k + 8);
            let h3 = load_vec::<f32x4>(h, k + 12);
            #[unroll]
            for r in 0..ROWS {
                let wv = wbuf[c * ROWS + r];
                let (f0, f1) = (e2m1x4_to_f32x4_raw(wv.x), e2m1x4_to_f32x4_raw(wv.x >> 16));
                let (f2, f3) = (e2m1x4_to_f32x4_raw(wv.y), e2m1x4_to_f32x4_raw(wv.y >> 16));
                let mut s = f0.x * h0.x;
                s = fma(f0.y, h0.y, s);
                s = fma(f0.z, h0.z, s);
                s = fma(f0.w, h0.w, s);
                s = fma(f1.x, h1.x, s);
                s = fma(f1.y, h1.y, s);
                s = fma(f1.z, h1.z, s);
                s = fma(f1.w, h1.w, s);
                s = fma(f2.x, h2.x, s);
                s = fma(f2.y, h2.y, s);
                s = fma(f2.z, h2.z, s);
                s = fma(f2.w, h2.w, s);
                s = fma(f3.x, h3.x, s);
                s = fma(f3.y, h3.y, s);
                s = fma(f3.z, h3.z, s);
                s = fma(f3.w, h3.w, s);
                acc[r] = fma(s, e4m3x4_to_f32x4(sbuf[c * ROWS + r]).x, acc[r]);
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
            let row = row0 + r;
            if row < rows {
                // The matrix's global scale: W_down's rows first, then W_inj's.
                let global = if row < rank { global_down } else { global_inject };
                partial[stream * rows + row] = acc[r] * global * factor;
            }
        }
    }
    if block_idx() == 0 && thread_idx() == 0 {
        scale[stream] = factor;
    }
}

/// Launch 2 with NVFP4 weights: as [`mix_up_bf16`], W_up in ModelOpt's layout (`packed`
/// [n·d, rank / 2], `scales` e4m3 [n·d, rank / 16], its global scale in `scale2[2]`). Lanes take
/// 16 values (8 bytes of codes and one block scale) per chunk; a row of the published rank
/// (320 = 16 · LANES · CHUNKS) fills a lane's registers exactly.
#[kernel(
    block = 32 * WARPS,
    grid = div_ceil(n * d, WARPS * (32 / LANES)),
    helpers = "src/kernels/helpers/mix.rs",
    require(
        LANES * CHUNKS == 20,
        WARPS * CHUNKS <= 100,
        32 % (n * LANES) == 0,
        rank % (16 * LANES) == 0,
        rank <= 16 * LANES * CHUNKS,
        rank + inject <= 64 * WARPS,
    ),
)]
pub fn mix_up_nvfp4(
    #[tile(default = 4, candidates = [2, 4])] LANES: u32,
    #[tile(default = 10, candidates = [10, 20])] WARPS: u32,
    #[tile(default = 5, candidates = [5, 10])] CHUNKS: u32,
    residual: &mut [bf16],
    y: &[bf16],
    gains_prev: &[f32],
    norm: &[bf16],
    packed: &[e2m1x2],
    scales: &[e4m3],
    scale2: &[f32],
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
    let group = (block_idx() * WARPS + warp_id()) * (32 / LANES) + lane_id() / LANES;
    let lane = lane_id() % LANES;
    let j = group / n;
    let s = group % n;
    let row = s * d + j;
    let active = j < d;

    // Before the wait, immutable data only: the norm value, the global scale, the row's codes and
    // block scales.
    let mut norm_w = 0.0;
    // Raw decode, as in mix_down_nvfp4: u is stored lifted and the global scale carries the
    // rest of the gap.
    let lift = e2m1_raw_lift();
    let drop = e2m1_raw_gap() / lift;
    let global = scale2[2] * drop;
    let mut wbuf = [u32x2(0, 0); CHUNKS];
    let mut sbuf = [0.0; CHUNKS];
    if active {
        norm_w = 1.0 + norm[row] as f32;
        #[unroll]
        for c in 0..CHUNKS {
            let k = (lane + c * LANES) * 16;
            if k < rank {
                let v = row * rank + k;
                wbuf[c] = load_stream::<u32x2>(packed, v / 2);
                sbuf[c] = scales[v / 16] as f32;
            }
        }
    }
    grid_dependency_wait();
    // Only now may the next kernel launch (the module docs say why not earlier).
    launch_dependents();

    // The partials, then the epilogue's inputs held raw, as in the bf16 kernel.
    let rows = rank + inject;
    let mut pa = [0.0; 32 / LANES];
    let mut pb = [0.0; 32 / LANES];
    load_partials(pa, pb, partial, n, rows);
    let mut x_raw = 0.0 as bf16;
    let mut y_raw = 0.0 as bf16;
    let mut omega = 0.0;
    let mut stream_scale = 0.0;
    if active {
        x_raw = residual[row];
        if post {
            y_raw = y[j];
            omega = gains_prev[s];
        }
        stream_scale = load_cg(scale, s);
    }
    // u and the gains from the streams' partials, as in the bf16 kernel.
    let u = shared::<f32, { 16 * LANES * CHUNKS }>();
    u_from_partials(u, gains, pa, pb, n, rank, rows, lift);
    let stream_value = epilogue_stream(x_raw, y_raw, omega, post);
    let norm_scale = stream_scale * norm_w;
    sync_threads();

    let mut acc = 0.0;
    #[unroll]
    for c in 0..CHUNKS {
        let k = (lane + c * LANES) * 16;
        if k < rank {
            let wv = wbuf[c];
            let (f0, f1) = (e2m1x4_to_f32x4_raw(wv.x), e2m1x4_to_f32x4_raw(wv.x >> 16));
            let (f2, f3) = (e2m1x4_to_f32x4_raw(wv.y), e2m1x4_to_f32x4_raw(wv.y >> 16));
            let (u0, u1) = (load_vec::<f32x4>(u, k), load_vec::<f32x4>(u, k + 4));
            let (u2, u3) = (load_vec::<f32x4>(u, k + 8), load_vec::<f32x4>(u, k + 12));
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
            acc = fma(b, sbuf[c], acc);
        }
    }
    write_mix(residual, x, acc, global, stream_value, norm_scale, active, lane, n, s, j, row, post);
}
