//! Purlin: single-kernel, intra-node GPU collectives for NVLink-connected NVIDIA GPUs.
//!
//! This crate joins the protocol (purlin-snac) and the datapath (purlin-atom) on the
//! machine described by purlin-topo, and is the public API.
//!
//! Architecture invariant: purlin-collectives is the only library crate that depends on
//! both purlin-snac and purlin-atom.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod comm;
#[doc(hidden)]
pub mod conformance;
pub mod cpu;
pub mod cpu_symmetric;
pub mod device;
pub mod error;
pub mod exec_device;
pub mod host;
pub mod host_exec;
pub mod id;
pub mod kernels;
pub mod nccl;
pub mod smoke;
pub mod symmetric;
pub mod tuning;
pub mod verification;
pub mod workspace;

pub use comm::{Comm, CommConfig, ReduceOp};
pub use cpu::{CpuComm, CpuConfig};
pub use cpu_symmetric::{CpuBuffer, CpuBufferMut, CpuSymmetricBuffer};
pub use error::Error;
pub use id::Id;
pub use symmetric::SymmetricBuffer;

pub use purlin_atom as atom;
pub use purlin_snac as snac;
pub use purlin_topo as topo;
