//! The GPU architectures kernels are built for.

use std::fmt;

/// A compile target. One kernel description serves both; where they differ (the FP4 conversion
/// instruction, shared-memory limits), the template or the prelude chooses by this value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Hopper (H100, H200): the machine we can run on.
    Sm90,
    /// GB10 (DGX Spark), with the arch-specific features (`a`): the machine we build for.
    Sm121a,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm90, Arch::Sm121a];

    /// The architecture for a device's compute capability, or why there is none.
    pub fn from_compute_capability(major: i32, minor: i32) -> Result<Arch, String> {
        match (major, minor) {
            (9, 0) => Ok(Arch::Sm90),
            (12, 1) => Ok(Arch::Sm121a),
            _ => {
                Err(format!("compute capability {major}.{minor} is not a target of this build (sm_90 and sm_121a are)"))
            }
        }
    }

    /// NVRTC's `--gpu-architecture` value; a real architecture, so NVRTC emits a cubin.
    pub fn nvrtc_target(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm_90",
            Arch::Sm121a => "sm_121a",
        }
    }

    /// The SM version as a number, as the `sm()` intrinsic sees it.
    pub fn sm(self) -> u32 {
        match self {
            Arch::Sm90 => 90,
            Arch::Sm121a => 121,
        }
    }

    /// Whether `cvt.rn.f16x2.e2m1x2` exists (sm_100a and sm_12xa); elsewhere FP4 is decoded with
    /// integer bit operations.
    pub fn has_fp4_conversion(self) -> bool {
        matches!(self, Arch::Sm121a)
    }

    /// The most shared memory one block may use, dynamic included, once opted in.
    pub fn max_shared_bytes_per_block(self) -> u32 {
        match self {
            Arch::Sm90 => 227 * 1024,
            Arch::Sm121a => 99 * 1024,
        }
    }

    /// Static `__shared__` arrays are limited to 48 KiB on every architecture.
    pub const MAX_STATIC_SHARED_BYTES: u32 = 48 * 1024;

    /// The most threads in one block.
    pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

    /// The most threads resident on one SM on every architecture: 2048 on sm_90, 1536 on sm_121a;
    /// the smaller, so that one `min_blocks` holds on both.
    pub const MAX_THREADS_PER_SM: u32 = 1536;
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.nvrtc_target())
    }
}

impl std::str::FromStr for Arch {
    type Err = String;

    fn from_str(s: &str) -> Result<Arch, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.nvrtc_target() == s)
            .ok_or_else(|| format!("unknown architecture `{s}` (expected sm_90 or sm_121a)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_capabilities_map_to_targets() {
        assert_eq!(Arch::from_compute_capability(9, 0), Ok(Arch::Sm90));
        assert_eq!(Arch::from_compute_capability(12, 1), Ok(Arch::Sm121a));
        assert!(Arch::from_compute_capability(8, 0).is_err());
        assert_eq!("sm_121a".parse::<Arch>(), Ok(Arch::Sm121a));
        assert!("sm_80".parse::<Arch>().is_err());
    }
}
