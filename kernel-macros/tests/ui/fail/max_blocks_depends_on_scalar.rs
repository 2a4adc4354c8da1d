use kernel_macros::kernel;

#[kernel(block = 128, grid = n, max_blocks = n / 4)]
fn k(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
