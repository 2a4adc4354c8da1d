//! The device intrinsics a kernel body may call: their names in Rust, their typing rules and the
//! prelude helpers they need. How each prints as CUDA lives in [`crate::emit`].

use crate::emit::prelude::Helper;
use crate::types::{Elem, Scalar, Space, Type, Vector};

/// A device intrinsic. Generic ones carry their type argument (`load_vec::<u32x4>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intrinsic {
    // Launch geometry (u32).
    ThreadIdx,
    BlockIdx,
    BlockIdxY,
    BlockIdxZ,
    BlockDim,
    GridDim,
    GridDimY,
    LaneId,
    WarpId,
    /// The target's SM version (90 or 121); folded to a constant when the template is specialised.
    Sm,
    /// The GPU's global nanosecond timer (u64), the same clock on every SM: for timing inside a
    /// kernel and across kernels.
    GlobalTimer,
    // Barriers and fences.
    SyncThreads,
    SyncWarp,
    ThreadFence,
    // Programmatic dependent launch (sm_90+): a kernel launched to overlap its predecessor may
    // start before the predecessor finishes. It reads nothing the predecessor writes and writes
    // nothing before `grid_dependency_wait()`; `launch_dependents()` lets the successor start.
    GridDependencyWait,
    LaunchDependents,
    /// `prefetch_l2(buffer, index, bytes)`: a bulk prefetch of `bytes` (a multiple of 16, from a
    /// 16-byte aligned element) into L2, fire and forget.
    PrefetchL2,
    // Bulk copies into shared memory (sm_90+): the copy engine moves whole rows while the
    // threads hold no registers for them, and an mbarrier in shared memory (a `shared::<u64, N>()`
    // slot) counts the bytes that have landed.
    /// `bulk_barrier_init(bars, i, arrivals)`: slot i becomes an mbarrier whose phase ends after
    /// `arrivals` calls of `bulk_barrier_arrive` and every byte its `bulk_load`s announced. One
    /// thread initialises a slot, then the threads that use it meet (`sync_warp`/`sync_threads`).
    BulkBarrierInit,
    /// `bulk_load(dst, d, src, s, bytes, bars, i)`: copies `bytes` (a multiple of 16; both
    /// addresses 16-byte aligned) from the read-only global `src[s..]` to the shared `dst[d..]`
    /// and adds them to what slot i's current phase waits for. Issued by one thread, before that
    /// thread's `bulk_barrier_arrive` on the slot.
    BulkLoad,
    /// `bulk_barrier_arrive(bars, i)`: one of the slot's arrivals.
    BulkBarrierArrive,
    /// `bulk_barrier_wait(bars, i, parity)`: spins until the slot's phase of that parity (0 for
    /// its first) has ended; the copies it counted are then visible to the waiting thread.
    BulkBarrierWait,
    // Warp and block collectives.
    ShflXor,
    ShflDown,
    Shfl,
    WarpSum,
    WarpMax,
    /// The largest and smallest u32 over the warp's 32 lanes in one instruction (`redux.sync`,
    /// sm_80+); every lane gets it.
    WarpMaxU32,
    WarpMinU32,
    BlockSum,
    BlockMax,
    // f32 math.
    Exp,
    Ln,
    Sqrt,
    Rsqrt,
    Tanh,
    Abs,
    Sigmoid,
    Silu,
    Softplus,
    Max,
    Min,
    Fma,
    // Bit reinterpretation.
    F32FromBits,
    F32ToBits,
    // Packed decodes: bf16 pairs, fp8 quads, fp4 quads.
    Bf16x2ToF32x2,
    PackBf16x2,
    DotBf16x4,
    DotBf16x8,
    E4m3x4ToF32x4,
    E2m1x4ToF32x4,
    /// `e2m1x4_to_f32x4_raw(w)`: `e2m1x4_to_f32x4` without the multiply that puts its values at
    /// scale: each value comes out divided by `e2m1_raw_gap()` (2^126 on sm_90, where the decode
    /// is bits put in place; 1 on sm_121a, which converts). A kernel using it lifts its
    /// activations so that the products stay normal f32, and multiplies its sums by the gap over
    /// the lift: one multiply a block scale instead of one a value.
    E2m1x4ToF32x4Raw,
    /// The factor `e2m1x4_to_f32x4_raw` leaves out (an f32 constant of the target).
    E2m1RawGap,
    /// `dot_e2m1x16_raw(w, x0, x1, x2, x3)`: Σ of 16 E2M1 values (`u32x2`, element 0 in the low
    /// nibble) decoded raw (`e2m1x4_to_f32x4_raw`) times 16 lifted f32 activations (`x0` the
    /// first four), in order: an f32 product and 15 fused multiply-adds, the sum short by the gap
    /// over the lift as the kernel's own products would be.
    DotE2m1x16Raw,
    /// `dot_e2m1x16_i8(w, q)`: Σ of 16 E2M1 values (`u32x2`, element 0 in the low nibble) times
    /// 16 int8 activations (`u32x4`, element 0 in the low byte), exact, as an i32 that counts each
    /// value twice (E2M1 values are halves: twice each is an int8). Byte permutes look the values
    /// up, `dp4a` multiplies: in sm_90 SASS about 30 instructions for the 16 (eight permutes, eight
    /// dp4a, the shifts and xors that feed them, moves of a table word, the sum to f32), where
    /// `dot_e2m1x16_raw` takes about 64 (static counts of a loop of each).
    DotE2m1x16I8,
    /// `pack_i8x4(v)`: four f32 (`f32x4`) rounded to nearest even, clamped to [-127, 127], as
    /// four int8 in a `u32` (element 0 in the low byte): activations staged for `dot_e2m1x16_i8`.
    PackI8x4,
    /// The power of two a kernel multiplies its activations by before products with raw values
    /// (an f32 constant of the target): 2^64 where the gap is 2^126, so that the products stay
    /// normal f32 for |w·x| ≥ 2^-64 and |x| < 2^64; 1 where there is no gap. Its sums then carry
    /// `e2m1_raw_gap() / e2m1_raw_lift()`, a power of two, so they round as exact products' would.
    E2m1RawLift,
    /// Σ of 16 E2M1 values (`u32x2`, element 0 in the low nibble) times 16 activations that
    /// `stage_e2m1_x8` staged; f16 products, an f32 result.
    DotE2m1x16,
    /// `dot_e2m1x16` on codes in the architecture's paired layout (`crate::e2m1_pairs`).
    DotE2m1x16Paired,
    /// Eight activations (two `f32x4`, already divided by their scale) as f16 pairs in the order
    /// this architecture's E2M1 decode produces them.
    StageE2m1x8,
    /// Eight E2M1 values (a `u32`, element 0 in the low nibble) as four f16 pairs (`u32x4`) in the
    /// order this architecture's decode produces them, the order `stage_e2m1_x8` stages
    /// activations in: on sm_90 (v0, v4), (v1, v5), (v2, v6), (v3, v7), each the value times 2^-14
    /// (`stage_e2m1_x8` multiplies the activations by 2^14); on sm_121a (v0, v1), ... (v6, v7),
    /// exact.
    E2m1x8ToF16x8,
    /// `mma_f16_16x8x16(a, b, c)`: one warp's D = A·B + C on the tensor cores (sm_80 and later),
    /// A 16 × 16 f16 (`u32x4` a thread: two f16 a word), B 16 × 8 f16 (`u32x2`), C and D 16 × 8 f32
    /// (`f32x4`), in the fragment layout of PTX's `mma.m16n8k16`: lane l holds rows l/4 and l/4 + 8,
    /// A's columns 2(l%4), 2(l%4) + 1 (`.x` the first row, `.y` the second) and 8 + 2(l%4),
    /// 9 + 2(l%4) (`.z`, `.w`), B's rows likewise in column l/4, and C's columns 2(l%4), 2(l%4) + 1
    /// (`.x`, `.y` the first row, `.z`, `.w` the second). Products of f16 values are exact in the
    /// f32 sums.
    MmaF16,
    /// `nvfp4_mma_segment(wa, wb, xs, at, own)`: one 128-value segment of a warp's 16 NVFP4 rows
    /// on the tensor cores (`mma_f16_16x8x16`, eight products). Lane (q = l%4, g = l/4) passes
    /// its 16 bytes of rows g and g + 8 (`u32x4` each: values 32q .. 32q + 31 of the segment, two
    /// 16-value blocks) and the staged x (`xs`, a shared u32 array: [segment][word j][lane q] four
    /// f16 pairs each in the decode's order, `at` the word of (segment, j 0, its q)); `own` is
    /// g == 2q, the lanes that carry B's column 2q (the others pass zeros). Returns this lane's
    /// block sums: row g over its first and second block (`.x`, `.y`), row g + 8 (`.z`, `.w`).
    Nvfp4MmaSegment,
    /// `nvfp4_mma_segment_paired(wa, wb, xs, at, own)`: [`Intrinsic::Nvfp4MmaSegment`] on codes in
    /// the paired layout of the architecture (`crate::e2m1_pairs`: nine integer instructions a
    /// word on sm_90 instead of about sixteen; ModelOpt's layout on sm_121a).
    Nvfp4MmaSegmentPaired,
    /// `nvfp4_mma_stage(v, xs, xsc, i, valid)`: stages eight bf16 activations (`v`, a `u32x4`)
    /// for `nvfp4_mma_segment`, as value i / 8 of a slice: the 16 lanes of a 128-value segment
    /// (one half of a warp, all of whose lanes must call it: it shuffles) share a power-of-two
    /// scale that puts their largest |x| in [1, 2); the f16 pairs go to `xs` (a shared u32 array,
    /// [segment][word j][lane q] four words each) and the scale back (its inverse) to `xsc[i /
    /// 16]` (a shared f32 array). A lane with `valid` false stages nothing.
    Nvfp4MmaStage,
    /// A vector from its lanes: `u32x4(a, b, c, d)`.
    Make(Vector),
    // Memory.
    LoadVec(Vector),
    LoadStream(Vector),
    /// `load_early::<V>(weights, i)`: `load_stream` for loads issued before
    /// `grid_dependency_wait()` (data no kernel writes, such as weights). A coherent load
    /// (`ld.global`, not `.nc`): ptxas keeps it before the wait, where it moves a read-only-path
    /// load past the wait to just before its use (sm_90 SASS), which would leave the batch to
    /// stream only after the predecessor ends; and `asm volatile`, so that NVVM, for which the
    /// wait is the only memory effect in sight, does not move it either.
    LoadEarly(Vector),
    LoadCg,
    /// `load_acquire(buffer, index)`: a u32 that other blocks of this launch update, read from L2
    /// with acquire semantics at GPU scope (`ld.acquire.gpu`): never cached, hoisted or merged, so
    /// a spin on it sees their updates, and the loads after it see what they wrote before.
    LoadAcquire,
    StoreVec,
    AtomicAdd,
    AtomicMax,
}

/// The concrete parameter types an intrinsic takes for given arguments, and what it returns.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub params: Vec<Type>,
    pub ret: Type,
}

impl Intrinsic {
    /// Looks up a free function by its name in a kernel body; `generic` is the type argument of a
    /// turbofish (`load_vec::<u32x4>`).
    pub fn from_function(name: &str, generic: Option<&str>) -> Result<Intrinsic, String> {
        let vector = || -> Result<Vector, String> {
            let g = generic.ok_or_else(|| format!("`{name}` needs a vector type: `{name}::<u32x4>(ptr, index)`"))?;
            Vector::from_rust_name(g).ok_or_else(|| format!("`{g}` is not a vector type (u32x2, u32x4, f32x2, f32x4)"))
        };
        let plain = |i: Intrinsic| -> Result<Intrinsic, String> {
            match generic {
                None => Ok(i),
                Some(_) => Err(format!("`{name}` takes no type argument")),
            }
        };
        match name {
            "thread_idx" => plain(Intrinsic::ThreadIdx),
            "block_idx" => plain(Intrinsic::BlockIdx),
            "block_idx_y" => plain(Intrinsic::BlockIdxY),
            "block_idx_z" => plain(Intrinsic::BlockIdxZ),
            "block_dim" => plain(Intrinsic::BlockDim),
            "grid_dim" => plain(Intrinsic::GridDim),
            "grid_dim_y" => plain(Intrinsic::GridDimY),
            "lane_id" => plain(Intrinsic::LaneId),
            "warp_id" => plain(Intrinsic::WarpId),
            "sm" => plain(Intrinsic::Sm),
            "global_timer" => plain(Intrinsic::GlobalTimer),
            "sync_threads" => plain(Intrinsic::SyncThreads),
            "sync_warp" => plain(Intrinsic::SyncWarp),
            "thread_fence" => plain(Intrinsic::ThreadFence),
            "grid_dependency_wait" => plain(Intrinsic::GridDependencyWait),
            "launch_dependents" => plain(Intrinsic::LaunchDependents),
            "prefetch_l2" => plain(Intrinsic::PrefetchL2),
            "bulk_barrier_init" => plain(Intrinsic::BulkBarrierInit),
            "bulk_load" => plain(Intrinsic::BulkLoad),
            "bulk_barrier_arrive" => plain(Intrinsic::BulkBarrierArrive),
            "bulk_barrier_wait" => plain(Intrinsic::BulkBarrierWait),
            "shfl_xor" => plain(Intrinsic::ShflXor),
            "shfl_down" => plain(Intrinsic::ShflDown),
            "shfl" => plain(Intrinsic::Shfl),
            "warp_sum" => plain(Intrinsic::WarpSum),
            "warp_max" => plain(Intrinsic::WarpMax),
            "warp_max_u32" => plain(Intrinsic::WarpMaxU32),
            "warp_min_u32" => plain(Intrinsic::WarpMinU32),
            "block_sum" => plain(Intrinsic::BlockSum),
            "block_max" => plain(Intrinsic::BlockMax),
            "exp" => plain(Intrinsic::Exp),
            "ln" => plain(Intrinsic::Ln),
            "sqrt" => plain(Intrinsic::Sqrt),
            "rsqrt" => plain(Intrinsic::Rsqrt),
            "tanh" => plain(Intrinsic::Tanh),
            "abs" => plain(Intrinsic::Abs),
            "sigmoid" => plain(Intrinsic::Sigmoid),
            "silu" => plain(Intrinsic::Silu),
            "softplus" => plain(Intrinsic::Softplus),
            "max" => plain(Intrinsic::Max),
            "min" => plain(Intrinsic::Min),
            "fma" => plain(Intrinsic::Fma),
            "f32_from_bits" => plain(Intrinsic::F32FromBits),
            "bf16x2_to_f32x2" => plain(Intrinsic::Bf16x2ToF32x2),
            "pack_bf16x2" => plain(Intrinsic::PackBf16x2),
            "dot_bf16x4" => plain(Intrinsic::DotBf16x4),
            "dot_bf16x8" => plain(Intrinsic::DotBf16x8),
            "e4m3x4_to_f32x4" => plain(Intrinsic::E4m3x4ToF32x4),
            "e2m1x4_to_f32x4" => plain(Intrinsic::E2m1x4ToF32x4),
            "e2m1x4_to_f32x4_raw" => plain(Intrinsic::E2m1x4ToF32x4Raw),
            "e2m1_raw_gap" => plain(Intrinsic::E2m1RawGap),
            "dot_e2m1x16_raw" => plain(Intrinsic::DotE2m1x16Raw),
            "dot_e2m1x16_i8" => plain(Intrinsic::DotE2m1x16I8),
            "pack_i8x4" => plain(Intrinsic::PackI8x4),
            "e2m1_raw_lift" => plain(Intrinsic::E2m1RawLift),
            "dot_e2m1x16" => plain(Intrinsic::DotE2m1x16),
            "dot_e2m1x16_paired" => plain(Intrinsic::DotE2m1x16Paired),
            "stage_e2m1_x8" => plain(Intrinsic::StageE2m1x8),
            "e2m1x8_to_f16x8" => plain(Intrinsic::E2m1x8ToF16x8),
            "mma_f16_16x8x16" => plain(Intrinsic::MmaF16),
            "nvfp4_mma_segment" => plain(Intrinsic::Nvfp4MmaSegment),
            "nvfp4_mma_segment_paired" => plain(Intrinsic::Nvfp4MmaSegmentPaired),
            "nvfp4_mma_stage" => plain(Intrinsic::Nvfp4MmaStage),
            "atomic_max" => plain(Intrinsic::AtomicMax),
            "load_vec" => vector().map(Intrinsic::LoadVec),
            "load_stream" => vector().map(Intrinsic::LoadStream),
            "load_early" => vector().map(Intrinsic::LoadEarly),
            "load_cg" => plain(Intrinsic::LoadCg),
            "load_acquire" => plain(Intrinsic::LoadAcquire),
            "store_vec" => plain(Intrinsic::StoreVec),
            "atomic_add" => plain(Intrinsic::AtomicAdd),
            _ => match Vector::from_rust_name(name) {
                Some(v) => plain(Intrinsic::Make(v)),
                None => {
                    Err(format!("unknown function `{name}` in a kernel body (see kernel_dsl::intrinsic for the list)"))
                }
            },
        }
    }

    /// Looks up a method (`x.exp()`, `a.max(b)`, `x.to_bits()`); the receiver becomes the first argument.
    pub fn from_method(name: &str) -> Result<Intrinsic, String> {
        match name {
            "exp" => Ok(Intrinsic::Exp),
            "ln" => Ok(Intrinsic::Ln),
            "sqrt" => Ok(Intrinsic::Sqrt),
            "rsqrt" => Ok(Intrinsic::Rsqrt),
            "tanh" => Ok(Intrinsic::Tanh),
            "abs" => Ok(Intrinsic::Abs),
            "max" => Ok(Intrinsic::Max),
            "min" => Ok(Intrinsic::Min),
            "mul_add" => Ok(Intrinsic::Fma),
            "to_bits" => Ok(Intrinsic::F32ToBits),
            _ => Err(format!("unknown method `{name}` in a kernel body")),
        }
    }

    /// The launch geometry and the target: values fixed for the whole launch.
    pub fn is_geometry(self) -> bool {
        use Intrinsic as I;
        matches!(
            self,
            I::ThreadIdx
                | I::BlockIdx
                | I::BlockIdxY
                | I::BlockIdxZ
                | I::BlockDim
                | I::GridDim
                | I::GridDimY
                | I::LaneId
                | I::WarpId
                | I::Sm
        )
    }

    /// Whether the call has an effect beyond its value, so it is never dropped or reordered.
    pub fn has_effect(self) -> bool {
        matches!(
            self,
            Intrinsic::SyncThreads
                | Intrinsic::SyncWarp
                | Intrinsic::ThreadFence
                | Intrinsic::GridDependencyWait
                | Intrinsic::LaunchDependents
                | Intrinsic::PrefetchL2
                | Intrinsic::BulkBarrierInit
                | Intrinsic::BulkLoad
                | Intrinsic::BulkBarrierArrive
                | Intrinsic::BulkBarrierWait
                | Intrinsic::GlobalTimer
                | Intrinsic::LoadAcquire
                | Intrinsic::StoreVec
                | Intrinsic::AtomicAdd
                | Intrinsic::AtomicMax
                | Intrinsic::BlockSum
                | Intrinsic::BlockMax
                | Intrinsic::Nvfp4MmaStage
        )
    }

    /// Types the call: the parameter types chosen for these arguments (open literals among them
    /// settle to those) and the result type, or a message saying what is wrong.
    pub fn signature(self, args: &[Type]) -> Result<Signature, String> {
        use Intrinsic as I;
        let f32 = Type::F32;
        let u32 = Type::U32;
        let sig = |params: Vec<Type>, ret: Type| Ok(Signature { params, ret });
        let arity = |n: usize| -> Result<(), String> {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!("takes {n} argument{}, {} given", if n == 1 { "" } else { "s" }, args.len()))
            }
        };
        let want = |i: usize, t: Type| -> Result<(), String> {
            if args[i] == t
                || (args[i] == Type::FloatLit && t == Type::F32)
                || (args[i] == Type::IntLit && t.is_int_like())
            {
                Ok(())
            } else {
                Err(format!("argument {} must be {t}, found {}", i + 1, args[i]))
            }
        };
        match self {
            I::ThreadIdx
            | I::BlockIdx
            | I::BlockIdxY
            | I::BlockIdxZ
            | I::BlockDim
            | I::GridDim
            | I::GridDimY
            | I::LaneId
            | I::WarpId
            | I::Sm => {
                arity(0)?;
                sig(vec![], u32)
            }
            I::SyncThreads | I::SyncWarp | I::ThreadFence | I::GridDependencyWait | I::LaunchDependents => {
                arity(0)?;
                sig(vec![], Type::Void)
            }
            I::GlobalTimer => {
                arity(0)?;
                sig(vec![], Type::Scalar(Scalar::U64))
            }
            I::PrefetchL2 => {
                arity(3)?;
                let base = args[0];
                if !matches!(base, Type::Ptr { .. }) {
                    return Err(format!("argument 1 must be a global pointer, found {base}"));
                }
                let index = index_type(args[1])?;
                want(2, u32)?;
                sig(vec![base, index, u32], Type::Void)
            }
            I::BulkBarrierInit | I::BulkBarrierArrive | I::BulkBarrierWait => {
                arity(if self == I::BulkBarrierArrive { 2 } else { 3 })?;
                let bars = barrier_slots(args[0], 1)?;
                let index = index_type(args[1])?;
                let mut params = vec![bars, index];
                if self != I::BulkBarrierArrive {
                    want(2, u32)?;
                    params.push(u32);
                }
                sig(params, Type::Void)
            }
            I::BulkLoad => {
                arity(7)?;
                let dst = args[0];
                if !matches!(dst, Type::Array { space: Space::Shared, .. }) {
                    return Err(format!("argument 1 must be a shared array, found {dst}"));
                }
                let d = index_type(args[1])?;
                let src = args[2];
                if !matches!(src, Type::Ptr { mutable: false, .. }) {
                    return Err(format!("argument 3 must be a read-only global pointer `&[T]`, found {src}"));
                }
                let s = index_type(args[3])?;
                want(4, u32)?;
                let bars = barrier_slots(args[5], 6)?;
                let i = index_type(args[6])?;
                sig(vec![dst, d, src, s, u32, bars, i], Type::Void)
            }
            I::ShflXor | I::ShflDown | I::Shfl => {
                arity(2)?;
                let t = match args[0].settled() {
                    t @ Type::Scalar(Scalar::F32 | Scalar::U32 | Scalar::I32) => t,
                    t => return Err(format!("shuffles move f32, u32 or i32 values, found {t}")),
                };
                want(1, u32)?;
                sig(vec![t, u32], t)
            }
            I::WarpSum | I::WarpMax => {
                arity(1)?;
                want(0, f32)?;
                sig(vec![f32], f32)
            }
            I::WarpMaxU32 | I::WarpMinU32 => {
                arity(1)?;
                want(0, u32)?;
                sig(vec![u32], u32)
            }
            I::BlockSum | I::BlockMax => {
                arity(2)?;
                want(0, f32)?;
                let scratch = Type::Array { elem: Elem::Scalar(Scalar::F32), space: Space::Shared };
                if args[1] != scratch {
                    return Err(format!(
                        "argument 2 must be a shared f32 array with one slot per warp (`shared::<f32, WARPS>()`), found {}",
                        args[1]
                    ));
                }
                sig(vec![f32, scratch], f32)
            }
            I::Exp | I::Ln | I::Sqrt | I::Rsqrt | I::Tanh | I::Abs | I::Sigmoid | I::Silu | I::Softplus => {
                arity(1)?;
                want(0, f32)?;
                sig(vec![f32], f32)
            }
            I::Max | I::Min => {
                arity(2)?;
                let t = crate::typing::unify(args[0], args[1])
                    .filter(|t| t.settled().scalar().is_some_and(Scalar::is_arith))
                    .ok_or_else(|| {
                        format!("takes two values of one arithmetic type, found {} and {}", args[0], args[1])
                    })?
                    .settled();
                sig(vec![t, t], t)
            }
            I::Fma => {
                arity(3)?;
                (0..3).try_for_each(|i| want(i, f32))?;
                sig(vec![f32; 3], f32)
            }
            I::F32FromBits => {
                arity(1)?;
                want(0, u32)?;
                sig(vec![u32], f32)
            }
            I::F32ToBits => {
                arity(1)?;
                want(0, f32)?;
                sig(vec![f32], u32)
            }
            I::Bf16x2ToF32x2 => {
                arity(1)?;
                want(0, u32)?;
                sig(vec![u32], Type::Vector(Vector::F32x2))
            }
            I::PackBf16x2 => {
                arity(2)?;
                want(0, f32)?;
                want(1, f32)?;
                sig(vec![f32, f32], u32)
            }
            I::DotBf16x4 => {
                arity(2)?;
                let v = Type::Vector(Vector::U32x2);
                want(0, v)?;
                want(1, v)?;
                sig(vec![v, v], f32)
            }
            I::DotE2m1x16 | I::DotE2m1x16Paired => {
                arity(3)?;
                let (w, x) = (Type::Vector(Vector::U32x2), Type::Vector(Vector::U32x4));
                want(0, w)?;
                want(1, x)?;
                want(2, x)?;
                sig(vec![w, x, x], f32)
            }
            I::DotE2m1x16Raw => {
                arity(5)?;
                let (w, x) = (Type::Vector(Vector::U32x2), Type::Vector(Vector::F32x4));
                want(0, w)?;
                (1..5).try_for_each(|i| want(i, x))?;
                sig(vec![w, x, x, x, x], f32)
            }
            I::DotE2m1x16I8 => {
                arity(2)?;
                let (w, q) = (Type::Vector(Vector::U32x2), Type::Vector(Vector::U32x4));
                want(0, w)?;
                want(1, q)?;
                sig(vec![w, q], Type::I32)
            }
            I::PackI8x4 => {
                arity(1)?;
                let v = Type::Vector(Vector::F32x4);
                want(0, v)?;
                sig(vec![v], u32)
            }
            I::StageE2m1x8 => {
                arity(2)?;
                let v = Type::Vector(Vector::F32x4);
                want(0, v)?;
                want(1, v)?;
                sig(vec![v, v], Type::Vector(Vector::U32x4))
            }
            I::E2m1x8ToF16x8 => {
                arity(1)?;
                want(0, u32)?;
                sig(vec![u32], Type::Vector(Vector::U32x4))
            }
            I::MmaF16 => {
                arity(3)?;
                let (a, b, c) = (Type::Vector(Vector::U32x4), Type::Vector(Vector::U32x2), Type::Vector(Vector::F32x4));
                want(0, a)?;
                want(1, b)?;
                want(2, c)?;
                sig(vec![a, b, c], c)
            }
            I::Nvfp4MmaSegment | I::Nvfp4MmaSegmentPaired => {
                arity(5)?;
                let w = Type::Vector(Vector::U32x4);
                want(0, w)?;
                want(1, w)?;
                let xs = Type::Array { elem: Elem::Scalar(Scalar::U32), space: Space::Shared };
                if args[2] != xs {
                    return Err(format!("argument 3 must be a shared u32 array (the staged x), found {}", args[2]));
                }
                want(3, u32)?;
                want(4, Type::BOOL)?;
                sig(vec![w, w, xs, u32, Type::BOOL], Type::Vector(Vector::F32x4))
            }
            I::Nvfp4MmaStage => {
                arity(5)?;
                want(0, Type::Vector(Vector::U32x4))?;
                let xs = Type::Array { elem: Elem::Scalar(Scalar::U32), space: Space::Shared };
                let xsc = Type::Array { elem: Elem::Scalar(Scalar::F32), space: Space::Shared };
                if args[1] != xs {
                    return Err(format!("argument 2 must be a shared u32 array (the staged x), found {}", args[1]));
                }
                if args[2] != xsc {
                    return Err(format!("argument 3 must be a shared f32 array (the scales), found {}", args[2]));
                }
                want(3, u32)?;
                want(4, Type::BOOL)?;
                sig(vec![Type::Vector(Vector::U32x4), xs, xsc, u32, Type::BOOL], Type::Void)
            }
            I::Make(v) => {
                let lane = Type::Scalar(v.lane());
                arity(usize::from(v.lanes()))?;
                (0..args.len()).try_for_each(|i| want(i, lane))?;
                sig(vec![lane; args.len()], Type::Vector(v))
            }
            I::DotBf16x8 => {
                arity(2)?;
                let v = Type::Vector(Vector::U32x4);
                want(0, v)?;
                want(1, v)?;
                sig(vec![v, v], f32)
            }
            I::E2m1RawGap | I::E2m1RawLift => {
                arity(0)?;
                sig(vec![], f32)
            }
            I::E4m3x4ToF32x4 | I::E2m1x4ToF32x4 | I::E2m1x4ToF32x4Raw => {
                arity(1)?;
                want(0, u32)?;
                sig(vec![u32], Type::Vector(Vector::F32x4))
            }
            I::LoadVec(v) | I::LoadStream(v) | I::LoadEarly(v) => {
                arity(2)?;
                let base = args[0];
                match (self, base) {
                    (I::LoadVec(_), Type::Ptr { .. } | Type::Array { space: Space::Shared, .. }) => {}
                    (I::LoadStream(v) | I::LoadEarly(v), Type::Ptr { mutable: false, .. })
                        if v.lane() == Scalar::U32 => {}
                    (I::LoadStream(_) | I::LoadEarly(_), Type::Ptr { mutable: false, .. }) => {
                        return Err("`load_stream` and `load_early` load raw bits: use u32x4 or u32x2".to_owned());
                    }
                    (I::LoadStream(_) | I::LoadEarly(_), _) => {
                        return Err(format!("argument 1 must be a read-only global pointer `&[T]`, found {base}"));
                    }
                    _ => return Err(format!("argument 1 must be a global pointer or a shared array, found {base}")),
                }
                let index = index_type(args[1])?;
                sig(vec![base, index], Type::Vector(v))
            }
            I::LoadCg => {
                arity(2)?;
                let base = args[0];
                match base {
                    Type::Ptr { elem: Elem::Scalar(Scalar::F32 | Scalar::U32 | Scalar::U64), .. } => {}
                    _ => return Err(format!("argument 1 must be a global f32, u32 or u64 pointer, found {base}")),
                }
                let index = index_type(args[1])?;
                sig(vec![base, index], base.indexed().map_or(Type::Void, Elem::as_type))
            }
            I::LoadAcquire => {
                arity(2)?;
                let base = args[0];
                if !matches!(base, Type::Ptr { elem: Elem::Scalar(Scalar::U32), .. }) {
                    return Err(format!("argument 1 must be a global u32 pointer, found {base}"));
                }
                let index = index_type(args[1])?;
                sig(vec![base, index], u32)
            }
            I::StoreVec => {
                arity(3)?;
                let base = args[0];
                match base {
                    Type::Ptr { mutable: true, .. } | Type::Array { space: Space::Shared, .. } => {}
                    _ => {
                        return Err(format!(
                            "argument 1 must be a mutable global pointer or a shared array, found {base}"
                        ));
                    }
                }
                let index = index_type(args[1])?;
                match args[2] {
                    Type::Vector(_) => {}
                    t => return Err(format!("argument 3 must be a vector value (u32x4, f32x4, ...), found {t}")),
                }
                sig(vec![base, index, args[2]], Type::Void)
            }
            I::AtomicMax => atomic(args, &[Scalar::U32, Scalar::I32]),
            I::AtomicAdd => atomic(args, &[Scalar::F32, Scalar::U32, Scalar::I32, Scalar::U64]),
        }
    }

    /// The prelude helpers this intrinsic's CUDA needs.
    pub fn helpers(self) -> &'static [Helper] {
        use Intrinsic as I;
        match self {
            I::WarpSum => &[Helper::WarpSum],
            I::WarpMax => &[Helper::WarpMax],
            I::BlockSum => &[Helper::BlockSum],
            I::BlockMax => &[Helper::BlockMax],
            I::Sigmoid => &[Helper::Sigmoid],
            I::Silu => &[Helper::Silu],
            I::Softplus => &[Helper::Softplus],
            I::Bf16x2ToF32x2 => &[Helper::Bf16x2ToFloat2],
            I::PackBf16x2 => &[Helper::PackBf16x2],
            I::DotBf16x4 => &[Helper::DotBf16x4],
            I::DotBf16x8 => &[Helper::DotBf16x8],
            I::E4m3x4ToF32x4 => &[Helper::E4m3x4ToFloat4],
            I::E2m1x4ToF32x4 => &[Helper::E2m1x4ToFloat4],
            I::E2m1x4ToF32x4Raw | I::E2m1RawGap => &[Helper::E2m1x4ToFloat4Raw],
            I::E2m1RawLift => &[Helper::E2m1RawLift],
            I::DotE2m1x16 => &[Helper::DotE2m1x16],
            I::DotE2m1x16Paired => &[Helper::DotE2m1x16Paired],
            I::DotE2m1x16Raw => &[Helper::DotE2m1x16Raw],
            I::DotE2m1x16I8 => &[Helper::DotE2m1x16I8],
            I::PackI8x4 => &[Helper::PackI8x4],
            I::StageE2m1x8 => &[Helper::StageE2m1x8],
            I::E2m1x8ToF16x8 => &[Helper::E2m1x8ToF16x8],
            I::MmaF16 => &[Helper::MmaF16],
            I::Nvfp4MmaSegment => &[Helper::Nvfp4MmaSegment],
            I::Nvfp4MmaSegmentPaired => &[Helper::Nvfp4MmaSegmentPaired],
            I::Nvfp4MmaStage => &[Helper::Nvfp4MmaStage],
            I::LoadStream(Vector::U32x4 | Vector::F32x4) => &[Helper::LdStreamV4],
            I::LoadStream(Vector::U32x2 | Vector::F32x2) => &[Helper::LdStreamV2],
            I::LoadEarly(Vector::U32x4 | Vector::F32x4) => &[Helper::LdEarlyV4],
            I::LoadEarly(Vector::U32x2 | Vector::F32x2) => &[Helper::LdEarlyV2],
            I::LoadCg => &[Helper::LdCg],
            I::LoadAcquire => &[Helper::LdAcquire],
            I::GridDependencyWait | I::LaunchDependents => &[Helper::GridDependency],
            I::PrefetchL2 => &[Helper::PrefetchL2],
            I::BulkBarrierInit | I::BulkLoad | I::BulkBarrierArrive | I::BulkBarrierWait => &[Helper::BulkCopy],
            I::GlobalTimer => &[Helper::GlobalTimer],
            _ => &[],
        }
    }
}

/// `atomic_*(buffer, index, value)` on a mutable global buffer or a shared array of one of `elems`.
fn atomic(args: &[Type], elems: &[Scalar]) -> Result<Signature, String> {
    if args.len() != 3 {
        return Err(format!("takes 3 arguments, {} given", args.len()));
    }
    let base = args[0];
    let elem = match base {
        Type::Ptr { mutable: true, elem: Elem::Scalar(s) }
        | Type::Array { space: Space::Shared, elem: Elem::Scalar(s) }
            if elems.contains(&s) =>
        {
            s
        }
        _ => {
            let names: Vec<&str> = elems.iter().map(|s| s.rust_name()).collect();
            return Err(format!(
                "argument 1 must be a mutable {} pointer or shared array, found {base}",
                names.join(", ")
            ));
        }
    };
    let index = index_type(args[1])?;
    let value = Type::Scalar(elem);
    if args[2] != value
        && !(args[2] == Type::IntLit && value.is_int_like())
        && !(args[2] == Type::FloatLit && value == Type::F32)
    {
        return Err(format!("argument 3 must be {value}, found {}", args[2]));
    }
    Ok(Signature { params: vec![base, index, value], ret: value })
}

/// The mbarrier slots a bulk intrinsic takes (its argument `n`, 1-based): a shared u64 array.
fn barrier_slots(t: Type, n: usize) -> Result<Type, String> {
    let bars = Type::Array { elem: Elem::Scalar(Scalar::U64), space: Space::Shared };
    if t == bars {
        Ok(bars)
    } else {
        Err(format!("argument {n} must be a shared u64 array of mbarrier slots (`shared::<u64, N>()`), found {t}"))
    }
}

/// Indices are u32 (the usual case on a GPU), i32, or u64 for buffers past 4 GiB elements.
fn index_type(t: Type) -> Result<Type, String> {
    match t {
        Type::IntLit => Ok(Type::U32),
        Type::Scalar(Scalar::U32 | Scalar::I32 | Scalar::U64 | Scalar::I64) => Ok(t),
        _ => Err(format!("an index must be u32, i32, u64 or i64, found {t}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        assert_eq!(Intrinsic::from_function("thread_idx", None), Ok(Intrinsic::ThreadIdx));
        assert_eq!(Intrinsic::from_function("load_vec", Some("u32x4")), Ok(Intrinsic::LoadVec(Vector::U32x4)));
        assert!(Intrinsic::from_function("load_vec", None).is_err());
        assert!(Intrinsic::from_function("load_vec", Some("u8")).is_err());
        assert!(Intrinsic::from_function("thread_idx", Some("u32")).is_err());
        assert!(Intrinsic::from_function("printf", None).is_err());
        assert_eq!(Intrinsic::from_method("mul_add"), Ok(Intrinsic::Fma));
    }

    #[test]
    fn signatures_check_arity_and_types() {
        let s = Intrinsic::Max.signature(&[Type::IntLit, Type::U32]).expect("max(u32)");
        assert_eq!(s.ret, Type::U32);
        assert!(Intrinsic::Max.signature(&[Type::F32, Type::U32]).is_err());
        assert!(Intrinsic::Exp.signature(&[]).is_err());
        assert!(Intrinsic::Exp.signature(&[Type::U32]).is_err());
        let s = Intrinsic::Exp.signature(&[Type::FloatLit]).expect("exp(literal)");
        assert_eq!(s.params, [Type::F32]);
        let ptr = Type::Ptr { elem: Elem::Scalar(Scalar::Bf16), mutable: false };
        let s = Intrinsic::LoadStream(Vector::U32x4).signature(&[ptr, Type::IntLit]).expect("load_stream");
        assert_eq!(s.params[1], Type::U32);
        let mut_ptr = Type::Ptr { elem: Elem::Scalar(Scalar::Bf16), mutable: true };
        assert!(Intrinsic::LoadStream(Vector::U32x4).signature(&[mut_ptr, Type::U32]).is_err());
        let s = Intrinsic::LoadEarly(Vector::U32x2).signature(&[ptr, Type::IntLit]).expect("load_early");
        assert_eq!(s.ret, Type::Vector(Vector::U32x2));
        assert!(Intrinsic::LoadEarly(Vector::U32x2).signature(&[mut_ptr, Type::U32]).is_err());
        assert!(Intrinsic::LoadEarly(Vector::F32x4).signature(&[ptr, Type::U32]).is_err());
        let counters = Type::Ptr { elem: Elem::Scalar(Scalar::U32), mutable: true };
        let s = Intrinsic::AtomicAdd.signature(&[counters, Type::U32, Type::IntLit]).expect("atomic_add");
        assert_eq!(s.ret, Type::U32);
        assert!(Intrinsic::AtomicAdd.signature(&[ptr, Type::U32, Type::IntLit]).is_err());
        let s = Intrinsic::LoadAcquire.signature(&[counters, Type::IntLit]).expect("load_acquire");
        assert_eq!((s.params[1], s.ret), (Type::U32, Type::U32));
        assert!(Intrinsic::LoadAcquire.signature(&[ptr, Type::U32]).is_err());
        assert!(Intrinsic::LoadAcquire.has_effect(), "a spin must not be hoisted or dropped");
    }

    #[test]
    fn bulk_copies_take_shared_rows_and_barrier_slots() {
        let bars = Type::Array { elem: Elem::Scalar(Scalar::U64), space: Space::Shared };
        let rows = Type::Array { elem: Elem::Scalar(Scalar::U32), space: Space::Shared };
        let codes = Type::Ptr { elem: Elem::Scalar(Scalar::U8), mutable: false };
        let args = [rows, Type::IntLit, codes, Type::U32, Type::U32, bars, Type::IntLit];
        let s = Intrinsic::BulkLoad.signature(&args).expect("bulk_load");
        assert_eq!((s.params[1], s.params[6], s.ret), (Type::U32, Type::U32, Type::Void));
        // Into global memory, from a writable buffer, or counted by a slot of the wrong type: refused.
        let mut wrong = args;
        wrong[0] = codes;
        assert!(Intrinsic::BulkLoad.signature(&wrong).is_err());
        let mut wrong = args;
        wrong[2] = Type::Ptr { elem: Elem::Scalar(Scalar::U8), mutable: true };
        assert!(Intrinsic::BulkLoad.signature(&wrong).is_err());
        let mut wrong = args;
        wrong[5] = rows;
        assert!(Intrinsic::BulkLoad.signature(&wrong).is_err());
        assert!(Intrinsic::BulkBarrierInit.signature(&[bars, Type::IntLit, Type::IntLit]).is_ok());
        assert!(Intrinsic::BulkBarrierWait.signature(&[bars, Type::U32, Type::U32]).is_ok());
        assert!(Intrinsic::BulkBarrierArrive.signature(&[bars, Type::U32]).is_ok());
        assert!(Intrinsic::BulkBarrierArrive.signature(&[bars, Type::U32, Type::U32]).is_err());
        for f in
            [Intrinsic::BulkBarrierInit, Intrinsic::BulkLoad, Intrinsic::BulkBarrierArrive, Intrinsic::BulkBarrierWait]
        {
            assert!(f.has_effect(), "{f:?} must keep its place");
        }
    }
}
