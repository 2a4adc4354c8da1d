use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn immutable_local(y: &mut [f32], n: u32) {
    let acc = 0.0;
    acc = 1.0;
    y[thread_idx()] = acc;
}

#[kernel(block = 32, grid = n)]
fn scalar_parameter(y: &mut [u32], n: u32) {
    n = 3;
}

#[kernel(block = 32, grid = n)]
fn loop_variable(y: &mut [u32], n: u32) {
    for i in 0..n {
        i = 3;
    }
}

#[kernel(block = 32 * WARPS, grid = n)]
fn tile_parameter(#[tile(default = 1)] WARPS: u32, y: &mut [u32], n: u32) {
    WARPS = 2;
}

#[kernel(block = 32, grid = n)]
fn immutable_array(y: &mut [f32], n: u32) {
    let acc = [0.0; 4];
    acc[1] = 2.0;
}

fn main() {}
