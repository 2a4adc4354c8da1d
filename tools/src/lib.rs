//! The tools' shared code: the parts of the decode binary (`src/bin/decode.rs`), kept in a library
//! so its tests and a later GPU backend reach them; those of the long runs (`src/bin/longrun.rs`); and
//! the bench report's (`src/bin/bench_report.rs`).

pub mod autotune;
pub mod bench_report;
pub mod decode;
pub mod longrun;
