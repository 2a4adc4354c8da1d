//! What a generated launcher needs, free of any CUDA runtime: typed device addresses, kernel
//! parameter values, launch dimensions, and the traits `#[kernel]` implements. The engine turns
//! these into driver calls.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

use crate::arch::Arch;
use crate::ir::KernelTemplate;
use crate::key::TileValue;
use crate::specialize::{Kernel, SpecializeError, specialize};

/// The device address of a buffer of `T` that a kernel reads (`&[T]` in its signature).
pub struct DevPtr<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

/// The device address of a buffer of `T` that a kernel writes (`&mut [T]` in its signature).
pub struct DevPtrMut<T> {
    addr: u64,
    _elem: PhantomData<fn() -> T>,
}

macro_rules! dev_ptr_common {
    ($t:ident) => {
        impl<T> $t<T> {
            /// Address 0: for checking a launch's requirements, which never read the addresses.
            pub const NULL: Self = $t::from_addr(0);

            /// Wraps a raw device address. The engine's buffers hand these out; building one from a
            /// number is for code that manages device memory itself.
            pub const fn from_addr(addr: u64) -> Self {
                $t { addr, _elem: PhantomData }
            }

            pub const fn addr(self) -> u64 {
                self.addr
            }

            /// The address `count` elements further on.
            pub const fn offset(self, count: u64) -> Self {
                $t::from_addr(self.addr + count * std::mem::size_of::<T>() as u64)
            }
        }

        impl<T> Clone for $t<T> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<T> Copy for $t<T> {}

        impl<T> PartialEq for $t<T> {
            fn eq(&self, other: &Self) -> bool {
                self.addr == other.addr
            }
        }

        impl<T> Eq for $t<T> {}

        impl<T> fmt::Debug for $t<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}<{}>({:#x})", stringify!($t), std::any::type_name::<T>(), self.addr)
            }
        }
    };
}

dev_ptr_common!(DevPtr);
dev_ptr_common!(DevPtrMut);

impl<T> From<DevPtrMut<T>> for DevPtr<T> {
    fn from(p: DevPtrMut<T>) -> DevPtr<T> {
        DevPtr::from_addr(p.addr)
    }
}

/// One kernel parameter as it is passed to the driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamValue {
    Ptr(u64),
    Bool(bool),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
}

/// Converts one launcher field into its parameter value.
pub trait IntoParam {
    fn into_param(self) -> ParamValue;
}

impl<T> IntoParam for DevPtr<T> {
    fn into_param(self) -> ParamValue {
        ParamValue::Ptr(self.addr)
    }
}

impl<T> IntoParam for DevPtrMut<T> {
    fn into_param(self) -> ParamValue {
        ParamValue::Ptr(self.addr)
    }
}

macro_rules! scalar_param {
    ($($t:ty => $v:ident),*) => {
        $(impl IntoParam for $t {
            fn into_param(self) -> ParamValue {
                ParamValue::$v(self)
            }
        })*
    };
}

scalar_param!(bool => Bool, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32);

/// Grid, block and dynamic shared memory of one launch, and how it must be launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchDims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
    /// A cooperative launch (`#[kernel(..., cooperative)]`): the driver starts the grid only if
    /// every block can be resident at once, and fails the launch otherwise, so that blocks that
    /// wait for each other (a software grid barrier) never wait for one that cannot start, under
    /// compute-sanitizer included.
    pub cooperative: bool,
}

impl LaunchDims {
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }
}

/// Why a kernel cannot be launched with these tiles or these arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchError {
    pub kernel: &'static str,
    pub message: String,
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`: {}", self.kernel, self.message)
    }
}

impl std::error::Error for LaunchError {}

/// The tile parameters of one kernel, as a struct `#[kernel]` generates.
pub trait TileSet: Copy + fmt::Debug + Eq + Hash + Send + Sync + 'static {
    /// The defaults: valid on every architecture.
    const DEFAULT: Self;

    /// The tiles marked `step` (`#[tile(..., step)]`), by name: each decides how the kernel's
    /// launch meets its neighbours in the decode step (when the next kernel may launch, how many
    /// blocks of an early grid an SM takes), which a harness of the kernel alone cannot time. The
    /// autotuner holds them at the plan's value; pinned tables and the step bench choose them.
    const CHOSEN_IN_STEP: &'static [&'static str] = &[];

    /// The values by tile name, in declaration order.
    fn values(&self) -> Vec<(&'static str, TileValue)>;

    /// Every combination of the declared candidates that meets the tile constraints.
    fn candidates() -> Vec<Self>;

    /// Checks the constraints that involve tiles alone.
    fn check(&self) -> Result<(), LaunchError>;

    /// Threads per block, a function of the tiles alone.
    fn block_threads(&self) -> u32;

    /// Blocks that must fit on one SM together (`#[kernel(min_blocks = ...)]`), 0 for no bound.
    fn min_blocks(&self) -> u32 {
        0
    }

    /// At most this many blocks on one SM (`#[kernel(max_blocks = ...)]`), 0 for no bound. Not
    /// part of the compiled kernel: the engine reserves dynamic shared memory at load so that no
    /// more fit.
    fn max_blocks(&self) -> u32 {
        0
    }
}

/// A kernel described with `#[kernel]`: its template, tiles, arguments and launch geometry.
pub trait KernelDef: 'static {
    const NAME: &'static str;
    type Tiles: TileSet;
    type Args: KernelArgs;

    /// The kernel as written, tiles still symbolic.
    fn template() -> &'static KernelTemplate;

    /// Grid and block for these tiles and arguments, after checking the shape constraints.
    fn launch_dims(tiles: &Self::Tiles, args: &Self::Args) -> Result<LaunchDims, LaunchError>;

    /// The kernel specialised for `tiles` on `arch`.
    fn specialize(tiles: &Self::Tiles, arch: Arch) -> Result<Kernel, SpecializeError> {
        tiles.check().map_err(|e| SpecializeError { kernel: Self::NAME.to_owned(), message: e.message })?;
        let mut kernel = specialize(Self::template(), &tiles.values(), arch, tiles.block_threads())?;
        kernel.min_blocks = tiles.min_blocks();
        Ok(kernel)
    }
}

/// The argument struct of a kernel: its parameter values in declaration order.
pub trait KernelArgs {
    fn params(&self) -> Vec<ParamValue>;
}

/// A kernel seen without its types, for tools that walk every kernel (the generated files, the
/// compile test, the autotuner).
pub trait AnyKernel: Sync {
    fn name(&self) -> &'static str;
    fn template(&self) -> &'static KernelTemplate;
    /// The kernel at its default tiles.
    fn default_kernel(&self, arch: Arch) -> Result<Kernel, SpecializeError>;
    /// The kernel at every candidate tile set.
    fn candidate_kernels(&self, arch: Arch) -> Vec<Result<Kernel, SpecializeError>>;
}

/// The [`AnyKernel`] view of a [`KernelDef`].
pub struct Erased<K>(PhantomData<fn() -> K>);

impl<K> Erased<K> {
    pub const fn new() -> Self {
        Erased(PhantomData)
    }
}

impl<K> Default for Erased<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for Erased<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Erased<{}>", std::any::type_name::<K>())
    }
}

impl<K: KernelDef> AnyKernel for Erased<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn template(&self) -> &'static KernelTemplate {
        K::template()
    }

    fn default_kernel(&self, arch: Arch) -> Result<Kernel, SpecializeError> {
        K::specialize(&K::Tiles::DEFAULT, arch)
    }

    fn candidate_kernels(&self, arch: Arch) -> Vec<Result<Kernel, SpecializeError>> {
        K::Tiles::candidates().iter().map(|t| K::specialize(t, arch)).collect()
    }
}

/// `ceil(a / b)`, for grid sizes in launch expressions.
pub const fn div_ceil(a: u32, b: u32) -> u32 {
    a.div_ceil(b)
}
