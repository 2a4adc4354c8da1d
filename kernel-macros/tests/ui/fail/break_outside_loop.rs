use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn stray_break(y: &mut [u32], n: u32) {
    if thread_idx() >= n {
        break;
    }
    y[thread_idx()] = 1;
}

#[kernel(block = 32, grid = n)]
fn stray_continue(y: &mut [u32], n: u32) {
    continue;
}

fn main() {}
