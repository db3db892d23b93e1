// The Ampere Atom (sm_80+): a cp.async global -> shared pipeline for copy and for
// rank-interleaved reduce (engine_cp_async.cuh).
// Supplied to executors as "atom_impl.cuh".
#pragma once
#if __has_include("atom_config.cuh")
#include "atom_config.cuh"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "this Atom needs sm_80+"
#endif
#include "atom_common.cuh"
#include "engine_cp_async.cuh"

#ifndef PURLIN_ATOM_THREADS
#define PURLIN_ATOM_THREADS 512
#endif
#ifndef PURLIN_ATOM_STAGES
#define PURLIN_ATOM_STAGES 4
#endif
#ifndef PURLIN_ATOM_VECS
#define PURLIN_ATOM_VECS 2
#endif

namespace purlin {
namespace atom {
constexpr u32 kGeneration = 2;
constexpr u32 kThreads = PURLIN_ATOM_THREADS;
typedef CpAsyncEngine<PURLIN_ATOM_STAGES, PURLIN_ATOM_VECS> Engine;
}  // namespace atom
}  // namespace purlin

#include "atom_api.cuh"
