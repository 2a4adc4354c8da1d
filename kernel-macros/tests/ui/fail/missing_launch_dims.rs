use kernel_macros::kernel;

#[kernel(grid = n)]
fn no_block(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32)]
fn no_grid(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
