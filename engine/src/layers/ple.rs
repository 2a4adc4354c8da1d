//! PLE on the device, the parts done so far: the n-gram hash constants of every PLE layer and the
//! token history, on the device for [`ple_ids`], and the row gather [`ple_gather_bf16`] from a
//! table the device can address (mapped host memory: [`crate::cuda::MappedHostBuffer`]).
//!
//! One table holds every PLE layer's rows, layer after layer (each layer `rows_padded` rows, see
//! [`table_row_bases`]); the ids the kernel writes already include their layer's first row.

use kernel_dsl::{DevPtr, DevPtrMut};

use crate::cuda::{DeviceBuffer, Gpu};
use crate::error::{Error, Result};
use crate::kernels::ple::gather_bf16::ple_gather_bf16;
use crate::kernels::ple::ids::ple_ids;
use crate::model::ngram_hash::NgramHash;

/// The first row of each PLE layer's rows in the one table, and the table's total rows.
pub fn table_row_bases(hashes: &[NgramHash]) -> (Vec<u64>, u64) {
    let mut bases = Vec::with_capacity(hashes.len());
    let mut total = 0u64;
    for h in hashes {
        bases.push(total);
        total += h.rows_padded;
    }
    (bases, total)
}

/// The hash constants of every PLE layer and the token history, on the device.
#[derive(Debug)]
pub struct PleHashOnDevice {
    /// [layers, ngram_size].
    multipliers: DeviceBuffer<u64>,
    /// [layers, heads].
    primes: DeviceBuffer<u64>,
    /// [layers, heads]: each head's first row in the one table (its layer's base included).
    offsets: DeviceBuffer<u64>,
    /// [ngram_size − 1]: the tokens before the next one, oldest first.
    history: DeviceBuffer<u32>,
    initial_history: Vec<u32>,
    layers: u32,
    heads: u32,
    heads_per_ngram: u32,
    ngram_size: u32,
    eos: u32,
}

impl PleHashOnDevice {
    /// The constants of `hashes` (the PLE layers in ascending order, all of one config), the
    /// history at the start of a sequence.
    pub fn new(gpu: &Gpu, hashes: &[NgramHash]) -> Result<PleHashOnDevice> {
        let first = hashes.first().ok_or_else(|| Error::Buffer("no PLE layer to hash for".into()))?;
        let (ngram_size, per_ngram, eos) = (first.ngram_size(), first.heads_per_ngram(), first.eos());
        let heads = first.primes.len();
        if ngram_size < 2 || heads != (ngram_size - 1) * per_ngram {
            return Err(Error::Buffer(format!(
                "PLE hash with n-gram size {ngram_size} and {per_ngram} heads per order has {heads} heads"
            )));
        }
        if hashes.iter().any(|h| h.ngram_size() != ngram_size || h.primes.len() != heads || h.eos() != eos) {
            return Err(Error::Buffer("PLE layers with different hash geometries".into()));
        }
        let (bases, _) = table_row_bases(hashes);
        let multipliers: Vec<u64> = hashes.iter().flat_map(|h| h.multipliers.iter().copied()).collect();
        let primes: Vec<u64> = hashes.iter().flat_map(|h| h.primes.iter().copied()).collect();
        let offsets: Vec<u64> =
            hashes.iter().zip(&bases).flat_map(|(h, &b)| h.offsets.iter().map(move |&o| o + b)).collect();
        let initial_history = first.initial_history();
        Ok(PleHashOnDevice {
            multipliers: gpu.upload(&multipliers)?,
            primes: gpu.upload(&primes)?,
            offsets: gpu.upload(&offsets)?,
            history: gpu.upload(&initial_history)?,
            initial_history,
            layers: hashes.len() as u32,
            heads: heads as u32,
            heads_per_ngram: per_ngram as u32,
            ngram_size: ngram_size as u32,
            eos,
        })
    }

    /// Ids per step: one per head of every PLE layer.
    pub fn ids_per_step(&self) -> usize {
        (self.layers * self.heads) as usize
    }

    /// Puts the history back to the start of a sequence (enqueued on the stream).
    pub fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        gpu.write(&mut self.history, &self.initial_history)
    }

    /// The history on the device, oldest first (waits for the stream).
    pub fn history(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        gpu.download(&self.history)
    }

    /// The launch that hashes `token[0]` into `ids` [`ids_per_step`](Self::ids_per_step) and
    /// advances the history by it.
    pub fn ids_args(&mut self, token: DevPtr<u32>, ids: DevPtrMut<u64>) -> ple_ids::Args {
        ple_ids::Args {
            token,
            history: self.history.ptr_mut(),
            multipliers: self.multipliers.ptr(),
            primes: self.primes.ptr(),
            offsets: self.offsets.ptr(),
            ids,
            layers: self.layers,
            heads: self.heads,
            heads_per_ngram: self.heads_per_ngram,
            ngram_size: self.ngram_size,
            eos: self.eos,
        }
    }
}

/// The launch that copies the `count` rows `ids` addresses in `table` (rows of `width` bf16) into
/// `rows` [count, width].
pub fn gather_args(
    table: DevPtr<half::bf16>,
    ids: DevPtr<u64>,
    rows: DevPtrMut<half::bf16>,
    count: usize,
    width: usize,
) -> ple_gather_bf16::Args {
    ple_gather_bf16::Args { table, ids, rows, count: count as u32, width: width as u32 }
}
