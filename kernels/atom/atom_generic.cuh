// The generic Atom (sm_75+): 16-byte vector loads and stores through registers, several
// loads in flight per thread. Supplied to executors as "atom_impl.cuh".
#pragma once
#if __has_include("atom_config.cuh")
#include "atom_config.cuh"
#endif
#include "atom_common.cuh"
#include "engine_regs.cuh"

#ifndef PURLIN_ATOM_THREADS
#define PURLIN_ATOM_THREADS 512
#endif
#ifndef PURLIN_ATOM_UNROLL
#define PURLIN_ATOM_UNROLL 8
#endif

namespace purlin {
namespace atom {
constexpr u32 kGeneration = 1;
constexpr u32 kThreads = PURLIN_ATOM_THREADS;
typedef RegEngine<PURLIN_ATOM_UNROLL> Engine;
}  // namespace atom
}  // namespace purlin

#include "atom_api.cuh"
