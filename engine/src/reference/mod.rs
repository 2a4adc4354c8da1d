//! Plain CPU references of the kernels, in f32 with f64 sums: slow, obvious, and what every GPU
//! kernel is tested against.

pub mod gemv;
pub mod norm;
