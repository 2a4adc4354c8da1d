use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn add(y: &mut [u32], n: u32, shift: i32) {
    let i = thread_idx();
    y[i] = i + shift;
}

#[kernel(block = 32, grid = n)]
fn compound(y: &mut [f32], n: u32) {
    let mut acc = 0.0;
    acc += thread_idx();
    y[0] = acc;
}

#[kernel(block = 32, grid = n)]
fn integer_literal_with_f32(y: &mut [f32], n: u32) {
    y[0] = y[1] * 2;
}

fn main() {}
