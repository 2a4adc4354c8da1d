use kernel_macros::kernel;

#[kernel(block = 32 * warps, grid = n)]
fn k(y: &mut [f32], n: u32, warps: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
