//! The PLE row gather from bf16 rows: the rows the ids address, copied from the table (in mapped
//! host memory, read zero-copy over the bus, or anywhere else the device can address) into one
//! device buffer, head after head.

use kernel_macros::kernel;

/// `rows[r, :] = table[ids[r], :]` for r < `count`, rows of `width` bf16 values.
///
/// Every 16-byte piece of every row is one thread's load, so all of a step's reads are in
/// flight at once: over PCIe or C2C a read costs a round trip of a microsecond or so, and
/// issuing them together pays it once, not once per row. The table is read-only while the
/// step runs, so the loads may take the non-coherent path.
#[kernel(block = 32 * WARPS, grid = div_ceil(count * (width / 8), 32 * WARPS), require(width % 8 == 0))]
pub fn ple_gather_bf16(
    #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
    table: &[bf16],
    ids: &[u64],
    rows: &mut [bf16],
    count: u32,
    width: u32,
) {
    let pieces = width / 8;
    let i = block_idx() * block_dim() + thread_idx();
    if i < count * pieces {
        let r = i / pieces;
        let col = (i % pieces) * 8;
        let v = load_vec::<u32x4>(table, ids[r] * (width as u64) + (col as u64));
        store_vec(rows, r * width + col, v);
    }
}
