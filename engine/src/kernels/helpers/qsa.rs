//! Device functions of QSA's split attention (`qsa::attention`, `qsa::combine`). A helpers file,
//! not a Rust module: each kernel names it (`#[kernel(..., helpers = "src/kernels/helpers/qsa.rs")]`)
//! and every call is expanded in place when the kernel is lowered.

/// The tokens the attention attends to at position `pos`: the selection's `min((pos + 1) / c,
/// top)` whole blocks of `c` tokens (the count `qsa_top_blocks` writes: the position lies inside
/// the context, so the cache's capacity never binds) and the tail of the block being filled.
/// The attention leaves the splits past them empty and the combine reads none of them: both take
/// the count from here, so they cannot disagree.
fn attended_tokens(pos: u32, c: u32, top: u32) -> u32 {
    let complete = (pos + 1) / c;
    min(complete, top) * c + (pos + 1 - complete * c)
}
