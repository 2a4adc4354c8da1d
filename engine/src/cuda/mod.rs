//! The CUDA runtime, on cudarc's driver API: NVRTC and its caches, the device and its one stream,
//! buffers, compiled kernels and their launches, event timing.

pub mod buffer;
pub mod cache;
pub mod cubin_info;
pub mod device;
pub mod graph;
pub mod host_mapped;
pub mod kernel;
pub mod nvrtc;
mod residency;
pub mod side_stream;
pub mod timing;
pub mod trace;

pub use buffer::DeviceBuffer;
pub use device::{DeviceInfo, Gpu};
pub use graph::Graph;
pub use host_mapped::MappedHostBuffer;
pub use kernel::LoadedKernel;
pub use side_stream::SideStream;
