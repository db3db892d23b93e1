// Purlin's Atom for your own kernels: copy() and reduce<T, Op>() of one block's share, on
// local or peer pointers (a symmetric buffer's peers, `SymmetricBuffer::peer_addresses`).
// The contract (every thread of the block calls with the same arguments, `smem` at least
// purlin::atom::kSmemBytes of dynamic shared memory, completion at return) is written in
// kernels/atom/atom.cuh, which this header includes; `FusedKernel` hands both to NVRTC.
#pragma once
#include "atom.cuh"
