use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn closure(y: &mut [f32], n: u32) {
    let square = |v: f32| v * v;
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32, grid = n)]
fn nested_fn(y: &mut [f32], n: u32) {
    fn helper(v: f32) -> f32 {
        v * v
    }
    y[thread_idx()] = 1.0;
}

#[kernel(block = 32, grid = n)]
fn macro_call(y: &mut [f32], n: u32) {
    println!("thread {}", thread_idx());
}

#[kernel(block = 32, grid = n)]
fn reference(y: &mut [f32], n: u32) {
    let r = &n;
}

fn main() {}
