use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn local(y: &mut [f32], n: u32) {
    let acc: f64 = 0.0;
    y[thread_idx()] = acc as f32;
}

#[kernel(block = 32, grid = n)]
fn buffer(x: &[f64], y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32, grid = n)]
fn literal_suffix(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0f64;
}

fn main() {}
