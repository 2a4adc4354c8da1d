//! Support for the workspace's integration tests and benches: seeded random inputs, element-wise
//! comparison with readable failures, the GPU for tests that need one, and graph-replay timing.

pub mod bench;
pub mod compare;
pub mod goldens;
pub mod gpu;
pub mod rng;
