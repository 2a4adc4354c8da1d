//! Every kernel compiled by NVRTC to a cubin for sm_90 and sm_121a: no GPU needed, so this runs
//! in CI (the test command installs NVRTC when it is missing) and is never skipped. Registers and
//! spills are reported; at default tiles a spill fails the test. Every candidate tile set of the
//! autotuner's space is compiled too, so none of them is broken CUDA.
//!
//! The report goes to stdout and to target/nvrtc-compile-report.txt.

use std::fmt::Write;

use engine::cuda::nvrtc;
use kernel_dsl::Arch;

#[test]
fn every_kernel_compiles_for_every_arch_without_spills_at_default_tiles() {
    let version = nvrtc::load().unwrap_or_else(|e| panic!("{e}"));
    let mut report = format!("NVRTC {}.{}\n", version.major, version.minor);
    let mut compiled = 0usize;
    let mut problems = Vec::new();
    for kernel in engine::kernels::ALL {
        for arch in Arch::ALL {
            let spec = kernel.default_kernel(arch).unwrap_or_else(|e| panic!("{e}"));
            let source = kernel_dsl::emit::cuda(&spec);
            match nvrtc::compile(&source, kernel.name(), arch) {
                Ok(c) => {
                    compiled += 1;
                    let r = c.resources;
                    let _ = writeln!(
                        report,
                        "{:<12} {:<8} default  {:>3} registers  {:>4} B stack  {:>4} B spill st  {:>4} B spill ld  {:>5} B smem  {:>6} B cubin",
                        kernel.name(),
                        arch,
                        r.registers,
                        r.stack_frame_bytes,
                        r.spill_store_bytes,
                        r.spill_load_bytes,
                        r.shared_bytes,
                        c.image.len()
                    );
                    if !r.reported {
                        problems.push(format!("NVRTC's log for {} has no ptxas report; the log:\n{}", spec.key, c.log));
                    }
                    if r.spills() || c.image.is_empty() {
                        problems.push(format!("{} spills at its default tiles on {arch}", spec.key));
                    }
                }
                Err(e) => problems.push(e.to_string()),
            }
            let (mut ok, mut spilling, mut total) = (0, 0, 0);
            for candidate in kernel.candidate_kernels(arch) {
                total += 1;
                let Ok(spec) = candidate else { continue };
                match nvrtc::compile(&kernel_dsl::emit::cuda(&spec), kernel.name(), arch) {
                    Ok(c) => {
                        ok += 1;
                        spilling += usize::from(c.resources.spills());
                    }
                    Err(e) => problems.push(format!("candidate {}: {e}", spec.key)),
                }
            }
            compiled += ok;
            let _ = writeln!(
                report,
                "{:<12} {:<8} {ok}/{total} candidate tile sets compiled, {spilling} spill",
                kernel.name(),
                arch
            );
        }
    }
    let _ = writeln!(report, "{compiled} cubins compiled by NVRTC");
    print!("{report}");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/nvrtc-compile-report.txt");
    let _ = std::fs::write(out, &report);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
