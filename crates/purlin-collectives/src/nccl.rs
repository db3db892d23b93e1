//! The drop-in for `cudarc::nccl`: a program written against cudarc's NCCL wrapper compiles
//! against Purlin by changing its `use cudarc::nccl::...` line to `use purlin_collectives::nccl::...`.
//!
//! Differences a caller can see: errors are [`Error`] (a `std::error::Error`, unlike
//! `NcclError`), statuses are [`Status`] (cudarc's `NcclStatus`), and `Id::new` makes a
//! Purlin id (it names a Unix socket, not an NCCL bootstrap), and reductions take only the
//! element types Purlin reduces ([`ReduceType`]: a reduction of `f64`, `i64`, `u64`, `i8` or
//! `u8` does not compile).

pub use crate::bootstrap::Id;
pub use crate::call::types::{DataType, NcclType, ReduceOp, ReduceType, Status};
pub use crate::error::Error;
pub use crate::gpu::comm::{Comm, CommConfig, Group, group_end, group_start};

/// cudarc's name for [`Status`].
pub type NcclStatus = Status;
/// cudarc's name for the error type.
pub type NcclError = Error;
