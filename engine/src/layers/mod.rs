//! Blocks of the decode step on the device: weights laid out as their kernels read them, scratch,
//! and the sequence of launches.

pub mod gdn;
pub mod lm_head;
pub mod matrix;
pub mod mix;
pub mod moe;
pub mod paired_codes;
pub mod ple;
pub mod qsa;
pub mod sample;
