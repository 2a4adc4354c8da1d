//! `#[kernel]`: a GPU kernel written as a Rust function, lowered at compile time to a
//! `kernel-dsl` template, with a typed launcher.
//!
//! ```ignore
//! /// y = W·x for a bf16 matrix, one warp per ROWS rows.
//! #[kernel(
//!     block = 32 * WARPS,
//!     grid = div_ceil(rows, WARPS * ROWS),
//!     require(cols % 256 == 0),
//! )]
//! pub fn gemv(
//!     #[tile(default = 2, candidates = [1, 2, 4])] ROWS: u32,
//!     #[tile(default = 4, candidates = [2, 4, 8])] WARPS: u32,
//!     w: &[bf16], x: &[bf16], y: &mut [bf16], rows: u32, cols: u32,
//! ) {
//!     let first = (block_idx() * WARPS + warp_id()) * ROWS;
//!     #[unroll]
//!     for r in 0..ROWS { /* ... */ }
//! }
//! ```
//!
//! The function becomes a module of the same name holding `Tiles` (the `#[tile]` parameters, with
//! their defaults and candidates), `Args` (the other parameters as device pointers and scalars),
//! `Kernel` (implementing `kernel_dsl::KernelDef`: the template, the launch dimensions, the
//! constraint checks) and `ERASED` (the kernel seen as `&dyn kernel_dsl::AnyKernel`).
//!
//! `#[kernel(..., cooperative)]` marks a kernel whose blocks wait for each other (a software grid
//! barrier): its `LaunchDims::cooperative` is set, and the engine launches it cooperatively, so the
//! driver either makes every block resident at once or fails the launch, instead of a barrier
//! waiting forever for a block that cannot start.
//!
//! `#[kernel(..., min_blocks = EXPR)]` (tiles alone) is the residency the kernel is compiled for,
//! `__launch_bounds__`'s second argument: ptxas budgets registers to that many blocks an SM. A
//! kernel that issues a batch of loads before it uses them declares it (often as a tile): left
//! to itself ptxas may aim for few registers and move each load back next to its use, and the
//! bound sets the budget it schedules to instead.
//!
//! `#[kernel(..., max_blocks = EXPR)]` (tiles alone, 0 for none) bounds the other way: at most
//! that many blocks of the kernel on one SM. It is a launch property, not a compiled one (the
//! CUDA is the same): the engine reserves enough dynamic shared memory when it loads the kernel
//! that no more blocks fit (`Tiles::max_blocks`). It is for a grid meant one block an SM that
//! launches while its predecessor still runs: the block scheduler places blocks wherever there
//! is room, so without the bound they pile onto the few SMs the predecessor has left.
//!
//! `#[kernel(..., helpers = "src/kernels/helpers/radix.rs")]` names a file of device functions the
//! body calls (`helpers = ["a.rs", "b.rs"]` several), relative to the crate's manifest (a proc
//! macro cannot see other items, so the kernel names the file, and the generated module includes
//! its bytes so that cargo rebuilds on its change). They are plain `fn` items in the same subset;
//! parameters are values (scalars and vectors, copied) or `&[T]` / `&mut [T]` taking a buffer or an
//! array by name. Each call is expanded in place, its locals renamed as any local is: a
//! one-expression function of values wherever it stands (the argument then takes the parameter's
//! place, so it must have no effect), one with statements as a statement of its own or as a `let`'s
//! value. A function sees its parameters and the kernel's tiles only, and has no early `return`.
//!
//! The body is a Rust subset: `let` and `let mut` (scalars, vectors, `[v; N]` local arrays,
//! `shared::<T, N>()` shared arrays), `const NAME: T = value;` (a scalar of tiles and literals, put
//! in place of each use, so it may size an array or bound an unrolled loop), assignment and
//! compound assignment, `if`/`else` (also as a value), `for` over `a..b` or `(a..b).step_by(s)`
//! with `#[unroll]` or `#[unroll(n)]`, `while`, `loop`, `break`, `continue`, `return`, arithmetic,
//! comparisons, `as` casts, indexing, vector lanes (`v.x`) and the intrinsics of
//! `kernel_dsl::intrinsic`. `raw_cuda::<T>("...{0}...", args)` is the escape hatch for an
//! instruction the DSL lacks. Types follow Rust: no implicit conversions; a literal takes the type
//! of what it meets, u32 or f32 when nothing decides. A mistake is reported at its span when the
//! crate compiles.

mod error;
mod generate;
mod parse;
mod paths;

use proc_macro::TokenStream;

/// Turns a Rust function into a kernel template with its launcher. See the crate documentation.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2: proc_macro2::TokenStream = item.into();
    match parse::kernel::parse(attr.into(), item2.clone()) {
        Ok(decl) => generate::kernel::generate(&decl).into(),
        Err(err) => error::into_tokens(err, item2).into(),
    }
}
