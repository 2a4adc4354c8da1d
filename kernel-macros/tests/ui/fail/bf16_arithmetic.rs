use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn multiply(x: &[bf16], y: &mut [f32], n: u32) {
    let i = thread_idx();
    y[i] = x[i] * x[i];
}

#[kernel(block = 32, grid = n)]
fn cast_to_integer(x: &[bf16], y: &mut [u32], n: u32) {
    y[0] = x[0] as u32;
}

fn main() {}
