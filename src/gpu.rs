//! The GPU for GPU-only tests and benches. Those tests are `#[ignore = "needs a CUDA device"]`;
//! run with `--include-ignored` on a machine without one, they fail here, loudly, rather than pass.

use engine::cuda::Gpu;

/// Opens device 0 or panics with the reason.
pub fn open() -> Gpu {
    match Gpu::open(0) {
        Ok(g) => {
            let i = g.info();
            println!(
                "device: {} (sm_{}{}, {} SMs, {} MB L2)",
                i.name,
                i.compute_capability.0,
                i.compute_capability.1,
                i.sm_count,
                i.l2_bytes >> 20
            );
            g
        }
        Err(e) => panic!("this test needs a CUDA device: {e}"),
    }
}
