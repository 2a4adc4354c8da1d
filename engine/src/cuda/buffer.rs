//! Device buffers of plain-old-data elements, handing out the typed addresses kernels take.

use std::marker::PhantomData;

use bytemuck::Pod;
use cudarc::driver::{CudaSlice, DevicePtr};
use kernel_dsl::{DevPtr, DevPtrMut};

/// `len` elements of `T` in device memory. The bytes are owned by a cudarc slice; the address is
/// read once, at allocation.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    pub(crate) bytes: CudaSlice<u8>,
    addr: u64,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    pub(crate) fn from_bytes(bytes: CudaSlice<u8>, len: usize) -> DeviceBuffer<T> {
        let addr = {
            let (addr, _sync) = bytes.device_ptr(bytes.stream());
            addr
        };
        DeviceBuffer { bytes, addr, len, _elem: PhantomData }
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

    /// The address for a kernel that reads this buffer.
    pub fn ptr(&self) -> DevPtr<T> {
        DevPtr::from_addr(self.addr)
    }

    /// The address for a kernel that writes this buffer. Taking `&mut self` keeps a buffer from
    /// being handed out as both input and output of one launch.
    pub fn ptr_mut(&mut self) -> DevPtrMut<T> {
        DevPtrMut::from_addr(self.addr)
    }
}
