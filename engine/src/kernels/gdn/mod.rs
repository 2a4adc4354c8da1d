//! Gated DeltaNet decode as three launches: the input projections with the conv and the gates
//! ([`in_proj`]), the delta rule on the fp32 state with the gated norm of its output
//! ([`state_update`]), and `out_proj` (the plain bf16 GEMV, [`crate::kernels::gemv_bf16`]).

pub mod in_proj;
pub mod state_update;
