//! The bf16 matrix-vector product, with split-K.

use kernel_macros::kernel;

/// y = W·x for a row-major bf16 matrix W [rows, cols] and a bf16 vector x [cols], summed in f32,
/// y rounded to bf16.
///
/// Each warp owns ROWS consecutive rows; its lanes stream them with VEC-element loads (16 or
/// 8 bytes) that bypass L1, UNROLL steps in flight, and reduce with shuffles. With K_SPLIT > 1,
/// blockIdx.y takes one of K_SPLIT column slices, so that a short matrix still fills every SM:
/// each block writes its partial sums to `partial` [K_SPLIT, rows], and the last block of a row
/// tile to arrive (a counter per tile in `counters` [grid.x], zero before the first launch) adds
/// the K_SPLIT partials in split order, writes y and puts its counter back to zero. The sum is
/// therefore deterministic, and graph replays find the counters as the first launch did.
#[kernel(
    block = 32 * WARPS,
    grid = (div_ceil(rows, WARPS * ROWS), K_SPLIT),
    require(rows % ROWS == 0, cols % (K_SPLIT * 32 * VEC) == 0, VEC == 4 || VEC == 8),
)]
pub fn gemv_bf16(
    #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    #[tile(default = 1, candidates = [1, 2, 4, 8, 16])] K_SPLIT: u32,
    #[tile(default = 8, candidates = [4, 8])] VEC: u32,
    #[tile(default = 2, candidates = [1, 2, 4])] UNROLL: u32,
    w: &[bf16],
    x: &[bf16],
    y: &mut [bf16],
    partial: &mut [f32],
    counters: &mut [u32],
    rows: u32,
    cols: u32,
) {
    let split = block_idx_y();
    let k_len = cols / K_SPLIT;
    let k_begin = split * k_len;
    let row0 = (block_idx() * WARPS + warp_id()) * ROWS;
    // Whole warps past the last row still take part in the block's barriers below.
    let active = row0 < rows;

    let mut acc = [0.0; ROWS];
    if active {
        #[unroll(UNROLL)]
        for k in (k_begin + lane_id() * VEC..k_begin + k_len).step_by(32 * VEC) {
            if VEC == 8 {
                let xv = load_vec::<u32x4>(x, k);
                #[unroll]
                for r in 0..ROWS {
                    acc[r] += dot_bf16x8(load_stream::<u32x4>(w, (row0 + r) * cols + k), xv);
                }
            } else {
                let xv = load_vec::<u32x2>(x, k);
                #[unroll]
                for r in 0..ROWS {
                    acc[r] += dot_bf16x4(load_stream::<u32x2>(w, (row0 + r) * cols + k), xv);
                }
            }
        }
    }
    #[unroll]
    for r in 0..ROWS {
        acc[r] = warp_sum(acc[r]);
    }

    if K_SPLIT == 1 {
        if active && lane_id() == 0 {
            #[unroll]
            for r in 0..ROWS {
                y[row0 + r] = acc[r] as bf16;
            }
        }
    } else {
        if active && lane_id() == 0 {
            #[unroll]
            for r in 0..ROWS {
                partial[split * rows + row0 + r] = acc[r];
            }
        }
        // Publish the partials before counting this block in.
        thread_fence();
        sync_threads();
        let last = shared::<u32, 1>();
        if thread_idx() == 0 {
            let arrived = atomic_add(counters, block_idx(), 1);
            last[0] = if arrived == K_SPLIT - 1 { 1 } else { 0 };
        }
        sync_threads();
        if last[0] == 1 {
            let row = block_idx() * WARPS * ROWS + thread_idx();
            if thread_idx() < WARPS * ROWS && row < rows {
                let mut sum = 0.0;
                for s in 0..K_SPLIT {
                    sum += load_cg(partial, s * rows + row);
                }
                y[row] = sum as bf16;
            }
            if thread_idx() == 0 {
                counters[block_idx()] = 0;
            }
        }
    }
}
