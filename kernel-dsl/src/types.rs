//! The types a kernel value can have, and their CUDA spellings.
//!
//! Storage types (bf16, f16, fp8 e4m3, packed e2m1, u8, u16) take no part in arithmetic: a kernel
//! converts them to f32 (`as f32` or a decode helper) first, so every sum is an f32 sum and nothing
//! narrows behind the author's back. Arithmetic happens in i32, u32, i64, u64 and f32.

use std::fmt;

/// A scalar element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    Bool,
    I32,
    U32,
    I64,
    U64,
    U8,
    U16,
    F32,
    F16,
    Bf16,
    /// FP8 E4M3 (OCP, the "fn" variant: no infinities, one NaN code per sign).
    E4m3,
    /// Two FP4 E2M1 values in one byte; the low nibble holds the element with the even index.
    E2m1x2,
}

impl Scalar {
    /// Every scalar type, in declaration order.
    pub const ALL: [Scalar; 12] = [
        Scalar::Bool,
        Scalar::I32,
        Scalar::U32,
        Scalar::I64,
        Scalar::U64,
        Scalar::U8,
        Scalar::U16,
        Scalar::F32,
        Scalar::F16,
        Scalar::Bf16,
        Scalar::E4m3,
        Scalar::E2m1x2,
    ];

    /// The name a kernel written in Rust uses for this type.
    pub fn rust_name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I32 => "i32",
            Scalar::U32 => "u32",
            Scalar::I64 => "i64",
            Scalar::U64 => "u64",
            Scalar::U8 => "u8",
            Scalar::U16 => "u16",
            Scalar::F32 => "f32",
            Scalar::F16 => "f16",
            Scalar::Bf16 => "bf16",
            Scalar::E4m3 => "e4m3",
            Scalar::E2m1x2 => "e2m1x2",
        }
    }

    pub fn from_rust_name(name: &str) -> Option<Scalar> {
        Scalar::ALL.into_iter().find(|s| s.rust_name() == name)
    }

    /// The CUDA C spelling. The 16- and 8-bit float types are the prelude's own one-member structs
    /// (no CUDA header is included), so they cannot be mixed with integers by accident.
    pub fn cuda_name(self) -> &'static str {
        match self {
            Scalar::Bool => "bool",
            Scalar::I32 => "int",
            Scalar::U32 => "unsigned",
            Scalar::I64 => "long long",
            Scalar::U64 => "unsigned long long",
            Scalar::U8 => "unsigned char",
            Scalar::U16 => "unsigned short",
            Scalar::F32 => "float",
            Scalar::F16 => "f16",
            Scalar::Bf16 => "bf16",
            Scalar::E4m3 => "fp8_e4m3",
            Scalar::E2m1x2 => "fp4x2_e2m1",
        }
    }

    pub fn size_bytes(self) -> u32 {
        match self {
            Scalar::Bool | Scalar::U8 | Scalar::E4m3 | Scalar::E2m1x2 => 1,
            Scalar::U16 | Scalar::F16 | Scalar::Bf16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 => 8,
        }
    }

    pub fn is_int(self) -> bool {
        matches!(self, Scalar::I32 | Scalar::U32 | Scalar::I64 | Scalar::U64 | Scalar::U8 | Scalar::U16)
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Scalar::I32 | Scalar::I64 | Scalar::F32)
    }

    /// Types that arithmetic and comparisons may use directly.
    pub fn is_arith(self) -> bool {
        matches!(self, Scalar::I32 | Scalar::U32 | Scalar::I64 | Scalar::U64 | Scalar::F32)
    }

    /// Integer types that arithmetic may use (the narrow ones are storage only).
    pub fn is_arith_int(self) -> bool {
        self.is_arith() && self != Scalar::F32
    }

    /// The custom float encodings, which the prelude defines as structs.
    pub fn is_encoded_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::Bf16 | Scalar::E4m3 | Scalar::E2m1x2)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rust_name())
    }
}

/// The built-in CUDA vector types, for 8- and 16-byte loads and stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Vector {
    U32x2,
    U32x4,
    F32x2,
    F32x4,
}

impl Vector {
    pub const ALL: [Vector; 4] = [Vector::U32x2, Vector::U32x4, Vector::F32x2, Vector::F32x4];

    pub fn rust_name(self) -> &'static str {
        match self {
            Vector::U32x2 => "u32x2",
            Vector::U32x4 => "u32x4",
            Vector::F32x2 => "f32x2",
            Vector::F32x4 => "f32x4",
        }
    }

    pub fn from_rust_name(name: &str) -> Option<Vector> {
        Vector::ALL.into_iter().find(|v| v.rust_name() == name)
    }

    pub fn cuda_name(self) -> &'static str {
        match self {
            Vector::U32x2 => "uint2",
            Vector::U32x4 => "uint4",
            Vector::F32x2 => "float2",
            Vector::F32x4 => "float4",
        }
    }

    pub fn lane(self) -> Scalar {
        match self {
            Vector::U32x2 | Vector::U32x4 => Scalar::U32,
            Vector::F32x2 | Vector::F32x4 => Scalar::F32,
        }
    }

    pub fn lanes(self) -> u8 {
        match self {
            Vector::U32x2 | Vector::F32x2 => 2,
            Vector::U32x4 | Vector::F32x4 => 4,
        }
    }

    pub fn size_bytes(self) -> u32 {
        self.lane().size_bytes() * u32::from(self.lanes())
    }

    /// The lane names, as in CUDA (`.x .y .z .w`).
    pub const LANE_NAMES: [&'static str; 4] = ["x", "y", "z", "w"];
}

impl fmt::Display for Vector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rust_name())
    }
}

/// What an array or a pointer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Scalar(Scalar),
    Vector(Vector),
}

impl Elem {
    pub fn size_bytes(self) -> u32 {
        match self {
            Elem::Scalar(s) => s.size_bytes(),
            Elem::Vector(v) => v.size_bytes(),
        }
    }

    pub fn cuda_name(self) -> &'static str {
        match self {
            Elem::Scalar(s) => s.cuda_name(),
            Elem::Vector(v) => v.cuda_name(),
        }
    }

    pub fn as_type(self) -> Type {
        match self {
            Elem::Scalar(s) => Type::Scalar(s),
            Elem::Vector(v) => Type::Vector(v),
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Scalar(s) => s.fmt(f),
            Elem::Vector(v) => v.fmt(f),
        }
    }
}

/// Where an array lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// Registers of one thread (a fixed-size local array, indexed with constants once unrolled).
    Local,
    /// Shared memory of the block.
    Shared,
}

/// The type of a value in a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    /// The result of a call made for its effect.
    Void,
    Scalar(Scalar),
    Vector(Vector),
    /// A global-memory pointer: a kernel parameter `&[T]` (const) or `&mut [T]`.
    Ptr {
        elem: Elem,
        mutable: bool,
    },
    /// A local or shared array declared in the body.
    Array {
        elem: Elem,
        space: Space,
    },
    /// An integer literal whose type is still open; it takes the type of what it meets, as in
    /// Rust, or u32 when nothing decides (Rust says i32; on a GPU indices and counts are u32).
    IntLit,
    /// A float literal whose type is still open; it becomes f32.
    FloatLit,
}

impl Type {
    pub const BOOL: Type = Type::Scalar(Scalar::Bool);
    pub const I32: Type = Type::Scalar(Scalar::I32);
    pub const U32: Type = Type::Scalar(Scalar::U32);
    pub const U64: Type = Type::Scalar(Scalar::U64);
    pub const F32: Type = Type::Scalar(Scalar::F32);

    pub fn scalar(self) -> Option<Scalar> {
        match self {
            Type::Scalar(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_open_literal(self) -> bool {
        matches!(self, Type::IntLit | Type::FloatLit)
    }

    /// The type a value of an open literal type settles to when nothing else decides it.
    pub fn settled(self) -> Type {
        match self {
            Type::IntLit => Type::U32,
            Type::FloatLit => Type::F32,
            t => t,
        }
    }

    /// Integer-valued: a concrete arithmetic integer type or an open integer literal.
    pub fn is_int_like(self) -> bool {
        match self {
            Type::IntLit => true,
            Type::Scalar(s) => s.is_arith_int(),
            _ => false,
        }
    }

    /// The element type reached by indexing, if this type can be indexed.
    pub fn indexed(self) -> Option<Elem> {
        match self {
            Type::Ptr { elem, .. } | Type::Array { elem, .. } => Some(elem),
            _ => None,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Void => f.write_str("()"),
            Type::Scalar(s) => s.fmt(f),
            Type::Vector(v) => v.fmt(f),
            Type::Ptr { elem, mutable: false } => write!(f, "&[{elem}]"),
            Type::Ptr { elem, mutable: true } => write!(f, "&mut [{elem}]"),
            Type::Array { elem, space: Space::Local } => write!(f, "[{elem}; _]"),
            Type::Array { elem, space: Space::Shared } => write!(f, "shared [{elem}; _]"),
            Type::IntLit => f.write_str("{integer}"),
            Type::FloatLit => f.write_str("{float}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_names_round_trip() {
        for s in Scalar::ALL {
            assert_eq!(Scalar::from_rust_name(s.rust_name()), Some(s));
        }
        for v in Vector::ALL {
            assert_eq!(Vector::from_rust_name(v.rust_name()), Some(v));
        }
        assert_eq!(Scalar::from_rust_name("usize"), None);
    }

    #[test]
    fn sizes_match_cuda() {
        assert_eq!(Scalar::Bf16.size_bytes(), 2);
        assert_eq!(Scalar::E2m1x2.size_bytes(), 1);
        assert_eq!(Vector::U32x4.size_bytes(), 16);
        assert_eq!(Elem::Vector(Vector::F32x2).size_bytes(), 8);
    }

    #[test]
    fn only_wide_types_do_arithmetic() {
        let arith: Vec<_> = Scalar::ALL.into_iter().filter(|s| s.is_arith()).collect();
        assert_eq!(arith, [Scalar::I32, Scalar::U32, Scalar::I64, Scalar::U64, Scalar::F32]);
    }
}
