use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn k(y: &mut [u32], n: u32) {
    let i = thread_idx();
    y[i] = i + offset;
}

fn main() {}
