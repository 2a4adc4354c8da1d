use kernel_macros::kernel;

#[kernel(block = 32, grid = 1)]
fn inclusive(y: &mut [u32], n: u32) {
    for i in 0..=n {
        y[i] = i;
    }
}

#[kernel(block = 32, grid = 1)]
fn open_ended(y: &mut [u32], n: u32) {
    for i in 0.. {
        y[i] = i;
    }
}

#[kernel(block = 32, grid = 1)]
fn over_a_buffer(y: &mut [u32], n: u32) {
    for v in y {}
}

#[kernel(block = 32, grid = 1)]
fn zero_step(y: &mut [u32], n: u32) {
    for i in (0..n).step_by(0) {
        y[i] = i;
    }
}

fn main() {}
