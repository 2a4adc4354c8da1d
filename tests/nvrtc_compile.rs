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
                        "{:<17} {:<8} default  {:>3} registers  {:>4} B stack  {:>4} B spill st  {:>4} B spill ld  {:>5} B smem  {:>6} B cubin  ({:?})",
                        kernel.name(),
                        arch,
                        r.registers,
                        r.stack_frame_bytes,
                        r.spill_store_bytes,
                        r.spill_load_bytes,
                        r.shared_bytes,
                        c.image.len(),
                        r.source
                    );
                    // The cubin's own attributes agree with ptxas where both exist: the fallback
                    // used when NVRTC serves a compile from its cache reads real cubins right.
                    if r.source == nvrtc::ResourceSource::Ptxas {
                        let from_cubin = engine::cuda::cubin_info::registers_and_frame(&c.image);
                        if from_cubin != Some((r.registers, r.stack_frame_bytes)) {
                            problems.push(format!(
                                "{}: the cubin says {from_cubin:?}, ptxas ({}, {})",
                                spec.key, r.registers, r.stack_frame_bytes
                            ));
                        }
                    }
                    if r.source == nvrtc::ResourceSource::Unknown {
                        problems.push(format!(
                            "no resource figures for {}: no ptxas report and no .nv.info in the cubin",
                            spec.key
                        ));
                    }
                    if r.spills() || c.image.is_empty() {
                        problems.push(format!("{} spills at its default tiles on {arch}", spec.key));
                    }
                }
                Err(e) => problems.push(e.to_string()),
            }
            // The candidates, compiled on every core: NVRTC compiles independent programs in parallel.
            let specs: Vec<_> = kernel.candidate_kernels(arch);
            let total = specs.len();
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
            let results: Vec<Result<bool, String>> = std::thread::scope(|scope| {
                let chunk = specs.len().div_ceil(threads).max(1);
                let handles: Vec<_> = specs
                    .chunks(chunk)
                    .map(|part| {
                        scope.spawn(move || {
                            part.iter()
                                .map(|candidate| match candidate {
                                    Ok(spec) => nvrtc::compile(&kernel_dsl::emit::cuda(spec), kernel.name(), arch)
                                        .map(|c| c.resources.spills())
                                        .map_err(|e| format!("candidate {}: {e}", spec.key)),
                                    Err(e) => Err(format!("candidate of {}: {e}", kernel.name())),
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
            });
            let (mut ok, mut spilling) = (0, 0);
            for r in results {
                match r {
                    Ok(spills) => {
                        ok += 1;
                        spilling += usize::from(spills);
                    }
                    Err(e) => problems.push(e),
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

/// A kernel NVRTC rejects: the error carries NVRTC's log and the generated lines it points at.
#[test]
fn a_compile_error_shows_the_log_and_the_offending_lines() {
    nvrtc::load().unwrap_or_else(|e| panic!("{e}"));
    let source = "extern \"C\" __global__ void broken(float* y)\n{\n    y[0] = undefined_name + 1.0f;\n}\n";
    let err = nvrtc::compile(source, "broken", Arch::Sm90).expect_err("the source does not compile").to_string();
    assert!(err.contains("broken") && err.contains("undefined_name"), "{err}");
    assert!(err.contains(">    3 |     y[0] = undefined_name + 1.0f;"), "the excerpt marks line 3:\n{err}");
}

/// The traced build of every kernel (`kernel_dsl::emit::trace`, what a GPU opened with
/// `FLASHNEXT_TRACE=1` loads) compiles for every architecture at its default tiles, its entry
/// point taking the trace words and the block records last, with at most 24 registers more than
/// the plain build (the stamps must not change the code they time much; the most was 8 on sm_90
/// and 17 on sm_121a, `ple_gate_conv`'s, before the block records) and no spill the plain build
/// does not have.
#[test]
fn every_kernel_compiles_traced_with_about_the_plain_registers() {
    nvrtc::load().unwrap_or_else(|e| panic!("{e}"));
    let mut problems = Vec::new();
    for kernel in engine::kernels::ALL {
        for arch in Arch::ALL {
            let spec = kernel.default_kernel(arch).unwrap_or_else(|e| panic!("{e}"));
            let traced = kernel_dsl::emit::trace::cuda_traced(&spec);
            let tail = format!(
                "unsigned long long* {},\n    unsigned long long* {})",
                kernel_dsl::emit::trace::TRACE_PARAM,
                kernel_dsl::emit::trace::TRACE_BLOCKS_PARAM
            );
            if !traced.contains(&tail) {
                problems.push(format!(
                    "{}: the entry point does not take the trace words and block records last",
                    spec.key
                ));
            }
            let plain = nvrtc::compile(&kernel_dsl::emit::cuda(&spec), kernel.name(), arch);
            match (nvrtc::compile(&traced, kernel.name(), arch), plain) {
                (Ok(t), Ok(p)) => {
                    let (t, p) = (t.resources, p.resources);
                    if t.spills() && !p.spills() {
                        problems.push(format!("{} spills traced", spec.key));
                    }
                    if t.registers > p.registers + 24 {
                        problems.push(format!("{}: {} registers traced, {} plain", spec.key, t.registers, p.registers));
                    }
                }
                (Err(e), _) => problems.push(format!("{} traced: {e}", spec.key)),
                (_, Err(e)) => problems.push(format!("{}: {e}", spec.key)),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
