//! Device functions for the emitter's snapshot test of helpers (`tests/emit_snapshots.rs`,
//! example `helpers`): a value returned, a helper calling another, parameters by value and by
//! reference (a device buffer and a shared array), and locals named as the caller's are; the
//! one-expression helper the example also calls is in the second file it names, `half.rs`.


/// The warp's sum of `v`, by xor butterflies (every lane gets it).
fn warp_total(v: f32) -> f32 {
    let mut acc = v;
    #[unroll]
    for i in 0..5 {
        acc += shfl_xor(acc, 16 >> i);
    }
    acc
}

/// Lane 0 adds `scale` times the warp's total of `v` to `out[at]` and counts itself in `seen[0]`.
fn add_scaled(out: &mut [f32], seen: &mut [u32], v: f32, scale: f32, at: u32) {
    let total = warp_total(v);
    if lane_id() == 0 {
        out[at] += total * scale;
        atomic_add(seen, 0, 1);
    }
}
