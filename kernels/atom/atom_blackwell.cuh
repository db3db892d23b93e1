// The Blackwell Atom (sm_100): compile-checked only (no Blackwell GPU here); for
// now the cp.async pipeline with Hopper's sizing. Paired f32 math and 32-byte accesses
// are future work.
// Supplied to executors as "atom_impl.cuh".
#pragma once
#if __has_include("atom_config.cuh")
#include "atom_config.cuh"
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 1000
#error "this Atom needs sm_100+"
#endif
#include "atom_common.cuh"
#include "engine_cp_async.cuh"
#include "engine_bulk.cuh"

#ifndef PURLIN_ATOM_THREADS
#define PURLIN_ATOM_THREADS 512
#endif
#ifndef PURLIN_ATOM_STAGES
#define PURLIN_ATOM_STAGES 5
#endif
#ifndef PURLIN_ATOM_VECS
#define PURLIN_ATOM_VECS 2
#endif

namespace purlin {
namespace atom {
constexpr u32 kGeneration = 4;
constexpr u32 kThreads = PURLIN_ATOM_THREADS;
#if defined(PURLIN_ATOM_BULK) && PURLIN_ATOM_BULK
// Opt-in: copy through the bulk-copy (TMA) engine; reduce stays on cp.async.
typedef BulkEngine<PURLIN_ATOM_STAGES, PURLIN_ATOM_VECS> Engine;
#else
typedef CpAsyncEngine<PURLIN_ATOM_STAGES, PURLIN_ATOM_VECS> Engine;
#endif
}  // namespace atom
}  // namespace purlin

#include "atom_api.cuh"
