//! Device functions of the MoE router (`moe::router`). A helpers file, not a Rust module: the
//! router names it (`#[kernel(..., helpers = "src/kernels/helpers/router.rs")]`) and every call is
//! expanded in place. They read the calling kernel's BATCH tile.

/// One warp's dot product of a bf16 row (from `row[at]`, `hidden` values) with x, every lane
/// holding the sum. A batch's loads (BATCH pieces of the row and of x a lane, 256 columns apart)
/// are all issued before its first product, so the published width (2560 = 256 · 10) takes one
/// round trip to memory at the default BATCH; the products add in column order, piece after
/// piece. `stream` loads the row with the streaming hint (`load_stream`: a routed expert's row,
/// read once a token); each call passes a literal, so the branch folds away.
fn row_dot(row: &[bf16], at: u32, x: &[bf16], hidden: u32, stream: bool) -> f32 {
    let mut acc = 0.0;
    for b in (0..hidden).step_by(256 * BATCH) {
        let mut wbuf = [u32x4(0, 0, 0, 0); BATCH];
        let mut xbuf = [u32x4(0, 0, 0, 0); BATCH];
        #[unroll]
        for t in 0..BATCH {
            let k = b + (lane_id() + 32 * t) * 8;
            if k < hidden {
                if stream {
                    wbuf[t] = load_stream::<u32x4>(row, at + k);
                } else {
                    wbuf[t] = load_vec::<u32x4>(row, at + k);
                }
                xbuf[t] = load_vec::<u32x4>(x, k);
            }
        }
        #[unroll]
        for t in 0..BATCH {
            if b + (lane_id() + 32 * t) * 8 < hidden {
                acc += dot_bf16x8(wbuf[t], xbuf[t]);
            }
        }
    }
    warp_sum(acc)
}
