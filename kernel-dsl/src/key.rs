//! The identity of a compiled kernel: the name of its generated file, the key of the compile
//! caches and of the tuning tables.

use std::fmt;

use crate::arch::Arch;

/// Bumped whenever the emitter's output changes meaning, so that caches and tuning tables made by
/// an older emitter are not trusted.
pub const DSL_VERSION: u32 = 1;

/// The value of one tile parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TileValue {
    U32(u32),
    Bool(bool),
}

impl fmt::Display for TileValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TileValue::U32(v) => v.fmt(f),
            TileValue::Bool(v) => v.fmt(f),
        }
    }
}

/// Kernel name + tile values + architecture + DSL version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelKey {
    pub name: String,
    /// Tile parameters in declaration order, by their names in the kernel.
    pub tiles: Vec<(String, TileValue)>,
    pub arch: Arch,
    pub dsl_version: u32,
}

impl KernelKey {
    pub fn new(name: &str, tiles: Vec<(String, TileValue)>, arch: Arch) -> KernelKey {
        KernelKey { name: name.to_owned(), tiles, arch, dsl_version: DSL_VERSION }
    }

    /// The tile values alone, `ROWS=4 WARPS=8`.
    pub fn tiles_string(&self) -> String {
        let parts: Vec<String> = self.tiles.iter().map(|(n, v)| format!("{n}={v}")).collect();
        parts.join(" ")
    }

    /// A form fit for a file name: `gemv_bf16.ROWS4.WARPS8.sm_90.dsl1`.
    pub fn file_stem(&self) -> String {
        let mut s = self.name.clone();
        for (n, v) in &self.tiles {
            s.push('.');
            s.push_str(n);
            s.push_str(&v.to_string());
        }
        format!("{s}.{}.dsl{}", self.arch, self.dsl_version)
    }
}

impl fmt::Display for KernelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]@{}/dsl{}", self.name, self.tiles_string(), self.arch, self.dsl_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_forms() {
        let key = KernelKey::new(
            "gemv_bf16",
            vec![("ROWS".into(), TileValue::U32(4)), ("SPLIT".into(), TileValue::Bool(true))],
            Arch::Sm90,
        );
        assert_eq!(key.to_string(), "gemv_bf16[ROWS=4 SPLIT=true]@sm_90/dsl1");
        assert_eq!(key.file_stem(), "gemv_bf16.ROWS4.SPLITtrue.sm_90.dsl1");
    }
}
