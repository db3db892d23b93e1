// Shared by every Atom generation: element types, conversions, reduce operators, the
// block-share driver (pointer alignment, heads and tails) and small PTX helpers.
//
// Self-contained: no CUDA headers (NVRTC from the pip wheel has none). Conversions are
// written out so that the host Atom (crates/purlin-atom/src/host.rs) can mirror them bit
// for bit:
//   - 8- and 16-bit floats accumulate in f32; results round to nearest even, once;
//   - e4m3 (the "fn" variant: no infinities) saturates to +-448 on overflow and on +-Inf;
//   - e5m2 overflows to +-Inf;
//   - NaN stays NaN (payloads are not specified, except that a bf16 encode keeps sign and top
//     payload bits, quieted, like the host Atom; f32 arithmetic on the GPU makes its own NaN);
//   - min/max propagate NaN (a NaN operand gives NaN), and on ties keep the earlier rank;
//   - i32/u32 sum and prod wrap (two's complement).
// This file never includes anything from kernels/snac/.
#pragma once

namespace purlin {
namespace atom {

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

// The largest number of sources one reduce() combines.
constexpr u32 kMaxSources = 16;
// Pointer alignment the vector paths need; anything element-aligned is accepted.
constexpr u32 kAlign = 16;

struct alignas(16) V16 {
  u32 w[4];
};

// ---------------------------------------------------------------- small PTX helpers

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u64 a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return (u32)a;
}

__device__ __forceinline__ V16 ld_global_v16(const void* p) {
  V16 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
  return v;
}

// Cached in L2 only, like the engines' cp.async.cg: a peer's bytes never sit in this SM's
// L1, which no other GPU's stores invalidate.
__device__ __forceinline__ V16 ld_global_cg_v16(const void* p) {
  V16 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p));
  return v;
}

__device__ __forceinline__ void st_global_v16(void* p, const V16& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3])
               : "memory");
}

__device__ __forceinline__ V16 ld_shared_v16(u32 addr) {
  V16 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ float bits_f32(u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ u32 f32_bits(float f) { return __float_as_uint(f); }

// ---------------------------------------------------------------- conversions

// f16: the hardware conversions (sm_53+) are exact (f16 -> f32) and round to nearest even
// (f32 -> f16, overflow to Inf), which is the contract.
__device__ __forceinline__ float f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// bf16: software (sm_75 has no bf16 cvt); the same integer recipe as the host Atom.
__device__ __forceinline__ float bf16_to_f32(u16 b) { return bits_f32((u32)b << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
  u32 x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);  // quiet NaN, sign kept
  x += 0x7fffu + ((x >> 16) & 1u);
  return (u16)(x >> 16);
}

// Two bf16 in one word (lo in bits 0..15), the software way: ~7 integer ops and a NaN
// test per element, then the halves merged.
__device__ __forceinline__ u32 bf16x2_soft(float lo, float hi) {
  return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// Fast 16-bit float packing (sm_80+): one `cvt.rn.bf16x2.f32` (F2FP.BF16.F32.PACK_AB) per two
// elements instead of ~16 integer ops, round to nearest even like the software recipe. The
// hardware turns every NaN into 0x7fff (H200: the device test fails without the fix-up), so
// packers test a vector's accumulators for NaN (one FSETP per pair, chained) and redo the rare
// vector that holds one with the software code: results stay bit-identical to the software
// path and the host Atom's encode, payloads included.
// PURLIN_ATOM_SOFT_CONVERT=1 (AtomParams::soft_convert) keeps the software path, for
// measuring the difference in one run. f16 needs nothing here: the compiler already fuses two
// cvt.rn.f16.f32 and the merge into one F2FP.F16.F32.PACK_AB (9 instructions per 16-byte
// store on sm_90, against 67 for software bf16).
#ifndef PURLIN_ATOM_SOFT_CONVERT
#define PURLIN_ATOM_SOFT_CONVERT 0
#endif
#if !PURLIN_ATOM_SOFT_CONVERT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PURLIN_ATOM_HW_BF16X2 1
#else
#define PURLIN_ATOM_HW_BF16X2 0
#endif
// fp8 pairs (sm_89+): `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32`, see fp8x16_hw below.
#if !PURLIN_ATOM_SOFT_CONVERT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PURLIN_ATOM_HW_FP8X2 1
#else
#define PURLIN_ATOM_HW_FP8X2 0
#endif

#if PURLIN_ATOM_HW_BF16X2
// PTX: the first source goes to the upper half.
__device__ __forceinline__ u32 bf16x2_hw(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif
#if PURLIN_ATOM_HW_BF16X2 || PURLIN_ATOM_HW_FP8X2
// Whether either is NaN (one `setp.nan`).
__device__ __forceinline__ bool any_nan2(float a, float b) {
  u32 r;
  asm("{\n .reg .pred p;\n setp.nan.f32 p, %1, %2;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(r) : "f"(a), "f"(b));
  return r != 0;
}
#endif

// fp8 decode: (EXP bits, MAN bits, BIAS); FN = no infinities (e4m3: only S.1111.111 is NaN).
template <int EXP, int MAN, int BIAS, bool FN>
__device__ __forceinline__ float fp8_to_f32(u8 c) {
  const u32 sign = ((u32)c & 0x80u) << 24;
  const u32 e = ((u32)c >> MAN) & ((1u << EXP) - 1u);
  const u32 m = (u32)c & ((1u << MAN) - 1u);
  if (FN) {
    if (e == (1u << EXP) - 1u && m == (1u << MAN) - 1u) return bits_f32(sign | 0x7fc00000u);
  } else if (e == (1u << EXP) - 1u) {
    return bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
  }
  if (e == 0) {
    // Subnormal: m * 2^(1 - BIAS - MAN), exact in f32.
    const float mag = (float)m * bits_f32((u32)(127 + 1 - BIAS - MAN) << 23);
    return bits_f32(f32_bits(mag) | sign);
  }
  return bits_f32(sign | ((e - BIAS + 127) << 23) | (m << (23 - MAN)));
}

// fp8 encode, round to nearest even. FN (e4m3): NaN -> NaN, overflow and +-Inf saturate to
// the largest finite value. Otherwise (e5m2): overflow -> +-Inf, NaN -> quiet NaN.
// Branch-free: the normal-range code comes from adding the rounding bias to the f32 bits
// (a mantissa carry moves into the exponent), subnormal codes from rni(|f| * 2^(BIAS-1+MAN)).
template <int EXP, int MAN, int BIAS, bool FN>
__device__ __forceinline__ u8 f32_to_fp8(float f) {
  constexpr u32 kInf = ((1u << EXP) - 1u) << MAN;                              // e5m2 only
  constexpr u32 kMax = FN ? (1u << (EXP + MAN)) - 2u : kInf - 1u;              // largest finite
  constexpr u32 kSat = FN ? kMax : kInf;                                       // what overflow gives
  constexpr u32 kNan = FN ? 0x7fu : (kInf | (1u << (MAN - 1)));
  constexpr u32 kMinNormal = (u32)(127 + 1 - BIAS) << 23;                      // f32 bits of 2^(1-BIAS)
  constexpr u32 kSubScale = (u32)(127 + BIAS - 1 + MAN) << 23;                 // f32 bits of 2^(BIAS-1+MAN)
  const u32 x = f32_bits(f);
  const u32 sign = (x >> 24) & 0x80u;
  const u32 a = x & 0x7fffffffu;
  const u32 r = a + ((1u << (22 - MAN)) - 1u) + ((a >> (23 - MAN)) & 1u);
  u32 code = (r >> (23 - MAN)) - ((u32)(127 - BIAS) << MAN);
  code = code > kMax ? kSat : code;
  u32 sub;
  asm("cvt.rni.sat.u32.f32 %0, %1;" : "=r"(sub) : "f"(bits_f32(a) * bits_f32(kSubScale)));
  code = a < kMinNormal ? sub : code;
  code = a > 0x7f800000u ? kNan : code;
  return (u8)(sign | code);
}

#if PURLIN_ATOM_HW_FP8X2
// Two fp8 codes from two floats in one instruction, round to nearest even (PTX: the first
// source goes to the upper byte; `.satfinite` is required for fp8 destinations).
template <bool E5M2>
__device__ __forceinline__ u32 fp8x2_hw(float lo, float hi) {
  u16 r;
  if (E5M2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// A vector's sixteen fp8 lanes through fp8x2_hw: 8 conversions against ~15 integer ops per
// lane for f32_to_fp8, which made fp8 reductions slow (rounds 124 and 125). Returns whether
// the vector must be redone in software for the contract: a NaN lane (the contract's NaN code
// keeps the sign; PTX promises no particular NaN code), and for e5m2 a lane beyond the largest
// finite value (satfinite gives +-57344 where the contract overflows to +-Inf). e4m3's
// saturation to +-448, Inf included, is the contract already.
template <bool E5M2>
__device__ __forceinline__ bool fp8x16_hw(const float* a, V16& v) {
  bool redo = false;
#pragma unroll
  for (u32 j = 0; j < 4; ++j) {
    const float* q = a + 4 * j;
    v.w[j] = fp8x2_hw<E5M2>(q[0], q[1]) | (fp8x2_hw<E5M2>(q[2], q[3]) << 16);
    redo = redo | any_nan2(q[0], q[1]) | any_nan2(q[2], q[3]);
    if (E5M2) redo = redo | (fmaxf(fmaxf(fabsf(q[0]), fabsf(q[1])), fmaxf(fabsf(q[2]), fabsf(q[3]))) > 57344.0f);
  }
  return redo;
}

// A vector's sixteen e4m3 lanes decoded by `cvt.rn.f16x2.e4m3x2` (exact: every e4m3 value is
// an f16), then f16 -> f32: ~1.5 instructions per lane against ~6 for the software decode
// (e5m2's software decode is already one shift and one cvt per lane). False, decoding
// nothing, when a lane is NaN (S.1111.111): the software decode gives every NaN code +NaN
// 0x7fc00000, which the hardware's NaN need not be. The test is bytewise: (b & 0x7f) + 1
// carries into bit 7 only for 0x7f.
__device__ __forceinline__ bool fp8x16_unpack_e4m3_hw(const V16& v, float* a) {
  u32 nan = 0;
#pragma unroll
  for (u32 j = 0; j < 4; ++j) nan |= ((v.w[j] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (__builtin_expect(nan != 0, 0)) return false;
#pragma unroll
  for (u32 j = 0; j < 4; ++j) {
#pragma unroll
    for (u32 k = 0; k < 2; ++k) {
      u32 h;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)(v.w[j] >> (16 * k))));
      a[4 * j + 2 * k] = f16_to_f32((u16)h);
      a[4 * j + 2 * k + 1] = f16_to_f32((u16)(h >> 16));
    }
  }
  return true;
}
#endif

// ---------------------------------------------------------------- element types
//
// Each type: `storage` (in memory), `acc` (accumulator), kLanes (elements per 16 bytes),
// decode/encode of one element, and unpack/pack of one 16-byte vector.

// unpack_soft and pack_soft: lane by lane through decode/encode.
#define PURLIN_ATOM_WORD_LANES_SOFT(T, BITS)                                               \
  static constexpr u32 kLanes = 16 / sizeof(storage);                                      \
  __device__ __forceinline__ static void unpack_soft(const V16& v, acc* a) {               \
    _Pragma("unroll") for (u32 i = 0; i < kLanes; ++i) {                                    \
      a[i] = decode((storage)((v.w[i * BITS / 32] >> ((i * BITS) % 32)) & ((1ull << BITS) - 1))); \
    }                                                                                      \
  }                                                                                        \
  __device__ __forceinline__ static V16 pack_soft(const acc* a) {                          \
    V16 v = {{0u, 0u, 0u, 0u}};                                                            \
    _Pragma("unroll") for (u32 i = 0; i < kLanes; ++i) {                                    \
      v.w[i * BITS / 32] |= (u32)encode(a[i]) << ((i * BITS) % 32);                         \
    }                                                                                      \
    return v;                                                                              \
  }
#define PURLIN_ATOM_WORD_LANES(T, BITS)                                                    \
  PURLIN_ATOM_WORD_LANES_SOFT(T, BITS)                                                     \
  __device__ __forceinline__ static void unpack(const V16& v, acc* a) { unpack_soft(v, a); } \
  __device__ __forceinline__ static V16 pack(const acc* a) { return pack_soft(a); }
// fp8: pack through fp8x16_hw where there is one, the rare vector it cannot do in software.
#if PURLIN_ATOM_HW_FP8X2
#define PURLIN_ATOM_FP8_LANES(T, E5M2)                                                     \
  PURLIN_ATOM_WORD_LANES_SOFT(T, 8)                                                        \
  __device__ __forceinline__ static void unpack(const V16& v, acc* a) {                    \
    if (E5M2 || !fp8x16_unpack_e4m3_hw(v, a)) unpack_soft(v, a);                           \
  }                                                                                        \
  __device__ __forceinline__ static V16 pack(const acc* a) {                               \
    V16 v;                                                                                 \
    if (__builtin_expect(fp8x16_hw<E5M2>(a, v), 0)) v = pack_soft(a);                      \
    return v;                                                                              \
  }
#else
#define PURLIN_ATOM_FP8_LANES(T, E5M2) PURLIN_ATOM_WORD_LANES(T, 8)
#endif

struct F32 {
  typedef u32 storage;
  typedef float acc;
  __device__ __forceinline__ static float decode(u32 s) { return bits_f32(s); }
  __device__ __forceinline__ static u32 encode(float a) { return f32_bits(a); }
  PURLIN_ATOM_WORD_LANES(F32, 32)
};
struct F16 {
  typedef u16 storage;
  typedef float acc;
  __device__ __forceinline__ static float decode(u16 s) { return f16_to_f32(s); }
  __device__ __forceinline__ static u16 encode(float a) { return f32_to_f16(a); }
  PURLIN_ATOM_WORD_LANES(F16, 16)
};
struct BF16 {
  typedef u16 storage;
  typedef float acc;
  static constexpr u32 kLanes = 8;
  __device__ __forceinline__ static float decode(u16 s) { return bf16_to_f32(s); }
  __device__ __forceinline__ static u16 encode(float a) { return f32_to_bf16(a); }
  // Decoding is exact and one op per lane either way (w << 16, w & 0xffff0000).
  __device__ __forceinline__ static void unpack(const V16& v, float* a) {
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      a[2 * j] = bits_f32(v.w[j] << 16);
      a[2 * j + 1] = bits_f32(v.w[j] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static V16 pack(const float* a) {
    V16 v;
#if PURLIN_ATOM_HW_BF16X2
    // sm_90, cp.async reduce loop, per 16-byte store: 4 F2FP + 4 FSETP + a branch around
    // the NaN fix-up, against 67 instructions for the software path.
    bool nan = false;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) {
      v.w[j] = bf16x2_hw(a[2 * j], a[2 * j + 1]);
      nan = nan | any_nan2(a[2 * j], a[2 * j + 1]);
    }
    if (__builtin_expect(nan, 0)) fix_nan(a, v);
#else
#pragma unroll
    for (u32 j = 0; j < 4; ++j) v.w[j] = bf16x2_soft(a[2 * j], a[2 * j + 1]);
#endif
    return v;
  }
  // The software conversions, bit for bit the same (for rare vectors: small code).
  __device__ __forceinline__ static void unpack_soft(const V16& v, float* a) { unpack(v, a); }
  __device__ __forceinline__ static V16 pack_soft(const float* a) {
    V16 v;
#pragma unroll
    for (u32 j = 0; j < 4; ++j) v.w[j] = bf16x2_soft(a[2 * j], a[2 * j + 1]);
    return v;
  }
#if PURLIN_ATOM_HW_BF16X2
  // The rare vector with a NaN: every lane gets the software code (NaN lanes differ).
  __device__ __forceinline__ static void fix_nan(const float* a, V16& v) {
#pragma unroll
    for (u32 j = 0; j < 4; ++j) v.w[j] = bf16x2_soft(a[2 * j], a[2 * j + 1]);
  }
#endif
};
struct E4M3 {
  typedef u8 storage;
  typedef float acc;
  // Through the hardware f16 conversion: the e4m3 bits placed as an f16 (bias 15 instead of
  // 7) give the value times 2^-8, subnormals included; the scaling back is exact, and an
  // FMA contraction of it into a sum is exact too. Only S.1111.111 (NaN) needs a case.
  __device__ __forceinline__ static float decode(u8 s) {
    const u32 c = s;
    const float v = f16_to_f32((u16)(((c & 0x80u) << 8) | ((c & 0x7fu) << 7))) * 256.0f;
    return (c & 0x7fu) == 0x7fu ? bits_f32(0x7fc00000u) : v;
  }
  __device__ __forceinline__ static u8 encode(float a) { return f32_to_fp8<4, 3, 7, true>(a); }
  PURLIN_ATOM_FP8_LANES(E4M3, false)
};
struct E5M2 {
  typedef u8 storage;
  typedef float acc;
  // e5m2 is the top byte of an f16 (same sign, exponent and bias): exact through the
  // hardware f16 conversion, Inf and NaN included.
  __device__ __forceinline__ static float decode(u8 s) { return f16_to_f32((u16)((u16)s << 8)); }
  __device__ __forceinline__ static u8 encode(float a) { return f32_to_fp8<5, 2, 15, false>(a); }
  PURLIN_ATOM_FP8_LANES(E5M2, true)
};
struct I32 {
  typedef u32 storage;
  typedef i32 acc;
  __device__ __forceinline__ static i32 decode(u32 s) { return (i32)s; }
  __device__ __forceinline__ static u32 encode(i32 a) { return (u32)a; }
  PURLIN_ATOM_WORD_LANES(I32, 32)
};
struct U32 {
  typedef u32 storage;
  typedef u32 acc;
  __device__ __forceinline__ static u32 decode(u32 s) { return s; }
  __device__ __forceinline__ static u32 encode(u32 a) { return a; }
  PURLIN_ATOM_WORD_LANES(U32, 32)
};
#undef PURLIN_ATOM_FP8_LANES
#undef PURLIN_ATOM_WORD_LANES
#undef PURLIN_ATOM_WORD_LANES_SOFT

// ---------------------------------------------------------------- reduce operators
// apply(a, b): a is the running value (earlier ranks), b the next rank's element.

__device__ __forceinline__ bool is_nan(float x) { return x != x; }

// Each operator: apply(a, b), the combine in rank order, and finish(a, n), applied once to
// the combined accumulator of n sources before it is encoded (the identity but for Mean).
struct Sum {
  __device__ __forceinline__ static float apply(float a, float b) { return a + b; }
  __device__ __forceinline__ static i32 apply(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
  __device__ __forceinline__ static u32 apply(u32 a, u32 b) { return a + b; }
  template <class A>
  __device__ __forceinline__ static A finish(A a, u32) {
    return a;
  }
};
struct Prod {
  __device__ __forceinline__ static float apply(float a, float b) { return a * b; }
  __device__ __forceinline__ static i32 apply(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
  __device__ __forceinline__ static u32 apply(u32 a, u32 b) { return a * b; }
  template <class A>
  __device__ __forceinline__ static A finish(A a, u32) {
    return a;
  }
};
struct Min {
  __device__ __forceinline__ static float apply(float a, float b) { return is_nan(a) ? a : (is_nan(b) || b < a) ? b : a; }
  __device__ __forceinline__ static i32 apply(i32 a, i32 b) { return b < a ? b : a; }
  __device__ __forceinline__ static u32 apply(u32 a, u32 b) { return b < a ? b : a; }
  template <class A>
  __device__ __forceinline__ static A finish(A a, u32) {
    return a;
  }
};
struct Max {
  __device__ __forceinline__ static float apply(float a, float b) { return is_nan(a) ? a : (is_nan(b) || b > a) ? b : a; }
  __device__ __forceinline__ static i32 apply(i32 a, i32 b) { return b > a ? b : a; }
  __device__ __forceinline__ static u32 apply(u32 a, u32 b) { return b > a ? b : a; }
  template <class A>
  __device__ __forceinline__ static A finish(A a, u32) {
    return a;
  }
};
// The mean of n sources: combined like Sum, then divided by n once, in the accumulator
// (floats in f32, so one rounding into the storage type; integers truncate toward zero).
// The executor's Avg (a sum scaled by 1/world) where a reduce has all world ranks as its
// sources: the scale then costs no pass of its own over the output (round 138).
struct Mean {
  template <class A>
  __device__ __forceinline__ static A apply(A a, A b) {
    return Sum::apply(a, b);
  }
  __device__ __forceinline__ static float finish(float a, u32 n) { return a / (float)n; }
  __device__ __forceinline__ static i32 finish(i32 a, u32 n) { return a / (i32)n; }
  __device__ __forceinline__ static u32 finish(u32 a, u32 n) { return a / n; }
};

// a / n correctly rounded, for n in 1..16 and a zero, Inf, NaN or of magnitude at least
// 2^-100 (a quotient far from f32's subnormals): q = a * RN(1/n), then Markstein's FMA
// correction, exact for every f32 significand and n (purlin-atom's host test
// `mean_division_by_fma_matches_ieee` checks the recipe against IEEE division). Inline and
// branch-free but for the specials, where div.rn's slow-path call inlined at every fp8
// finish spilled the e4m3 Avg executor to 266/576 bytes stored/loaded (NVRTC 13.0).
// RN(1/n) is rcp.rn (IEEE, so correctly rounded), not a table: a module with a user
// constant bank ran byte-identical kernels slower in CUDA graphs (rounds 139-141).
__device__ __forceinline__ float div_rn_small(float a, u32 n) {
  const float r = __frcp_rn((float)n);
  const float q = __fmul_rn(a, r);
  const float corrected = __fmaf_rn(__fmaf_rn(-q, (float)n, a), r, q);
  // |q| - 1 wraps for ±0 (whose sign is kept) and lies past the largest finite for Inf, NaN.
  const bool special = (f32_bits(q) & 0x7fffffffu) - 1u >= 0x7f7fffffu;
  return special ? q : corrected;
}

template <class X, class Y>
struct SameType {
  static constexpr bool value = false;
};
template <class X>
struct SameType<X, X> {
  static constexpr bool value = true;
};

// Op's finish of n sources for element type T (Op::finish, but fp8's Mean through
// div_rn_small): every reduce calls this once per element before the encode. fp8 (the
// one-byte types) sums at most 16 values, zero or at least 2^-16 in magnitude, which
// div_rn_small divides exactly; wider types keep IEEE division, which compiles without
// spilling there.
template <class T, class Op, class A>
__device__ __forceinline__ A finish(A a, u32 n) {
  if constexpr (SameType<Op, Mean>::value && sizeof(typename T::storage) == 1) {
    return div_rn_small(a, n);
  } else {
    return Op::finish(a, n);
  }
}

// ---------------------------------------------------------------- two sources, in 16-bit lanes
//
// Every reduce at world 2 has exactly two sources. For Sum of two bf16 or fp8 values the
// f32 path (decode, add in f32, encode once) is replaced by one correctly rounded add in a
// 16-bit format (bf16x2; fp8 through f16x2) with the same bits: two values of p
// significant bits whose exponents differ by d have an exact sum of at most d + p + 1 bits.
// Where that does not fit the wider of the two intermediate formats, the smaller value is
// below a quarter of the larger's unit in the last place of the result format, so neither
// path can reach a rounding midpoint of the result and both round to the same neighbour.
// A lane the shortcut cannot give the contract's bits (a NaN, whose code the hardware picks;
// an e5m2 sum that the contract overflows to Inf where satfinite saturates) sends the whole
// vector through the f32 path. Half the instructions of the f32 path or less per vector:
// no unpack to f32, half the adds, no f32 NaN tests (round 127).
// sm_90+ (`add.rn.bf16x2`); PURLIN_ATOM_SOFT_CONVERT=1 keeps the f32 path.
#if !PURLIN_ATOM_SOFT_CONVERT && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PURLIN_ATOM_PAIRWISE 1
#else
#define PURLIN_ATOM_PAIRWISE 0
#endif

// Pairwise<T, Op>::word(x, y, out, guard): out = x (op) y for one 32-bit word of lanes,
// folding into `guard` (0 before the first word) what ok(guard) needs to say whether every
// lane so far has the f32 path's bits (where not, out is unspecified). `value`: whether
// there is one.
template <class T, class Op>
struct Pairwise {
  static constexpr bool value = false;
  __device__ __forceinline__ static void word(u32, u32, u32&, u32&) {}
  __device__ __forceinline__ static bool ok(u32) { return false; }
};

#if PURLIN_ATOM_PAIRWISE
// Bit 15 of each 16-bit half of w whose magnitude bits (h & 0x7fff) exceed `limit`.
__device__ __forceinline__ u32 halves_above(u32 w, u32 limit) {
  return ((w & 0x7fff7fffu) + (0x7fffu - limit) * 0x00010001u) & 0x80008000u;
}
__device__ __forceinline__ u32 add_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 add_f16x2(u32 a, u32 b) {
  u32 r;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ u32 mul_f16x2(u32 a, u32 b) {
  u32 r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// max(acc, |s|) per half, NaN (0x7fff) where either is NaN.
__device__ __forceinline__ u32 max_abs_f16x2(u32 acc, u32 s) {
  u32 r;
  asm("{\n .reg .b32 a;\n abs.f16x2 a, %2;\n max.NaN.f16x2 %0, %1, a;\n}" : "=r"(r) : "r"(acc), "r"(s));
  return r;
}
// Two fp8 codes (low byte -> low half) as f16x2, exact; and back, round to nearest even.
template <bool E5M2>
__device__ __forceinline__ u32 fp8x2_to_f16x2(u16 c) {
  u32 h;
  if (E5M2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(c));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(c));
  }
  return h;
}
template <bool E5M2>
__device__ __forceinline__ u32 f16x2_to_fp8x2(u32 h) {
  u16 c;
  if (E5M2) {
    asm("cvt.rn.satfinite.e5m2x2.f16x2 %0, %1;" : "=h"(c) : "r"(h));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(c) : "r"(h));
  }
  return c;
}

// bf16 (8 significant bits) through bf16x2: the f32 sum is exact up to d = 15. NaN lanes
// (magnitude above Inf's 0x7f80) go the f32 way. (f16 stays on the f32 path: through f16x2
// it was no faster, round 127; its f32 path is already short, one conversion per lane each
// way.)
template <>
struct Pairwise<BF16, Sum> {
  static constexpr bool value = true;
  __device__ __forceinline__ static void word(u32 x, u32 y, u32& out, u32& guard) {
    out = add_bf16x2(x, y);
    guard |= halves_above(out, 0x7f80u);
  }
  __device__ __forceinline__ static bool ok(u32 guard) { return guard == 0; }
};
// fp8 (4 and 3 bits) through f16x2, where every fp8 value is exact and the sum of two is
// exact up to d = 6 (e4m3's largest sum, 896, is far below f16's range). e4m3: only NaN
// lanes go the f32 way (saturation to +-448 is the contract); e5m2: also sums of 61440
// (the midpoint above 57344) and more, which the contract rounds to +-Inf, and which a
// mean would otherwise halve after f16 overflowed them.
// HALVE (Mean of two): the f16 sum times 0.5, exact (every fp8 sum is a multiple of 2^-16,
// so its half is an f16 value), then one rounding into fp8; the f32 path also halves its
// sum exactly, so the argument above holds on fp8's grid scaled by two.
template <bool E5M2, bool HALVE>
struct Fp8Pair {
  static constexpr bool value = true;
  // guard: the largest |sum| so far, per half, NaN if any sum is (one `max.NaN.f16x2` of
  // absolute values per pair of lanes; the limit is tested once, in ok).
  __device__ __forceinline__ static void word(u32 x, u32 y, u32& out, u32& guard) {
    u16 xh[2], yh[2], c[2];
    asm("mov.b32 {%0, %1}, %2;" : "=h"(xh[0]), "=h"(xh[1]) : "r"(x));
    asm("mov.b32 {%0, %1}, %2;" : "=h"(yh[0]), "=h"(yh[1]) : "r"(y));
#pragma unroll
    for (u32 k = 0; k < 2; ++k) {
      u32 s = add_f16x2(fp8x2_to_f16x2<E5M2>(xh[k]), fp8x2_to_f16x2<E5M2>(yh[k]));
      guard = max_abs_f16x2(guard, s);
      if (HALVE) s = mul_f16x2(s, 0x38003800u);  // 0.5 in both halves
      c[k] = (u16)f16x2_to_fp8x2<E5M2>(s);
    }
    asm("mov.b32 %0, {%1, %2};" : "=r"(out) : "h"(c[0]), "h"(c[1]));
  }
  __device__ __forceinline__ static bool ok(u32 guard) { return halves_above(guard, E5M2 ? 0x7b7fu : 0x7c00u) == 0; }
};
template <>
struct Pairwise<E4M3, Sum> : Fp8Pair<false, false> {};
template <>
struct Pairwise<E5M2, Sum> : Fp8Pair<true, false> {};
template <>
struct Pairwise<E4M3, Mean> : Fp8Pair<false, true> {};
template <>
struct Pairwise<E5M2, Mean> : Fp8Pair<true, true> {};
#endif

// x (op) y for one vector, both unpacked to the accumulator type, combined lane by lane in
// rank order, finished as a reduce of two sources (Mean halves) and packed; SOFT: through
// the software decode/encode (the exact fallback). Only for whole two-source reduces.
template <class T, class Op, bool SOFT>
__device__ __forceinline__ V16 combine_lanes(const V16& x, const V16& y) {
  typename T::acc a[T::kLanes], b[T::kLanes];
  if constexpr (SOFT) {
    T::unpack_soft(x, a);
    T::unpack_soft(y, b);
  } else {
    T::unpack(x, a);
    T::unpack(y, b);
  }
#pragma unroll
  for (u32 e = 0; e < T::kLanes; ++e) a[e] = finish<T, Op>(Op::apply(a[e], b[e]), 2u);
  if constexpr (SOFT) {
    return T::pack_soft(a);
  } else {
    return T::pack(a);
  }
}

// x (op) y for one vector through the f32 path. Out of line: it is the rare vector, and
// inlined its 2 x kLanes floats weigh on the registers of every loop that calls it.
template <class T, class Op>
__device__ __noinline__ V16 combine_two_f32(V16 x, V16 y) {
  return combine_lanes<T, Op, true>(x, y);
}

// x (op) y for one vector of two sources: Pairwise where it applies, else (or for the rare
// vector it cannot do) the f32 path, in rank order like every reduce.
template <class T, class Op>
__device__ __forceinline__ V16 combine_two(const V16& x, const V16& y) {
  V16 out;
  u32 guard = 0;
#pragma unroll
  for (u32 j = 0; j < 4; ++j) Pairwise<T, Op>::word(x.w[j], y.w[j], out.w[j], guard);
  if (__builtin_expect(!Pairwise<T, Op>::ok(guard), 0)) out = combine_two_f32<T, Op>(x, y);
  return out;
}

// x (op) y for one vector of two sources, any type: combine_two where Pairwise applies,
// else both unpacked, combined lane by lane in rank order and packed.
template <class T, class Op>
__device__ __forceinline__ V16 combine_pair(const V16& x, const V16& y) {
  if constexpr (Pairwise<T, Op>::value) {
    return combine_two<T, Op>(x, y);
  } else {
    return combine_lanes<T, Op, false>(x, y);
  }
}

// The same for the low W words of two 64-bit payloads (the executor's packets); false when
// the caller must take the f32 path (nothing then is written).
template <class T, class Op, u32 W>
__device__ __forceinline__ bool combine_two_payload(u64 x, u64 y, u64& out) {
  static_assert(W == 1 || W == 2, "a payload is one or two words");
  u32 o[2] = {0u, 0u}, guard = 0;
#pragma unroll
  for (u32 j = 0; j < W; ++j) Pairwise<T, Op>::word((u32)(x >> (32 * j)), (u32)(y >> (32 * j)), o[j], guard);
  if (__builtin_expect(!Pairwise<T, Op>::ok(guard), 0)) return false;
  out = o[0] | ((u64)o[1] << 32);
  return true;
}

// ---------------------------------------------------------------- the block-share driver
//
// A generation supplies an Engine with two block-cooperative loops over 16-byte vectors,
// all pointers 16-byte aligned:
//   Engine::copy_vectors(dst, src, nvec, smem)
//   Engine::reduce_vectors<T, Op>(dst, srcs, off, n, nvec, smem)
// (source r's vectors start at srcs[r] + off bytes; srcs is a table in shared memory)
// and the driver below adds what every generation shares: the entry and exit barriers of
// the completion contract, the scalar heads and tails, and the scalar path for pointers
// whose alignments differ.

// The calling thread's index in its block and the block's size (executors use these too).
__device__ __forceinline__ u32 tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
__device__ __forceinline__ u32 nthreads() { return blockDim.x * blockDim.y * blockDim.z; }

// Elements per thread kept in flight by the scalar paths.
constexpr u32 kScalarUnroll = 8;

__device__ __forceinline__ void copy_bytes(u8* dst, const u8* src, u64 bytes) {
  for (u64 i = tid(); i < bytes; i += nthreads()) dst[i] = src[i];
}

// A share of at most kDirectVectorsPerThread 16-byte vectors per thread (8 KiB at 512
// threads) skips the engine: each thread loads its vectors into registers, all at once, and
// stores them. The engines' pipelines pay their set-up and drain on every call, which at
// these sizes cost more than the one load round trip that moves the data (round 85).
constexpr u32 kDirectVectorsPerThread = 2;

__device__ __forceinline__ void copy_vectors_direct(V16* dst, const V16* src, u64 nvec) {
  const u32 t = tid(), nt = nthreads();
  V16 v[kDirectVectorsPerThread];
#pragma unroll
  for (u32 k = 0; k < kDirectVectorsPerThread; ++k) {
    const u64 i = (u64)k * nt + t;
    if (i < nvec) v[k] = ld_global_cg_v16(src + i);
  }
#pragma unroll
  for (u32 k = 0; k < kDirectVectorsPerThread; ++k) {
    const u64 i = (u64)k * nt + t;
    if (i < nvec) st_global_v16(dst + i, v[k]);
  }
}

template <class Engine>
__device__ __forceinline__ void copy_share(void* dst_, const void* src_, u64 bytes, void* smem) {
  u8* dst = (u8*)dst_;
  const u8* src = (const u8*)src_;
  __syncthreads();  // the workspace is ours from here
  if ((((u64)dst ^ (u64)src) & 15u) == 0) {
    u64 head = (16u - ((u64)dst & 15u)) & 15u;
    if (head > bytes) head = bytes;
    copy_bytes(dst, src, head);
    const u64 nvec = (bytes - head) / 16u;
    if (nvec <= (u64)kDirectVectorsPerThread * nthreads()) {
      copy_vectors_direct((V16*)(dst + head), (const V16*)(src + head), nvec);
    } else {
      Engine::copy_vectors((V16*)(dst + head), (const V16*)(src + head), nvec, smem);
    }
    const u64 done = head + nvec * 16u;
    copy_bytes(dst + done, src + done, bytes - done);
  } else if ((((u64)dst ^ (u64)src) & 3u) == 0) {
    u64 head = (4u - ((u64)dst & 3u)) & 3u;
    if (head > bytes) head = bytes;
    copy_bytes(dst, src, head);
    const u64 nw = (bytes - head) / 4u;
    u32* d = (u32*)(dst + head);
    const u32* s = (const u32*)(src + head);
    // Pointers 4-byte aligned but differently 16-byte aligned (V collectives' partitions at
    // arbitrary element offsets): kScalarUnroll loads in flight per thread before any store,
    // so the word path is not one load latency per word (as a plain loop it made skewed V
    // collectives several times slower, round 13).
    const u64 step = nthreads();
    u64 i = tid();
    for (; i + (kScalarUnroll - 1) * step < nw; i += kScalarUnroll * step) {
      u32 v[kScalarUnroll];
#pragma unroll
      for (u32 k = 0; k < kScalarUnroll; ++k) v[k] = s[i + k * step];
#pragma unroll
      for (u32 k = 0; k < kScalarUnroll; ++k) d[i + k * step] = v[k];
    }
    for (; i < nw; i += step) d[i] = s[i];
    const u64 done = head + nw * 4u;
    copy_bytes(dst + done, src + done, bytes - done);
  } else {
    copy_bytes(dst, src, bytes);
  }
  __syncthreads();  // completion: every thread's reads and writes are performed
}

// Scalar reduce of elements [begin, end) of every source (table in shared memory), in rank
// order per element; kScalarUnroll elements per thread in flight (see copy_share).
template <class T, class Op>
__device__ __noinline__ void reduce_scalar(typename T::storage* dst, const u64* srcs, u32 n, u64 begin, u64 end) {
  typedef typename T::storage S;
  typedef typename T::acc A;
  const u64 step = nthreads();
  u64 i = begin + tid();
  for (; i + (kScalarUnroll - 1) * step < end; i += kScalarUnroll * step) {
    A a[kScalarUnroll];
#pragma unroll
    for (u32 k = 0; k < kScalarUnroll; ++k) a[k] = T::decode(((const S*)srcs[0])[i + k * step]);
    for (u32 r = 1; r < n; ++r) {
      S v[kScalarUnroll];
#pragma unroll
      for (u32 k = 0; k < kScalarUnroll; ++k) v[k] = ((const S*)srcs[r])[i + k * step];
#pragma unroll
      for (u32 k = 0; k < kScalarUnroll; ++k) a[k] = Op::apply(a[k], T::decode(v[k]));
    }
#pragma unroll
    for (u32 k = 0; k < kScalarUnroll; ++k) dst[i + k * step] = T::encode(finish<T, Op>(a[k], n));
  }
  for (; i < end; i += step) {
    A a = T::decode(((const S*)srcs[0])[i]);
    for (u32 r = 1; r < n; ++r) a = Op::apply(a, T::decode(((const S*)srcs[r])[i]));
    dst[i] = T::encode(finish<T, Op>(a, n));
  }
}

// The reduce counterpart of copy_vectors_direct, for shares of at most one vector per
// thread: the sources' vectors are loaded a group at a time before any of them is combined
// (one round trip for all sources of a group, as the cp.async engine's rank-interleaved
// pipeline overlaps them), combined in rank order. Four 16-byte vectors in flight for
// 32-bit lanes; two for narrower lanes, whose unpacked accumulators (8 to 16 floats per
// vector) otherwise spill to local memory (NVRTC 13.0 on sm_90, the bf16 by-value
// executor; round 119).
template <class T>
struct DirectSources {
  static constexpr u32 value = T::kLanes > 4 ? 2u : 4u;
};

template <class T, class Op>
__device__ __forceinline__ void reduce_vectors_direct(V16* dst, const u64* srcs, u64 off, u32 n, u64 nvec) {
  typedef typename T::acc A;
  constexpr u32 E = T::kLanes;
  const u64 i = tid();
  if (i >= nvec) return;
  if constexpr (Pairwise<T, Op>::value) {
    if (n == 2) {
      const V16 x = ld_global_cg_v16((const V16*)(srcs[0] + off) + i);
      const V16 y = ld_global_cg_v16((const V16*)(srcs[1] + off) + i);
      st_global_v16(dst + i, combine_two<T, Op>(x, y));
      return;
    }
  }
  constexpr u32 G = DirectSources<T>::value;
  A a[E];
  for (u32 r0 = 0; r0 < n; r0 += G) {
    V16 v[G];
#pragma unroll
    for (u32 g = 0; g < G; ++g) {
      if (r0 + g < n) v[g] = ld_global_cg_v16((const V16*)(srcs[r0 + g] + off) + i);
    }
#pragma unroll
    for (u32 g = 0; g < G; ++g) {
      if (r0 + g < n) {
        A b[E];
        T::unpack(v[g], b);
#pragma unroll
        for (u32 e = 0; e < E; ++e) a[e] = r0 + g == 0 ? b[e] : Op::apply(a[e], b[e]);
      }
    }
  }
#pragma unroll
  for (u32 e = 0; e < E; ++e) a[e] = finish<T, Op>(a[e], n);
  st_global_v16(dst + i, T::pack(a));
}

// The block's table of a reduce's source addresses, in shared memory: one per kernel, as
// every reduce of a block runs to completion (a barrier) before the next one fills it.
__device__ __forceinline__ u64* source_table() {
  __shared__ u64 table[kMaxSources];
  return table;
}

// Reduce of n <= kMaxSources sources whose addresses are already in source_table() (and
// visible to every thread: the caller's barrier after filling it). Block-uniform.
template <class Engine, class T, class Op>
__device__ __forceinline__ void reduce_from_table(void* dst_, u32 n, u64 count, void* smem) {
  typedef typename T::storage S;
  const u64* table = source_table();
  S* dst = (S*)dst_;
  const u64 mis = (u64)dst & 15u;
  bool aligned = true;
  for (u32 r = 0; r < n; ++r) aligned = aligned && ((table[r] & 15u) == mis);
  if (n == 0 || count == 0) {
    // nothing to do
  } else if (aligned && mis % sizeof(S) == 0) {
    u64 head = ((16u - mis) & 15u) / sizeof(S);
    if (head > count) head = count;
    // (reduce_scalar is out of line: not called for an empty head or tail.)
    if (head) reduce_scalar<T, Op>(dst, table, n, 0, head);
    const u64 nvec = (count - head) / T::kLanes;
    if (nvec <= nthreads()) {
      reduce_vectors_direct<T, Op>((V16*)(dst + head), table, head * sizeof(S), n, nvec);
    } else {
      Engine::template reduce_vectors<T, Op>((V16*)(dst + head), table, head * sizeof(S), n, nvec, smem);
    }
    if (head + nvec * T::kLanes < count) reduce_scalar<T, Op>(dst, table, n, head + nvec * T::kLanes, count);
  } else {
    reduce_scalar<T, Op>(dst, table, n, 0, count);
  }
  __syncthreads();  // completion: every thread's reads and writes are performed
}

template <class Engine, class T, class Op>
__device__ __forceinline__ void reduce_share(void* dst, const void* const* srcs_in, u32 n, u64 count, u64 src_offset,
                                             void* smem) {
  u64* table = source_table();
  __syncthreads();  // the workspace and the table are ours from here
  if (n > kMaxSources) n = kMaxSources;  // the host API rejects this; never read past the table
  for (u32 r = tid(); r < n; r += nthreads()) table[r] = (u64)srcs_in[r] + src_offset;
  __syncthreads();
  reduce_from_table<Engine, T, Op>(dst, n, count, smem);
}

}  // namespace atom
}  // namespace purlin
