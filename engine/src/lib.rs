//! The engine: kernels described in the DSL, their CPU references, and the CUDA runtime that
//! compiles them with NVRTC (no CUDA toolkit needed at build time) and launches them.

pub mod cuda;
pub mod error;
pub mod kernels;
pub mod layers;
pub mod model;
pub mod reference;
pub mod step;
pub mod synthetic;
pub mod tuned;

pub use error::{Error, Result};
