//! The drop-in for `cudarc::nccl`: a program written against cudarc's NCCL wrapper compiles
//! against Purlin by changing its `use cudarc::nccl::...` line to `use purlin_collectives::nccl::...`.
//!
//! Differences a caller can see: errors are [`Error`] (a `std::error::Error`, unlike
//! `NcclError`), statuses are [`Status`] (cudarc's `NcclStatus`), and `Id::new` makes a
//! Purlin id (it names a Unix socket, not an NCCL bootstrap).

pub use crate::comm::{Comm, CommConfig, DataType, Group, NcclType, ReduceOp, Status, group_end, group_start};
pub use crate::error::Error;
pub use crate::id::Id;

/// cudarc's name for [`Status`].
pub type NcclStatus = Status;
/// cudarc's name for the error type.
pub type NcclError = Error;
