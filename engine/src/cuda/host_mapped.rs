//! Pinned host memory mapped into the device's address space: kernels read it zero-copy, over
//! the bus, through a device address. This is where the PLE table lives when it fits in RAM: far
//! too large for device memory, read a few kilobytes per token.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::CudaContext;
use cudarc::driver::sys;
use kernel_dsl::DevPtr;

use crate::error::{DriverContext, Error, Result};

/// `len` elements of `T` in page-locked host memory, mapped for the device. The host writes it
/// through [`MappedHostBuffer::as_mut_slice`]; kernels read it through [`MappedHostBuffer::ptr`].
/// Freed on drop (the caller makes sure no enqueued kernel still reads it, as for device buffers).
#[derive(Debug)]
pub struct MappedHostBuffer<T> {
    ctx: Arc<CudaContext>,
    host: *mut T,
    device_addr: u64,
    len: usize,
    _elem: PhantomData<T>,
}

// SAFETY: the buffer owns its allocation exclusively (like a Box<[T]>); the raw pointer is only
// dereferenced through `&self`/`&mut self`, so the usual borrow rules make sharing sound.
unsafe impl<T: Send> Send for MappedHostBuffer<T> {}
// SAFETY: as above; `&self` gives only shared reads.
unsafe impl<T: Sync> Sync for MappedHostBuffer<T> {}

impl<T: Pod> MappedHostBuffer<T> {
    /// `len` zeroed elements of pinned, device-mapped host memory in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<MappedHostBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::Buffer(format!("{len} elements of pinned host memory overflow")))?;
        ctx.bind_to_thread().during("binding the context to allocate pinned host memory")?;
        let mut host = std::ptr::null_mut();
        // SAFETY: `host` is a valid out-pointer; DEVICEMAP asks for a device mapping, PORTABLE for
        // one valid in every context.
        unsafe {
            sys::cuMemHostAlloc(&mut host, bytes.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .result()
        .map_err(|e| Error::Buffer(format!("allocating {bytes} bytes of pinned host memory: {e}")))?;
        let mut buf =
            MappedHostBuffer { ctx: Arc::clone(ctx), host: host.cast::<T>(), device_addr: 0, len, _elem: PhantomData };
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP in this context; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut addr, host, 0) }
            .result()
            .during("mapping pinned host memory for the device")?;
        buf.device_addr = addr;
        buf.as_mut_slice().fill(T::zeroed());
        Ok(buf)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The host's view. Writing while a kernel reads the same elements is a race the caller avoids.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `host` addresses `len` initialised (zeroed at allocation) elements owned by self.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// The host's view, for filling it.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only host view.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }

    /// The device address of the mapping, for a kernel that reads it.
    pub fn ptr(&self) -> DevPtr<T> {
        DevPtr::from_addr(self.device_addr)
    }
}

impl<T> Drop for MappedHostBuffer<T> {
    fn drop(&mut self) {
        // A failure here leaves the memory allocated; nothing better can be done in a drop.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `host` came from cuMemHostAlloc and is freed once, here.
        let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
    }
}

/// Host memory that something else owns (a memory-mapped file, a vector), registered with the
/// driver for as long as this lives: page-locked in place and mapped for the device, read-only.
/// The owner moves in, so the bytes stay where the registration points (a `Deref` to a heap or
/// mapped slice does not move them); dropping unregisters, then drops the owner.
#[derive(Debug)]
pub struct HostRegistration<O: std::ops::Deref<Target = [u8]>> {
    ctx: Arc<CudaContext>,
    owner: O,
    device_addr: u64,
}

// SAFETY: the registration holds no thread-bound state; the owner decides whether it may move
// across threads.
unsafe impl<O: std::ops::Deref<Target = [u8]> + Send> Send for HostRegistration<O> {}
// SAFETY: `&self` gives only shared reads of the owner.
unsafe impl<O: std::ops::Deref<Target = [u8]> + Sync> Sync for HostRegistration<O> {}

impl<O: std::ops::Deref<Target = [u8]>> HostRegistration<O> {
    /// Registers `owner`'s bytes (non-empty) for reading by the device.
    pub fn new(ctx: &Arc<CudaContext>, owner: O) -> Result<HostRegistration<O>> {
        let bytes: &[u8] = &owner;
        if bytes.is_empty() {
            return Err(Error::Buffer("registering 0 bytes of host memory".into()));
        }
        ctx.bind_to_thread().during("binding the context to register host memory")?;
        let host = bytes.as_ptr().cast_mut().cast::<std::ffi::c_void>();
        // SAFETY: `host` and `len` describe memory the owner keeps alive and in place until
        // `drop` unregisters it; READ_ONLY matches a read-only mapping (the device never writes it).
        unsafe {
            sys::cuMemHostRegister_v2(
                host,
                bytes.len(),
                sys::CU_MEMHOSTREGISTER_DEVICEMAP
                    | sys::CU_MEMHOSTREGISTER_PORTABLE
                    | sys::CU_MEMHOSTREGISTER_READ_ONLY,
            )
        }
        .result()
        .map_err(|e| Error::Buffer(format!("registering {} bytes of host memory with the device: {e}", bytes.len())))?;
        // From here on, dropping `reg` unregisters.
        let mut reg = HostRegistration { ctx: Arc::clone(ctx), device_addr: 0, owner };
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just registered with DEVICEMAP; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut addr, host, 0) }
            .result()
            .during("mapping registered host memory for the device")?;
        reg.device_addr = addr;
        Ok(reg)
    }

    pub fn owner(&self) -> &O {
        &self.owner
    }

    /// The device address of the owner's first byte.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }
}

impl<O: std::ops::Deref<Target = [u8]>> Drop for HostRegistration<O> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the pointer is the one registered in `new` (the owner has not moved its bytes).
        let _ = unsafe { sys::cuMemHostUnregister(self.owner.as_ptr().cast_mut().cast()) };
    }
}
