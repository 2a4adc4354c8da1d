use kernel_macros::kernel;

#[kernel(block = 32, grid = n)]
fn k(y: &mut [f32], n: u32) {
    let tile: [f32; 32] = shared::<f32, 32>();
    tile[thread_idx()] = 0.0;
    y[thread_idx()] = tile[0];
}

fn main() {}
