//! NVFP4 codes in the layout the `_paired` kernels read (`kernel_dsl::e2m1_pairs`): the MoE
//! gate/up projection's, the lm_head's and the tensor-core path of GDN's input projection. On
//! sm_90 that is the paired layout, which those kernels decode in fewer instructions; on
//! sm_121a, which converts in hardware, ModelOpt's. Everything that puts such codes on the device,
//! reads them back or moves them between layouts goes through here, so the host always sees
//! ModelOpt's codes.

use kernel_dsl::E2m1x2;
use kernel_dsl::e2m1_pairs::{self, Layout};

use crate::cuda::{DeviceBuffer, Gpu};
use crate::error::{Error, Result};

/// The layout of these codes on `gpu`'s device.
pub fn layout(gpu: &Gpu) -> Layout {
    Layout::for_arch(gpu.arch())
}

/// ModelOpt codes (two a byte), uploaded in [`layout`]; `what` names them in an error.
pub fn upload(gpu: &Gpu, what: &str, codes: &[u8]) -> Result<DeviceBuffer<E2m1x2>> {
    // One host copy (the lm_head's codes are 0.33 GB), rearranged in place.
    let mut v: Vec<E2m1x2> = bytemuck::cast_slice(codes).to_vec();
    e2m1_pairs::to_layout(bytemuck::cast_slice_mut(&mut v), layout(gpu))
        .map_err(|e| Error::Buffer(format!("{what}: {e}")))?;
    gpu.upload(&v)
}

/// The codes in `buf` (in [`layout`]) as ModelOpt codes: for whatever compares them or computes
/// with them on the host.
pub fn download(gpu: &Gpu, buf: &DeviceBuffer<E2m1x2>) -> Result<Vec<u8>> {
    let mut codes: Vec<u8> = gpu.download(buf)?.into_iter().map(|c| c.0).collect();
    e2m1_pairs::from_layout(&mut codes, layout(gpu)).map_err(Error::Buffer)?;
    Ok(codes)
}

/// The codes in `buf`, in layout `from`, rearranged into `to` in place: a round trip through the
/// host, for tests and tools that run one upload at tile sets whose kernels read different
/// layouts (synthetic weights go into the paired layout on the device: `crate::synthetic`).
pub fn rearrange(gpu: &Gpu, buf: &mut DeviceBuffer<E2m1x2>, from: Layout, to: Layout) -> Result<()> {
    if from == to {
        return Ok(());
    }
    let mut codes: Vec<E2m1x2> = gpu.download(buf)?;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut codes);
    e2m1_pairs::from_layout(bytes, from).map_err(Error::Buffer)?;
    e2m1_pairs::to_layout(bytes, to).map_err(Error::Buffer)?;
    gpu.write(buf, &codes)
}
