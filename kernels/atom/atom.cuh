// The Atom interface (DESIGN.md §4): the only Atom header an executor may include.
//
// Contract, for one block's share of the work:
//   copy(dst, src, bytes)               dst and src may be local or peer pointers
//   reduce<T, Op>(dst, srcs, n, count)  combines n sources in rank order (deterministic),
//                                       accumulating 8- and 16-bit types in f32
// Completion: when copy()/reduce() returns in every thread of the block, all its reads
// of the sources and writes of the destination are performed and visible to ordinary
// (generic-proxy) accesses of that block. The Atom owns its own async-copy waits and
// proxy fences; callers add only the protocol's ordering (kernels/snac/sync.cuh).
//
// The generation's implementation is supplied by the compiler (purlin-atom) under the
// include name "atom_impl.cuh"; this header never names an architecture's file.
#pragma once

namespace purlin {
namespace atom {

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

}  // namespace atom
}  // namespace purlin

#if __has_include("atom_impl.cuh")
#include "atom_impl.cuh"
#endif
