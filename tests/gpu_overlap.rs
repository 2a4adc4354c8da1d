//! Programmatic dependent launch on a GPU: a kernel that waits on its grid dependency starts
//! before its predecessor ends when launched overlapped (eagerly and in a captured graph), not
//! when overlap is off, and still sees everything the predecessor wrote after its wait.

use engine::cuda::Gpu;
use kernel_dsl::TileSet;
use kernel_macros::kernel;

/// The predecessor: lets its dependents start at once (when `trigger`), then spins for `ns`
/// nanoseconds, writes `marks[0..32]` and stamps its start and end.
#[kernel(block = 32, grid = 1)]
fn spin(marks: &mut [u32], stamps: &mut [u64], ns: u64, value: u32, trigger: bool) {
    if trigger {
        launch_dependents();
    }
    let start = global_timer();
    if thread_idx() == 0 {
        stamps[2] = start;
    }
    let mut now = start;
    while now - start < ns {
        now = global_timer();
    }
    marks[thread_idx()] = value + thread_idx();
    sync_threads();
    if thread_idx() == 0 {
        stamps[0] = global_timer();
    }
}

/// The dependent: stamps its start before the wait (a write of its own, not the predecessor's
/// data), then after the wait copies what the predecessor wrote.
#[kernel(block = 32, grid = 1)]
fn probe(marks: &[u32], seen: &mut [u32], stamps: &mut [u64]) {
    if thread_idx() == 0 {
        stamps[1] = global_timer();
    }
    grid_dependency_wait();
    seen[thread_idx()] = marks[thread_idx()];
    if thread_idx() == 0 {
        stamps[3] = global_timer();
    }
}

struct Pair {
    spin: engine::cuda::LoadedKernel<spin::Kernel>,
    probe: engine::cuda::LoadedKernel<probe::Kernel>,
}

/// Runs spin then probe (eagerly, or as a captured graph) and returns (probe started before spin
/// ended, the marks probe saw).
fn run(gpu: &Gpu, k: &Pair, graph: bool, value: u32) -> (bool, Vec<u32>) {
    run_with(gpu, k, graph, value, true).0
}

/// As `run`, with the trigger choice, and the four stamps relative to spin's start: spin end,
/// probe start, probe after its wait.
fn run_with(gpu: &Gpu, k: &Pair, graph: bool, value: u32, trigger: bool) -> ((bool, Vec<u32>), [i64; 3]) {
    let mut marks = gpu.alloc::<u32>(32).expect("marks");
    let mut seen = gpu.alloc::<u32>(32).expect("seen");
    let mut stamps = gpu.alloc::<u64>(4).expect("stamps");
    gpu.fill_bytes(&mut seen, 0xff).expect("poison");
    let enqueue = |marks: &mut engine::cuda::DeviceBuffer<u32>,
                   seen: &mut engine::cuda::DeviceBuffer<u32>,
                   stamps: &mut engine::cuda::DeviceBuffer<u64>| {
        let a = spin::Args { marks: marks.ptr_mut(), stamps: stamps.ptr_mut(), ns: 200_000, value, trigger };
        let b = probe::Args { marks: marks.ptr(), seen: seen.ptr_mut(), stamps: stamps.ptr_mut() };
        // SAFETY: every buffer holds what the kernels index (32 marks, 2 stamps).
        unsafe {
            k.spin.launch(gpu, &a)?;
            k.probe.launch(gpu, &b)
        }
    };
    if graph {
        let g = gpu.capture(|| enqueue(&mut marks, &mut seen, &mut stamps)).expect("capture");
        g.launch().expect("replay");
    } else {
        enqueue(&mut marks, &mut seen, &mut stamps).expect("launch");
    }
    let t = gpu.download(&stamps).expect("stamps");
    let rel = |i: usize| t[i] as i64 - t[2] as i64;
    ((t[1] < t[0], gpu.download(&seen).expect("seen")), [rel(0), rel(1), rel(3)])
}

/// Prints the stamps of every combination (diagnostic; asserts nothing about timing).
#[test]
#[ignore = "needs a CUDA device"]
fn overlap_timeline() {
    let gpu = flashnext::gpu::open();
    let k = Pair {
        spin: gpu.kernel(spin::Tiles::DEFAULT).expect("spin"),
        probe: gpu.kernel(probe::Tiles::DEFAULT).expect("probe"),
    };
    for graph in [false, true] {
        for trigger in [true, false] {
            for overlap in [true, false] {
                gpu.set_overlap_launches(overlap);
                let ((_, seen), t) = run_with(&gpu, &k, graph, 7, trigger);
                println!(
                    "graph {graph:5} trigger {trigger:5} overlap {overlap:5}: spin end {:>8} ns, probe start {:>8} ns, probe after wait {:>8} ns, seen[0] {}",
                    t[0], t[1], t[2], seen[0]
                );
            }
        }
    }
    gpu.set_overlap_launches(true);
}

#[test]
#[ignore = "needs a CUDA device"]
fn an_overlapped_launch_starts_before_its_predecessor_ends_and_waits_for_its_writes() {
    let gpu = flashnext::gpu::open();
    let k = Pair {
        spin: gpu.kernel(spin::Tiles::DEFAULT).expect("spin"),
        probe: gpu.kernel(probe::Tiles::DEFAULT).expect("probe"),
    };
    assert!(!k.spin.overlappable(), "spin does not wait, so it is never launched overlapped");
    assert!(k.probe.overlappable(), "probe waits on its grid dependency");
    for (graph, value) in [(false, 100), (true, 200)] {
        gpu.set_overlap_launches(true);
        let (early, seen) = run(&gpu, &k, graph, value);
        let want: Vec<u32> = (0..32).map(|i| value + i).collect();
        assert_eq!(seen, want, "graph {graph}: after its wait the dependent sees the predecessor's writes");
        assert!(early, "graph {graph}: the overlapped dependent did not start before its predecessor ended");
        gpu.set_overlap_launches(false);
        let (early, seen) = run(&gpu, &k, graph, value + 1);
        assert_eq!(seen, want.iter().map(|v| v + 1).collect::<Vec<_>>(), "graph {graph}, serialised");
        assert!(!early, "graph {graph}: with overlap off the dependent started before its predecessor ended");
        println!(
            "graph {graph}: overlapped launch starts early and waits for the writes; serialised does not start early"
        );
    }
    gpu.set_overlap_launches(true);
}
