//! A DSL kernel compiled and loaded for the device, and its launch with typed arguments.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream};
use kernel_dsl::{KernelArgs, KernelDef, KernelKey, LaunchDims, ParamValue, TileSet as _};

use super::device::Gpu;
use super::nvrtc::Resources;
use crate::error::{DriverContext, Result};

/// Kernel `K` at one tile set, ready to launch on the GPU that loaded it.
#[derive(Debug)]
pub struct LoadedKernel<K: KernelDef> {
    tiles: K::Tiles,
    key: KernelKey,
    resources: Resources,
    /// The kernel calls `grid_dependency_wait()`, so it may start before its predecessor ends.
    overlappable: bool,
    /// Compiled traced: its launches take one more parameter, their trace words.
    traced: bool,
    /// Dynamic shared memory every launch reserves and nothing uses, so that at most the tiles'
    /// `max_blocks` blocks fit on one SM (`super::residency`); 0 without that bound.
    reserved_shared: u32,
    /// Set when the driver refused a cooperative launch that also asked to overlap its
    /// predecessor: the kernel's later launches are cooperative only.
    cooperative_alone: AtomicBool,
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
        overlappable: bool,
        traced: bool,
        module: Arc<CudaModule>,
        function: CudaFunction,
    ) -> Self {
        LoadedKernel {
            tiles,
            key,
            resources,
            overlappable,
            traced,
            reserved_shared: 0,
            cooperative_alone: AtomicBool::new(false),
            _module: module,
            function,
            _kernel: PhantomData,
        }
    }

    /// Applies the tiles' `max_blocks` (`#[kernel(max_blocks = ...)]`): each launch reserves, for
    /// every block, the least dynamic shared memory that keeps at most that many blocks on an SM
    /// (`super::residency`), on a device whose blocks may take up to `max_per_block` bytes. The
    /// bound is for speed, not correctness: where shared memory cannot make it (no device we know
    /// of), the kernel runs unbounded and says so.
    pub(crate) fn bound_residency(mut self, max_per_block: u32) -> Result<Self> {
        let most = self.tiles.max_blocks();
        if most == 0 {
            return Ok(self);
        }
        let threads = self.tiles.block_threads();
        let what = self.key.to_string();
        let function = self.function.cu_function();
        match super::residency::shared_reservation(function, threads, most, max_per_block, &what)? {
            Some(bytes) => self.reserved_shared = bytes,
            None => eprintln!(
                "{what}: no reservation of shared memory keeps it to {most} blocks an SM on this device; launched without the bound"
            ),
        }
        Ok(self)
    }

    /// Whether the kernel waits on its grid dependency, so launches may overlap its predecessor.
    pub fn overlappable(&self) -> bool {
        self.overlappable
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

    /// Bytes of dynamic shared memory each block reserves to bound the blocks an SM holds
    /// (`#[kernel(max_blocks = ...)]`); 0 for a kernel without the bound.
    pub fn reserved_shared(&self) -> u32 {
        self.reserved_shared
    }

    /// How many blocks of this kernel the whole device holds at once (the driver's occupancy for
    /// its block size, registers and shared memory, the reservation included, times the SMs): a
    /// kernel whose blocks wait for each other (a software grid barrier) needs its grid no larger
    /// than this.
    pub fn co_resident_blocks(&self, gpu: &Gpu) -> Result<u32> {
        let mut per_sm: std::ffi::c_int = 0;
        let threads = self.tiles.block_threads() as std::ffi::c_int;
        // SAFETY: the function belongs to a module this kernel keeps loaded; `per_sm` outlives
        // the call.
        unsafe {
            cudarc::driver::sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                self.function.cu_function(),
                threads,
                self.reserved_shared as usize,
            )
        }
        .result()
        .during(&format!("reading the occupancy of {}", self.key))?;
        Ok(per_sm.max(0) as u32 * gpu.info().sm_count)
    }

    /// The grid and block a launch with `args` would use, after the kernel's requirements.
    pub fn dims(&self, args: &K::Args) -> Result<LaunchDims> {
        let mut dims = K::launch_dims(&self.tiles, args)?;
        dims.dynamic_shared_bytes += self.reserved_shared;
        Ok(dims)
    }

    /// Enqueues the kernel on the GPU's stream. A kernel that calls `grid_dependency_wait()` is
    /// launched to overlap its predecessor (programmatic stream serialisation) while the GPU's
    /// overlap switch is on: its blocks may start as soon as every block of the previous kernel
    /// has called `launch_dependents()` or exited, and run up to the wait meanwhile. Where a kernel
    /// calls `launch_dependents()` decides how many grids are resident at once, and so what the
    /// early ones take from the running one (SM room, and DRAM time for their pre-wait loads).
    /// On the H200 (BENCHMARKS.md, step section, session 24) both mix kernels triggering at their
    /// top made the step 1.6% slower than triggering after their wait, and `gemv_nvfp4`
    /// triggering after its wait 9% slower than not at all, while the mix kernel after it piled
    /// its blocks onto the few SMs with room; since that kernel keeps to one block an SM
    /// (`max_blocks`, [`reserved_shared`](Self::reserved_shared)) the early trigger gains (4.4% on
    /// an H100, session 43). The step's kernels trigger after their wait or, where measured
    /// better, at their exit. A kernel
    /// declared `#[kernel(..., cooperative)]` is launched cooperatively (`LaunchDims::cooperative`):
    /// the driver makes all its blocks resident at once or fails the launch
    /// (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`), so its grid barriers cannot wait for a block
    /// that never starts, under compute-sanitizer as well. Both attributes are kept in a captured
    /// graph's kernel node.
    ///
    /// # Safety
    /// The buffers behind `args` must be live and as large as the kernel reads and writes for the
    /// shape in `args` (each kernel's doc says what it touches), and no buffer it writes may alias
    /// another argument. The kernel's requirements on tiles and shape are checked here.
    pub unsafe fn launch(&self, gpu: &Gpu, args: &K::Args) -> Result<()> {
        // SAFETY: the caller's guarantees, on the GPU's own stream.
        unsafe { self.launch_on(gpu, gpu.stream(), args) }
    }

    /// [`launch`](Self::launch) on another stream of the GPU's context (a side stream forked
    /// from the main one with events, as [`super::SideStream`] does).
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); ordering against the main stream is the caller's.
    pub unsafe fn launch_on(&self, gpu: &Gpu, stream: &CudaStream, args: &K::Args) -> Result<()> {
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
        let [gx, gy, gz] = dims.grid;
        if self.traced {
            // The traced build's last parameters: this launch's own words and its blocks' records
            // (a graph keeps them).
            let blocks = gx as usize * gy as usize * gz as usize;
            let (words, records) = gpu.trace_slot(&self.key.name, blocks)?;
            slots.extend([words, records]);
        }
        let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| (s as *mut u64).cast::<c_void>()).collect();
        let [bx, by, bz] = dims.block;
        let overlapped = self.overlappable && gpu.overlaps_launches() && !self.cooperative_alone.load(Relaxed);
        if dims.cooperative || overlapped {
            use cudarc::driver::sys;
            let attribute = |id| sys::CUlaunchAttribute {
                id,
                pad: [0; 4],
                // SAFETY: an all-zero union is a valid value of every member; one is set below.
                value: unsafe { std::mem::zeroed() },
            };
            let mut attributes = Vec::with_capacity(2);
            if dims.cooperative {
                let mut a = attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
                a.value.cooperative = 1;
                attributes.push(a);
            }
            if overlapped {
                let mut a = attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
                a.value.programmaticStreamSerializationAllowed = 1;
                attributes.push(a);
            }
            let mut launch_ex = |attributes: &mut [sys::CUlaunchAttribute]| {
                let config = sys::CUlaunchConfig {
                    gridDimX: gx,
                    gridDimY: gy,
                    gridDimZ: gz,
                    blockDimX: bx,
                    blockDimY: by,
                    blockDimZ: bz,
                    sharedMemBytes: dims.dynamic_shared_bytes,
                    hStream: stream.cu_stream(),
                    attrs: attributes.as_mut_ptr(),
                    numAttrs: attributes.len() as u32,
                };
                // SAFETY: as below; the configuration and its attributes outlive the call, a kernel
                // launched overlapped orders its reads of earlier kernels' outputs after its grid
                // dependency wait, and a cooperative one has a grid the driver checks.
                unsafe {
                    sys::cuLaunchKernelEx(&config, self.function.cu_function(), ptrs.as_mut_ptr(), std::ptr::null_mut())
                }
            };
            let mut status = launch_ex(&mut attributes);
            let mut how = match (dims.cooperative, overlapped) {
                (true, true) => "cooperative, overlapped",
                (true, false) => "cooperative",
                _ => "overlapped",
            };
            if dims.cooperative && overlapped && refuses_the_pair(status) {
                // Should a driver refuse the two attributes together, co-residency wins: without
                // it a grid barrier may wait forever; without the overlap the kernel only starts
                // after its predecessor ends (its grid dependency wait then returns at once).
                status = launch_ex(&mut attributes[..1]);
                how = "cooperative, after the driver refused it overlapped";
                if status == sys::CUresult::CUDA_SUCCESS {
                    self.cooperative_alone.store(true, Relaxed);
                }
            }
            return status.result().during(&format!("launching {} ({how})", self.key));
        }
        // SAFETY: the function belongs to a module this kernel keeps loaded; the parameter slots
        // match the kernel's signature (generated from the same description); the caller
        // guarantees the buffers.
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.function.cu_function(),
                (gx, gy, gz),
                (bx, by, bz),
                dims.dynamic_shared_bytes,
                stream.cu_stream(),
                &mut ptrs,
            )
        }
        .during(&format!("launching {}", self.key))
    }
}

/// Whether a launch's status says that the driver does not take a cooperative launch that also
/// overlaps its predecessor (rather than a problem of the launch itself, such as a grid too large
/// to be resident at once, which is reported as it is).
fn refuses_the_pair(status: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult;
    matches!(status, CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_NOT_SUPPORTED)
}
