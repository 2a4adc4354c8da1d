use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn k(x: &[f32], y: &mut [f32], n: u32) {
    let i = thread_idx();
    y[i] = max(x[i]);
}

fn main() {}
