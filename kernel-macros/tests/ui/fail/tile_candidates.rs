use kernel_macros::kernel;

#[kernel(block = 32 * WARPS, grid = n)]
fn default_not_a_candidate(#[tile(default = 3, candidates = [1, 2, 4])] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32 * WARPS, grid = n)]
fn candidate_twice(#[tile(default = 2, candidates = [1, 2, 4, 2])] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32 * WARPS, grid = n)]
fn no_default(#[tile(candidates = [1, 2])] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32 * WARPS, grid = n)]
fn step_twice(#[tile(default = 2, candidates = [1, 2], step, step)] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32 * WARPS, grid = n)]
fn unknown_option(#[tile(default = 2, candidates = [1, 2], tuned)] WARPS: u32, y: &mut [f32], n: u32) {
    y[thread_idx()] = 1.0;
}

fn main() {}
