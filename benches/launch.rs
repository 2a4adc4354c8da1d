//! What a launch of the step costs when it moves almost nothing: chains of CHAIN dependent
//! launches of a kernel whose every thread reads one word the launch before wrote and writes one
//! word for the launch after, captured in one CUDA graph and replayed, as the step is.
//!
//! The step is 536 launches a token (`benches/step.rs`); this says how much of its time a chain
//! that long takes before any kernel loads a weight, in each way the step launches:
//! - `wait, then let the next launch`: `grid_dependency_wait()` at the top and
//!   `launch_dependents()` right after it, launched overlapped (programmatic dependent launch):
//!   the QSA kernels' and the mix kernels' order;
//! - `wait, no early launch`: the wait and no trigger, overlapped: the next launch may start only
//!   as this one's blocks exit (`gemv_nvfp4`'s order);
//! - the first kernel again with overlapped launches off (`Gpu::set_overlap_launches(false)`, as
//!   `FLASHNEXT_NO_PDL=1` does to the step): each launch starts when the one before has ended;
//! - `no wait`: a kernel that never waits, so it is never launched overlapped;
//! - the first kernel with the step's last-block tail after its write (every thread fences, the
//!   block counts itself in on a counter, the last block puts it back and reads from L2), as the
//!   router and `gemv_nvfp4`'s split-K sum end: what such a tail adds to a launch;
//! - `flags`: the dependency passed by a counter instead of the end of the grid ([`hop_flag`]):
//!   each launch's blocks count themselves in after their write (fence, atomic), and the next
//!   launch's blocks spin on that count (acquire loads) instead of waiting on the grid; with the
//!   next launch let in after the spin, or at the top (then as many launches as fit are resident
//!   and spinning). This asks whether the step's kernels could hand work on faster than a grid
//!   ends.
//!
//! Each at grids of one block, one block an SM and four blocks an SM (128 threads a block). The
//! time per launch is a replay's time over CHAIN; median, p10 and p90 over REPLAYS replays. After
//! the timing the words are checked: each launch adds one, so after a replay from zero every word
//! must be CHAIN (a chain that dropped or reordered a launch fails; three replays a case, so a
//! flag chain whose reads were not ordered after its spin has three chances to show it), and the
//! last-block case's counter must be back at zero (each launch's last block puts it back). Records go to
//! $OUT/bench-launch.jsonl (or target/).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use engine::cuda::{DeviceBuffer, Gpu, Graph, LoadedKernel};
use flashnext::bench::{Recorder, Sample, Unit, replay_times, replays_duration_with};
use kernel_dsl::{DevPtr, DevPtrMut, KernelDef, TileSet};
use kernel_macros::kernel;

/// Launches in one graph: about a token's worth of the step's.
const CHAIN: usize = 512;
/// Timed replays per case.
const REPLAYS: usize = 100;
/// Threads a block.
const THREADS: usize = 128;

/// dst = src + 1, one word a thread, after the grid dependency wait, letting the next launch
/// start right after the wait.
#[kernel(block = 128, grid = blocks)]
fn hop_trigger_after_wait(src: &[u32], dst: &mut [u32], blocks: u32) {
    grid_dependency_wait();
    launch_dependents();
    let i = block_idx() * 128 + thread_idx();
    dst[i] = src[i] + 1;
}

/// As [`hop_trigger_after_wait`] with no trigger: the next launch starts as this one's blocks exit.
#[kernel(block = 128, grid = blocks)]
fn hop_wait_only(src: &[u32], dst: &mut [u32], blocks: u32) {
    grid_dependency_wait();
    let i = block_idx() * 128 + thread_idx();
    dst[i] = src[i] + 1;
}

/// As [`hop_trigger_after_wait`] with no wait: never launched overlapped.
#[kernel(block = 128, grid = blocks)]
fn hop_no_wait(src: &[u32], dst: &mut [u32], blocks: u32) {
    let i = block_idx() * 128 + thread_idx();
    dst[i] = src[i] + 1;
}

/// As [`hop_trigger_after_wait`], then the step's last-block pattern (the router's tail,
/// `gemv_nvfp4`'s split-K sum): every thread fences its write, the block counts itself in, and the
/// last block to arrive puts the counter back and reads a word another block wrote, from L2.
#[kernel(block = 128, grid = blocks)]
fn hop_last_block(src: &[u32], dst: &mut [u32], counter: &mut [u32], blocks: u32) {
    grid_dependency_wait();
    launch_dependents();
    let i = block_idx() * 128 + thread_idx();
    dst[i] = src[i] + 1;
    thread_fence();
    sync_threads();
    let last = shared::<u32, 1>();
    if thread_idx() == 0 {
        last[0] = if atomic_add(counter, 0, 1) == blocks - 1 { 1 } else { 0 };
    }
    sync_threads();
    if last[0] == 1 && thread_idx() == 0 {
        counter[0] = 0;
        counter[1] = load_cg(dst, 0);
    }
}

/// The chain with flags in place of the grid dependency wait: launch `link` waits until every
/// block of launch `link - 1` has counted itself in on `flags[link - 1]` (one thread spins on it
/// with acquire loads, the block waits at a barrier), then does its hop and counts itself in on
/// `flags[link]` (a barrier, a fence, an atomic: the release). The counters only grow, by
/// `blocks` a replay: the goal is (`epoch[0]` + 1)·blocks, `epoch[0]` being the replays before
/// this one (the graph ends with [`bump_epoch`]), so nothing is reset between replays. The first
/// launch waits on its grid dependency instead (it follows the previous replay's bump), which is
/// also what makes every launch of this kernel an overlapped one. TRIGGER_FIRST 1 lets the next
/// launch start at the top, so as many launches as fit are resident and spinning; 0 after the
/// spin, as the step's kernels let theirs after their wait.
///
/// What this asks: whether a counter and a spin pass a dependency on faster than the end of a
/// grid does, and so whether the step's kernels could hand work on without waiting for their
/// predecessor's grid to end.
#[kernel(block = 128, grid = blocks)]
fn hop_flag(
    #[tile(default = 0, candidates = [0, 1])] TRIGGER_FIRST: u32,
    src: &[u32],
    dst: &mut [u32],
    flags: &mut [u32],
    epoch: &[u32],
    link: u32,
    blocks: u32,
) {
    if link == 0 {
        grid_dependency_wait();
    }
    if TRIGGER_FIRST == 1 {
        launch_dependents();
    }
    if link > 0 && thread_idx() == 0 {
        let goal = (load_cg(epoch, 0) + 1) * blocks;
        // A wrapping difference, as the QSA grid top-k's barriers compare.
        while load_acquire(flags, link - 1) - goal >= 0x80000000 {}
    }
    sync_threads();
    if TRIGGER_FIRST == 0 {
        launch_dependents();
    }
    let i = block_idx() * 128 + thread_idx();
    dst[i] = src[i] + 1;
    sync_threads();
    if thread_idx() == 0 {
        thread_fence();
        atomic_add(flags, link, 1);
    }
}

/// The flag chain's last launch: one more replay done (an ordinary launch, so it starts once
/// the chain has ended).
#[kernel(block = 32, grid = 1)]
fn bump_epoch(epoch: &mut [u32]) {
    if thread_idx() == 0 {
        epoch[0] = epoch[0] + 1;
    }
}

/// The chain's two buffers: launch i reads one and writes the other.
struct PingPong {
    a: DeviceBuffer<u32>,
    b: DeviceBuffer<u32>,
}

/// Captures CHAIN launches of `k`, `args(src, dst)` making each launch's arguments, the odd ones
/// reading `b` and writing `a`.
///
/// # Safety
/// `args` must make arguments whose buffers hold every index the launch touches.
unsafe fn capture<K: KernelDef>(
    gpu: &Gpu,
    k: &LoadedKernel<K>,
    bufs: &mut PingPong,
    args: impl Fn(DevPtr<u32>, DevPtrMut<u32>) -> K::Args,
) -> Graph {
    let (pa, pb) = (bufs.a.ptr_mut(), bufs.b.ptr_mut());
    gpu.capture(|| {
        for i in 0..CHAIN {
            let (src, dst) = if i % 2 == 0 { (pa, pb) } else { (pb, pa) };
            // SAFETY: the caller vouches for the arguments.
            unsafe { k.launch(gpu, &args(src.into(), dst)) }?;
        }
        Ok(())
    })
    .expect("capture")
}

/// Captures the flag chain: CHAIN launches of `k` (launch i waiting on `flags[i - 1]` and
/// counting itself in on `flags[i]`), then the epoch bump.
///
/// # Safety
/// `flags` must hold CHAIN words and `epoch` one; both zero before the first replay and touched
/// by nothing else; the buffers must hold `blocks`·128 words.
unsafe fn capture_flags(
    gpu: &Gpu,
    k: &LoadedKernel<hop_flag::Kernel>,
    bump: &LoadedKernel<bump_epoch::Kernel>,
    bufs: &mut PingPong,
    flags: DevPtrMut<u32>,
    epoch: DevPtrMut<u32>,
    blocks: u32,
) -> Graph {
    let (pa, pb) = (bufs.a.ptr_mut(), bufs.b.ptr_mut());
    gpu.capture(|| {
        for i in 0..CHAIN {
            let (src, dst) = if i % 2 == 0 { (pa, pb) } else { (pb, pa) };
            let args = hop_flag::Args { src: src.into(), dst, flags, epoch: epoch.into(), link: i as u32, blocks };
            // SAFETY: the caller vouches for the buffers' sizes.
            unsafe { k.launch(gpu, &args) }?;
        }
        // SAFETY: one word.
        unsafe { bump.launch(gpu, &bump_epoch::Args { epoch }) }
    })
    .expect("capture")
}

/// Zeroes both buffers, replays, and checks that every word went through CHAIN launches; three
/// times, so that a chain which reads a word before its writer's launch is done (the flag
/// chain, if its acquire did not order the reads after it) has three chances to show it.
fn check(gpu: &Gpu, g: &Graph, bufs: &mut PingPong, words: usize, case: &str) {
    for round in 0..3 {
        gpu.fill_bytes(&mut bufs.a, 0).expect("zero");
        gpu.fill_bytes(&mut bufs.b, 0).expect("zero");
        g.launch().expect("replay");
        // CHAIN is even: the last launch writes `a`.
        let got = gpu.download(&bufs.a).expect("download");
        let wrong = got[..words].iter().filter(|&&v| v != CHAIN as u32).count();
        assert_eq!(wrong, 0, "{case}, round {round}: {wrong} of {words} words did not pass through {CHAIN} launches");
    }
}

fn bench_launch(c: &mut Criterion) {
    let Some(gpu) = flashnext::bench::open_gpu("launch") else { return };
    let mut rec = Recorder::new(&gpu, "launch", None);
    let sms = gpu.info().sm_count as usize;
    let trigger =
        gpu.kernel::<hop_trigger_after_wait::Kernel>(hop_trigger_after_wait::Tiles::DEFAULT).expect("compile");
    let wait_only = gpu.kernel::<hop_wait_only::Kernel>(hop_wait_only::Tiles::DEFAULT).expect("compile");
    let no_wait = gpu.kernel::<hop_no_wait::Kernel>(hop_no_wait::Tiles::DEFAULT).expect("compile");
    let last_block = gpu.kernel::<hop_last_block::Kernel>(hop_last_block::Tiles::DEFAULT).expect("compile");
    let flag_after = gpu.kernel::<hop_flag::Kernel>(hop_flag::Tiles { trigger_first: 0 }).expect("compile");
    let flag_first = gpu.kernel::<hop_flag::Kernel>(hop_flag::Tiles { trigger_first: 1 }).expect("compile");
    let bump = gpu.kernel::<bump_epoch::Kernel>(bump_epoch::Tiles::DEFAULT).expect("compile");
    // The last-block case's counter (zero before the first launch; each launch leaves it zero)
    // and the word its last block reads.
    let mut counter = gpu.alloc::<u32>(2).expect("alloc");
    gpu.fill_bytes(&mut counter, 0).expect("zero");
    let count = counter.ptr_mut();
    let mut group = c.benchmark_group("launch");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for blocks in [1, sms, 4 * sms] {
        let words = blocks * THREADS;
        let mut bufs = PingPong { a: gpu.alloc(words).expect("alloc"), b: gpu.alloc(words).expect("alloc") };
        let n = blocks as u32;
        // The flag chains' counters and replay count, for this grid size (their goals are
        // multiples of it); both flag graphs share them, each replay adding `blocks` to every
        // counter and one to the epoch.
        let mut flags = gpu.alloc::<u32>(CHAIN).expect("alloc");
        let mut epoch = gpu.alloc::<u32>(1).expect("alloc");
        gpu.fill_bytes(&mut flags, 0).expect("zero");
        gpu.fill_bytes(&mut epoch, 0).expect("zero");
        let (flag_ptr, epoch_ptr) = (flags.ptr_mut(), epoch.ptr_mut());
        // (case, overlapped launches on, graph)
        let mut cases: Vec<(&str, bool, Graph)> = Vec::new();
        // SAFETY: every launch indexes blocks·128 words, the size of both buffers.
        unsafe {
            let g = capture(&gpu, &trigger, &mut bufs, |src, dst| hop_trigger_after_wait::Args { src, dst, blocks: n });
            cases.push(("wait, then let the next launch", true, g));
            let g = capture(&gpu, &wait_only, &mut bufs, |src, dst| hop_wait_only::Args { src, dst, blocks: n });
            cases.push(("wait, no early launch", true, g));
            gpu.set_overlap_launches(false);
            let g = capture(&gpu, &trigger, &mut bufs, |src, dst| hop_trigger_after_wait::Args { src, dst, blocks: n });
            gpu.set_overlap_launches(true);
            cases.push(("wait, then let the next launch, overlapped launches off", false, g));
            let g = capture(&gpu, &no_wait, &mut bufs, |src, dst| hop_no_wait::Args { src, dst, blocks: n });
            cases.push(("no wait", false, g));
            let g = capture(&gpu, &last_block, &mut bufs, |src, dst| hop_last_block::Args {
                src,
                dst,
                counter: count,
                blocks: n,
            });
            cases.push(("wait, then let the next launch, then a last block (fence, counter, one L2 read)", true, g));
            let g = capture_flags(&gpu, &flag_after, &bump, &mut bufs, flag_ptr, epoch_ptr, n);
            cases.push((
                "flags: spin on the launch before's counter, then let the next launch, then count in",
                true,
                g,
            ));
            let g = capture_flags(&gpu, &flag_first, &bump, &mut bufs, flag_ptr, epoch_ptr, n);
            cases.push(("flags: let the next launch, spin on the launch before's counter, then count in", true, g));
        }
        for (case, overlapped, g) in &cases {
            let name = format!("{case}, {blocks} blocks of {THREADS}");
            check(&gpu, g, &mut bufs, words, &name);
            let (m, p10, p90) = replay_times(&gpu, g, REPLAYS);
            let per = |t: f64| t / CHAIN as f64;
            rec.record(
                Sample::new(format!("chain of {CHAIN} dependent launches"), name.clone(), Unit::Launch, (per(m), per(p10), per(p90)))
                    .launches(1)
                    .notes(format!(
                        "{CHAIN} launches a graph; overlapped (programmatic dependent) launches {}; one word a thread read and written",
                        if *overlapped { "on" } else { "off" }
                    )),
            );
            group.bench_function(name.replace([' ', ','], "_"), |bench| {
                bench.iter_custom(|iters| {
                    let replays = (iters as usize).div_ceil(CHAIN);
                    replays_duration_with(&gpu, g, replays, || {}).mul_f64(iters as f64 / (replays * CHAIN) as f64)
                })
            });
        }
        let left = gpu.download(&counter).expect("counter")[0];
        assert_eq!(left, 0, "{blocks} blocks: the last-block case left its counter at {left}");
    }
    group.finish();
}

criterion_group!(benches, bench_launch);
criterion_main!(benches);
