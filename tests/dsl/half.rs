//! A second helpers file for the emitter's snapshot test of helpers (`tests/emit_snapshots.rs`,
//! example `helpers`), which names both files.

/// Half of `v`: one expression, so a call anywhere becomes `v * 0.5` with the argument in place.
fn half(v: f32) -> f32 {
    v * 0.5
}
