//! The traced build of a kernel: the same CUDA, with the global timer read where a launch starts,
//! where its grid dependency wait returns and where it ends, so that a captured step can be laid
//! out as a timeline of its launches without a profiler (the device machines have no Nsight
//! Systems, and events between launches end the overlaps they would measure).
//!
//! The kernel's body becomes a `__device__` function (an early `return` in it comes back to the
//! wrapper, so every thread reaches the end stamp), and the `__global__` wrapper takes two more
//! parameters, in nanoseconds of `%globaltimer` (one clock for every SM). [`TRACE_PARAM`] is four
//! 64-bit words of this launch's own, stamped by thread 0 of each block:
//!
//! | word | what | how |
//! |---|---|---|
//! | 0 | the first block's start | `atomicMin` |
//! | 1 | the last block's start | `atomicMax` |
//! | 2 | the first return from `grid_dependency_wait()` | `atomicMin`, by each block that waits |
//! | 3 | the last block's end | a barrier after the body, then `atomicMax` |
//!
//! [`TRACE_BLOCKS_PARAM`] is four words a block (block `x + gridDim.x·(y + gridDim.y·z)`), plain
//! stores by the same thread: the block's start, its wait's return (left as it was when the block
//! does not wait), its end and the SM it ran on (`%smid`). They say which block ended a launch,
//! whether it started late or ran long, and which launches shared an SM. A null pointer there
//! records no block (the host passes one for grids too large to keep, such as the fills that
//! make a synthetic model).
//!
//! The host sets words 0 and 2 to `u64::MAX` and 1 and 3 to zero before the launches it times,
//! and the block records to zero once (`engine::cuda::trace`). A word 2 still at `u64::MAX` means
//! the kernel did not wait (or its thread 0 did not). What the stamps cost: two atomics, one
//! barrier and four stores a block, and an atomic and a store a block at the wait; the traced
//! step's time beside the plain one's says what that adds.

use std::fmt::Write;

/// The wrapper's first extra parameter: this launch's four words.
pub const TRACE_PARAM: &str = "flashnext_trace";

/// The wrapper's second extra parameter: four words for each block of the launch.
pub const TRACE_BLOCKS_PARAM: &str = "flashnext_trace_blocks";

/// The traced source of a kernel: [`super::cuda`] with the stamps described above.
pub fn cuda_traced(kernel: &crate::Kernel) -> String {
    super::source(kernel, true)
}

/// The block's records, ahead of the prelude's helpers (the traced grid dependency wait uses
/// them) and after the global timer's (`global_timer()`, which the source puts first).
pub const HELPERS: &str = "// Traced build: this launch's four timeline words (first start, last start, first return\n\
// from the grid dependency wait, last end) and four words a block (start, wait return, end, SM),\n\
// ns of %globaltimer, stamped by thread 0 of each block. The block keeps both addresses in shared\n\
// memory for the wait to find.\n\
__device__ __forceinline__ bool trace_leader() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }\n\
__device__ __forceinline__ unsigned long long*& trace_words() {\n\
\x20   __shared__ unsigned long long* words;\n\
\x20   return words;\n\
}\n\
__device__ __forceinline__ unsigned long long*& trace_block() {\n\
\x20   __shared__ unsigned long long* record;\n\
\x20   return record;\n\
}\n";

/// The prelude's grid dependency helpers, the wait stamping its first return.
pub const GRID_DEPENDENCY: &str = "// Programmatic dependent launch: wait until the grids this one overlaps have finished and\n\
// their writes are visible; let the next grid start (its blocks wait in turn). Traced: the\n\
// first block back from the wait stamps word 2, each block its record's word 1.\n\
__device__ __forceinline__ void grid_dependency_wait() {\n\
\x20   asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n\
\x20   if (trace_leader()) {\n\
\x20       const unsigned long long t = global_timer();\n\
\x20       atomicMin(trace_words() + 2, t);\n\
\x20       if (trace_block()) trace_block()[1] = t;\n\
\x20   }\n\
}\n\
__device__ __forceinline__ void launch_dependents() { asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\"); }\n";

/// The end of the `__global__` wrapper's parameter list, after the kernel's own, and its body:
/// stamp the start, run the body, wait for the block's threads, stamp the end.
pub fn wrapper(name: &str, params: &[&str]) -> String {
    let mut out = String::new();
    let lead = if params.is_empty() { "\n    " } else { ",\n    " };
    let _ =
        writeln!(out, "{lead}unsigned long long* {TRACE_PARAM},\n    unsigned long long* {TRACE_BLOCKS_PARAM})\n{{");
    let _ = writeln!(out, "    if (trace_leader()) {{");
    let _ = writeln!(out, "        const unsigned long long t = global_timer();");
    let _ = writeln!(out, "        unsigned sm;");
    let _ = writeln!(out, "        asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm));");
    let _ = writeln!(out, "        trace_words() = {TRACE_PARAM};");
    let _ = writeln!(
        out,
        "        trace_block() = {TRACE_BLOCKS_PARAM} ? {TRACE_BLOCKS_PARAM} + 4ull * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)) : nullptr;"
    );
    let _ = writeln!(out, "        atomicMin({TRACE_PARAM}, t);");
    let _ = writeln!(out, "        atomicMax({TRACE_PARAM} + 1, t);");
    let _ = writeln!(out, "        if (trace_block()) {{");
    let _ = writeln!(out, "            trace_block()[0] = t;");
    let _ = writeln!(out, "            trace_block()[3] = sm;");
    let _ = writeln!(out, "        }}");
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "    {name}_body({});", params.join(", "));
    let _ = writeln!(out, "    __syncthreads();");
    let _ = writeln!(out, "    if (trace_leader()) {{");
    let _ = writeln!(out, "        const unsigned long long t = global_timer();");
    let _ = writeln!(out, "        atomicMax({TRACE_PARAM} + 3, t);");
    let _ = writeln!(out, "        if (trace_block()) trace_block()[2] = t;");
    let _ = writeln!(out, "    }}");
    out.push_str("}\n");
    out
}
