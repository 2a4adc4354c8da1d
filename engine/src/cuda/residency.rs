//! At most N blocks of a kernel on one SM (`#[kernel(max_blocks = N)]`), by reserving dynamic
//! shared memory for each block when the kernel is loaded.
//!
//! The block scheduler puts a block wherever an SM has room when the block is placed. A grid
//! launched while its predecessor still runs (programmatic dependent launch) is placed while
//! most SMs are still full, so a grid meant one block an SM piles onto the few with room (the
//! Gated Residual's down-projection, behind the MoE's down projection on the H200: 132 blocks on
//! 38 SMs, three to six on one, each extra block about 1 µs longer; `moe_down_nvfp4`'s docs).
//! Its blocks hold little shared memory and the kernels around it less, so shared memory is the
//! resource that can bound it without touching its neighbours: with each block holding more
//! than 1/(N + 1) of an SM's, no (N + 1)-th fits, and the grid spreads as SMs free up.

use cudarc::driver::sys;

use crate::error::{DriverContext, Result};

/// The fewest bytes of dynamic shared memory that leave at most `most` blocks of `threads`
/// threads of `function` on one SM, or None when not even the most one block may take
/// (`max_per_block`, the device's opt-in limit) bounds it so. 0 when the kernel's registers,
/// threads or static shared memory already bound it. The function's limit on dynamic shared
/// memory is left at the answer (0 for None), as a launch with that much requires.
///
/// The driver's occupancy calculator answers for each size (it knows the allocation granularity
/// and the per-block reservation of this device), and the blocks it fits fall as the size grows,
/// so a bisection finds the least size.
pub(crate) fn shared_reservation(
    function: sys::CUfunction,
    threads: u32,
    most: u32,
    max_per_block: u32,
    what: &str,
) -> Result<Option<u32>> {
    let during = || format!("bounding the residency of {what}");
    let mut static_bytes: std::ffi::c_int = 0;
    // SAFETY: `function` is a loaded function of the current context; the out-pointer lives.
    unsafe {
        sys::cuFuncGetAttribute(
            &mut static_bytes,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            function,
        )
    }
    .result()
    .during(&during())?;
    let ceiling = max_per_block.saturating_sub(static_bytes.max(0) as u32);
    let allow = |bytes: u32| {
        // SAFETY: as above; the attribute takes a byte count no larger than the opt-in limit.
        unsafe {
            sys::cuFuncSetAttribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as std::ffi::c_int,
            )
        }
        .result()
        .during(&during())
    };
    let fitting = |bytes: u32| -> Result<u32> {
        let mut blocks: std::ffi::c_int = 0;
        // SAFETY: as above; the out-pointer lives through the call.
        unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                function,
                threads as std::ffi::c_int,
                bytes as usize,
            )
        }
        .result()
        .during(&during())?;
        Ok(blocks.max(0) as u32)
    };
    allow(ceiling)?;
    if fitting(0)? <= most {
        allow(0)?;
        return Ok(Some(0));
    }
    let at_ceiling = fitting(ceiling)?;
    if at_ceiling > most || at_ceiling == 0 {
        allow(0)?;
        return Ok(None);
    }
    // fitting(low) > most >= fitting(high), throughout.
    let (mut low, mut high) = (0u32, ceiling);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fitting(mid)? <= most {
            high = mid;
        } else {
            low = mid;
        }
    }
    allow(high)?;
    Ok(Some(high))
}
