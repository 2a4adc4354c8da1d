//! Plain CPU references, in f32 with f64 sums: slow, obvious, and what every GPU kernel and the
//! engine's whole step are tested against. `decoder` is the whole decode step; the other modules
//! are its parts, one concept each.

pub mod decoder;
pub mod fill;
pub mod gdn;
pub mod gemv;
pub mod mix;
pub mod moe;
pub mod norm;
pub mod ple;
pub mod qsa;
pub mod rope;
pub mod sample;
