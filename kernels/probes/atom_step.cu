// Round 98 probe: what one Atom copy or 2-source reduce of a small per-block share costs on
// its own (the executor's block shape: 512 threads, the Hopper Atom's sizing t512 s5 v2),
// against the in-situ cost of repeating such a step in the interpreter (round 97).
// Each block times ITERS back-to-back calls on its share with %globaltimer; "hot": the same
// addresses every call (L2-resident), "cold": each call 256 KiB further into a 1 GiB buffer.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "atom.cuh"

typedef unsigned long long u64;
typedef unsigned char u8;

__device__ __forceinline__ u64 gtime() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

// mode: 0 copy, 1 reduce (2 sources), 2 nothing but the two barriers a step pays
extern "C" __global__ void __launch_bounds__(512) probe(u8* dst, const u8* a, const u8* b, u64 share, u64 stride,
                                                        u64 span, int iters, int mode, u64* out) {
  extern __shared__ __align__(128) u8 smem[];
  __syncthreads();
  const u64 t0 = gtime();
  for (int i = 0; i < iters; ++i) {
    const u64 off = (u64)blockIdx.x * share + ((u64)i * stride) % span;
    if (mode == 0) {
      purlin::atom::copy(dst + off, a + off, share, smem);
    } else if (mode == 1) {
      const void* ptrs[2] = {a + off, b + off};
      purlin::atom::reduce<purlin::atom::F32, purlin::atom::Sum>(dst + off, ptrs, 2, share / 4, smem);
    } else {
      __syncthreads();
      __syncthreads();
    }
  }
  __syncthreads();
  const u64 t1 = gtime();
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

int main() {
  const u64 span = 1ull << 30;
  u8 *a, *b, *d;
  u64* out;
  CK(cudaMalloc(&a, span)); CK(cudaMalloc(&b, span)); CK(cudaMalloc(&d, span));
  CK(cudaMemset(a, 1, span)); CK(cudaMemset(b, 2, span)); CK(cudaMemset(d, 0, span));
  CK(cudaMalloc(&out, 1024 * 8));
  const int smem = purlin::atom::kSmemBytes;
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const char* names[] = {"copy", "reduce2", "barriers"};
  const int iters = 200;
  for (int mode = 0; mode < 3; ++mode) {
    for (u64 share : {1024ull, 4096ull, 16384ull, 65536ull}) {
      for (int blocks : {1, 32}) {
        for (int cold = 0; cold < 2; ++cold) {
          const u64 stride = cold ? (256ull << 10) : 0;
          const u64 sp = cold ? span - (u64)blocks * share : 1;
          std::vector<double> per;
          for (int rep = 0; rep < 5; ++rep) {
            probe<<<blocks, 512, smem>>>(d, a, b, share, stride, sp, iters, mode, out);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            std::vector<u64> h(blocks);
            CK(cudaMemcpy(h.data(), out, blocks * 8, cudaMemcpyDeviceToHost));
            std::sort(h.begin(), h.end());
            per.push_back((double)h[blocks / 2] / iters);
          }
          std::sort(per.begin(), per.end());
          printf("ATOM-STEP %-8s share %6llu B blocks %2d %s: %7.1f ns per call (median block, median of 5; min %7.1f)\n",
                 names[mode], share, blocks, cold ? "cold" : "hot ", per[2], per[0]);
          if (mode == 2) break;
        }
        if (mode == 2 && blocks == 1) continue;
      }
      if (mode == 2) break;
    }
  }
  // correctness: one reduce of 16 KiB per block, checked (1.0f bytes patterns are not floats;
  // check the copy instead: d == a after a copy).
  probe<<<32, 512, smem>>>(d, a, b, 16384, 0, 1, 1, 0, out);
  CK(cudaDeviceSynchronize());
  std::vector<u8> h(32 * 16384);
  CK(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost));
  long wrong = 0;
  for (u8 x : h) wrong += x != 1;
  printf("ATOM-STEP copy check: %ld wrong bytes of %zu\n", wrong, h.size());
  return 0;
}
