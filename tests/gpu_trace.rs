//! The traced build on a GPU (`engine::cuda::trace`): a launch's stamps bracket what it did, a
//! waiting launch's wait returns only after its predecessor's last block has stamped its end, a
//! launch that does not wait has no wait stamp, and a captured graph stamps the same words at each
//! replay, later each time.

use engine::cuda::trace::{LaunchStamps, Timeline};
use engine::cuda::{Gpu, LoadedKernel};
use kernel_dsl::TileSet;
use kernel_macros::kernel;

/// Lets its dependent launch at once, then every block spins `ns` nanoseconds and writes `value`.
#[kernel(block = 64, grid = blocks)]
fn busy(out: &mut [u32], ns: u64, value: u32, blocks: u32) {
    launch_dependents();
    let start = global_timer();
    let mut now = start;
    while now - start < ns {
        now = global_timer();
    }
    out[block_idx() * 64 + thread_idx()] = value;
}

/// Waits on its grid dependency, then copies `src` to `dst` plus one.
#[kernel(block = 64, grid = blocks)]
fn after(src: &[u32], dst: &mut [u32], blocks: u32) {
    grid_dependency_wait();
    let i = block_idx() * 64 + thread_idx();
    dst[i] = src[i] + 1;
}

const BLOCKS: u32 = 8;
const SPIN_NS: u64 = 20_000;

struct Kernels {
    busy: LoadedKernel<busy::Kernel>,
    after: LoadedKernel<after::Kernel>,
}

/// busy, then after, then after again: three launches on the stream.
fn enqueue(
    gpu: &Gpu,
    k: &Kernels,
    a: &mut engine::cuda::DeviceBuffer<u32>,
    b: &mut engine::cuda::DeviceBuffer<u32>,
    value: u32,
) {
    let (pa, pb) = (a.ptr_mut(), b.ptr_mut());
    // SAFETY: both buffers hold BLOCKS·64 words, which is what each launch touches.
    unsafe {
        k.busy.launch(gpu, &busy::Args { out: pa, ns: SPIN_NS, value, blocks: BLOCKS }).expect("busy");
        k.after.launch(gpu, &after::Args { src: pa.into(), dst: pb, blocks: BLOCKS }).expect("after");
        k.after.launch(gpu, &after::Args { src: pb.into(), dst: pa, blocks: BLOCKS }).expect("after");
    }
}

/// What every trace of the three launches must show, on a device of `sms` SMs.
fn check(l: &[LaunchStamps], sms: u32) {
    assert_eq!(l.iter().map(|s| s.kernel.as_str()).collect::<Vec<_>>(), ["busy", "after", "after"]);
    for s in l {
        assert!(s.first_start <= s.last_start && s.last_start <= s.last_end, "{s:?}");
        // Every block has its record, inside the launch's, and the launch's words are the
        // records' extremes.
        assert_eq!(s.blocks.len(), BLOCKS as usize, "{s:?}");
        for b in &s.blocks {
            assert!(b.sm < sms, "SM {} of {sms}: {s:?}", b.sm);
            assert!(s.first_start <= b.start && b.start <= b.end && b.end <= s.last_end, "{b:?} in {s:?}");
            if let Some(w) = b.wait {
                assert!(b.start <= w && w <= b.end, "{b:?}");
            }
        }
        assert_eq!(s.blocks.iter().map(|b| b.start).min(), Some(s.first_start));
        assert_eq!(s.blocks.iter().map(|b| b.start).max(), Some(s.last_start));
        assert_eq!(s.blocks.iter().map(|b| b.end).max(), Some(s.last_end));
        assert_eq!(s.blocks.iter().filter_map(|b| b.wait).min(), s.first_wait);
        let c = s.critical().expect("blocks");
        assert_eq!(s.blocks[c.block].end, s.last_end);
    }
    assert_eq!(l[0].first_wait, None, "busy does not wait");
    assert!(l[0].blocks.iter().all(|b| b.wait.is_none()), "no block of busy waits");
    assert!(l[1..].iter().all(|s| s.blocks.iter().all(|b| b.wait.is_some())), "every block of after waits");
    assert!(l[0].last_end - l[0].first_start >= SPIN_NS, "busy spins {SPIN_NS} ns: {:?}", l[0]);
    for i in 1..3 {
        let wait = l[i].first_wait.expect("after waits");
        assert!(wait >= l[i - 1].last_end, "launch {i}'s wait returned before its predecessor ended: {l:?}");
        assert!(wait <= l[i].last_end, "{:?}", l[i]);
    }
    let t = Timeline::of(l);
    let sum: f64 = t.steps.iter().map(|s| s.advance).sum();
    assert!((sum - t.span).abs() < 1.0, "advances {sum} against span {}", t.span);
}

fn kernels(gpu: &Gpu) -> Kernels {
    Kernels {
        busy: gpu.kernel(busy::Tiles::DEFAULT).expect("busy"),
        after: gpu.kernel(after::Tiles::DEFAULT).expect("after"),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn stamps_bracket_each_launch_eagerly_and_in_a_graph() {
    let gpu = Gpu::open_traced(0).expect("a traced GPU");
    assert!(gpu.traced());
    let k = kernels(&gpu);
    let words = (BLOCKS * 64) as usize;
    let mut a = gpu.alloc::<u32>(words).expect("a");
    let mut b = gpu.alloc::<u32>(words).expect("b");

    // Eager: three slots, stamped once.
    gpu.trace_reset().expect("reset");
    assert!(gpu.trace_read().expect("read").is_empty(), "nothing ran since the reset");
    enqueue(&gpu, &k, &mut a, &mut b, 7);
    let eager = gpu.trace_read().expect("read");
    check(&eager, gpu.info().sm_count);
    assert_eq!(gpu.download(&a).expect("a"), vec![9; words], "the launches did their work");

    // Captured: three more slots; each replay stamps them again, later.
    let g = gpu
        .capture(|| {
            enqueue(&gpu, &k, &mut a, &mut b, 11);
            Ok(())
        })
        .expect("capture");
    let mut last_end = 0;
    for replay in 0..2 {
        gpu.trace_reset().expect("reset");
        g.launch().expect("replay");
        let l = gpu.trace_read().expect("read");
        check(&l, gpu.info().sm_count);
        assert!(l.iter().all(|s| s.slot >= 3), "replay {replay}: the graph's launches have slots of their own: {l:?}");
        assert!(l[0].first_start > last_end, "replay {replay} is later than the one before");
        last_end = l[2].last_end;
    }
    assert_eq!(gpu.download(&a).expect("a"), vec![13; words]);
}

/// The stamps show the overlap: busy lets its dependent launch at its top, so the dependent is
/// resident during the spin. A timing test: under compute-sanitizer, which runs kernels one after
/// another, it cannot hold (`tools/sanitize.sh` skips it, as it does gpu_overlap's).
#[test]
#[ignore = "needs a CUDA device"]
fn an_overlapped_launch_starts_before_its_predecessor_ends_in_the_trace() {
    let gpu = Gpu::open_traced(0).expect("a traced GPU");
    let k = kernels(&gpu);
    let words = (BLOCKS * 64) as usize;
    let mut a = gpu.alloc::<u32>(words).expect("a");
    let mut b = gpu.alloc::<u32>(words).expect("b");
    gpu.trace_reset().expect("reset");
    enqueue(&gpu, &k, &mut a, &mut b, 1);
    let l = gpu.trace_read().expect("read");
    check(&l, gpu.info().sm_count);
    assert!(l[1].first_start < l[0].last_end, "the overlapped launch started only after busy ended: {l:?}");
}

/// A grid past `MOST_BLOCKS_RECORDED` (as the fills that make a synthetic model launch) keeps its
/// launch's words and records no block, so that it cannot fill the arena; the launch after it
/// records its blocks again.
#[test]
#[ignore = "needs a CUDA device"]
fn a_grid_too_large_to_record_keeps_its_launch_words_and_no_block() {
    let gpu = Gpu::open_traced(0).expect("a traced GPU");
    let k = kernels(&gpu);
    let large = (engine::cuda::trace::MOST_BLOCKS_RECORDED + 1) as u32;
    let mut a = gpu.alloc::<u32>(large as usize * 64).expect("a");
    let mut b = gpu.alloc::<u32>(large as usize * 64).expect("b");
    gpu.trace_reset().expect("reset");
    let (pa, pb) = (a.ptr_mut(), b.ptr_mut());
    // SAFETY: both buffers hold large·64 words, which is what each launch touches.
    unsafe {
        k.busy.launch(&gpu, &busy::Args { out: pa, ns: 0, value: 5, blocks: large }).expect("busy");
        k.after.launch(&gpu, &after::Args { src: pa.into(), dst: pb, blocks: BLOCKS }).expect("after");
    }
    let l = gpu.trace_read().expect("read");
    assert_eq!(l.len(), 2);
    assert!(l[0].first_start <= l[0].last_start && l[0].last_start <= l[0].last_end, "{:?}", l[0]);
    assert!(l[0].blocks.is_empty(), "{} blocks recorded past the limit", l[0].blocks.len());
    assert_eq!(l[1].blocks.len(), BLOCKS as usize);
    assert!(l[1].blocks.iter().all(|b| b.wait.is_some() && b.start <= b.end));
    assert_eq!(gpu.download(&b).expect("b")[..(BLOCKS * 64) as usize], vec![6; (BLOCKS * 64) as usize][..]);
}
