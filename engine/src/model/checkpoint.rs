//! A Hugging Face checkpoint's safetensors files, memory-mapped: one `model.safetensors` or shards
//! listed by `model.safetensors.index.json`. Headers are validated when opened (a truncated file or
//! a bad header is an error naming the file); tensors are read on demand, by name.
//!
//! A checkpoint can also be one safetensors file already in memory: the decode binary's embedded
//! default model ([`Checkpoint::from_static`]), or bytes the caller owns ([`Checkpoint::from_bytes`],
//! which the parsers' fuzz targets feed).
//!
//! Names are normalised to the text model's: the vision-language checkpoint's
//! `model.language_model.` prefix becomes `model.`, and the vision tower (`model.visual.*`) and
//! the multi-token-prediction head (`mtp.*`) are left out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

/// What is wrong with a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointError(pub String);

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckpointError {}

/// One tensor as stored.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The values as f32, from bf16, f16 or f32 storage.
    pub fn to_f32(&self) -> Result<Vec<f32>, CheckpointError> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            Dtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            other => {
                return Err(CheckpointError(format!(
                    "tensor `{}` has dtype {other:?}; a floating-point tensor must be BF16, F16 or F32",
                    self.name
                )));
            }
        })
    }

    /// The values of an integer tensor (I64, I32) as i64.
    pub fn to_i64(&self) -> Result<Vec<i64>, CheckpointError> {
        let b = self.bytes;
        Ok(match self.dtype {
            Dtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
            Dtype::I32 => b.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect(),
            other => {
                return Err(CheckpointError(format!(
                    "tensor `{}` has dtype {other:?}; expected I64 or I32",
                    self.name
                )));
            }
        })
    }

    /// Checks the shape, naming the tensor and both shapes when they differ.
    pub fn expect_shape(&self, want: &[usize]) -> Result<(), CheckpointError> {
        if self.shape == want {
            Ok(())
        } else {
            Err(CheckpointError(format!("tensor `{}` has shape {:?}, expected {:?}", self.name, self.shape, want)))
        }
    }
}

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range within the file.
    start: usize,
    end: usize,
}

/// The bytes of one safetensors file: mapped from disk, in the program's image, or owned.
enum FileBytes {
    Mapped(Mmap),
    Static(&'static [u8]),
    Owned(Vec<u8>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(m) => m,
            FileBytes::Static(b) => b,
            FileBytes::Owned(b) => b,
        }
    }
}

/// An opened checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, FileBytes)>,
    entries: HashMap<String, Entry>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.files.len())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

/// The name the text model uses, or None for tensors it does not use.
pub fn normalise_name(name: &str) -> Option<String> {
    if name.starts_with("mtp.") || name.starts_with("model.visual.") || name.starts_with("visual.") {
        return None;
    }
    Some(match name.strip_prefix("model.language_model.") {
        Some(rest) => format!("model.{rest}"),
        None => name.to_owned(),
    })
}

impl Checkpoint {
    /// Opens `dir`: `model.safetensors.index.json` with its shards, or `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.exists() {
            let text =
                std::fs::read_to_string(&index).map_err(|e| CheckpointError(format!("{}: {e}", index.display())))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| CheckpointError(format!("{}: not valid JSON: {e}", index.display())))?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| CheckpointError(format!("{}: no `weight_map` object", index.display())))?;
            let mut shards: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            shards.sort();
            shards.dedup();
            if shards.is_empty() {
                return Err(CheckpointError(format!("{}: the weight map names no file", index.display())));
            }
            shards.iter().map(|s| dir.join(s)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            return Err(CheckpointError(format!(
                "{}: no model.safetensors nor model.safetensors.index.json",
                dir.display()
            )));
        };

        let mut opened = Vec::with_capacity(files.len());
        let mut entries = HashMap::new();
        for (i, path) in files.into_iter().enumerate() {
            let file = File::open(&path).map_err(|e| CheckpointError(format!("{}: {e}", path.display())))?;
            // SAFETY: the map is read-only; a checkpoint rewritten while it is open is outside the
            // contract of any loader (its bytes would change under us, as under a read()).
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| CheckpointError(format!("{}: cannot map: {e}", path.display())))?;
            index_file(i, &path, &map, &mut entries)?;
            opened.push((path, FileBytes::Mapped(map)));
        }
        Ok(Checkpoint { dir: dir.to_owned(), files: opened, entries })
    }

    /// One safetensors file held in memory for the life of the program (`include_bytes!`), named
    /// `name` in error messages; validated like a file on disk.
    pub fn from_static(name: &str, bytes: &'static [u8]) -> Result<Checkpoint, CheckpointError> {
        let path = PathBuf::from(name);
        let mut entries = HashMap::new();
        index_file(0, &path, bytes, &mut entries)?;
        Ok(Checkpoint { dir: path.clone(), files: vec![(path, FileBytes::Static(bytes))], entries })
    }

    /// One safetensors file's bytes, owned by the checkpoint, named `name` in error messages;
    /// validated like a file on disk.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Checkpoint, CheckpointError> {
        let path = PathBuf::from(name);
        let mut entries = HashMap::new();
        index_file(0, &path, &bytes, &mut entries)?;
        Ok(Checkpoint { dir: path.clone(), files: vec![(path, FileBytes::Owned(bytes))], entries })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let sorted: BTreeMap<&str, ()> = self.entries.keys().map(|k| (k.as_str(), ())).collect();
        sorted.into_keys().collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The tensor `name`, if present.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (key, e) = self.entries.get_key_value(name)?;
        let bytes = &self.files[e.file].1[e.start..e.end];
        Some(TensorRef { name: key, dtype: e.dtype, shape: &e.shape, bytes })
    }

    /// The tensor `name`, or an error that names it.
    pub fn require(&self, name: &str) -> Result<TensorRef<'_>, CheckpointError> {
        self.get(name).ok_or_else(|| {
            CheckpointError(format!("tensor `{name}` is missing from the checkpoint in {}", self.dir.display()))
        })
    }
}

/// Validates the header of file number `file` and records each of its tensors in `entries`.
fn index_file(
    file: usize,
    path: &Path,
    bytes: &[u8],
    entries: &mut HashMap<String, Entry>,
) -> Result<(), CheckpointError> {
    let (header_len, metadata) = SafeTensors::read_metadata(bytes).map_err(|e| {
        CheckpointError(format!("{}: not a valid safetensors file ({e}); is it truncated or corrupt?", path.display()))
    })?;
    let data_start = 8 + header_len;
    for (name, info) in metadata.tensors() {
        let Some(name) = normalise_name(&name) else { continue };
        let entry = Entry {
            file,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: data_start + info.data_offsets.0,
            end: data_start + info.data_offsets.1,
        };
        if entries.insert(name.clone(), entry).is_some() {
            return Err(CheckpointError(format!("tensor `{name}` appears twice in the checkpoint")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised() {
        assert_eq!(
            normalise_name("model.language_model.layers.0.mlp.gate.weight").as_deref(),
            Some("model.layers.0.mlp.gate.weight")
        );
        assert_eq!(normalise_name("lm_head.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(normalise_name("mtp.layers.0.weight"), None);
        assert_eq!(normalise_name("model.visual.blocks.0.weight"), None);
    }

    #[test]
    fn a_checkpoint_in_memory_is_validated_and_read() {
        let e = Checkpoint::from_static("<mem>/model.safetensors", b"\x08\0\0\0\0\0\0\0{broken}").expect_err("bad");
        assert!(e.0.starts_with("<mem>/model.safetensors: not a valid safetensors file"), "{e}");

        let data: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = safetensors::tensor::TensorView::new(Dtype::F32, vec![2], &data).expect("view");
        let bytes = safetensors::serialize([("model.language_model.norm.weight", view)], None).expect("serialise");
        let ck = Checkpoint::from_static("<mem>", Box::leak(bytes.into_boxed_slice())).expect("valid");
        assert_eq!(ck.names(), vec!["model.norm.weight"]);
        assert_eq!(ck.require("model.norm.weight").and_then(|t| t.to_f32()).expect("read"), vec![1.5, -2.0]);
        assert!(ck.require("lm_head.weight").expect_err("absent").0.contains("missing from the checkpoint in <mem>"));
    }
}
