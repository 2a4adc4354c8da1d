//! The tools' shared code: the parts of the decode binary (`src/bin/decode.rs`), kept in a library
//! so its tests reach them; those of the long runs (`src/bin/longrun.rs`);
//! the bench report's (`src/bin/bench_report.rs`); the autotuner's; and kernel-inspect's
//! (`src/bin/kernel_inspect.rs`).

pub mod autotune;
pub mod bench_report;
pub mod decode;
pub mod inspect;
pub mod longrun;
