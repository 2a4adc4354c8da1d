use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn unknown_intrinsic(y: &mut [f32], n: u32) {
    y[thread_idx()] = cosine(1.0);
}

#[kernel(block = 32, grid = n)]
fn unknown_method(x: &[f32], y: &mut [f32], n: u32) {
    let i = thread_idx();
    y[i] = x[i].powf(2.0);
}

#[kernel(block = 32, grid = n)]
fn load_vec_without_type(x: &[u32], y: &mut [u32], n: u32) {
    let v = load_vec(x, thread_idx() * 4);
    y[thread_idx()] = v.x;
}

#[kernel(block = 32, grid = n)]
fn unknown_constant(y: &mut [f32], n: u32) {
    y[0] = f32::NAN;
}

fn main() {}
