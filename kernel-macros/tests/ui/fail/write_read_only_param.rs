use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn assign(x: &[f32], n: u32) {
    x[thread_idx()] = 0.0;
}

#[kernel(block = 32, grid = n)]
fn compound_assign(x: &[f32], n: u32) {
    x[thread_idx()] += 1.0;
}

fn main() {}
