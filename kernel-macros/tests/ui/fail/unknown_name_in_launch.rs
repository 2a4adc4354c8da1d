use kernel_macros::kernel;

#[kernel(block = 32 * WARPS, grid = div_ceil(rows, WARPS))]
fn in_grid(#[tile(default = 4)] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32, grid = n, require(n % VEC == 0))]
fn in_require(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32, grid = n, require(y > 0))]
fn buffer_in_require(y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
