//! The GPU: its context, the one stream everything runs on, its properties, memory, and the
//! kernels compiled for it.
//!
//! Event tracking is switched off before the first allocation: with one stream, order is the
//! stream's, and cudarc's per-buffer events would otherwise break CUDA-graph capture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use kernel_dsl::{Arch, KernelDef, KernelKey};

use super::buffer::DeviceBuffer;
use super::cache::{self, CompileCache};
use super::host_mapped::MappedHostBuffer;
use super::kernel::LoadedKernel;
use super::trace::{Arena, LaunchStamps};
use crate::error::{DriverContext, Error, Result};

/// What the engine needs to know about the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub arch: Arch,
    pub sm_count: u32,
    pub l2_bytes: u64,
    pub total_memory: u64,
    /// Shared memory one block may use once it opts in.
    pub max_shared_per_block: u32,
}

/// An open GPU with its stream and compiled kernels.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    cache: CompileCache,
    modules: Mutex<HashMap<KernelKey, Arc<cudarc::driver::CudaModule>>>,
    /// Whether kernels that wait on their grid dependency are launched to overlap their
    /// predecessor (programmatic dependent launch); on by default, off with `FLASHNEXT_NO_PDL=1`.
    overlap: std::sync::atomic::AtomicBool,
    /// With `FLASHNEXT_TRACE=1`: every kernel is compiled traced and each launch stamps its own
    /// words of this arena (`super::trace`).
    trace: Option<Arena>,
}

/// Whether a CUDA driver is installed and sees at least one device; says why not otherwise.
pub fn probe() -> Result<i32> {
    // SAFETY: probing the driver library by name has no effect beyond loading it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoDevice("the CUDA driver library (libcuda.so) is not installed".into()));
    }
    cudarc::driver::result::init().during("initialising the CUDA driver")?;
    let n = CudaContext::device_count().during("counting CUDA devices")?;
    if n == 0 {
        return Err(Error::NoDevice("the CUDA driver sees no device".into()));
    }
    Ok(n)
}

impl Gpu {
    /// Opens device `ordinal` with the default on-disk kernel cache.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        Gpu::open_with_cache(ordinal, CompileCache::new(cache::default_dir()))
    }

    /// Opens device `ordinal`, tracing its launches when `FLASHNEXT_TRACE=1` ([`Gpu::traced`]).
    pub fn open_with_cache(ordinal: usize, cache: CompileCache) -> Result<Gpu> {
        let traced = std::env::var_os("FLASHNEXT_TRACE").is_some_and(|v| !v.is_empty() && v != "0");
        Gpu::open_with(ordinal, cache, traced)
    }

    /// Opens device `ordinal` with the default cache, every kernel compiled traced and every
    /// launch stamping its own trace words (`super::trace`), whatever the environment says.
    pub fn open_traced(ordinal: usize) -> Result<Gpu> {
        Gpu::open_with(ordinal, CompileCache::new(cache::default_dir()), true)
    }

    fn open_with(ordinal: usize, cache: CompileCache, traced: bool) -> Result<Gpu> {
        let count = probe()?;
        if ordinal >= count as usize {
            return Err(Error::NoDevice(format!("device {ordinal} asked for, {count} present")));
        }
        let ctx = CudaContext::new(ordinal).during("creating the CUDA context")?;
        // SAFETY: no buffer exists yet in this context (the stated precondition).
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().during("reading the compute capability")?;
        let arch = Arch::from_compute_capability(major, minor).map_err(Error::NoDevice)?;
        let attr = |a: Attr| ctx.attribute(a).during("reading device attributes");
        let info = DeviceInfo {
            name: ctx.name().during("reading the device name")?,
            compute_capability: (major, minor),
            arch,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            total_memory: ctx.total_mem().during("reading the memory size")? as u64,
            max_shared_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32,
        };
        // The legacy default stream cannot be captured into a graph: a stream of our own.
        let stream = ctx.new_stream().during("creating the stream")?;
        let overlap = std::env::var_os("FLASHNEXT_NO_PDL").is_none_or(|v| v.is_empty() || v == "0");
        let mut gpu = Gpu {
            ctx,
            stream,
            info,
            cache,
            modules: Mutex::new(HashMap::new()),
            overlap: std::sync::atomic::AtomicBool::new(overlap),
            trace: None,
        };
        if traced {
            gpu.trace = Some(Arena::new(&gpu)?);
        }
        Ok(gpu)
    }

    /// Whether this GPU compiles its kernels traced (`FLASHNEXT_TRACE=1` when it was opened):
    /// each launch stamps its start, its wait's return and its end (`super::trace`).
    pub fn traced(&self) -> bool {
        self.trace.is_some()
    }

    /// Readies every traced launch's words for the launches that follow (an error on a GPU that
    /// does not trace).
    pub fn trace_reset(&self) -> Result<()> {
        self.arena()?.reset(self)
    }

    /// Waits for the stream, then reads the stamps of the traced launches that ran since the last
    /// [`trace_reset`](Self::trace_reset), in the order they were enqueued or captured.
    pub fn trace_read(&self) -> Result<Vec<LaunchStamps>> {
        self.arena()?.read(self)
    }

    /// Gives every traced launch's slot back, so that a process can trace more launches than one
    /// arena holds (the step bench's two tile sets, each with its synthetic model's fills and its
    /// captures). `&mut self`: nothing that holds this GPU, an engine and its graph among them,
    /// may replay a launch whose slot is gone.
    pub fn trace_forget(&mut self) -> Result<()> {
        self.arena()?.forget();
        Ok(())
    }

    /// The device addresses of a new launch's trace words and of its `blocks` block records, for
    /// `kernel`.
    pub(crate) fn trace_slot(&self, kernel: &str, blocks: usize) -> Result<(u64, u64)> {
        self.arena()?.take(kernel, blocks)
    }

    fn arena(&self) -> Result<&Arena> {
        self.trace.as_ref().ok_or_else(|| Error::Buffer("this GPU was not opened with FLASHNEXT_TRACE=1".into()))
    }

    /// Whether launches of kernels that call `grid_dependency_wait()` overlap their predecessor.
    pub fn overlaps_launches(&self) -> bool {
        self.overlap.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns overlapped launches on or off for the launches enqueued from now on (a graph keeps
    /// what it captured).
    pub fn set_overlap_launches(&self, on: bool) {
        self.overlap.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn arch(&self) -> Arch {
        self.info.arch
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn compile_cache(&self) -> &CompileCache {
        &self.cache
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().during("synchronising the stream")
    }

    /// (free, total) bytes of device memory.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().during("reading the device's free memory")
    }

    /// `len` elements, zero-filled.
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Buffer(format!("{len} elements overflow")))?;
        let free = self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(usize::MAX);
        if bytes > free {
            return Err(Error::Buffer(format!(
                "asked for {bytes} bytes of device memory, {free} free on {}",
                self.info.name
            )));
        }
        let slice = self.stream.alloc_zeros::<u8>(bytes.max(1)).during("allocating device memory")?;
        Ok(DeviceBuffer::from_bytes(slice, len))
    }

    /// A device copy of `host`.
    pub fn upload<T: Pod>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = self.alloc::<T>(host.len())?;
        self.write(&mut buf, host)?;
        Ok(buf)
    }

    /// Overwrites `buf` with `host` (same length).
    pub fn write<T: Pod>(&self, buf: &mut DeviceBuffer<T>, host: &[T]) -> Result<()> {
        if host.len() != buf.len() {
            return Err(Error::Buffer(format!("writing {} elements into a buffer of {}", host.len(), buf.len())));
        }
        if host.is_empty() {
            return Ok(());
        }
        let bytes: &[u8] = bytemuck::cast_slice(host);
        let mut view = buf.bytes.slice_mut(..bytes.len());
        self.stream.memcpy_htod(bytes, &mut view).during("copying to the device")
    }

    /// The contents of `buf`, after the work enqueued before.
    pub fn download<T: Pod>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>> {
        self.download_first(buf, buf.len())
    }

    /// The first `len` elements of `buf`, after the work enqueued before.
    pub fn download_first<T: Pod>(&self, buf: &DeviceBuffer<T>, len: usize) -> Result<Vec<T>> {
        if len > buf.len() {
            return Err(Error::Buffer(format!("reading {len} elements of a buffer of {}", buf.len())));
        }
        let mut host = vec![T::zeroed(); len];
        if !host.is_empty() {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut host);
            let n = bytes.len();
            self.stream.memcpy_dtoh(&buf.bytes.slice(..n), bytes).during("copying from the device")?;
        }
        self.synchronize()?;
        Ok(host)
    }

    /// Sets every byte of `buf` to `byte`: poison for tests that must see every element written.
    pub fn fill_bytes<T: Pod>(&self, buf: &mut DeviceBuffer<T>, byte: u8) -> Result<()> {
        let n = buf.size_bytes();
        let (ptr, _sync) = buf.bytes.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` addresses `n` bytes owned by `buf`, which outlives the enqueued memset
        // because the stream is synchronised before any buffer is freed (cudarc frees on the stream).
        unsafe { cudarc::driver::result::memset_d8_async(ptr, byte, n, self.stream.cu_stream()) }
            .during("filling device memory")
    }

    /// Copies `src` into `dst` on the device (equal lengths).
    pub fn copy<T: Pod>(&self, src: &DeviceBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::Buffer(format!("copying {} elements into a buffer of {}", src.len(), dst.len())));
        }
        let n = src.size_bytes();
        let (s, _a) = src.bytes.device_ptr(&self.stream);
        let (d, _b) = dst.bytes.device_ptr_mut(&self.stream);
        // SAFETY: both ranges are `n` bytes of live buffers, and they are distinct allocations.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, n, self.stream.cu_stream()) }
            .during("copying on the device")
    }

    /// Copies pinned mapped host memory into `dst` (equal lengths), asynchronously on the stream:
    /// the per-token upload of a few words, which a graph replay enqueued after it then reads.
    /// The host must not change `src` until the stream has passed the copy.
    pub fn copy_from_pinned<T: Pod>(&self, src: &MappedHostBuffer<T>, dst: &mut DeviceBuffer<T>) -> Result<()> {
        if src.len() != dst.len() {
            return Err(Error::Buffer(format!("copying {} elements into a buffer of {}", src.len(), dst.len())));
        }
        let n = dst.size_bytes();
        let (d, _b) = dst.bytes.device_ptr_mut(&self.stream);
        // SAFETY: `src` is mapped pinned memory whose device address reads `n` bytes, `dst` a live
        // buffer of `n` bytes; unified addressing lets the copy engine take the mapped address.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d, src.ptr().addr(), n, self.stream.cu_stream()) }
            .during("copying pinned host memory to the device")
    }

    /// Kernel `K` at `tiles`, compiled for this device (through the caches) and loaded.
    pub fn kernel<K: KernelDef>(&self, tiles: K::Tiles) -> Result<LoadedKernel<K>> {
        let spec = K::specialize(&tiles, self.arch())?;
        let cubin = self.cache.get_built(&spec, self.traced())?;
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(&spec.key) {
                Some(m) => Arc::clone(m),
                None => {
                    let m = self
                        .ctx
                        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.image.clone()))
                        .during(&format!("loading kernel {}", spec.key))?;
                    modules.insert(spec.key.clone(), Arc::clone(&m));
                    m
                }
            }
        };
        let function = module.load_function(K::NAME).during(&format!("finding the entry of {}", spec.key))?;
        let overlappable = spec.waits_on_grid_dependency();
        LoadedKernel::new(tiles, spec.key, cubin.resources, overlappable, self.traced(), module, function)
            .bound_residency(self.info().max_shared_per_block)
    }
}
