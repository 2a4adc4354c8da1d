//! Does the device's memory stream as fast after many model-sized allocations and frees as when
//! the process is fresh?
//!
//! The step bench makes one model a tile set (70 GB on an 80 GB H100). Session 52 found its copy
//! rate 3.034 TB/s before its runs and 2.633 after them, and this bench to say where that comes
//! from (H100, `tuned/runs/nvidia-h100-2026-12-07-session52.txt`): with the pool's memory handed
//! back to the driver at each synchronisation (the default), two 1 GiB buffers allocated right
//! after a large free copy at 2.63–2.64 TB/s in every cycle, while the chunks of each cycle copy
//! at 3.03 among themselves; trimming the pool changes nothing; `cuMemAlloc` gives 2.60 for both
//! after the first cycle; a pool that keeps what is freed gives 3.03 for both. The step's own
//! slower later models (its module doc) stayed with such a pool, so they are not this effect.
//!
//! Each cycle allocates chunks of model-like sizes until `FILL` of the free memory is taken, fills
//! them (as `Gpu::alloc` zero-fills), times a 1 GiB device-to-device copy between its first two
//! expert-sized chunks while every chunk is live, frees them all, and times a copy between two fresh 1 GiB
//! buffers. The allocator is the argument, one a process (the driver's state ends with it):
//! - `async`: `cuMemAllocAsync` from the device's default pool, as `Gpu::alloc` allocates;
//! - `async-trim`: the same, the pool trimmed to nothing after each cycle's frees;
//! - `async-keep`: the same, the pool keeping what is freed (its release threshold at the most);
//! - `sync`: `cuMemAlloc`.
//!
//! `FLASHNEXT_CHURN_CYCLES` (default 8) cycles. Lines to stdout, records to $OUT/bench-memory_churn.jsonl.

use engine::cuda::Gpu;
use engine::cuda::timing::time_mean;
use flashnext::bench::{Recorder, Sample, Unit};

use cudarc::driver::{result, sys};

/// Bytes each timed copy moves one way.
const COPY: usize = 1 << 30;
/// Share of the free memory one cycle takes (the step's model leaves about a tenth free).
const FILL: f64 = 0.88;
/// A layer's allocations, largest first, in the proportions of the synthetic model's: its experts
/// (1,400 MiB), the other matrices, norms and states. Repeated until FILL is reached.
const LAYER: [usize; 6] = [1_400 << 20, 300 << 20, 40 << 20, 13 << 20, 3 << 20, 200 << 10];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Allocator {
    Async,
    AsyncTrim,
    AsyncKeep,
    Sync,
}

impl Allocator {
    fn parse(s: &str) -> Option<Allocator> {
        match s {
            "async" => Some(Allocator::Async),
            "async-trim" => Some(Allocator::AsyncTrim),
            "async-keep" => Some(Allocator::AsyncKeep),
            "sync" => Some(Allocator::Sync),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Allocator::Async => "async",
            Allocator::AsyncTrim => "async-trim",
            Allocator::AsyncKeep => "async-keep",
            Allocator::Sync => "sync",
        }
    }

    fn alloc(self, gpu: &Gpu, bytes: usize) -> sys::CUdeviceptr {
        let stream = gpu.stream().cu_stream();
        // SAFETY: a fresh allocation of `bytes`, filled before any use and freed by `free`.
        unsafe {
            let p = match self {
                Allocator::Sync => result::malloc_sync(bytes),
                _ => result::malloc_async(stream, bytes),
            }
            .expect("allocating device memory");
            result::memset_d8_async(p, 0, bytes, stream).expect("filling");
            p
        }
    }

    fn free(self, gpu: &Gpu, p: sys::CUdeviceptr) {
        // SAFETY: `p` came from `alloc` with the same allocator and is freed once.
        unsafe {
            match self {
                Allocator::Sync => result::free_sync(p),
                _ => result::free_async(p, gpu.stream().cu_stream()),
            }
            .expect("freeing device memory")
        }
    }
}

/// Bytes read plus written per second of a COPY-byte copy from `src` to `dst` (mean of 10 after 2).
fn copy_rate(gpu: &Gpu, src: sys::CUdeviceptr, dst: sys::CUdeviceptr) -> f64 {
    let stream = gpu.stream().cu_stream();
    // SAFETY: both pointers hold at least COPY bytes (the callers allocate them so).
    let copy = || unsafe { result::memcpy_dtod_async(dst, src, COPY, stream).expect("copy") };
    let t = time_mean(gpu, 2, 10, |_| {
        copy();
        Ok(())
    })
    .expect("timing the copies");
    2.0 * COPY as f64 / t.as_secs_f64()
}

fn main() {
    let mode = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| "async".into());
    let Some(alloc) = Allocator::parse(&mode) else {
        eprintln!("memory_churn: allocator {mode:?} is none of async, async-trim, async-keep, sync");
        std::process::exit(2);
    };
    let cycles = flashnext::bench::env_count("FLASHNEXT_CHURN_CYCLES", 8);
    let gpu = flashnext::gpu::open();
    // The raw calls below act on the current context: the engine's, made current here explicitly.
    gpu.context().bind_to_thread().expect("binding the context");
    let mut rec = Recorder::new(&gpu, "memory_churn", None);
    if alloc == Allocator::AsyncKeep {
        let mut threshold = u64::MAX;
        // SAFETY: the device's default pool; the release threshold attribute is a u64.
        unsafe {
            let pool = result::device::get_default_mem_pool(gpu.context().cu_device()).expect("pool");
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            result::mem_pool::set_attribute(pool, attr, (&mut threshold as *mut u64).cast()).expect("threshold");
        }
    }
    let fresh = {
        let (a, b) = (alloc.alloc(&gpu, COPY), alloc.alloc(&gpu, COPY));
        let r = copy_rate(&gpu, a, b);
        alloc.free(&gpu, a);
        alloc.free(&gpu, b);
        gpu.synchronize().expect("sync");
        r
    };
    println!("memory_churn {}: fresh copy {:.3} TB/s", alloc.name(), fresh / 1e12);
    let (free, _) = gpu.memory().expect("free memory");
    let budget = (free as f64 * FILL) as usize;
    // The copy among live chunks takes the first two expert-sized ones: a layer and one more.
    let least = LAYER.iter().sum::<usize>() + LAYER[0];
    if budget < least {
        eprintln!(
            "memory_churn: {:.1} GB free, {:.1} GB needed for two expert-sized chunks and what lies between",
            free as f64 / 1e9,
            least as f64 / FILL / 1e9
        );
        std::process::exit(2);
    }
    for cycle in 1..=cycles {
        let mut chunks = Vec::new();
        let mut taken = 0;
        'fill: loop {
            for &bytes in &LAYER {
                if taken + bytes > budget {
                    break 'fill;
                }
                chunks.push(alloc.alloc(&gpu, bytes));
                taken += bytes;
            }
        }
        gpu.synchronize().expect("sync");
        // The first two expert-sized chunks (1,400 MiB ≥ COPY), present by the check above.
        let live = copy_rate(&gpu, chunks[0], chunks[LAYER.len()]);
        let count = chunks.len();
        for p in chunks.drain(..) {
            alloc.free(&gpu, p);
        }
        gpu.synchronize().expect("sync");
        if alloc == Allocator::AsyncTrim {
            // SAFETY: the device's default pool, trimmed after the stream's frees completed.
            unsafe {
                let pool = result::device::get_default_mem_pool(gpu.context().cu_device()).expect("pool");
                result::mem_pool::trim_to(pool, 0).expect("trim");
            }
        }
        let (a, b) = (alloc.alloc(&gpu, COPY), alloc.alloc(&gpu, COPY));
        let after = copy_rate(&gpu, a, b);
        alloc.free(&gpu, a);
        alloc.free(&gpu, b);
        gpu.synchronize().expect("sync");
        println!(
            "memory_churn {} cycle {cycle}: {:.1} GB in {} chunks; copy among them {:.3} TB/s, fresh pair after the \
             frees {:.3} TB/s",
            alloc.name(),
            taken as f64 / 1e9,
            count,
            live / 1e12,
            after / 1e12
        );
        // One copy's mean time over 10 (recorded as a median, the schema's one figure), a launch of
        // the copy engine's work, its bytes read plus written.
        let what = Sample::median(
            "memory_churn",
            format!("{} cycle {cycle}", alloc.name()),
            Unit::Launch,
            2.0 * COPY as f64 / live,
        );
        rec.record_quietly(
            what.bytes(2 * COPY)
                .notes(format!("copy among live chunks; a fresh pair after the frees {:.3} TB/s", after / 1e12)),
        );
    }
}
