//! Where the kernels let their successors launch. A kernel launched to overlap its predecessor
//! (programmatic dependent launch) may start once every block of the predecessor has called
//! `launch_dependents()`; where each kernel calls it decides how many grids are resident at once.
//! On the H200 the mix kernels calling it at their top made the decode step 1.6% slower than
//! calling it after their wait, and `gemv_nvfp4` calling it at all 9% slower (BENCHMARKS.md, step
//! section, session 24). The step's kernels, at their default tiles, therefore call it only after
//! their own `grid_dependency_wait()`; this test keeps it so. A tile candidate may still trigger
//! early (the GDN delta rule's `TRIGGER = 1`), for the autotuner to time.

use kernel_dsl::{Arch, KernelDef, TileSet};
use kernel_macros::kernel;

#[test]
fn no_kernel_lets_its_successor_launch_before_its_own_wait() {
    let mut early = Vec::new();
    for kernel in engine::kernels::ALL {
        for arch in Arch::ALL {
            let spec = kernel.default_kernel(arch).unwrap_or_else(|e| panic!("{e}"));
            if spec.triggers_before_its_wait() {
                early.push(format!("{} ({arch:?})", kernel.name()));
            }
        }
    }
    assert!(
        early.is_empty(),
        "these kernels call launch_dependents() before their grid_dependency_wait() (or never wait) at \
         their default tiles: {early:#?}\nmeasure the step with and without it first (benches/step.rs)"
    );
}

/// Triggers, then waits.
#[kernel(block = 32, grid = 1)]
pub fn trigger_then_wait(y: &mut [f32]) {
    launch_dependents();
    grid_dependency_wait();
    y[thread_idx()] = 1.0;
}

/// Waits, then triggers.
#[kernel(block = 32, grid = 1)]
pub fn wait_then_trigger(y: &mut [f32]) {
    grid_dependency_wait();
    launch_dependents();
    y[thread_idx()] = 1.0;
}

/// Triggers and never waits.
#[kernel(block = 32, grid = 1)]
pub fn trigger_only(y: &mut [f32]) {
    launch_dependents();
    y[thread_idx()] = 1.0;
}

/// Triggers before the wait only when its tile says so.
#[kernel(block = 32, grid = 1)]
pub fn trigger_by_tile(#[tile(default = 0, candidates = [0, 1])] EARLY: u32, y: &mut [f32]) {
    if EARLY == 1 {
        launch_dependents();
    }
    grid_dependency_wait();
    if EARLY == 0 {
        launch_dependents();
    }
    y[thread_idx()] = 1.0;
}

fn triggers_early<K: KernelDef>(tiles: &K::Tiles) -> bool {
    K::specialize(tiles, Arch::Sm90).expect("the example specialises").triggers_before_its_wait()
}

#[test]
fn the_check_tells_an_early_trigger_from_a_late_one() {
    assert!(triggers_early::<trigger_then_wait::Kernel>(&TileSet::DEFAULT));
    assert!(!triggers_early::<wait_then_trigger::Kernel>(&TileSet::DEFAULT));
    assert!(triggers_early::<trigger_only::Kernel>(&TileSet::DEFAULT));
    assert!(!triggers_early::<trigger_by_tile::Kernel>(&TileSet::DEFAULT));
    assert!(triggers_early::<trigger_by_tile::Kernel>(&trigger_by_tile::Tiles { early: 1 }));
}
