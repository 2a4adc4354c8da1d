//! From a kernel's description to Rust code. Each module mirrors its twin in `parse/`.

pub(crate) mod body;
pub(crate) mod kernel;
pub(crate) mod launch;
pub(crate) mod tiles;
