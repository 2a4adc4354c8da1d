use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn float_tile(#[tile(default = 0.5)] ALPHA: f32, y: &mut [f32], n: u32) {
    y[thread_idx()] = ALPHA;
}

#[kernel(block = 32, grid = n)]
fn bool_tile_with_integer(#[tile(default = 1)] WIDE: bool, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32 * WARPS, grid = n)]
fn tile_after_parameter(y: &mut [f32], #[tile(default = 4)] WARPS: u32, n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
