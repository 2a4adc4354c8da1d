//! Support for the workspace's integration tests and benches: seeded random inputs, element-wise
//! comparison with readable failures, the GPU for tests that need one, graph-replay timing, the
//! parsers' fuzz targets, and a small NVFP4 checkpoint made from a bf16 one.

pub mod bench;
pub mod compare;
pub mod fuzz_targets;
pub mod goldens;
pub mod gpu;
pub mod nvfp4_checkpoint;
pub mod rng;
