//! Purlin: single-kernel, intra-node GPU collectives for NVLink-connected NVIDIA GPUs.
//!
//! This crate joins the protocol (purlin-snac) and the datapath (purlin-atom) on the
//! machine described by purlin-topo, and is the public API:
//!
//! - [`Comm`]: a GPU communicator shaped like `cudarc::nccl::Comm` (its calls, its `i32`
//!   peers and roots, its [`Status`]), plus Purlin's additions: AllToAll and the V forms,
//!   in-place AllGather and ReduceScatter, symmetric buffers ([`Comm::alloc_symmetric`]),
//!   [`Comm::from_env`] under torchrun. [`nccl`] is the drop-in module for `cudarc::nccl`.
//! - [`CpuComm`]: the same calls on CPU threads over host memory, through the same verified
//!   plans (what CI tests every collective with, without a GPU).
//! - [`HierComm`]: a world across nodes — Purlin inside each node, NCCL between them
//!   (docs/multi-node.md); [`CpuHierComm`] is its host twin.
//! - [`snac`]: the protocol crate, to derive and verify plans offline.
//!
//! [`Comm`], [`CpuComm`], their configurations, [`SymmetricBuffer`] and
//! [`CpuSymmetricBuffer`] are `Send + Sync` (checked at compile time, no `unsafe impl`
//! needed): move a communicator into the thread that drives its rank, or share it by
//! reference. A rank's collectives still form one sequence that every rank issues in the same
//! order, so calls on one communicator from several threads need the caller's own ordering.
//!
//! Inside, by concern: `call` (a user's call → a validated spec, tuning, the verification
//! cache; backend-neutral), `bootstrap` (ranks meeting over threads or a Unix socket, [`Id`],
//! torchrun's environment), `workspace` (the symmetric workspace's layout and set-up
//! protocol), `gpu` (`Comm`, the device executor, the kernel catalogue, CUDA IPC), `cpu`
//! (`CpuComm`, the host executor), `hier` (the hierarchy across nodes, backend-neutral, and
//! its host twin), `diag` (diagnostics for tests and tools).
//!
//! ```
//! use purlin_collectives::{CpuComm, ReduceOp};
//!
//! let comms = CpuComm::threads(2)?;
//! std::thread::scope(|s| {
//!     for comm in &comms {
//!         s.spawn(move || {
//!             let send = vec![comm.rank() as f32 + 1.0; 4];
//!             let mut recv = vec![0.0f32; 4];
//!             comm.all_reduce(&send, &mut recv, &ReduceOp::Sum).expect("all_reduce");
//!             assert_eq!(recv, [3.0; 4]);
//!         });
//!     }
//! });
//! # Ok::<(), purlin_collectives::Error>(())
//! ```
//!
//! Architecture invariant: purlin-collectives is the only library crate that depends on
//! both purlin-snac and purlin-atom.
#![deny(unsafe_op_in_unsafe_fn)]

mod bootstrap;
mod call;
mod cpu;
mod diag;
mod error;
mod flight;
mod gpu;
mod hier;
pub mod nccl;
#[cfg(feature = "nvtx")]
mod nvtx;
mod observe;
mod thread_safety;
mod workspace;

pub use bootstrap::{Id, TorchEnv};
pub use call::Call;
pub use call::types::{DataType, NcclType, ReduceOp, ReduceType, Status};
pub use cpu::{CallInfo, CpuBuffer, CpuBufferMut, CpuComm, CpuConfig, CpuGroup, CpuSymmetricBuffer, CpuType};
pub use error::Error;
pub use flight::{Executor, FLIGHT_CALLS, FlightEntry, FlightRecorder, HangReport, RankCall};
pub use gpu::comm::{
    CollectiveArgs, Comm, CommConfig, FusedCall, FusedKernel, FusedLaunch, Group, OnStream, RawBuffer, SymmetricBuffer,
    TeardownReport, Untracked, group_end, group_start,
};
#[cfg(feature = "nccl")]
pub use gpu::hier::HierComm;
pub use hier::HierShape;
pub use hier::host::CpuHierComm;

pub use purlin_snac as snac;
pub use purlin_topo::{MAX_WORLD, device_count, driver_present};

/// The library's insides, for its own tests, benchmarks, examples and tools: no stability
/// promise, and hidden from the docs.
#[doc(hidden)]
pub mod internal {
    pub use crate::bootstrap::id::ID_BYTES;
    pub use crate::bootstrap::{DEFAULT_TIMEOUT, HostComm};
    pub use crate::call::{Call, Transfer, tuning, verified};
    pub use crate::cpu::executor as host_executor;
    pub use crate::diag::{CoResidency, Diag, PingPong, PingPongLaunch, conformance, smoke};
    pub use crate::gpu::comm::{KernelRequest, LoadedKernel, fused_unit};
    pub use crate::gpu::executor as device_executor;
    pub use crate::gpu::{ipc, kernels};

    /// The symmetric workspace: layout and set-up protocol.
    pub mod workspace {
        pub use crate::workspace::*;
    }
}

/// The README's examples, compiled and run as doctests (the CPU one runs in CI).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;
