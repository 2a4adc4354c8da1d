use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn exp_of_u32(y: &mut [f32], n: u32) {
    let i = thread_idx();
    y[i] = exp(i);
}

#[kernel(block = 32, grid = n)]
fn atomic_on_read_only(x: &[u32], n: u32) {
    atomic_add(x, 0, 1);
}

#[kernel(block = 32, grid = n)]
fn store_scalar_as_vector(y: &mut [u32], n: u32) {
    store_vec(y, 0, n);
}

fn main() {}
