//! A plain projection's matrix on the device, in the format its GEMV reads: bf16 for
//! [`gemv_bf16`], or NVFP4 for [`gemv_nvfp4`] (ModelOpt's layout, up to four matrices of one
//! width stacked, each with its own global scale). GDN's out_proj and QSA's stacked input
//! projection and o_proj are held this way, so a layer picks its GEMV from its weights.
//!
//! [`gemv_bf16`]: crate::kernels::gemv_bf16::gemv_bf16
//! [`gemv_nvfp4`]: crate::kernels::gemv_nvfp4::gemv_nvfp4

use half::bf16;
use kernel_dsl::e2m1_pairs::{self, Layout};
use kernel_dsl::{E2m1x2, E4m3};

use crate::cuda::{DeviceBuffer, Gpu};
use crate::error::{Error, Result};
use crate::model::nvfp4::Nvfp4Matrix;

/// The most matrices one NVFP4 stack holds (`gemv_nvfp4` has four global scales).
pub const MAX_STACKED: usize = 4;

#[derive(Debug)]
pub enum MatrixOnDevice {
    /// [rows, cols] row-major.
    Bf16(DeviceBuffer<bf16>),
    /// Codes [rows, cols/2], e4m3 block scales [rows, cols/16], the global scales [4] and the
    /// rows where the second, third and fourth matrix start (`rows` for those absent).
    Nvfp4 { packed: DeviceBuffer<E2m1x2>, scales: DeviceBuffer<E4m3>, scale2: DeviceBuffer<f32>, segs: [u32; 3] },
}

impl MatrixOnDevice {
    /// `values` [rows, cols] rounded to bf16.
    pub fn bf16(gpu: &Gpu, values: &[f32]) -> Result<MatrixOnDevice> {
        Ok(MatrixOnDevice::Bf16(gpu.upload(&values.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>())?))
    }

    /// `mats` stacked row-wise in NVFP4 (1 to 4 matrices of `cols` columns), as stored.
    pub fn nvfp4(gpu: &Gpu, what: &str, mats: &[&Nvfp4Matrix], cols: usize) -> Result<MatrixOnDevice> {
        Self::nvfp4_in(gpu, what, mats, cols, Layout::Nibbles)
    }

    /// [`MatrixOnDevice::nvfp4`] with the codes rearranged into `layout` on the host before
    /// the copy (`kernel_dsl::e2m1_pairs`), for a kernel that decodes the paired layout.
    pub fn nvfp4_in(
        gpu: &Gpu,
        what: &str,
        mats: &[&Nvfp4Matrix],
        cols: usize,
        layout: Layout,
    ) -> Result<MatrixOnDevice> {
        if mats.is_empty() || mats.len() > MAX_STACKED {
            return Err(Error::Buffer(format!("{what}: {} NVFP4 matrices stacked, 1 to 4 supported", mats.len())));
        }
        for m in mats {
            let ok = m.cols == cols && m.packed.len() * 2 == m.rows * cols && m.scales.len() * 16 == m.rows * cols;
            if !ok {
                return Err(Error::Buffer(format!(
                    "{what} in NVFP4: a matrix [{}, {}] with {} codes and {} scales where {cols} columns are needed",
                    m.rows,
                    m.cols,
                    m.packed.len() * 2,
                    m.scales.len() * 16
                )));
            }
        }
        let rows: usize = mats.iter().map(|m| m.rows).sum();
        let mut segs = [rows as u32; 3];
        let mut at = 0;
        for (i, m) in mats.iter().enumerate().take(mats.len() - 1) {
            at += m.rows;
            segs[i] = at as u32;
        }
        let mut scale2 = [0.0f32; MAX_STACKED];
        for (s, m) in scale2.iter_mut().zip(mats) {
            *s = m.scale_2;
        }
        let mut packed: Vec<E2m1x2> = mats.iter().flat_map(|m| m.packed.iter().map(|&b| E2m1x2(b))).collect();
        e2m1_pairs::to_layout(bytemuck::cast_slice_mut(&mut packed), layout)
            .map_err(|e| Error::Buffer(format!("{what}: {e}")))?;
        let scales: Vec<E4m3> = mats.iter().flat_map(|m| m.scales.iter().map(|&b| E4m3(b))).collect();
        Ok(MatrixOnDevice::Nvfp4 {
            packed: gpu.upload(&packed)?,
            scales: gpu.upload(&scales)?,
            scale2: gpu.upload(&scale2)?,
            segs,
        })
    }

    pub fn is_nvfp4(&self) -> bool {
        matches!(self, MatrixOnDevice::Nvfp4 { .. })
    }

    /// The addresses a launch binds: [values or codes, block scales, global scales] (0 where the
    /// format has none), and the stack's row boundaries.
    pub fn addresses(&self) -> ([u64; 3], [u32; 3]) {
        match self {
            MatrixOnDevice::Bf16(b) => ([b.ptr().addr(), 0, 0], [0; 3]),
            MatrixOnDevice::Nvfp4 { packed, scales, scale2, segs } => {
                ([packed.ptr().addr(), scales.ptr().addr(), scale2.ptr().addr()], *segs)
            }
        }
    }
}

/// Bytes of a [rows, cols] matrix: bf16, or NVFP4 (codes, e4m3 block scales, and the global
/// scales of the `matrices` stacked in it, which the GEMV reads).
pub fn matrix_bytes(rows: usize, cols: usize, nvfp4: bool, matrices: usize) -> usize {
    let v = rows * cols;
    if nvfp4 { v / 2 + v / 16 + 4 * matrices } else { 2 * v }
}
