// Probe: hardware floor of the executor's step kinds (one GPU), and %globaltimer resolution.
#include <cstdio>
#include <cstdint>
typedef unsigned long long u64;
__device__ __forceinline__ u64 gt() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u64 ld_acq(const u64* p) { u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_rel(u64* p, u64 v) { asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u64 ld_rlx(const u64* p) { u64 v; asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_release(u64* p, u64 v) { asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
struct Chain { u64 w[256]; };
__device__ __forceinline__ void fence() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__global__ void timer_res(u64* out) {
  if (threadIdx.x != 0) return;
  u64 prev = gt(), mind = ~0ull, changes = 0, start = prev;
  for (int i = 0; i < 200000; ++i) { u64 t = gt(); if (t != prev) { u64 d = t - prev; if (d < mind) mind = d; ++changes; prev = t; } }
  out[0] = mind; out[1] = changes; out[2] = prev - start;
}

// kind: 0 empty barrier pair, 1 signal no fence, 2 signal with fence, 3 wait on set flag,
// 4 copy 1 KiB (64 threads x 16 B), 5 copy 16 KiB, 6 signal+fence after a 1 KiB copy
template <int KIND>
__global__ void __launch_bounds__(512) steps(u64* flags, uint4* dst, const uint4* src, int iters, u64* out) {
  const int t = threadIdx.x;
  u64* flag = flags + blockIdx.x * 16;
  uint4* d = dst + blockIdx.x * 1024; const uint4* s = src + blockIdx.x * 1024;
  __syncthreads();
  u64 g0 = gt(); long long c0 = clock64();
  for (int i = 0; i < iters; ++i) {
    if (KIND == 1) { __syncthreads(); if (t == 0) st_rel(flag, i + 1); }
    if (KIND == 2) { __syncthreads(); if (t == 0) { fence(); st_rel(flag, i + 1); } }
    if (KIND == 3) { if (t == 0) { while (ld_acq(flag + 8) < 1) {} } }
    if (KIND == 4) { if (t < 64) d[t] = s[t]; }
    if (KIND == 5) { uint4 a = s[t], b = s[t + 512]; d[t] = a; d[t + 512] = b; }
    if (KIND == 7) { if (t == 0) { while (ld_rlx(flag + 8) < 1) {} } }
    if (KIND == 8) { __syncthreads(); if (t == 0) st_release(flag, i + 1); }
    if (KIND == 9) { __syncthreads(); if (t == 0) { fence_gpu(); st_rel(flag, i + 1); } }
    if (KIND == 6) { if (t < 64) d[t] = s[t]; __syncthreads(); if (t == 0) { fence(); st_rel(flag, i + 1); } }
    __syncthreads();
  }
  long long c1 = clock64(); u64 g1 = gt();
  if (t == 0) { out[blockIdx.x * 2] = g1 - g0; out[blockIdx.x * 2 + 1] = c1 - c0; }
}

// A chain of 8 dependent indexed reads of a __grid_constant__ parameter per step.
__global__ void __launch_bounds__(512) chain(const __grid_constant__ Chain c, int iters, u64* out) {
  u64 j = blockIdx.x % 7;
  __syncthreads();
  u64 g0 = gt(); long long c0 = clock64();
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 8; ++k) j = c.w[j];
  }
  long long c1 = clock64(); u64 g1 = gt();
  if (threadIdx.x == 0) { out[blockIdx.x * 2] = g1 - g0; out[blockIdx.x * 2 + 1] = c1 - c0 + (j == 12345); }
}

template <int K> void run(const char* name, u64* flags, uint4* d, uint4* s, u64* out, int blocks) {
  const int iters = 2000;
  for (int w = 0; w < 2; ++w) steps<K><<<blocks, 512>>>(flags, d, s, iters, out);
  cudaDeviceSynchronize();
  u64 h[512]; cudaMemcpy(h, out, blocks * 16, cudaMemcpyDeviceToHost);
  double ns = 0, cyc = 0; for (int b = 0; b < blocks; ++b) { ns += h[2 * b]; cyc += h[2 * b + 1]; }
  printf("%-28s blocks %3d: %8.1f ns/step  %8.1f cycles/step\n", name, blocks, ns / blocks / iters, cyc / blocks / iters);
}

int main() {
  u64 *flags, *out; uint4 *d, *s;
  cudaMalloc(&flags, 1 << 20); cudaMemset(flags, 0, 1 << 20);
  cudaMalloc(&out, 1 << 16); cudaMalloc(&d, 64 << 20); cudaMalloc(&s, 64 << 20); cudaMemset(s, 1, 64 << 20);
  // the "set" flags for kind 3
  u64 one = 1; for (int b = 0; b < 256; ++b) cudaMemcpy(flags + b * 16 + 8, &one, 8, cudaMemcpyHostToDevice);
  timer_res<<<1, 32>>>(out); cudaDeviceSynchronize();
  u64 h[3]; cudaMemcpy(h, out, 24, cudaMemcpyDeviceToHost);
  printf("globaltimer: min nonzero delta %llu ns, %llu changes over %llu ns\n", h[0], h[1], h[2]);
  for (int blocks : {1, 32}) {
    run<0>("barrier only", flags, d, s, out, blocks);
    run<1>("signal, no fence", flags, d, s, out, blocks);
    run<2>("signal, fence.acq_rel.sys", flags, d, s, out, blocks);
    run<3>("wait, flag set (acquire)", flags, d, s, out, blocks);
    run<4>("copy 1 KiB", flags, d, s, out, blocks);
    run<5>("copy 16 KiB", flags, d, s, out, blocks);
    run<6>("copy 1 KiB + fenced signal", flags, d, s, out, blocks);
    run<7>("wait, flag set (relaxed)", flags, d, s, out, blocks);
    run<8>("signal, st.release.sys", flags, d, s, out, blocks);
    run<9>("signal, fence.acq_rel.gpu", flags, d, s, out, blocks);
    {
      Chain c; for (int k = 0; k < 256; ++k) c.w[k] = (k * 37 + 11) % 256;
      const int iters = 2000;
      for (int w = 0; w < 2; ++w) chain<<<blocks, 512>>>(c, iters, out);
      cudaDeviceSynchronize();
      u64 h[512]; cudaMemcpy(h, out, blocks * 16, cudaMemcpyDeviceToHost);
      double ns = 0, cyc = 0; for (int b = 0; b < blocks; ++b) { ns += h[2 * b]; cyc += h[2 * b + 1]; }
      printf("%-28s blocks %3d: %8.1f ns/read  %8.1f cycles/read\n", "dependent param read", blocks, ns / blocks / iters / 8, cyc / blocks / iters / 8);
    }
  }
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
