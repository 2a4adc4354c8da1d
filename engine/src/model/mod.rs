//! The model as stored: its configuration, its checkpoint, NVFP4 weights, the n-gram hash, and
//! every weight read and checked.

pub mod checkpoint;
pub mod config;
pub mod ngram_hash;
pub mod nvfp4;
pub mod ple_table;
pub mod weights;
