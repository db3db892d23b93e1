// The standalone Atom kernels (purlin-atom's DeviceAtom): one whole-grid entry per
// primitive, each block calling the Atom on its share, plus the conversion kernels the
// device tests compare with the host Atom. Includes only the interface.
#include "atom.cuh"

using namespace purlin::atom;

// Shares are multiples of 4 KiB, so every block's share keeps the buffers' alignment.
__device__ __forceinline__ void block_share(u64 total, u64 granule, u64* begin, u64* end) {
  u64 per = (total + gridDim.x - 1) / gridDim.x;
  per = (per + granule - 1) / granule * granule;
  u64 b = per * blockIdx.x;
  if (b > total) b = total;
  u64 e = b + per;
  if (e > total) e = total;
  *begin = b;
  *end = e;
}

extern "C" __global__ void __launch_bounds__(PURLIN_ATOM_THREADS) purlin_atom_copy(u64 dst, u64 src, u64 bytes) {
  extern __shared__ V16 purlin_atom_smem[];
  u64 b, e;
  block_share(bytes, 4096, &b, &e);
  copy((u8*)dst + b, (const u8*)src + b, e - b, purlin_atom_smem);
}

// The executor's pattern: block b copies chunks b, b + grid, ... of `chunk` bytes, one
// Atom call per chunk (so each call fills and drains its pipeline). For measuring what a
// chunk size costs; `purlin_atom_copy` is the same with one chunk per block.
extern "C" __global__ void __launch_bounds__(PURLIN_ATOM_THREADS)
    purlin_atom_copy_chunked(u64 dst, u64 src, u64 bytes, u64 chunk) {
  extern __shared__ V16 purlin_atom_smem[];
  for (u64 b = blockIdx.x * chunk; b < bytes; b += (u64)gridDim.x * chunk) {
    const u64 len = bytes - b < chunk ? bytes - b : chunk;
    copy((u8*)dst + b, (const u8*)src + b, len, purlin_atom_smem);
  }
}

struct SrcPtrs {
  u64 p[kMaxSources];
};

#define PURLIN_ATOM_REDUCE_KERNEL(NAME, T, OP)                                                               \
  extern "C" __global__ void __launch_bounds__(PURLIN_ATOM_THREADS)                                          \
      purlin_atom_reduce_##NAME(u64 dst, const __grid_constant__ SrcPtrs srcs, u32 n, u64 count) {          \
    extern __shared__ V16 purlin_atom_smem[];                                                                \
    typedef T::storage S;                                                                                    \
    u64 b, e;                                                                                                \
    block_share(count, 4096 / sizeof(S), &b, &e);                                                            \
    reduce<T, OP>((S*)dst + b, (const void* const*)srcs.p, n, e - b, b * sizeof(S), purlin_atom_smem);       \
  }

#define PURLIN_ATOM_REDUCE_OPS(TNAME, T)          \
  PURLIN_ATOM_REDUCE_KERNEL(TNAME##_sum, T, Sum)   \
  PURLIN_ATOM_REDUCE_KERNEL(TNAME##_prod, T, Prod) \
  PURLIN_ATOM_REDUCE_KERNEL(TNAME##_min, T, Min)   \
  PURLIN_ATOM_REDUCE_KERNEL(TNAME##_max, T, Max)   \
  PURLIN_ATOM_REDUCE_KERNEL(TNAME##_mean, T, Mean)

// One translation unit per element type keeps each NVRTC compile short (purlin-atom
// compiles them lazily and in parallel): -DPURLIN_ATOM_WITH_<TYPE> selects the reduce and
// conversion kernels; without any, the unit holds the copy kernel only.
#ifdef PURLIN_ATOM_WITH_F32
PURLIN_ATOM_REDUCE_OPS(f32, F32)
#endif
#ifdef PURLIN_ATOM_WITH_F16
PURLIN_ATOM_REDUCE_OPS(f16, F16)
#endif
#ifdef PURLIN_ATOM_WITH_BF16
PURLIN_ATOM_REDUCE_OPS(bf16, BF16)
#endif
#ifdef PURLIN_ATOM_WITH_E4M3
PURLIN_ATOM_REDUCE_OPS(e4m3, E4M3)
#endif
#ifdef PURLIN_ATOM_WITH_E5M2
PURLIN_ATOM_REDUCE_OPS(e5m2, E5M2)
#endif
#ifdef PURLIN_ATOM_WITH_I32
PURLIN_ATOM_REDUCE_OPS(i32, I32)
#endif
#ifdef PURLIN_ATOM_WITH_U32
PURLIN_ATOM_REDUCE_OPS(u32, U32)
#endif

// Conversions, for the device tests: decode codes to f32 bits, encode f32 bits to codes.
// Whole 16-byte vectors go through T::unpack/T::pack, the reduce path (for bf16 on sm_80+
// the paired hardware encode with its NaN fix-up), the rest (and pointers that are not
// 16-byte aligned) through T::decode/T::encode, the scalar path of heads and tails.
#define PURLIN_ATOM_CONVERT_KERNELS(TNAME, T)                                                          \
  extern "C" __global__ void purlin_atom_decode_##TNAME(u32* out, const T::storage* in, u64 n) {       \
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;  \
    const bool vec = (((u64)out | (u64)in) & 15u) == 0;                                                \
    const u64 nv = vec ? n / T::kLanes : 0;                                                            \
    for (u64 j = first; j < nv; j += step) {                                                           \
      T::acc a[T::kLanes];                                                                             \
      T::unpack(ld_global_v16(in + j * T::kLanes), a);                                                 \
      for (u32 e = 0; e < T::kLanes; ++e) out[j * T::kLanes + e] = __float_as_uint(a[e]);              \
    }                                                                                                  \
    for (u64 i = nv * T::kLanes + first; i < n; i += step) out[i] = __float_as_uint(T::decode(in[i])); \
  }                                                                                                    \
  extern "C" __global__ void purlin_atom_encode_##TNAME(T::storage* out, const u32* in, u64 n) {       \
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;  \
    const bool vec = (((u64)out | (u64)in) & 15u) == 0;                                                \
    const u64 nv = vec ? n / T::kLanes : 0;                                                            \
    for (u64 j = first; j < nv; j += step) {                                                           \
      T::acc a[T::kLanes];                                                                             \
      for (u32 e = 0; e < T::kLanes; ++e) a[e] = __uint_as_float(in[j * T::kLanes + e]);               \
      st_global_v16(out + j * T::kLanes, T::pack(a));                                                  \
    }                                                                                                  \
    for (u64 i = nv * T::kLanes + first; i < n; i += step) out[i] = T::encode(__uint_as_float(in[i])); \
  }
#ifdef PURLIN_ATOM_WITH_F16
PURLIN_ATOM_CONVERT_KERNELS(f16, F16)
#endif
#ifdef PURLIN_ATOM_WITH_BF16
PURLIN_ATOM_CONVERT_KERNELS(bf16, BF16)
#endif
#ifdef PURLIN_ATOM_WITH_E4M3
PURLIN_ATOM_CONVERT_KERNELS(e4m3, E4M3)
#endif
#ifdef PURLIN_ATOM_WITH_E5M2
PURLIN_ATOM_CONVERT_KERNELS(e5m2, E5M2)
#endif
