use kernel_macros::kernel;

// `grid` and `require` are host Rust, type-checked by rustc, not by the macro: their errors must
// still point into the attribute.

// The grid is u32 dimensions: a u64 argument needs a conversion.
#[kernel(block = 32, grid = n)]
fn grid_of_u64(y: &mut [f32], n: u64) {
    y[thread_idx()] = 1.0;
}

// `eps` is f32: compared with an integer literal.
#[kernel(block = 32, grid = n, require(eps > 0))]
fn require_mixes_types(y: &mut [f32], n: u32, eps: f32) {
    y[thread_idx()] = eps;
}

fn main() {}
