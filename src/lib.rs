//! Support for the workspace's integration tests and benches: seeded random inputs, element-wise
//! comparison with readable failures, and the GPU for tests that need one.

pub mod compare;
pub mod gpu;
pub mod rng;
