//! Support for the workspace's integration tests and benches: seeded random inputs, element-wise
//! comparison with readable failures, the GPU for tests that need one, graph-replay timing, and the
//! parsers' fuzz targets.

pub mod bench;
pub mod compare;
pub mod fuzz_targets;
pub mod goldens;
pub mod gpu;
pub mod rng;
