//! The library of device helpers: number formats, conversions, reductions, cache-hinted loads.
//!
//! No CUDA header is included: NVRTC compiles the emitted file on its own, with nothing but the
//! built-ins every CUDA compiler has (`threadIdx`, `__shfl_xor_sync`, `uint4`, `__uint_as_float`,
//! inline PTX). A kernel's file holds only the helpers it uses, in dependency order.

use crate::arch::Arch;

/// The names of the prelude's functions, which kernel variables must not take.
pub const HELPER_FUNCTIONS: &[&str] = &[
    "bf16_to_f32",
    "f32_to_bf16",
    "f16_to_f32",
    "f32_to_f16",
    "f16x2_to_float2",
    "e4m3_to_f32",
    "bf16x2_to_float2",
    "pack_bf16x2",
    "dot_bf16x4",
    "dot_bf16x8",
    "e4m3x4_to_float4",
    "e2m1x4_to_float4",
    "e2m1x4_to_float4_raw",
    "e2m1_raw_gap",
    "e2m1_raw_lift",
    "dot_e2m1x16_raw",
    "dot_e2m1x16_i8",
    "pack_i8x4",
    "hfma2",
    "pack_f16x2",
    "e2m1x8_to_f16x2",
    "e2m1x8_to_f16x2_paired",
    "dot_f16_pairs",
    "dot_e2m1x16",
    "dot_e2m1x16_paired",
    "stage_e2m1_x8",
    "e2m1x8_to_f16x8",
    "e2m1x8_to_f16x8_paired",
    "mma_f16_16x8x16",
    "nvfp4_mma_segment",
    "nvfp4_mma_segment_paired",
    "nvfp4_mma_stage",
    "warp_sum",
    "warp_max",
    "block_sum",
    "block_max",
    "sigmoid",
    "silu",
    "softplus",
    "ld_stream_u32x4",
    "ld_stream_u32x2",
    "ld_early_u32x4",
    "ld_early_u32x2",
    "ld_cg",
    "ld_acquire",
    // The traced build's (`super::trace`).
    "trace_leader",
    "trace_words",
    "trace_block",
    "flashnext_trace",
    "flashnext_trace_blocks",
];

/// The CUDA text of `e2m1x8_to_f16x8{suffix}`: the four pairs of the word decode `$pairs` as one
/// vector, for the tensor-core products.
macro_rules! f16x8_decode {
    ($suffix:literal, $pairs:literal) => {
        concat!(
            "// ",
            $pairs,
            "'s four pairs as one vector, for the tensor-core products.\n",
            "__device__ __forceinline__ uint4 e2m1x8_to_f16x8",
            $suffix,
            "(unsigned w) {\n",
            "    uint4 p;\n",
            "    ",
            $pairs,
            "(w, p.x, p.y, p.z, p.w);\n",
            "    return p;\n",
            "}\n"
        )
    };
}

/// The CUDA text of `nvfp4_mma_segment{suffix}`, whose codes are in `$layout`: one body for
/// both layouts, which differ only in the word decode (`e2m1x8_to_f16x8{suffix}`); both decodes
/// give the pairs in the order stage_e2m1_x8 stages x.
macro_rules! nvfp4_mma_segment {
    ($suffix:literal, $layout:literal) => {
        concat!(
            "// One 128-value segment of a warp's 16 NVFP4 rows (codes in ",
            $layout,
            ") on the\n",
            "// tensor cores. Lane (q, g) brings 16 bytes of rows g and g + 8 (values 32q .. 32q + 31:\n",
            "// words 0 and 1 its first 16-value block, 2 and 3 its second) and the staged x ([segment]\n",
            "// [word j][lane q], four f16 pairs in the decode's order; `at` the word of j 0 and its q).\n",
            "// In each product the four lanes of a row hold four different blocks, so B carries lane\n",
            "// q's x in column 2q alone (the lanes g = 2q load it, the others pass zeros) and C's\n",
            "// column 2q is lane q's block sum. Returns row g's sums over the lane's first and second\n",
            "// block, then row g + 8's.\n",
            "__device__ __forceinline__ float4 nvfp4_mma_segment",
            $suffix,
            "(uint4 wa, uint4 wb, const unsigned* xs, unsigned at, bool own) {\n",
            "    const uint2 zero = make_uint2(0u, 0u);\n",
            "    const unsigned wa_[4] = {wa.x, wa.y, wa.z, wa.w}, wb_[4] = {wb.x, wb.y, wb.z, wb.w};\n",
            "    float4 blk[2];\n",
            "#pragma unroll\n",
            "    for (int b = 0; b < 2; ++b) {\n",
            "        float4 c = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n",
            "#pragma unroll\n",
            "        for (int j = 2 * b; j < 2 * b + 2; ++j) {\n",
            "            const uint4 p = e2m1x8_to_f16x8",
            $suffix,
            "(wa_[j]), r = e2m1x8_to_f16x8",
            $suffix,
            "(wb_[j]);\n",
            "            const uint2 x0 = own ? *reinterpret_cast<const uint2*>(xs + at + 16u * j) : zero;\n",
            "            const uint2 x1 = own ? *reinterpret_cast<const uint2*>(xs + at + 16u * j + 2u) : zero;\n",
            "            c = mma_f16_16x8x16(make_uint4(p.x, r.x, p.y, r.y), x0, c);\n",
            "            c = mma_f16_16x8x16(make_uint4(p.z, r.z, p.w, r.w), x1, c);\n",
            "        }\n",
            "        blk[b] = c;\n",
            "    }\n",
            "    return make_float4(blk[0].x, blk[1].x, blk[0].z, blk[1].z);\n",
            "}\n"
        )
    };
}

/// One helper (a type or a device function) of the prelude.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Helper {
    TypeBf16,
    TypeF16,
    TypeE4m3,
    TypeE2m1x2,
    Bf16ToF32,
    F32ToBf16,
    F16ToF32,
    F32ToF16,
    F16x2ToFloat2,
    E4m3ToF32,
    Bf16x2ToFloat2,
    PackBf16x2,
    DotBf16x4,
    DotBf16x8,
    E4m3x4ToFloat4,
    E2m1x4ToFloat4Raw,
    E2m1RawLift,
    DotE2m1x16Raw,
    DotE2m1x16I8,
    PackI8x4,
    E2m1x4ToFloat4,
    Hfma2,
    PackF16x2,
    E2m1x8ToF16x2,
    E2m1x8ToF16x2Paired,
    DotF16Pairs,
    DotE2m1x16,
    DotE2m1x16Paired,
    StageE2m1x8,
    E2m1x8ToF16x8,
    E2m1x8ToF16x8Paired,
    MmaF16,
    Nvfp4MmaSegment,
    Nvfp4MmaSegmentPaired,
    Nvfp4MmaStage,
    WarpSum,
    WarpMax,
    BlockSum,
    BlockMax,
    Sigmoid,
    Silu,
    Softplus,
    LdStreamV4,
    LdStreamV2,
    LdEarlyV4,
    LdEarlyV2,
    LdCg,
    LdAcquire,
    GridDependency,
    PrefetchL2,
    BulkCopy,
    GlobalTimer,
}

impl Helper {
    /// Helpers this one's code uses on `arch`.
    pub fn deps(self, arch: Arch) -> &'static [Helper] {
        use Helper as H;
        match self {
            H::Bf16ToF32 | H::F32ToBf16 => &[H::TypeBf16],
            H::F16ToF32 | H::F32ToF16 => &[H::TypeF16],
            H::E4m3ToF32 => &[H::TypeE4m3, H::F16x2ToFloat2],
            H::E4m3x4ToFloat4 => &[H::F16x2ToFloat2],
            H::E2m1x4ToFloat4Raw => &[H::F16x2ToFloat2],
            H::E2m1x4ToFloat4 => &[H::E2m1x4ToFloat4Raw],
            H::DotE2m1x16Raw => &[H::E2m1x4ToFloat4Raw],
            H::DotBf16x4 | H::DotBf16x8 => &[H::Bf16x2ToFloat2],
            H::DotF16Pairs => &[H::Hfma2, H::F16x2ToFloat2],
            H::DotE2m1x16 => &[H::E2m1x8ToF16x2, H::DotF16Pairs],
            // On sm_121a the paired layout is ModelOpt's, and so is its decode.
            H::E2m1x8ToF16x2Paired if arch.has_fp4_conversion() => &[H::E2m1x8ToF16x2],
            H::DotE2m1x16Paired => &[H::E2m1x8ToF16x2Paired, H::DotF16Pairs],
            H::StageE2m1x8 => &[H::PackF16x2],
            H::E2m1x8ToF16x8 => &[H::E2m1x8ToF16x2],
            H::E2m1x8ToF16x8Paired => &[H::E2m1x8ToF16x2Paired],
            H::Nvfp4MmaSegment => &[H::E2m1x8ToF16x8, H::MmaF16],
            H::Nvfp4MmaSegmentPaired => &[H::E2m1x8ToF16x8Paired, H::MmaF16],
            H::Nvfp4MmaStage => &[H::Bf16x2ToFloat2, H::StageE2m1x8],
            H::BlockSum => &[H::WarpSum],
            H::BlockMax => &[H::WarpMax],
            H::Silu => &[H::Sigmoid],
            _ => &[],
        }
    }

    /// The CUDA text of this helper for `arch`.
    pub fn code(self, arch: Arch) -> &'static str {
        use Helper as H;
        match self {
            H::TypeBf16 => {
                "// bf16: the upper half of an f32 (1 sign, 8 exponent, 7 mantissa bits).\n\
                 struct __align__(2) bf16 { unsigned short bits; };\n"
            }
            H::TypeF16 => "// f16: IEEE binary16.\nstruct __align__(2) f16 { unsigned short bits; };\n",
            H::TypeE4m3 => {
                "// FP8 E4M3 (OCP \"fn\": bias 7, no infinities, S.1111.111 is NaN, largest finite 448).\n\
                 struct fp8_e4m3 { unsigned char bits; };\n"
            }
            H::TypeE2m1x2 => {
                "// Two FP4 E2M1 values (bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives);\n\
                 // the low nibble holds the element with the even index.\n\
                 struct fp4x2_e2m1 { unsigned char bits; };\n"
            }
            H::Bf16ToF32 => {
                "__device__ __forceinline__ float bf16_to_f32(bf16 v) {\n\
                 \x20   return __uint_as_float((unsigned)v.bits << 16);\n\
                 }\n"
            }
            H::F32ToBf16 => {
                "// Round to nearest even; NaN stays NaN (the conversion instruction of sm_80 and later).\n\
                 __device__ __forceinline__ bf16 f32_to_bf16(float v) {\n\
                 \x20   bf16 r;\n\
                 \x20   asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(r.bits) : \"f\"(v));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::F16ToF32 => {
                "__device__ __forceinline__ float f16_to_f32(f16 v) {\n\
                 \x20   float r;\n\
                 \x20   asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(r) : \"h\"(v.bits));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::F32ToF16 => {
                "__device__ __forceinline__ f16 f32_to_f16(float v) {\n\
                 \x20   f16 r;\n\
                 \x20   asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(r.bits) : \"f\"(v));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::F16x2ToFloat2 => {
                "// Two f16 in one word (element 0 in the low half) to two f32.\n\
                 __device__ __forceinline__ float2 f16x2_to_float2(unsigned h2) {\n\
                 \x20   float2 r;\n\
                 \x20   asm(\"{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %2; cvt.f32.f16 %0, lo; cvt.f32.f16 %1, hi; }\"\n\
                 \x20       : \"=f\"(r.x), \"=f\"(r.y) : \"r\"(h2));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::E4m3ToF32 => {
                "// Every e4m3 value is exact in f16: one conversion instruction (sm_89 and later), then widen.\n\
                 __device__ __forceinline__ float e4m3_to_f32(fp8_e4m3 v) {\n\
                 \x20   unsigned h2;\n\
                 \x20   asm(\"cvt.rn.f16x2.e4m3x2 %0, %1;\" : \"=r\"(h2) : \"h\"((unsigned short)v.bits));\n\
                 \x20   return f16x2_to_float2(h2).x;\n\
                 }\n"
            }
            H::Bf16x2ToFloat2 => {
                "// Two bf16 in one word (element 0 in the low half) to two f32: bf16 is the top of an f32.\n\
                 __device__ __forceinline__ float2 bf16x2_to_float2(unsigned w) {\n\
                 \x20   return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));\n\
                 }\n"
            }
            H::PackBf16x2 => {
                "// Two f32 to two bf16 in one word, a in the low half; round to nearest even.\n\
                 __device__ __forceinline__ unsigned pack_bf16x2(float a, float b) {\n\
                 \x20   unsigned r;\n\
                 \x20   asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(b), \"f\"(a));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::DotBf16x4 => {
                "// The f32 dot product of four bf16 pairs held in two 8-byte vectors.\n\
                 __device__ __forceinline__ float dot_bf16x4(uint2 a, uint2 b) {\n\
                 \x20   const float2 a0 = bf16x2_to_float2(a.x), b0 = bf16x2_to_float2(b.x);\n\
                 \x20   const float2 a1 = bf16x2_to_float2(a.y), b1 = bf16x2_to_float2(b.y);\n\
                 \x20   float s = a0.x * b0.x;\n\
                 \x20   s = fmaf(a0.y, b0.y, s);\n\
                 \x20   s = fmaf(a1.x, b1.x, s);\n\
                 \x20   return fmaf(a1.y, b1.y, s);\n\
                 }\n"
            }
            H::DotBf16x8 => {
                "// The f32 dot product of eight bf16 pairs held in two 16-byte vectors.\n\
                 __device__ __forceinline__ float dot_bf16x8(uint4 a, uint4 b) {\n\
                 \x20   const float2 a0 = bf16x2_to_float2(a.x), b0 = bf16x2_to_float2(b.x);\n\
                 \x20   const float2 a1 = bf16x2_to_float2(a.y), b1 = bf16x2_to_float2(b.y);\n\
                 \x20   const float2 a2 = bf16x2_to_float2(a.z), b2 = bf16x2_to_float2(b.z);\n\
                 \x20   const float2 a3 = bf16x2_to_float2(a.w), b3 = bf16x2_to_float2(b.w);\n\
                 \x20   float s = a0.x * b0.x;\n\
                 \x20   s = fmaf(a0.y, b0.y, s);\n\
                 \x20   s = fmaf(a1.x, b1.x, s);\n\
                 \x20   s = fmaf(a1.y, b1.y, s);\n\
                 \x20   s = fmaf(a2.x, b2.x, s);\n\
                 \x20   s = fmaf(a2.y, b2.y, s);\n\
                 \x20   s = fmaf(a3.x, b3.x, s);\n\
                 \x20   return fmaf(a3.y, b3.y, s);\n\
                 }\n"
            }
            H::E4m3x4ToFloat4 => {
                "// Four e4m3 bytes (element 0 in the low byte) to four f32, two per conversion instruction.\n\
                 __device__ __forceinline__ float4 e4m3x4_to_float4(unsigned w) {\n\
                 \x20   unsigned lo, hi;\n\
                 \x20   asm(\"{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }\"\n\
                 \x20       : \"=r\"(lo), \"=r\"(hi) : \"r\"(w));\n\
                 \x20   const float2 l = f16x2_to_float2(lo), h = f16x2_to_float2(hi);\n\
                 \x20   return make_float4(l.x, l.y, h.x, h.y);\n\
                 }\n"
            }
            H::E2m1x4ToFloat4Raw if arch.has_fp4_conversion() => {
                "// Four e2m1 nibbles (the low 16 bits of w, element 0 in the low nibble) to four f32:\n\
                 // sm_121a converts a byte of two nibbles to two f16 in one instruction, exact, so the\n\
                 // raw decode has no gap.\n\
                 __device__ __forceinline__ float e2m1_raw_gap() { return 1.0f; }\n\
                 __device__ __forceinline__ float4 e2m1x4_to_float4_raw(unsigned w) {\n\
                 \x20   unsigned lo, hi;\n\
                 \x20   asm(\"{ .reg .b8 b0, b1, b2, b3; mov.b32 {b0, b1, b2, b3}, %2;\"\n\
                 \x20       \" cvt.rn.f16x2.e2m1x2 %0, b0; cvt.rn.f16x2.e2m1x2 %1, b1; }\"\n\
                 \x20       : \"=r\"(lo), \"=r\"(hi) : \"r\"(w));\n\
                 \x20   const float2 l = f16x2_to_float2(lo), h = f16x2_to_float2(hi);\n\
                 \x20   return make_float4(l.x, l.y, h.x, h.y);\n\
                 }\n"
            }
            H::E2m1x4ToFloat4Raw => {
                "// Four e2m1 nibbles (the low 16 bits of w, element 0 in the low nibble) to four f32 times\n\
                 // 2^-126, the raw decode's gap (sm_90 has no FP4 conversion). Each is the f32 with the\n\
                 // nibble's sign bit in bit 31 and its two exponent bits and mantissa bit in bits 24..22:\n\
                 // the value over 2^126, the gap between the biases (127 - 1; the code for 0.5 becomes an\n\
                 // exact subnormal). One integer multiply by 2^(28-4k) + 2^(22-4k) puts both copies of\n\
                 // nibble k in place (bits 31..28 and 25..22: apart, so the sum is their OR), and one mask\n\
                 // keeps bit 31 and bits 24..22. Nibbles 0 and 3 share a masked word: each one's copies\n\
                 // of the other land below bit 22 or past bit 31, apart, so nothing carries. A kernel that\n\
                 // lifts its activations (so that the products stay normal f32) and puts the gap back on\n\
                 // its sums saves the multiply a value that e2m1x4_to_float4 does.\n\
                 __device__ __forceinline__ float e2m1_raw_gap() { return __uint_as_float(0x7e800000u); }\n\
                 __device__ __forceinline__ float4 e2m1x4_to_float4_raw(unsigned w) {\n\
                 \x20   const unsigned keep = 0x81c00000u;\n\
                 \x20   const unsigned g03 = w & 0xf00fu, g1 = w & 0x00f0u, g2 = w & 0x0f00u;\n\
                 \x20   return make_float4(\n\
                 \x20       __uint_as_float((g03 * 0x10400000u) & keep), __uint_as_float((g1 * 0x01040000u) & keep),\n\
                 \x20       __uint_as_float((g2 * 0x00104000u) & keep), __uint_as_float((g03 * 0x00010400u) & keep));\n\
                 }\n"
            }
            H::E2m1RawLift if arch.has_fp4_conversion() => {
                "// The raw decode has no gap here: activations need no lift.\n\
                 __device__ __forceinline__ float e2m1_raw_lift() { return 1.0f; }\n"
            }
            H::E2m1RawLift => {
                "// What a kernel multiplies its activations by before products with raw values, 2^64:\n\
                 // the products stay normal f32 for |w·x| >= 2^-64 and |x| < 2^64.\n\
                 __device__ __forceinline__ float e2m1_raw_lift() { return __uint_as_float(0x5f800000u); }\n"
            }
            H::DotE2m1x16Raw => {
                "// Σ of 16 E2M1 values (two words, element 0 in the low nibble) decoded raw, times 16\n\
                 // lifted activations, in order: one f32 product, then fused multiply-adds, written out\n\
                 // (`s + a * b` after a product may be contracted around either product). The sum is\n\
                 // short by the raw gap over the lift; the caller's block scale carries that back.\n\
                 __device__ __forceinline__ float dot_e2m1x16_raw(uint2 w, float4 x0, float4 x1, float4 x2, float4 x3) {\n\
                 \x20   const float4 w0 = e2m1x4_to_float4_raw(w.x), w1 = e2m1x4_to_float4_raw(w.x >> 16u);\n\
                 \x20   const float4 w2 = e2m1x4_to_float4_raw(w.y), w3 = e2m1x4_to_float4_raw(w.y >> 16u);\n\
                 \x20   float s = __fmul_rn(w0.x, x0.x);\n\
                 \x20   s = __fmaf_rn(w0.y, x0.y, s); s = __fmaf_rn(w0.z, x0.z, s); s = __fmaf_rn(w0.w, x0.w, s);\n\
                 \x20   s = __fmaf_rn(w1.x, x1.x, s); s = __fmaf_rn(w1.y, x1.y, s); s = __fmaf_rn(w1.z, x1.z, s); s = __fmaf_rn(w1.w, x1.w, s);\n\
                 \x20   s = __fmaf_rn(w2.x, x2.x, s); s = __fmaf_rn(w2.y, x2.y, s); s = __fmaf_rn(w2.z, x2.z, s); s = __fmaf_rn(w2.w, x2.w, s);\n\
                 \x20   s = __fmaf_rn(w3.x, x3.x, s); s = __fmaf_rn(w3.y, x3.y, s); s = __fmaf_rn(w3.z, x3.z, s); s = __fmaf_rn(w3.w, x3.w, s);\n\
                 \x20   return s;\n\
                 }\n"
            }
            H::DotE2m1x16I8 => {
                "// Σ of 16 E2M1 values (two words, element 0 in the low nibble) times 16 int8 activations\n\
                 // (four words, element 0 in the low byte), exact in i32, each value counted twice itself\n\
                 // (0, 1, 2, 3, 4, 6, 8, 12: an int8). A byte permute looks the values up with the codes as\n\
                 // its selector: prmt takes a selector nibble's three low bits as the byte index and its high\n\
                 // bit (the code's sign) as \"replicate the byte's sign bit\", which for the table's\n\
                 // non-negative bytes gives 0. So prmt(table, codes) holds the positive values and zeros,\n\
                 // prmt(table, codes ^ 0x8888) the negative ones' magnitudes and zeros: two dp4a sums,\n\
                 // subtracted: for 8 values an xor, two shifts, four prmt and four dp4a, on every\n\
                 // architecture alike.\n\
                 __device__ __forceinline__ int dot_e2m1x16_i8(uint2 w, uint4 q) {\n\
                 \x20   const unsigned lo = 0x03020100u, hi = 0x0c080604u;\n\
                 \x20   const unsigned c[4] = {w.x, w.x >> 16u, w.y, w.y >> 16u};\n\
                 \x20   const unsigned n[4] = {w.x ^ 0x88888888u, (w.x ^ 0x88888888u) >> 16u, w.y ^ 0x88888888u, (w.y ^ 0x88888888u) >> 16u};\n\
                 \x20   const unsigned x[4] = {q.x, q.y, q.z, q.w};\n\
                 \x20   int pos = 0, neg = 0;\n\
                 #pragma unroll\n\
                 \x20   for (int i = 0; i < 4; ++i) {\n\
                 \x20       unsigned p, m;\n\
                 \x20       asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"(p) : \"r\"(lo), \"r\"(hi), \"r\"(c[i]));\n\
                 \x20       asm(\"prmt.b32 %0, %1, %2, %3;\" : \"=r\"(m) : \"r\"(lo), \"r\"(hi), \"r\"(n[i]));\n\
                 \x20       asm(\"dp4a.s32.s32 %0, %1, %2, %0;\" : \"+r\"(pos) : \"r\"(p), \"r\"(x[i]));\n\
                 \x20       asm(\"dp4a.s32.s32 %0, %1, %2, %0;\" : \"+r\"(neg) : \"r\"(m), \"r\"(x[i]));\n\
                 \x20   }\n\
                 \x20   return pos - neg;\n\
                 }\n"
            }
            H::PackI8x4 => {
                "// Four f32 to four int8 in one word (element 0 in the low byte): rounded to nearest even,\n\
                 // clamped to [-127, 127] (so that a value and its negation are both representable).\n\
                 __device__ __forceinline__ unsigned pack_i8x4(float4 v) {\n\
                 \x20   int a, b, c, d;\n\
                 \x20   asm(\"cvt.rni.s32.f32 %0, %1;\" : \"=r\"(a) : \"f\"(v.x));\n\
                 \x20   asm(\"cvt.rni.s32.f32 %0, %1;\" : \"=r\"(b) : \"f\"(v.y));\n\
                 \x20   asm(\"cvt.rni.s32.f32 %0, %1;\" : \"=r\"(c) : \"f\"(v.z));\n\
                 \x20   asm(\"cvt.rni.s32.f32 %0, %1;\" : \"=r\"(d) : \"f\"(v.w));\n\
                 \x20   a = a > 127 ? 127 : (a < -127 ? -127 : a); b = b > 127 ? 127 : (b < -127 ? -127 : b);\n\
                 \x20   c = c > 127 ? 127 : (c < -127 ? -127 : c); d = d > 127 ? 127 : (d < -127 ? -127 : d);\n\
                 \x20   return ((unsigned)a & 0xffu) | (((unsigned)b & 0xffu) << 8) | (((unsigned)c & 0xffu) << 16) | ((unsigned)d << 24);\n\
                 }\n"
            }
            H::E2m1x4ToFloat4 => {
                "// Four e2m1 nibbles (the low 16 bits of w, element 0 in the low nibble) to four f32, exact:\n\
                 // the raw decode times its gap (a multiply a value on sm_90, none on sm_121a).\n\
                 __device__ __forceinline__ float4 e2m1x4_to_float4(unsigned w) {\n\
                 \x20   const float4 r = e2m1x4_to_float4_raw(w);\n\
                 \x20   const float g = e2m1_raw_gap();\n\
                 \x20   return make_float4(r.x * g, r.y * g, r.z * g, r.w * g);\n\
                 }\n"
            }
            H::Hfma2 => {
                "// d = a·b + c on two f16 lanes.\n\
                 __device__ __forceinline__ unsigned hfma2(unsigned a, unsigned b, unsigned c) {\n\
                 \x20   unsigned d;\n\
                 \x20   asm(\"fma.rn.f16x2 %0, %1, %2, %3;\" : \"=r\"(d) : \"r\"(a), \"r\"(b), \"r\"(c));\n\
                 \x20   return d;\n\
                 }\n"
            }
            H::PackF16x2 => {
                "// Two f32 to two f16 in one word, a in the low half; round to nearest even.\n\
                 __device__ __forceinline__ unsigned pack_f16x2(float a, float b) {\n\
                 \x20   unsigned r;\n\
                 \x20   asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(b), \"f\"(a));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::E2m1x8ToF16x2 if arch.has_fp4_conversion() => {
                "// Eight E2M1 values (a word, element 0 in the low nibble) as four f16 pairs:\n\
                 // (v0, v1), (v2, v3), (v4, v5), (v6, v7), one conversion instruction per byte, exact.\n\
                 __device__ __forceinline__ void e2m1x8_to_f16x2(unsigned w, unsigned& p0, unsigned& p1, unsigned& p2, unsigned& p3) {\n\
                 \x20   asm(\"{ .reg .b8 b0, b1, b2, b3; mov.b32 {b0, b1, b2, b3}, %4;\"\n\
                 \x20       \" cvt.rn.f16x2.e2m1x2 %0, b0; cvt.rn.f16x2.e2m1x2 %1, b1;\"\n\
                 \x20       \" cvt.rn.f16x2.e2m1x2 %2, b2; cvt.rn.f16x2.e2m1x2 %3, b3; }\"\n\
                 \x20       : \"=r\"(p0), \"=r\"(p1), \"=r\"(p2), \"=r\"(p3) : \"r\"(w));\n\
                 }\n"
            }
            H::E2m1x8ToF16x2 => {
                "// Eight E2M1 values (a word, element 0 in the low nibble) as four f16 pairs, without a\n\
                 // conversion instruction (sm_90). A nibble's two exponent bits and mantissa bit land in\n\
                 // f16 bits 11..9 and its sign in bit 15: the f16 is the value times 2^-14 (the bias gap;\n\
                 // the code for 0.5 becomes an exact subnormal). Bytes 0 and 2 share shifts, as do bytes\n\
                 // 1 and 3, so the pairs are (v0, v4), (v1, v5), (v2, v6), (v3, v7): two shifts and two\n\
                 // masks a pair. stage_e2m1_x8 puts the activations in the same order, times 2^14.\n\
                 __device__ __forceinline__ void e2m1x8_to_f16x2(unsigned w, unsigned& p0, unsigned& p1, unsigned& p2, unsigned& p3) {\n\
                 \x20   p0 = ((w << 9) & 0x0e000e00u) | ((w << 12) & 0x80008000u);\n\
                 \x20   p1 = ((w << 5) & 0x0e000e00u) | ((w << 8) & 0x80008000u);\n\
                 \x20   p2 = ((w << 1) & 0x0e000e00u) | ((w << 4) & 0x80008000u);\n\
                 \x20   p3 = ((w >> 3) & 0x0e000e00u) | (w & 0x80008000u);\n\
                 }\n"
            }
            H::E2m1x8ToF16x2Paired if arch.has_fp4_conversion() => {
                "// Eight E2M1 values in the paired layout as four f16 pairs: on this architecture the paired\n\
                 // layout is ModelOpt's (kernel_dsl::e2m1_pairs), so this is e2m1x8_to_f16x2.\n\
                 __device__ __forceinline__ void e2m1x8_to_f16x2_paired(unsigned w, unsigned& p0, unsigned& p1, unsigned& p2, unsigned& p3) {\n\
                 \x20   e2m1x8_to_f16x2(w, p0, p1, p2, p3);\n\
                 }\n"
            }
            H::E2m1x8ToF16x2Paired => {
                "// Eight E2M1 values in the paired layout (kernel_dsl::e2m1_pairs: rearranged at load so that\n\
                 // a mask finds each pair) as the f16 pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7), each the\n\
                 // value times 2^-14 as e2m1x8_to_f16x2 makes them: nine instructions for the word. Pair 0\n\
                 // is in place, pair 1 three bits low; pairs 2 and 3 are copied twice by one multiply (the\n\
                 // magnitudes 6 or 9 bits up, the signs 2 or 1), the copies sharing no bit.\n\
                 __device__ __forceinline__ void e2m1x8_to_f16x2_paired(unsigned w, unsigned& p0, unsigned& p1, unsigned& p2, unsigned& p3) {\n\
                 \x20   p0 = w & 0x8e008e00u;\n\
                 \x20   p1 = (w << 3) & 0x8e008e00u;\n\
                 \x20   p2 = ((w & 0x20382038u) * 68u) & 0x8e008e00u;\n\
                 \x20   p3 = ((w & 0x40074007u) * 514u) & 0x8e008e00u;\n\
                 }\n"
            }
            H::DotF16Pairs => {
                "// Σ of sixteen f16 weights (a, b: eight pairs, as the decodes make them) times sixteen staged\n\
                 // activations (xa, xb): f16 products in two accumulators of four pair-products each, summed\n\
                 // in f32.\n\
                 __device__ __forceinline__ float dot_f16_pairs(uint4 a, uint4 b, uint4 xa, uint4 xb) {\n\
                 \x20   unsigned acc = hfma2(a.x, xa.x, 0u);\n\
                 \x20   acc = hfma2(a.y, xa.y, acc);\n\
                 \x20   acc = hfma2(a.z, xa.z, acc);\n\
                 \x20   acc = hfma2(a.w, xa.w, acc);\n\
                 \x20   unsigned bcc = hfma2(b.x, xb.x, 0u);\n\
                 \x20   bcc = hfma2(b.y, xb.y, bcc);\n\
                 \x20   bcc = hfma2(b.z, xb.z, bcc);\n\
                 \x20   bcc = hfma2(b.w, xb.w, bcc);\n\
                 \x20   const float2 s = f16x2_to_float2(acc), t = f16x2_to_float2(bcc);\n\
                 \x20   return (s.x + s.y) + (t.x + t.y);\n\
                 }\n"
            }
            H::DotE2m1x16 => {
                "// Σ of 16 E2M1 values (two words, ModelOpt's layout) times 16 staged activations.\n\
                 __device__ __forceinline__ float dot_e2m1x16(uint2 w, uint4 xa, uint4 xb) {\n\
                 \x20   uint4 a, b;\n\
                 \x20   e2m1x8_to_f16x2(w.x, a.x, a.y, a.z, a.w);\n\
                 \x20   e2m1x8_to_f16x2(w.y, b.x, b.y, b.z, b.w);\n\
                 \x20   return dot_f16_pairs(a, b, xa, xb);\n\
                 }\n"
            }
            H::DotE2m1x16Paired => {
                "// Σ of 16 E2M1 values (two words, the paired layout) times 16 staged activations.\n\
                 __device__ __forceinline__ float dot_e2m1x16_paired(uint2 w, uint4 xa, uint4 xb) {\n\
                 \x20   uint4 a, b;\n\
                 \x20   e2m1x8_to_f16x2_paired(w.x, a.x, a.y, a.z, a.w);\n\
                 \x20   e2m1x8_to_f16x2_paired(w.y, b.x, b.y, b.z, b.w);\n\
                 \x20   return dot_f16_pairs(a, b, xa, xb);\n\
                 }\n"
            }
            H::StageE2m1x8 if arch.has_fp4_conversion() => {
                "// Eight activations (lo = x0..x3, hi = x4..x7) as the f16 pairs e2m1x8_to_f16x2 meets:\n\
                 // (x0, x1), (x2, x3), (x4, x5), (x6, x7).\n\
                 __device__ __forceinline__ uint4 stage_e2m1_x8(float4 lo, float4 hi) {\n\
                 \x20   return make_uint4(pack_f16x2(lo.x, lo.y), pack_f16x2(lo.z, lo.w), pack_f16x2(hi.x, hi.y), pack_f16x2(hi.z, hi.w));\n\
                 }\n"
            }
            H::StageE2m1x8 => {
                "// Eight activations (lo = x0..x3, hi = x4..x7) as the f16 pairs e2m1x8_to_f16x2 meets on\n\
                 // sm_90, (x0, x4), (x1, x5), (x2, x6), (x3, x7), times 2^14 to undo the decode's 2^-14.\n\
                 __device__ __forceinline__ uint4 stage_e2m1_x8(float4 lo, float4 hi) {\n\
                 \x20   const float s = 16384.0f;\n\
                 \x20   return make_uint4(\n\
                 \x20       pack_f16x2(lo.x * s, hi.x * s), pack_f16x2(lo.y * s, hi.y * s),\n\
                 \x20       pack_f16x2(lo.z * s, hi.z * s), pack_f16x2(lo.w * s, hi.w * s));\n\
                 }\n"
            }
            H::E2m1x8ToF16x8 => f16x8_decode!("", "e2m1x8_to_f16x2"),
            H::E2m1x8ToF16x8Paired => f16x8_decode!("_paired", "e2m1x8_to_f16x2_paired"),
            H::MmaF16 => {
                "// One warp's D = A·B + C: A 16 x 16 and B 16 x 8 in f16, C and D in f32, on the tensor\n\
                 // cores (sm_80 and later), fragments as PTX's mma.m16n8k16 lays them out.\n\
                 __device__ __forceinline__ float4 mma_f16_16x8x16(uint4 a, uint2 b, float4 c) {\n\
                 \x20   float4 d;\n\
                 \x20   asm(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\"\n\
                 \x20       : \"=f\"(d.x), \"=f\"(d.y), \"=f\"(d.z), \"=f\"(d.w)\n\
                 \x20       : \"r\"(a.x), \"r\"(a.y), \"r\"(a.z), \"r\"(a.w), \"r\"(b.x), \"r\"(b.y), \"f\"(c.x), \"f\"(c.y), \"f\"(c.z), \"f\"(c.w));\n\
                 \x20   return d;\n\
                 }\n"
            }
            H::Nvfp4MmaSegment => nvfp4_mma_segment!("", "ModelOpt's layout"),
            H::Nvfp4MmaSegmentPaired => nvfp4_mma_segment!("_paired", "the paired layout (kernel_dsl::e2m1_pairs)"),
            H::Nvfp4MmaStage => {
                "// Eight bf16 activations, value i / 8 of a slice, staged for nvfp4_mma_segment. The 16\n\
                 // lanes of a 128-value segment (half a warp; every lane calls this: it shuffles) share\n\
                 // the power of two that puts their largest |x| in [1, 2) (e its exponent field): the\n\
                 // f16 pairs are then exact for bf16 x. They go to word j = i % 4 of lane q = (i % 16) / 4\n\
                 // of segment i / 16, the scale's inverse to xsc[i / 16].\n\
                 __device__ __forceinline__ void nvfp4_mma_stage(uint4 v, unsigned* xs, float* xsc, unsigned i, bool valid) {\n\
                 \x20   const float2 a = bf16x2_to_float2(v.x), b = bf16x2_to_float2(v.y);\n\
                 \x20   const float2 c = bf16x2_to_float2(v.z), d = bf16x2_to_float2(v.w);\n\
                 \x20   float m = fmaxf(fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y))),\n\
                 \x20                   fmaxf(fmaxf(fabsf(c.x), fabsf(c.y)), fmaxf(fabsf(d.x), fabsf(d.y))));\n\
                 #pragma unroll\n\
                 \x20   for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));\n\
                 \x20   const unsigned e = min(max((__float_as_uint(m) >> 23) & 255u, 1u), 253u);\n\
                 \x20   const float up = __uint_as_float((254u - e) << 23);\n\
                 \x20   const uint4 s = stage_e2m1_x8(make_float4(a.x * up, a.y * up, b.x * up, b.y * up),\n\
                 \x20                                 make_float4(c.x * up, c.y * up, d.x * up, d.y * up));\n\
                 \x20   if (valid) {\n\
                 \x20       const unsigned w = i % 16u;\n\
                 \x20       *reinterpret_cast<uint4*>(xs + (((i / 16u) * 4u + w % 4u) * 4u + w / 4u) * 4u) = s;\n\
                 \x20       if (w == 0u) xsc[i / 16u] = __uint_as_float(e << 23);\n\
                 \x20   }\n\
                 }\n"
            }
            H::WarpSum => {
                "// Butterfly sum over the 32 lanes of a warp; every lane gets the total.\n\
                 __device__ __forceinline__ float warp_sum(float v) {\n\
                 #pragma unroll\n\
                 \x20   for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);\n\
                 \x20   return v;\n\
                 }\n"
            }
            H::WarpMax => {
                "// Butterfly maximum over the 32 lanes of a warp; every lane gets it.\n\
                 __device__ __forceinline__ float warp_max(float v) {\n\
                 #pragma unroll\n\
                 \x20   for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));\n\
                 \x20   return v;\n\
                 }\n"
            }
            H::BlockSum => {
                "// Sum over the whole block; every thread gets the total. scratch holds one float per warp.\n\
                 // The leading barrier lets a caller use it twice in a row with the same scratch.\n\
                 __device__ __forceinline__ float block_sum(float v, float* scratch) {\n\
                 \x20   const unsigned warps = blockDim.x >> 5;\n\
                 \x20   v = warp_sum(v);\n\
                 \x20   __syncthreads();\n\
                 \x20   if ((threadIdx.x & 31u) == 0u) scratch[threadIdx.x >> 5] = v;\n\
                 \x20   __syncthreads();\n\
                 \x20   float t = (threadIdx.x & 31u) < warps ? scratch[threadIdx.x & 31u] : 0.0f;\n\
                 \x20   return warp_sum(t);\n\
                 }\n"
            }
            H::BlockMax => {
                "// Maximum over the whole block; every thread gets it. scratch holds one float per warp.\n\
                 __device__ __forceinline__ float block_max(float v, float* scratch) {\n\
                 \x20   const unsigned warps = blockDim.x >> 5;\n\
                 \x20   v = warp_max(v);\n\
                 \x20   __syncthreads();\n\
                 \x20   if ((threadIdx.x & 31u) == 0u) scratch[threadIdx.x >> 5] = v;\n\
                 \x20   __syncthreads();\n\
                 \x20   float t = (threadIdx.x & 31u) < warps ? scratch[threadIdx.x & 31u] : -__uint_as_float(0x7f800000u);\n\
                 \x20   return warp_max(t);\n\
                 }\n"
            }
            H::Sigmoid => "__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n",
            H::Silu => "__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }\n",
            H::Softplus => {
                "// log(1 + e^x), as torch computes it (threshold 20: above it, x itself).\n\
                 __device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }\n"
            }
            H::LdStreamV4 => {
                "// A 16-byte load of data read once (weights): read-only path, no L1 allocation.\n\
                 __device__ __forceinline__ uint4 ld_stream_u32x4(const void* p) {\n\
                 \x20   uint4 r;\n\
                 \x20   asm(\"ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\"\n\
                 \x20       : \"=r\"(r.x), \"=r\"(r.y), \"=r\"(r.z), \"=r\"(r.w) : \"l\"(p));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::LdStreamV2 => {
                "// An 8-byte load of data read once (weights): read-only path, no L1 allocation.\n\
                 __device__ __forceinline__ uint2 ld_stream_u32x2(const void* p) {\n\
                 \x20   uint2 r;\n\
                 \x20   asm(\"ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\" : \"=r\"(r.x), \"=r\"(r.y) : \"l\"(p));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::LdEarlyV4 => {
                "// A 16-byte load of data read once, issued before grid_dependency_wait(): coherent (not\n\
                 // .nc), so ptxas keeps it before the wait, and volatile, so the compiler does too; no\n\
                 // L1 allocation.\n\
                 __device__ __forceinline__ uint4 ld_early_u32x4(const void* p) {\n\
                 \x20   uint4 r;\n\
                 \x20   asm volatile(\"ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\"\n\
                 \x20       : \"=r\"(r.x), \"=r\"(r.y), \"=r\"(r.z), \"=r\"(r.w) : \"l\"(p));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::LdEarlyV2 => {
                "// An 8-byte load of data read once, issued before grid_dependency_wait(): coherent (not\n\
                 // .nc), so ptxas keeps it before the wait, and volatile, so the compiler does too; no\n\
                 // L1 allocation.\n\
                 __device__ __forceinline__ uint2 ld_early_u32x2(const void* p) {\n\
                 \x20   uint2 r;\n\
                 \x20   asm volatile(\"ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];\" : \"=r\"(r.x), \"=r\"(r.y) : \"l\"(p));\n\
                 \x20   return r;\n\
                 }\n"
            }
            H::LdCg => {
                "// Loads that skip L1 and read L2, where other blocks of this launch wrote (after their fence).\n\
                 // The built-in is an ordinary load to the compiler: several can be in flight at once.\n\
                 __device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }\n\
                 __device__ __forceinline__ unsigned ld_cg(const unsigned* p) { return __ldcg(p); }\n\
                 __device__ __forceinline__ unsigned long long ld_cg(const unsigned long long* p) { return __ldcg(p); }\n"
            }
            H::LdAcquire => {
                "// A load with acquire semantics at GPU scope, from L2: what other blocks released (a fence\n\
                 // then their store or atomic) is visible to the loads after it. Volatile: a spin re-reads.\n\
                 __device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {\n\
                 \x20   unsigned v;\n\
                 \x20   asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" : \"=r\"(v) : \"l\"(p) : \"memory\");\n\
                 \x20   return v;\n\
                 }\n"
            }
            H::GridDependency => {
                "// Programmatic dependent launch: wait until the grids this one overlaps have finished and\n\
                 // their writes are visible; let the next grid start (its blocks wait in turn).\n\
                 __device__ __forceinline__ void grid_dependency_wait() { asm volatile(\"griddepcontrol.wait;\" ::: \"memory\"); }\n\
                 __device__ __forceinline__ void launch_dependents() { asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\"); }\n"
            }
            H::GlobalTimer => {
                "// The global nanosecond timer, one clock for every SM.\n\
                 __device__ __forceinline__ unsigned long long global_timer() {\n\
                 \x20   unsigned long long t;\n\
                 \x20   asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n\
                 \x20   return t;\n\
                 }\n"
            }
            H::PrefetchL2 => {
                "// A bulk copy engine prefetch into L2 (no registers held, nothing waited for).\n\
                 __device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {\n\
                 \x20   asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(p), \"r\"(bytes) : \"memory\");\n\
                 }\n"
            }
            H::BulkCopy => {
                "// Bulk copies global -> shared by the copy engine (sm_90+), counted by an mbarrier in\n\
                 // shared memory: its phase ends when its arrivals are in and the bytes announced have landed.\n\
                 __device__ __forceinline__ unsigned shared_address(const void* p) {\n\
                 \x20   return (unsigned)__cvta_generic_to_shared(p);\n\
                 }\n\
                 __device__ __forceinline__ void bulk_barrier_init(unsigned long long* bar, unsigned arrivals) {\n\
                 \x20   asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"(shared_address(bar)), \"r\"(arrivals) : \"memory\");\n\
                 \x20   // So that the copy engine (the async proxy) sees the barrier initialised.\n\
                 \x20   asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n\
                 }\n\
                 __device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {\n\
                 \x20   unsigned b = shared_address(bar);\n\
                 \x20   asm volatile(\"mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\" :: \"r\"(b), \"r\"(bytes) : \"memory\");\n\
                 \x20   asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\"\n\
                 \x20                :: \"r\"(shared_address(dst)), \"l\"(src), \"r\"(bytes), \"r\"(b) : \"memory\");\n\
                 }\n\
                 __device__ __forceinline__ void bulk_barrier_arrive(unsigned long long* bar) {\n\
                 \x20   unsigned long long state;\n\
                 \x20   asm volatile(\"mbarrier.arrive.shared::cta.b64 %0, [%1];\" : \"=l\"(state) : \"r\"(shared_address(bar)) : \"memory\");\n\
                 }\n\
                 __device__ __forceinline__ void bulk_barrier_wait(unsigned long long* bar, unsigned parity) {\n\
                 \x20   unsigned done = 0;\n\
                 \x20   do {\n\
                 \x20       asm volatile(\"{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\"\n\
                 \x20                    : \"=r\"(done) : \"r\"(shared_address(bar)), \"r\"(parity) : \"memory\");\n\
                 \x20   } while (!done);\n\
                 }\n"
            }
        }
    }
}

/// The helpers in `wanted` and everything they use on `arch`, each once, dependencies first.
pub fn resolve(wanted: impl IntoIterator<Item = Helper>, arch: Arch) -> Vec<Helper> {
    fn add(h: Helper, arch: Arch, out: &mut Vec<Helper>) {
        if out.contains(&h) {
            return;
        }
        for &d in h.deps(arch) {
            add(d, arch, out);
        }
        out.push(h);
    }
    let mut wanted: Vec<Helper> = wanted.into_iter().collect();
    // A stable order, so that the emitted file does not change with the order of use.
    wanted.sort();
    wanted.dedup();
    let mut out = Vec::new();
    for h in wanted {
        add(h, arch, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_come_first_and_once() {
        let order = resolve([Helper::BlockSum, Helper::WarpSum, Helper::DotBf16x8], Arch::Sm90);
        assert_eq!(order, [Helper::Bf16x2ToFloat2, Helper::DotBf16x8, Helper::WarpSum, Helper::BlockSum]);
    }

    /// The paired segment is the plain one with the paired decode in its place, nothing else:
    /// the two layouts' tensor-core products differ only in how a word becomes f16 pairs. On
    /// sm_121a the paired decode is the plain one (the paired layout is ModelOpt's there).
    #[test]
    fn the_paired_segment_differs_only_in_its_decode() {
        for arch in [Arch::Sm90, Arch::Sm121a] {
            let plain = Helper::Nvfp4MmaSegment.code(arch);
            let paired = Helper::Nvfp4MmaSegmentPaired.code(arch);
            let renamed = paired
                .replace("nvfp4_mma_segment_paired", "nvfp4_mma_segment")
                .replace("e2m1x8_to_f16x8_paired", "e2m1x8_to_f16x8")
                .replace("the paired layout (kernel_dsl::e2m1_pairs)", "ModelOpt's layout");
            assert_eq!(renamed, plain, "{arch}");
            let order = resolve([Helper::Nvfp4MmaSegmentPaired], arch);
            assert!(order.contains(&Helper::E2m1x8ToF16x2Paired) && order.contains(&Helper::MmaF16), "{order:?}");
        }
        let paired_121 = Helper::E2m1x8ToF16x2Paired.code(Arch::Sm121a);
        assert!(paired_121.contains("e2m1x8_to_f16x2(w, p0, p1, p2, p3)"), "{paired_121}");
    }

    #[test]
    fn fp4_decode_depends_on_the_arch() {
        assert!(Helper::E2m1x4ToFloat4Raw.code(Arch::Sm121a).contains("cvt.rn.f16x2.e2m1x2"));
        assert!(!Helper::E2m1x4ToFloat4Raw.code(Arch::Sm90).contains("cvt.rn.f16x2.e2m1x2"));
    }
}
