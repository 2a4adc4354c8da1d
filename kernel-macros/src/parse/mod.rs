//! From the syntax of a `#[kernel]` function to its description. Each module here has its twin in
//! `generate/`: `kernel` (the whole declaration), `tiles` (the `#[tile]` parameters), `launch` (the
//! attribute's grid, block and requirements) and `body` (the body, lowered to IR and type-checked).
//! `helpers` reads the file of device functions a kernel names; its twin is the line of
//! `generate/kernel` that includes the file's bytes, so that cargo rebuilds on its change.

pub(crate) mod body;
pub(crate) mod helpers;
pub(crate) mod kernel;
pub(crate) mod launch;
pub(crate) mod tiles;
