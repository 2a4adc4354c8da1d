//! Device functions of the Gated Residual's mix kernels (`mix`): what the bf16 and NVFP4 forms of
//! each launch share. A helpers file, not a Rust module: the four kernels name it
//! (`#[kernel(..., helpers = "src/kernels/helpers/mix.rs")]`) and every call is expanded in
//! place. They read the calling kernel's WARPS tile (a block of 32·WARPS threads) and, in
//! launch 2, its LANES tile.

/// Launch 1: the stream through the previous block's write, X' = bf16(fma(ω, y, X)) when `post`
/// (rounded to bf16 as the streams are stored), times `(1 + w)·lift` into `h` (shared), 8
/// columns a piece, `pieces` pieces a thread, 256·WARPS columns apart; returns this thread's
/// Σ X'². `xbuf`, `ybuf` and `nbuf` hold the pieces of X, y and the norm weight w, loaded
/// before. `lift` is 1 for bf16 weights and the raw E2M1 decode's lift for NVFP4 ones.
fn stage_stream(
    h: &mut [f32],
    xbuf: &[u32x4],
    ybuf: &[u32x4],
    nbuf: &[u32x4],
    pieces: u32,
    d: u32,
    omega: f32,
    post: bool,
    lift: f32,
) -> f32 {
    let mut sq = 0.0;
    #[unroll]
    for t in 0..pieces {
        let i = (thread_idx() + t * 32 * WARPS) * 8;
        if i < d {
            let xv = xbuf[t];
            let mut x0 = bf16x2_to_f32x2(xv.x);
            let mut x1 = bf16x2_to_f32x2(xv.y);
            let mut x2 = bf16x2_to_f32x2(xv.z);
            let mut x3 = bf16x2_to_f32x2(xv.w);
            if post {
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
            let wv = nbuf[t];
            let (w0, w1) = (bf16x2_to_f32x2(wv.x), bf16x2_to_f32x2(wv.y));
            let (w2, w3) = (bf16x2_to_f32x2(wv.z), bf16x2_to_f32x2(wv.w));
            let a = f32x4((1.0 + w0.x) * lift, (1.0 + w0.y) * lift, (1.0 + w1.x) * lift, (1.0 + w1.y) * lift);
            let b = f32x4((1.0 + w2.x) * lift, (1.0 + w2.y) * lift, (1.0 + w3.x) * lift, (1.0 + w3.y) * lift);
            store_vec(h, i, f32x4(x0.x * a.x, x0.y * a.y, x1.x * a.z, x1.y * a.w));
            store_vec(h, i + 4, f32x4(x2.x * b.x, x2.y * b.y, x3.x * b.z, x3.y * b.w));
        }
    }
    sq
}

/// Launch 2: the n partials of rows `thread` and `thread + block` into `pa` and `pb`, every one
/// issued before any is used (n ≤ 32 / LANES: the launches require n·LANES to divide 32). A row
/// past `rows` loads row `rows - 1` instead, never used: unconditional loads are issued together,
/// where ptxas interleaved guarded ones with their adds and each add's wait began a new round.
fn load_partials(pa: &mut [f32], pb: &mut [f32], partial: &[f32], n: u32, rows: u32) {
    let ra = min(thread_idx(), rows - 1);
    let rb = min(thread_idx() + 32 * WARPS, rows - 1);
    #[unroll]
    for i in 0..32 / LANES {
        if i < n {
            pa[i] = load_cg(partial, i * rows + ra);
            pb[i] = load_cg(partial, i * rows + rb);
        }
    }
}

/// Launch 2: u = SiLU(Σ_s partial[s] / n)·lift into `u` (shared) and, block 0 only, the write
/// gains 2σ(Σ_s partial[s] / n) of the W_inj rows, from the partials `load_partials` put in `pa`
/// and `pb`, added in stream order. `lift` is 1 for bf16 weights and the raw E2M1 decode's lift
/// for NVFP4 ones. The caller's barrier follows.
fn u_from_partials(u: &mut [f32], gains: &mut [f32], pa: &[f32], pb: &[f32], n: u32, rank: u32, rows: u32, lift: f32) {
    let ra = thread_idx();
    let rb = thread_idx() + 32 * WARPS;
    let mut va = 0.0;
    let mut vb = 0.0;
    #[unroll]
    for i in 0..32 / LANES {
        if i < n {
            va += pa[i];
            vb += pb[i];
        }
    }
    va = va / n as f32;
    vb = vb / n as f32;
    if ra < rank {
        u[ra] = silu(va) * lift;
    } else if ra < rows && block_idx() == 0 {
        gains[ra - rank] = 2.0 * sigmoid(va);
    }
    if rb < rank {
        u[rb] = silu(vb) * lift;
    } else if rb < rows && block_idx() == 0 {
        gains[rb - rank] = 2.0 * sigmoid(vb);
    }
}

/// Launch 2's stream value: X (bf16), through the previous block's write bf16(fma(ω, y, X)) when
/// `post`, as f32. Its inputs are loaded raw before launch 2's partials and converted here, after
/// the partials' loads are issued, so that the epilogue's loads and the partials' share one round
/// trip to L2.
fn epilogue_stream(x_raw: bf16, y_raw: bf16, omega: f32, post: bool) -> f32 {
    let mut value = x_raw as f32;
    if post {
        value = (fma(omega, y_raw as f32, value) as bf16) as f32;
    }
    value
}

/// Launch 2's end: the row's dot product `acc` over its LANES lanes (offsets below LANES stay
/// inside the group), the gate σ(acc·global) times the normed stream value, then Σ over the n
/// groups of column j (adjacent groups, offsets LANES .. n·LANES/2: n is a power of two and
/// n·LANES divides 32, so the sum stays inside the column's lanes, the same on every lane of the
/// warp, so every lane takes part in every shuffle); the group's lane 0 stores the stream back
/// when `post` and, for stream 0, x[j] = the mean in bf16.
fn write_mix(
    residual: &mut [bf16],
    x: &mut [bf16],
    acc: f32,
    global: f32,
    stream_value: f32,
    norm_scale: f32,
    active: bool,
    lane: u32,
    n: u32,
    s: u32,
    j: u32,
    row: u32,
    post: bool,
) {
    let mut dot = acc;
    #[unroll]
    for i in 0..5 {
        let offset = 16 >> i;
        if offset < LANES {
            dot += shfl_xor(dot, offset);
        }
    }
    let mut term = 0.0;
    if active {
        term = sigmoid(dot * global) * (stream_value * norm_scale);
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
