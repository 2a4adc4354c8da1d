//! The tools' shared code: the parts of the decode binary (`src/bin/decode.rs`), kept in a library
//! so its tests and a later GPU backend reach them.

pub mod autotune;
pub mod decode;
