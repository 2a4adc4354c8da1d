use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn negative_unsigned(y: &mut [u32], n: u32) {
    let x: u32 = -1;
    y[thread_idx()] = x;
}

#[kernel(block = 32, grid = n)]
fn too_wide(y: &mut [u32], n: u32) {
    y[0] = n + 5000000000;
}

fn main() {}

#[kernel(block = 32, grid = 1)]
fn shift_too_far(y: &mut [u32]) {
    y[0] = 1u32 << 40;
}
