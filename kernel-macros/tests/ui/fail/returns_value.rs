use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn return_type(x: &[f32], n: u32) -> f32 {
    x[thread_idx()]
}

#[kernel(block = 32, grid = n)]
fn tail_expression(y: &mut [u32], n: u32) {
    let i = thread_idx();
    y[i] = 1;
    i
}

#[kernel(block = 32, grid = n)]
fn return_with_value(y: &mut [u32], n: u32) {
    return 1;
}

fn main() {}
