//! Purlin's datapath: the **Atom**.
//!
//! Two primitives, `copy` and N-to-1 `reduce`, on local or peer device pointers
//! (one CUDA implementation per GPU generation, in `kernels/atom/`) and on host memory.
//!
//! Architecture invariant: this crate knows nothing about collectives, ranks' roles,
//! signals or epochs. It depends only on hardware crates (cudarc), never on purlin-snac.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod nvrtc;
pub mod sources;

pub use nvrtc::{Arch, CompiledKernel, KernelCache, NvrtcError, TranslationUnit};
