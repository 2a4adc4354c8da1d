//! The kernel DSL: a typed IR for GPU kernels, its specialisation for tile shapes and an
//! architecture, a CUDA C emitter with a library of device helpers, and the runtime-free launch
//! interface that `#[kernel]` (crate `kernel-macros`) implements.
//!
//! Nothing here touches a GPU or the CUDA runtime: every part is tested on any machine. The engine
//! compiles the emitted CUDA with NVRTC and launches it.
//!
//! The flow: `#[kernel] fn` → [`KernelTemplate`] (tiles symbolic) → [`specialize`] (tiles, arch) →
//! [`Kernel`] → [`emit::cuda`] → CUDA C text.

pub mod arch;
pub mod e2m1_pairs;
pub mod emit;
pub mod intrinsic;
pub mod ir;
pub mod key;
pub mod launch;
pub mod shared_use;
pub mod specialize;
pub mod storage;
pub mod types;
pub mod typing;

pub use arch::Arch;
pub use ir::KernelTemplate;
pub use key::{DSL_VERSION, KernelKey, TileValue};
pub use launch::{
    AnyKernel, DevPtr, DevPtrMut, Erased, KernelArgs, KernelDef, LaunchDims, LaunchError, ParamValue, TileSet,
};
pub use specialize::{Kernel, SpecializeError, specialize};
pub use storage::{E2m1x2, E4m3};

/// The element types kernels name in their signatures, for the generated launchers.
pub mod elem {
    pub use crate::storage::{E2m1x2 as e2m1x2, E4m3 as e4m3};
    pub use half::{bf16, f16};
}
