//! Every kernel of the engine, each described once in the DSL. [`ALL`] lists them for the tools
//! that walk every kernel: the generated files, the NVRTC compile test, the autotuner.

pub mod gemv_bf16;
pub mod zc_rmsnorm;

use kernel_dsl::AnyKernel;

/// Every kernel, in a stable order.
pub static ALL: &[&dyn AnyKernel] = &[&gemv_bf16::gemv_bf16::ERASED, &zc_rmsnorm::zc_rmsnorm::ERASED];
