//! Purlin's datapath: the **Atom**.
//!
//! Two primitives, `copy` and N-to-1 `reduce`, on local or peer device pointers (one CUDA
//! implementation per GPU generation, in `kernels/atom/`) and on host memory.
//!
//! Module map:
//! - [`dtype`]: element types ([`DType`], [`AtomElem`], the fp8 types) and [`ReduceOp`].
//! - [`host`]: the host Atom, the same contract on CPU memory, bit for bit.
//! - [`generation`]: [`Generation`] (chosen from the compute capability, overridable),
//!   [`AtomSpec`] (generation + sizing) and the headers an executor's translation unit gets.
//! - [`sources`]: the CUDA sources, embedded, and the standalone kernels' translation units.
//! - [`nvrtc`]: libnvrtc discovery, NVRTC → CUBIN, the on-disk [`KernelCache`].
//! - [`device`]: [`DeviceAtom`], the standalone device API (raw and on cudarc buffers).
//! - [`copy_engine`]: [`CopyEngine`], copies on the GPU's copy engines (no SMs), ordered
//!   with stream word writes and waits; [`host_copy_engine`] is its host twin.
//!
//! Architecture invariant: this crate knows nothing about collectives, ranks' roles,
//! signals or epochs. It depends only on hardware crates (cudarc), never on purlin-snac.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod copy_engine;
pub mod cubin;
pub mod device;
pub mod dtype;
pub mod generation;
pub mod host;
pub mod host_copy_engine;
pub mod nvrtc;
pub mod sources;

pub use copy_engine::{CopyEngine, CopyEngineError, CopyOp, WaitCondition};
pub use device::{AtomError, DeviceAtom, DeviceBuffer, MAX_SOURCES};
pub use dtype::{AtomElem, DType, F8E4M3, F8E5M2, ReduceOp};
pub use generation::{AtomParams, AtomSpec, Generation, GenerationError, atom_headers};
pub use host_copy_engine::{HostCopyEngine, HostCopyError, HostWord};
pub use nvrtc::{Arch, CompiledKernel, FunctionResources, KernelCache, NvrtcError, TranslationUnit};
