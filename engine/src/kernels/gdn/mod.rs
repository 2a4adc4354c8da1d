//! Gated DeltaNet decode as three launches: the input projections with the conv and the gates
//! ([`in_proj`]); the delta rule on the fp32 state with whole-head blocks and the gated norm in
//! its epilogue ([`delta_rule_normed`]); and out_proj, the plain GEMV of the normed heads
//! ([`crate::kernels::gemv_bf16`] or [`crate::kernels::gemv_nvfp4`]).
//!
//! Two other places for the norm were built, measured and removed (session 42): in the last
//! block of each head of a column-split state update (a fence and a counter a head), and in
//! out_proj's prologue after a delta rule with no cross-block step. Both made the layer slower
//! on the H200 (40.51 and 46.67 µs against 39.08 in bf16), and no tuned table chose either
//! (BENCHMARKS.md, GDN section).

pub mod delta_rule_normed;
pub mod in_proj;
