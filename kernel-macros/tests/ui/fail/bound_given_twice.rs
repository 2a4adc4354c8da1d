use kernel_macros::kernel;

#[kernel(block = 128, grid = n, min_blocks = 2, max_blocks = 4, max_blocks = 2)]
fn k(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
