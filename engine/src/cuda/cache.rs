//! Compiled kernels by key: in this process, and on disk between processes.
//!
//! A cubin is stored under its kernel key's file stem plus a hash of everything that shapes the
//! machine code (the source, the NVRTC options, NVRTC's version), so a changed emitter, kernel or
//! compiler never reuses a stale image. Files are written to a temporary name and renamed into
//! place, so a concurrent reader sees a whole file or none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kernel_dsl::{Arch, Kernel};

use super::nvrtc::{self, Cubin, Resources};
use crate::error::Result;

/// FNV-1a, 64 bits: stable across Rust versions and platforms, unlike `DefaultHasher`.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where compiled kernels are kept between runs: `FLASHNEXT_CACHE_DIR`, else the user's cache
/// folder. `FLASHNEXT_CACHE_DIR=off` keeps them in memory only.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("FLASHNEXT_CACHE_DIR") {
        Some(d) if d == "off" => None,
        Some(d) => Some(PathBuf::from(d)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("flashnext").join("kernels")),
    }
}

/// Counts of where compiled kernels came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub memory_hits: u64,
    pub disk_hits: u64,
    pub compiled: u64,
}

#[derive(Debug)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    memory: Mutex<HashMap<u64, Arc<Cubin>>>,
    stats: Mutex<CacheStats>,
}

impl CompileCache {
    pub fn new(dir: Option<PathBuf>) -> CompileCache {
        CompileCache { dir, memory: Mutex::new(HashMap::new()), stats: Mutex::new(CacheStats::default()) }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn stats(&self) -> CacheStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cubin of `kernel` for its architecture: from memory, from disk, or compiled now.
    pub fn get(&self, kernel: &Kernel) -> Result<Arc<Cubin>> {
        self.get_built(kernel, false)
    }

    /// [`get`](Self::get), of the traced build when `traced` (`kernel_dsl::emit::trace`; its own
    /// source, so its own entry).
    pub fn get_built(&self, kernel: &Kernel, traced: bool) -> Result<Arc<Cubin>> {
        let source = if traced { kernel_dsl::emit::trace::cuda_traced(kernel) } else { kernel_dsl::emit::cuda(kernel) };
        let arch: Arch = kernel.key.arch;
        let version = nvrtc::load()?;
        let options = nvrtc::options(arch).join(" ");
        let nvrtc_version = format!("{}.{}", version.major, version.minor);
        let hash = stable_hash(&[source.as_bytes(), options.as_bytes(), nvrtc_version.as_bytes()]);

        if let Some(c) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(&hash) {
            self.count(|s| s.memory_hits += 1);
            return Ok(Arc::clone(c));
        }
        let stem = format!("{}-{hash:016x}", kernel.key.file_stem());
        let cubin = match self.read(&stem) {
            Some(c) => {
                self.count(|s| s.disk_hits += 1);
                c
            }
            None => {
                let c = nvrtc::compile(&source, kernel.name(), arch)?;
                self.count(|s| s.compiled += 1);
                self.write(&stem, &c);
                c
            }
        };
        let cubin = Arc::new(cubin);
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(hash, Arc::clone(&cubin));
        Ok(cubin)
    }

    fn count(&self, f: impl FnOnce(&mut CacheStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn read(&self, stem: &str) -> Option<Cubin> {
        let dir = self.dir.as_ref()?;
        let image = std::fs::read(dir.join(format!("{stem}.cubin"))).ok()?;
        let log = std::fs::read_to_string(dir.join(format!("{stem}.log"))).ok()?;
        Some(Cubin { resources: Resources::of(&log, &image), image, log })
    }

    /// Best effort: a cache that cannot be written only costs a recompile next time.
    fn write(&self, stem: &str, cubin: &Cubin) {
        let Some(dir) = &self.dir else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let put = |ext: &str, bytes: &[u8]| {
            let tmp = dir.join(format!("{stem}.{ext}.tmp{}", std::process::id()));
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, dir.join(format!("{stem}.{ext}")));
            } else {
                let _ = std::fs::remove_file(&tmp);
            }
        };
        // The log first: an image is trusted only with its resource report beside it.
        put("log", cubin.log.as_bytes());
        put("cubin", &cubin.image);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_is_stable_and_separates_parts() {
        assert_eq!(stable_hash(&[b"abc"]), stable_hash(&[b"abc"]));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        // A fixed value, computed independently: the on-disk names must not change between builds.
        assert_eq!(stable_hash(&[b"flashnext"]), 0xc6ce_a418_a36c_1c31);
    }
}
