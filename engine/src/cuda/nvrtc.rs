//! NVRTC: finding the library, compiling emitted CUDA C to a cubin for one architecture, and
//! reading the resources ptxas reports.
//!
//! NVRTC needs no GPU, so everything here runs on a machine without one. cudarc opens NVRTC by its
//! library name through the dynamic loader; to use a copy outside the loader's path (the pip wheel
//! the test command installs into `.nvrtc/`, or a CUDA toolkit), we first open it by its full path,
//! after which the loader resolves the name to the copy already open.

use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};
use kernel_dsl::Arch;

use crate::error::{Error, Result};

/// NVRTC's version, once it is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NvrtcVersion {
    pub major: i32,
    pub minor: i32,
}

/// Where NVRTC is looked for, in order: `FLASHNEXT_NVRTC_DIR`, the project-local wheel, then the
/// CUDA toolkit's usual places. The dynamic loader's own search (LD_LIBRARY_PATH) comes last.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("FLASHNEXT_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.nvrtc/nvidia/cu13/lib"));
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(PathBuf::from(d).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    dirs
}

/// Loads NVRTC once per process; later calls return the same answer.
pub fn load() -> Result<NvrtcVersion> {
    static LOADED: OnceLock<std::result::Result<NvrtcVersion, String>> = OnceLock::new();
    LOADED.get_or_init(load_once).clone().map_err(Error::NvrtcMissing)
}

fn load_once() -> std::result::Result<NvrtcVersion, String> {
    let dirs = search_dirs();
    for dir in &dirs {
        if preload_from(dir) {
            break;
        }
    }
    // SAFETY: probing the library by name has no effect beyond loading it.
    if !unsafe { sys::is_culib_present() } {
        let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "libnvrtc.so.13 was not found in {} nor on the loader's path. Run tools/test.sh once (it \
             installs the nvidia-cuda-nvrtc wheel into .nvrtc/), or point FLASHNEXT_NVRTC_DIR at a \
             folder holding libnvrtc.so.13 and libnvrtc-builtins.so.13.*",
            searched.join(", ")
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); the two pointers are valid for writes.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {status:?}"));
    }
    Ok(NvrtcVersion { major, minor })
}

/// Opens `libnvrtc-builtins` and `libnvrtc` from `dir` by path, for the process's lifetime.
fn preload_from(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let find = |prefix: &str| {
        let mut found: Vec<&PathBuf> = names
            .iter()
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && !n.contains(".alt."))
            })
            .collect();
        found.sort();
        found.last().map(|p| (*p).clone())
    };
    let (Some(builtins), Some(nvrtc)) = (find("libnvrtc-builtins.so.13"), find("libnvrtc.so.13")) else {
        return false;
    };
    for lib in [builtins, nvrtc] {
        // SAFETY: these are NVIDIA's NVRTC libraries; their initialisers only set up the compiler.
        // RTLD_GLOBAL makes them visible to the later open by name; the handle is kept open for
        // the process's lifetime on purpose.
        let opened = unsafe {
            libloading::os::unix::Library::open(
                Some(&lib),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        };
        match opened {
            Ok(l) => std::mem::forget(l),
            Err(_) => return false,
        }
    }
    true
}

/// Where a kernel's resource figures came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResourceSource {
    /// Nowhere: the figures are unknown, not zero.
    #[default]
    Unknown,
    /// ptxas's `-v` report in NVRTC's log: everything, spills split into stores and loads.
    Ptxas,
    /// The cubin's own attributes: registers and the stack frame (spills show as a frame).
    Cubin,
}

/// What a compiled kernel uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub stack_frame_bytes: u32,
    pub shared_bytes: u32,
    pub source: ResourceSource,
}

impl Resources {
    /// Reads ptxas's `-v` report out of an NVRTC log.
    pub fn from_log(log: &str) -> Resources {
        let mut r = Resources::default();
        for line in log.lines() {
            let number_before = |word: &str| -> Option<u32> {
                let i = line.find(word)?;
                line[..i].split_whitespace().last()?.parse().ok()
            };
            if line.contains("registers") {
                r.source = ResourceSource::Ptxas;
                r.registers = number_before(" registers").unwrap_or(0);
                r.shared_bytes = number_before(" bytes smem").unwrap_or(0);
            }
            if line.contains("spill stores") {
                r.stack_frame_bytes = number_before(" bytes stack frame").unwrap_or(0);
                r.spill_store_bytes = number_before(" bytes spill stores").unwrap_or(0);
                r.spill_load_bytes = number_before(" bytes spill loads").unwrap_or(0);
            }
        }
        r
    }

    /// ptxas's report if the log has one, else what the cubin records.
    pub fn of(log: &str, image: &[u8]) -> Resources {
        let r = Resources::from_log(log);
        if r.source == ResourceSource::Ptxas {
            return r;
        }
        match super::cubin_info::registers_and_frame(image) {
            Some((registers, frame)) => {
                Resources { registers, stack_frame_bytes: frame, source: ResourceSource::Cubin, ..Resources::default() }
            }
            None => r,
        }
    }

    /// Whether the kernel spills. From a cubin only the stack frame is known: any frame counts.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0
            || self.spill_load_bytes > 0
            || (self.source == ResourceSource::Cubin && self.stack_frame_bytes > 0)
    }
}

/// A kernel compiled to machine code for one architecture.
#[derive(Clone, Debug)]
pub struct Cubin {
    pub image: Vec<u8>,
    pub resources: Resources,
    /// NVRTC's log (ptxas's report included).
    pub log: String,
}

/// The options every kernel is compiled with. `-lineinfo` keeps source lines for profilers; no
/// fast-math, so that expf and division are the accurate ones the references are compared with.
pub fn options(arch: Arch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.nvrtc_target()),
        "--std=c++17".into(),
        "-lineinfo".into(),
        "-Xptxas=-v".into(),
    ]
}

/// Compiles one kernel's source for `arch`. `name` is the kernel's file name in messages.
pub fn compile(source: &str, name: &str, arch: Arch) -> Result<Cubin> {
    load()?;
    let compile_error = |log: String| Error::Compile { kernel: name.to_owned(), excerpt: excerpt(source, &log), log };
    let src = CString::new(source).map_err(|_| compile_error("the source holds a NUL byte".into()))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| compile_error("the name holds a NUL byte".into()))?;
    let prog =
        result::create_program(&src, Some(&file)).map_err(|e| compile_error(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: `prog` was created above and is destroyed once, at the end of this block.
    unsafe {
        let compiled = result::compile_program(prog, &options(arch));
        let log = result::get_program_log(prog).map(|l| c_chars_to_string(&l)).unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(compile_error(if log.trim().is_empty() { format!("{e:?}") } else { log.clone() })),
            Ok(()) => cubin(prog).map(|image| Cubin { resources: Resources::of(&log, &image), image, log }),
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// # Safety
/// `prog` is a successfully compiled, live program.
unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    let fail = |what: &str, s: sys::nvrtcResult| Error::Compile {
        kernel: String::new(),
        log: format!("{what} failed: {s:?}"),
        excerpt: String::new(),
    };
    // SAFETY: the caller guarantees `prog`; `size` is valid for writes.
    let s = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
    if s != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail("nvrtcGetCUBINSize", s));
    }
    let mut image = vec![0u8; size];
    // SAFETY: `image` has the size NVRTC reported.
    let s = unsafe { sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast::<c_char>()) };
    if s != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail("nvrtcGetCUBIN", s));
    }
    Ok(image)
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The lines of `source` that NVRTC's messages point at (`name.cu(42): error: ...`), two lines
/// of context each, numbered.
pub fn excerpt(source: &str, log: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = String::new();
    let mut shown = Vec::new();
    for msg in log.lines() {
        let Some(open) = msg.find(".cu(") else { continue };
        let rest = &msg[open + 4..];
        let Some(close) = rest.find(')') else { continue };
        let Ok(line) = rest[..close].parse::<usize>() else { continue };
        if line == 0 || shown.contains(&line) {
            continue;
        }
        shown.push(line);
        let lo = line.saturating_sub(2).max(1);
        let hi = (line + 2).min(lines.len());
        for n in lo..=hi {
            let mark = if n == line { ">" } else { " " };
            out.push_str(&format!("{mark}{n:5} | {}\n", lines.get(n - 1).unwrap_or(&"")));
        }
        out.push_str("      ...\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_ptxas_report() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 32 bytes smem\n";
        let r = Resources::from_log(log);
        assert_eq!(
            r,
            Resources {
                registers: 40,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                stack_frame_bytes: 8,
                shared_bytes: 32,
                source: ResourceSource::Ptxas,
            }
        );
        assert!(r.spills());
        assert_eq!(Resources::from_log("").source, ResourceSource::Unknown);
    }

    #[test]
    fn points_at_the_offending_lines() {
        let source = "a\nb\nc\nd\ne\nf\n";
        let log = "k.cu(4): error: identifier \"x\" is undefined\n";
        let ex = excerpt(source, log);
        assert!(ex.contains(">    4 | d"), "{ex}");
        assert!(ex.contains("     2 | b"), "{ex}");
        assert!(!ex.contains("| a"), "{ex}");
    }
}
