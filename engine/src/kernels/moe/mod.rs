//! The MoE block as three launches: the router, the gate and up projections of the chosen
//! experts and the shared expert, and the weighted down projection. NVFP4 and bf16 weights.

pub mod down;
pub mod gate_up;
pub mod router;
