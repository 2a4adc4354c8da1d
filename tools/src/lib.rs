//! The tools' shared code: the parts of the decode binary (`src/bin/decode.rs`), kept in a library
//! so its tests and a later GPU backend reach them; and those of the long runs (`src/bin/longrun.rs`).

pub mod autotune;
pub mod decode;
pub mod longrun;
