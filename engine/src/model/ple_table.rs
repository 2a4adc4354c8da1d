//! The PLE table as the engine maps it: one file holding every PLE layer's n-gram rows, layer
//! after layer (each layer its hash's `rows_padded` rows), after a 4 KiB header that says what
//! the rows are and for which hash they were written, with a checksum of the rows.
//!
//! Written once from a checkpoint's shards ([`write_table`], the `ple_table` tool), opened
//! memory-mapped at load ([`PleTableFile::open`]): the file's size, its header and the hash it was
//! written for are checked then (a truncated file, a file for another config, a file that is not
//! a table are clear errors); the checksum over every row is checked on request
//! ([`PleTableFile::verify`]), since reading 29 GB takes seconds.
//!
//! Rows are bf16 (`width` values, 2 bytes each) or NVFP4 ([`nvfp4_row_words`]: the e2m1 codes,
//! one e4m3 scale per 16 values, padding to 16 bytes; each layer's global scale in the header).
//!
//! Header (little-endian): magic `FNPLETAB`, version u32, row format u32 (1 = bf16, 2 = NVFP4),
//! row width u32 (values), layers u32, rows u64 (all layers), hash fingerprint u64, checksum u64,
//! zeros to byte 64, one f32 global scale per layer (1 for bf16), then zeros to 4096 bytes. The rows start page-aligned, so a mapping of the file can be registered
//! for the device and the rows addressed from its start.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use memmap2::Mmap;
use safetensors::Dtype;

use super::checkpoint::{Checkpoint, CheckpointError, TensorRef};
use super::config::ModelConfig;
use super::ngram_hash::NgramHash;
use super::nvfp4::{BLOCK, Nvfp4Matrix};

pub const MAGIC: [u8; 8] = *b"FNPLETAB";
pub const VERSION: u32 = 1;
/// The header's size: the rows start one page in.
pub const HEADER_BYTES: usize = 4096;

/// How the rows are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowFormat {
    Bf16 = 1,
    Nvfp4 = 2,
}

impl RowFormat {
    /// Bytes of one row of `width` values.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            RowFormat::Bf16 => 2 * width,
            RowFormat::Nvfp4 => 4 * nvfp4_row_words(width),
        }
    }

    fn from_code(code: u32) -> Option<RowFormat> {
        match code {
            1 => Some(RowFormat::Bf16),
            2 => Some(RowFormat::Nvfp4),
            _ => None,
        }
    }
}

/// Where the per-layer global scales start in the header, and how many fit.
const SCALES_AT: usize = 64;
pub const MAX_LAYERS: usize = (HEADER_BYTES - SCALES_AT) / 4;

/// What a table file holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TableHeader {
    pub format: RowFormat,
    /// Values per row.
    pub width: u32,
    pub layers: u32,
    /// Rows of all layers.
    pub rows: u64,
    /// [`hash_fingerprint`] of the layers' hashes.
    pub hash_fingerprint: u64,
    /// [`Checksum`] of the rows' bytes.
    pub checksum: u64,
    /// Each layer's global scale (NVFP4: value = code · block scale · this; 1 for bf16).
    pub scale_2: Vec<f32>,
}

impl TableHeader {
    /// The header a table of `format` rows for `cfg` has (its checksum 0 and its global scales 1,
    /// to be filled in).
    pub fn for_config(cfg: &ModelConfig, format: RowFormat) -> Result<TableHeader, CheckpointError> {
        let hashes = layer_hashes(cfg);
        if hashes.is_empty() {
            return Err(CheckpointError("the config has no PLE layer, so no n-gram table".into()));
        }
        if hashes.len() > MAX_LAYERS {
            return Err(CheckpointError(format!("{} PLE layers; a table holds at most {MAX_LAYERS}", hashes.len())));
        }
        let heads = cfg.ngram_heads();
        if heads == 0 || !cfg.ple_embed_dim.is_multiple_of(heads) {
            return Err(CheckpointError(format!("PLE width {} does not split over {heads} heads", cfg.ple_embed_dim)));
        }
        let width = cfg.ple_embed_dim / heads;
        if format == RowFormat::Nvfp4 && !width.is_multiple_of(BLOCK) {
            return Err(CheckpointError(format!(
                "PLE rows of {width} values cannot be NVFP4: blocks of {BLOCK} values share a scale"
            )));
        }
        Ok(TableHeader {
            format,
            width: width as u32,
            layers: hashes.len() as u32,
            rows: hashes.iter().map(|h| h.rows_padded).sum(),
            hash_fingerprint: hash_fingerprint(&hashes),
            checksum: 0,
            scale_2: vec![1.0; hashes.len()],
        })
    }

    pub fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.width as usize)
    }

    /// The rows' bytes: the file's size less the header.
    pub fn data_bytes(&self) -> u64 {
        self.rows * self.row_bytes() as u64
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(self.format as u32).to_le_bytes());
        h[16..20].copy_from_slice(&self.width.to_le_bytes());
        h[20..24].copy_from_slice(&self.layers.to_le_bytes());
        h[24..32].copy_from_slice(&self.rows.to_le_bytes());
        h[32..40].copy_from_slice(&self.hash_fingerprint.to_le_bytes());
        h[40..48].copy_from_slice(&self.checksum.to_le_bytes());
        for (l, s) in self.scale_2.iter().take(MAX_LAYERS).enumerate() {
            h[SCALES_AT + 4 * l..SCALES_AT + 4 * l + 4].copy_from_slice(&s.to_le_bytes());
        }
        h
    }

    /// Reads a header; `what` names the file in errors.
    pub fn decode(h: &[u8], what: &str) -> Result<TableHeader, CheckpointError> {
        if h.len() < HEADER_BYTES {
            return Err(CheckpointError(format!(
                "{what}: truncated: {} bytes, less than the {HEADER_BYTES}-byte header of a PLE table",
                h.len()
            )));
        }
        if h[0..8] != MAGIC {
            return Err(CheckpointError(format!("{what}: not a PLE table file (no FNPLETAB magic)")));
        }
        let u32_at = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let version = u32_at(8);
        if version != VERSION {
            return Err(CheckpointError(format!(
                "{what}: PLE table version {version}, this engine reads version {VERSION}; rewrite it with the ple_table tool"
            )));
        }
        let format = RowFormat::from_code(u32_at(12))
            .ok_or_else(|| CheckpointError(format!("{what}: unknown row format {}", u32_at(12))))?;
        let layers = u32_at(20);
        if layers as usize > MAX_LAYERS {
            return Err(CheckpointError(format!(
                "{what}: {layers} layers in the header; a table holds at most {MAX_LAYERS}"
            )));
        }
        let scale_2 = (0..layers as usize).map(|l| f32::from_bits(u32_at(SCALES_AT + 4 * l))).collect();
        Ok(TableHeader {
            format,
            width: u32_at(16),
            layers,
            rows: u64_at(24),
            hash_fingerprint: u64_at(32),
            checksum: u64_at(40),
            scale_2,
        })
    }
}

/// 32-bit words of one NVFP4 row of `width` values as the NVFP4 gather reads it: the e2m1 codes
/// (`width / 2` bytes, the even value in the low nibble), one e4m3 scale per 16 values, zeros to
/// a multiple of 16 bytes (96 bytes for the published 160 values).
pub fn nvfp4_row_words(width: usize) -> usize {
    (width / 2 + width / BLOCK).div_ceil(16) * 4
}

/// The rows of `m` in that layout, row after row (the global scale `scale_2` is not in the rows).
pub fn nvfp4_rows(m: &Nvfp4Matrix) -> Vec<u32> {
    let words = nvfp4_row_words(m.cols);
    let (code_bytes, blocks) = (m.cols / 2, m.cols / BLOCK);
    let mut out = vec![0u32; m.rows * words];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    for r in 0..m.rows {
        let row = &mut bytes[r * words * 4..(r + 1) * words * 4];
        row[..code_bytes].copy_from_slice(&m.packed[r * code_bytes..(r + 1) * code_bytes]);
        row[code_bytes..code_bytes + blocks].copy_from_slice(&m.scales[r * blocks..(r + 1) * blocks]);
    }
    out
}

/// The hashes of the config's PLE layers, in ascending order.
pub fn layer_hashes(cfg: &ModelConfig) -> Vec<NgramHash> {
    (0..cfg.ple_layers.len()).map(|k| NgramHash::new(cfg, k)).collect()
}

/// A fingerprint of the layers' hash constants (multipliers, primes, offsets, padded rows): a
/// table written for other constants addresses other rows.
pub fn hash_fingerprint(hashes: &[NgramHash]) -> u64 {
    let mut c = Checksum::new();
    for h in hashes {
        for v in h.multipliers.iter().chain(&h.primes).chain(&h.offsets).chain([&h.rows_padded]) {
            c.update(&v.to_le_bytes());
        }
    }
    c.finish()
}

/// A streaming 64-bit checksum of bytes, eight at a time (fast enough for 29 GB in seconds):
/// each little-endian word is mixed in with a multiply and a rotation; the length ends it.
#[derive(Clone, Debug)]
pub struct Checksum {
    state: u64,
    pending: [u8; 8],
    pending_len: usize,
    total: u64,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum::new()
    }
}

impl Checksum {
    pub fn new() -> Checksum {
        Checksum { state: 0xcbf2_9ce4_8422_2325, pending: [0; 8], pending_len: 0, total: 0 }
    }

    fn mix(&mut self, word: u64) {
        self.state = (self.state ^ word).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29);
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.pending_len > 0 {
            let take = (8 - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < 8 {
                return;
            }
            self.mix(u64::from_le_bytes(self.pending));
            self.pending_len = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.mix(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    pub fn finish(mut self) -> u64 {
        if self.pending_len > 0 {
            self.pending[self.pending_len..].fill(0);
            self.mix(u64::from_le_bytes(self.pending));
        }
        let total = self.total;
        self.mix(total);
        self.state
    }
}

/// The row bytes of one stored tensor as bf16 (bf16 as is; f32 and f16 rounded).
fn bf16_bytes(t: &TensorRef<'_>) -> Result<Vec<u8>, CheckpointError> {
    match t.dtype {
        Dtype::BF16 => Ok(t.bytes.to_vec()),
        Dtype::F32 | Dtype::F16 => {
            Ok(t.to_f32()?.into_iter().flat_map(|v| half::bf16::from_f32(v).to_le_bytes()).collect())
        }
        other => Err(CheckpointError(format!(
            "tensor `{}` stores n-gram rows as {other:?}; the table is written in bf16 from BF16, F16 or F32 rows \
             (NVFP4 and FP8 rows are not supported yet)",
            t.name
        ))),
    }
}

/// Writes the n-gram table of every PLE layer of `cfg` from checkpoint `ck` into `out`, the layout
/// [`PleTableFile`] maps, in `format`: bf16 (bf16 rows as stored, f16 and f32 rounded), or NVFP4
/// (quantised here, part after part, with one global scale per layer from a first pass over the
/// layer's rows). The rows come from `…ple_embedding.ngram_embedding.weight` or its `shard_{s}`
/// parts, in order; shapes are checked. Returns the header written.
pub fn write_table(
    cfg: &ModelConfig,
    ck: &Checkpoint,
    out: &Path,
    format: RowFormat,
) -> Result<TableHeader, CheckpointError> {
    let mut header = TableHeader::for_config(cfg, format)?;
    let io = |e: std::io::Error| CheckpointError(format!("{}: {e}", out.display()));
    let file = File::create(out).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    w.write_all(&[0u8; HEADER_BYTES]).map_err(io)?;
    let width = header.width as usize;
    let mut sum = Checksum::new();
    for (k, &layer) in cfg.ple_layers.iter().enumerate() {
        let rows = NgramHash::new(cfg, k).rows_padded as usize;
        let p = format!("model.layers.{layer}.ple.ple_embedding.ngram_embedding");
        let whole = format!("{p}.weight");
        let parts: Vec<(String, usize)> = if ck.contains(&whole) {
            vec![(whole, rows)]
        } else {
            let n = cfg.split_ngram_parts;
            if n == 0 || !rows.is_multiple_of(n) {
                return Err(CheckpointError(format!(
                    "{rows} n-gram rows of layer {layer} do not split into {n} shards"
                )));
            }
            (0..n).map(|s| (format!("{p}.shard_{s}.weight"), rows / n)).collect()
        };
        for (name, part_rows) in &parts {
            ck.require(name)?.expect_shape(&[*part_rows, width])?;
        }
        if format == RowFormat::Nvfp4 {
            let mut amax = 0.0f32;
            for (name, _) in &parts {
                amax = ck.require(name)?.to_f32()?.iter().fold(amax, |m, v| m.max(v.abs()));
            }
            header.scale_2[k] = Nvfp4Matrix::scale_2_for(amax);
        }
        for (name, part_rows) in &parts {
            let t = ck.require(name)?;
            let bytes = match format {
                RowFormat::Bf16 => bf16_bytes(&t)?,
                RowFormat::Nvfp4 => {
                    let m = Nvfp4Matrix::quantise_with_scale_2(&t.to_f32()?, *part_rows, width, header.scale_2[k]);
                    bytemuck::cast_slice(&nvfp4_rows(&m)).to_vec()
                }
            };
            sum.update(&bytes);
            w.write_all(&bytes).map_err(io)?;
        }
    }
    header.checksum = sum.finish();
    let mut file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(&header.encode()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(header)
}

/// A table file, memory-mapped read-only, its header checked against a config.
#[derive(Debug)]
pub struct PleTableFile {
    pub header: TableHeader,
    map: Mmap,
}

impl PleTableFile {
    /// Maps `path` and checks that it is a whole table for `cfg`'s PLE layers.
    pub fn open(path: &Path, cfg: &ModelConfig) -> Result<PleTableFile, CheckpointError> {
        let what = path.display().to_string();
        let file = File::open(path).map_err(|e| CheckpointError(format!("{what}: {e}")))?;
        // SAFETY: the mapping is read-only and private to this engine; the table file is not
        // written while the engine runs (a file changed underneath is outside what it supports).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError(format!("{what}: mapping: {e}")))?;
        let header = TableHeader::decode(&map, &what)?;
        let want = TableHeader::for_config(cfg, header.format)?;
        if header.format != want.format || header.width != want.width || header.layers != want.layers {
            return Err(CheckpointError(format!(
                "{what}: a table of {} layers of {}-value {:?} rows; the config needs {} layers of {}-value {:?} rows",
                header.layers, header.width, header.format, want.layers, want.width, want.format
            )));
        }
        if header.rows != want.rows || header.hash_fingerprint != want.hash_fingerprint {
            return Err(CheckpointError(format!(
                "{what}: written for another n-gram hash ({} rows, fingerprint {:#018x}; the config gives {} rows, \
                 {:#018x}): check vocab_size, seed, ngram_vocab_size_base and ple_layer_ids, or rewrite the table",
                header.rows, header.hash_fingerprint, want.rows, want.hash_fingerprint
            )));
        }
        let size = map.len() as u64;
        let full = HEADER_BYTES as u64 + header.data_bytes();
        if size < full {
            return Err(CheckpointError(format!(
                "{what}: truncated: {size} bytes, a table of {} rows needs {full}",
                header.rows
            )));
        }
        if size > full {
            return Err(CheckpointError(format!("{what}: {} bytes past the last row ({full} expected)", size - full)));
        }
        Ok(PleTableFile { header, map })
    }

    /// Reads every row and checks the checksum (seconds for a full-size table).
    pub fn verify(&self) -> Result<(), CheckpointError> {
        let mut sum = Checksum::new();
        for chunk in self.rows_bytes().chunks(1 << 24) {
            sum.update(chunk);
        }
        let got = sum.finish();
        if got != self.header.checksum {
            return Err(CheckpointError(format!(
                "PLE table checksum {got:#018x}, the header says {:#018x}: the file is damaged",
                self.header.checksum
            )));
        }
        Ok(())
    }

    /// The whole mapping, header included (page-aligned, for registering with the device).
    pub fn mapping(&self) -> &[u8] {
        &self.map
    }

    /// The header and the mapping (the rows start [`HEADER_BYTES`] into it).
    pub fn into_parts(self) -> (TableHeader, Mmap) {
        (self.header, self.map)
    }

    /// Every row's bytes, layer after layer.
    pub fn rows_bytes(&self) -> &[u8] {
        &self.map[HEADER_BYTES..]
    }

    /// The bytes of row `row` (counted over all layers).
    pub fn row(&self, row: u64) -> &[u8] {
        let n = self.header.row_bytes();
        let start = row as usize * n;
        &self.rows_bytes()[start..start + n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_independent_of_how_the_bytes_are_split() {
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut whole = Checksum::new();
        whole.update(&bytes);
        let whole = whole.finish();
        for split in [1, 3, 7, 8, 9, 500, 999] {
            let mut c = Checksum::new();
            for part in bytes.chunks(split) {
                c.update(part);
            }
            assert_eq!(c.finish(), whole, "parts of {split}");
        }
        let mut other = Checksum::new();
        other.update(&bytes[..999]);
        assert_ne!(other.finish(), whole, "a shorter input");
    }

    #[test]
    fn nvfp4_rows_hold_codes_then_scales() {
        assert_eq!(nvfp4_row_words(160), 24);
        let m = Nvfp4Matrix {
            rows: 2,
            cols: 32,
            packed: (0..32).map(|i| i as u8).collect(),
            scales: vec![0x38, 0x40, 0x30, 0x48],
            scale_2: 1.0,
        };
        let words = nvfp4_row_words(32);
        assert_eq!(words, 8);
        let rows = nvfp4_rows(&m);
        let bytes: &[u8] = bytemuck::cast_slice(&rows);
        assert_eq!(&bytes[..16], &m.packed[..16]);
        assert_eq!(&bytes[16..18], &[0x38, 0x40]);
        assert!(bytes[18..32].iter().all(|&b| b == 0));
        assert_eq!(&bytes[32..48], &m.packed[16..]);
        assert_eq!(&bytes[48..50], &[0x30, 0x48]);
    }

    #[test]
    fn header_round_trips() {
        let h = TableHeader {
            format: RowFormat::Nvfp4,
            width: 160,
            layers: 2,
            rows: 640_003_072,
            hash_fingerprint: 0x0123_4567_89ab_cdef,
            checksum: 42,
            scale_2: vec![0.25, 3.5e-4],
        };
        assert_eq!(TableHeader::decode(&h.encode(), "t"), Ok(h.clone()));
        assert_eq!(h.data_bytes(), 640_003_072 * 96);
    }
}
