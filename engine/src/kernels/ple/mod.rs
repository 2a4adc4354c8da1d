//! PLE (the per-layer n-gram embedding): the row ids of the newest token, hashed on the device
//! from a device-side token history ([`ids`]), and the gather of the rows those ids address from
//! a table in mapped host memory ([`gather_bf16`], or [`gather_nvfp4`] from NVFP4 rows, dequantised
//! to bf16 on the way); the projections of the rows are the plain
//! bf16 GEMV ([`crate::kernels::gemv_bf16`], key and value stacked in one matrix), and the rest of
//! the block, up to the sum into the residual streams, is [`gate_conv`].

pub mod gate_conv;
pub mod gather_bf16;
pub mod gather_nvfp4;
pub mod ids;
