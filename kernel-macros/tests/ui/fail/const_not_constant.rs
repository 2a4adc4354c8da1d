use kernel_macros::kernel;

#[kernel(block = 32 * WARPS, grid = n)]
fn from_a_variable(#[tile(default = 4, candidates = [4])] WARPS: u32, y: &mut [f32], n: u32) {
    const PER: u32 = n / (32 * WARPS);
    y[thread_idx()] = PER as f32;
}

#[kernel(block = 32, grid = n)]
fn from_a_load(x: &[u32], y: &mut [f32], n: u32) {
    const FIRST: u32 = x[0];
    y[thread_idx()] = FIRST as f32;
}

#[kernel(block = 32, grid = n)]
fn from_a_call(y: &mut [f32], n: u32) {
    const LANE: u32 = lane_id();
    y[thread_idx()] = LANE as f32;
}

#[kernel(block = 32, grid = n)]
fn assigned(y: &mut [f32], n: u32) {
    const ONE: u32 = 1;
    ONE = 2;
    y[thread_idx()] = ONE as f32;
}

#[kernel(block = 32, grid = n)]
fn public(y: &mut [f32], n: u32) {
    pub const ONE: u32 = 1;
    y[thread_idx()] = ONE as f32;
}

fn main() {}
