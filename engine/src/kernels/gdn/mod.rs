//! Gated DeltaNet decode as three launches: the input projections with the conv and the gates
//! ([`in_proj`]); then one of three pairs: the delta rule on the fp32 state with no cross-block
//! step ([`delta_rule`]) and out_proj with the gated norm in its prologue ([`out_proj`]); the
//! delta rule with whole-head blocks and the gated norm in its epilogue ([`delta_rule_normed`])
//! and the plain bf16 GEMV ([`crate::kernels::gemv_bf16`]); or the earlier pair: the delta rule
//! with the gated norm in the last block of each head ([`state_update`]) and the plain GEMV.

pub mod delta_rule;
pub mod delta_rule_normed;
pub mod in_proj;
pub mod out_proj;
pub mod state_update;
