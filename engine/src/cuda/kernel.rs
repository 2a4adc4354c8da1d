//! A DSL kernel compiled and loaded for the device, and its launch with typed arguments.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};
use kernel_dsl::{KernelArgs, KernelDef, KernelKey, LaunchDims, ParamValue};

use super::device::Gpu;
use super::nvrtc::Resources;
use crate::error::{DriverContext, Result};

/// Kernel `K` at one tile set, ready to launch on the GPU that loaded it.
#[derive(Debug)]
pub struct LoadedKernel<K: KernelDef> {
    tiles: K::Tiles,
    key: KernelKey,
    resources: Resources,
    // Kept so the function handle stays valid.
    _module: Arc<CudaModule>,
    function: CudaFunction,
    _kernel: PhantomData<fn() -> K>,
}

impl<K: KernelDef> LoadedKernel<K> {
    pub(crate) fn new(
        tiles: K::Tiles,
        key: KernelKey,
        resources: Resources,
        module: Arc<CudaModule>,
        function: CudaFunction,
    ) -> Self {
        LoadedKernel { tiles, key, resources, _module: module, function, _kernel: PhantomData }
    }

    pub fn tiles(&self) -> &K::Tiles {
        &self.tiles
    }

    pub fn key(&self) -> &KernelKey {
        &self.key
    }

    pub fn resources(&self) -> Resources {
        self.resources
    }

    /// The grid and block a launch with `args` would use, after the kernel's requirements.
    pub fn dims(&self, args: &K::Args) -> Result<LaunchDims> {
        Ok(K::launch_dims(&self.tiles, args)?)
    }

    /// Enqueues the kernel on the GPU's stream.
    ///
    /// # Safety
    /// The buffers behind `args` must be live and as large as the kernel reads and writes for the
    /// shape in `args` (each kernel's doc says what it touches), and no buffer it writes may alias
    /// another argument. The kernel's requirements on tiles and shape are checked here.
    pub unsafe fn launch(&self, gpu: &Gpu, args: &K::Args) -> Result<()> {
        let dims = self.dims(args)?;
        let params = args.params();
        // One 8-byte slot per parameter; the driver reads as many bytes as the parameter has.
        let mut slots: Vec<u64> = params
            .iter()
            .map(|p| match *p {
                ParamValue::Ptr(a) | ParamValue::U64(a) => a,
                ParamValue::Bool(b) => u64::from(b),
                ParamValue::I32(v) => u64::from(v as u32),
                ParamValue::U32(v) => u64::from(v),
                ParamValue::I64(v) => v as u64,
                ParamValue::F32(v) => u64::from(v.to_bits()),
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast::<c_void>()).collect();
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        // SAFETY: the function belongs to a module this kernel keeps loaded; the parameter slots
        // match the kernel's signature (generated from the same description); the caller
        // guarantees the buffers.
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.function.cu_function(),
                (gx, gy, gz),
                (bx, by, bz),
                dims.dynamic_shared_bytes,
                gpu.stream().cu_stream(),
                &mut ptrs,
            )
        }
        .during(&format!("launching {}", self.key))
    }
}
