//! The engine: kernels described in the DSL, their CPU references, and the CUDA runtime that
//! compiles them with NVRTC and launches them.

pub mod kernels;
