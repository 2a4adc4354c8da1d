use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn without_else(y: &mut [f32], n: u32, c: bool) {
    y[thread_idx()] = if c {
        1.0
    };
}

#[kernel(block = 32, grid = n)]
fn different_types(y: &mut [u32], n: u32, c: bool) {
    let z = if c { n } else { 1.0 };
}

#[kernel(block = 32, grid = n)]
fn condition_not_bool(y: &mut [u32], n: u32) {
    if n {
        y[0] = 1;
    }
}

fn main() {}
