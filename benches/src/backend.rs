//! What runs a collective: the [`Backend`] trait, and the backends the benchmark knows —
//! NCCL plain, NCCL with symmetric windows, and Purlin.

use std::fmt;

use serde::Serialize;

use crate::case::Case;

/// Which backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Purlin's communicator (`purlin_collectives::Comm`).
    Purlin,
    /// NCCL on `cuMemAlloc` buffers.
    Nccl,
    /// NCCL on `ncclMemAlloc` buffers registered as symmetric windows
    /// (`ncclCommWindowRegister(.., NCCL_WIN_COLL_SYMMETRIC)`): NCCL's own low-latency kernels.
    NcclSymm,
}

impl BackendKind {
    /// Every backend, in column order.
    pub const ALL: [BackendKind; 3] = [BackendKind::Purlin, BackendKind::Nccl, BackendKind::NcclSymm];

    /// The command-line (and column) name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Purlin => "purlin",
            BackendKind::Nccl => "nccl",
            BackendKind::NcclSymm => "nccl-symm",
        }
    }

    /// Parses a comma-separated list (`all` for every backend); keeps column order.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<BackendKind>> {
        let mut want = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                want.extend(BackendKind::ALL);
                continue;
            }
            match BackendKind::ALL.iter().find(|b| b.name() == part) {
                Some(b) => want.push(*b),
                None => anyhow::bail!("unknown backend {part:?}; expected purlin, nccl, nccl-symm or all"),
            }
        }
        let out: Vec<BackendKind> = BackendKind::ALL.into_iter().filter(|b| want.contains(b)).collect();
        if out.is_empty() {
            anyhow::bail!("--backends: empty list");
        }
        Ok(out)
    }

    /// Whether this is one of the NCCL baselines.
    pub fn is_nccl(self) -> bool {
        matches!(self, BackendKind::Nccl | BackendKind::NcclSymm)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a backend produced no number for a row (or for the whole run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "kebab-case")]
pub enum Status {
    /// Measured.
    Ok,
    /// The backend exists but this collective is not implemented yet.
    NotImplemented(String),
    /// The backend does not support this case (dtype, op, size, ...).
    Unsupported(String),
    /// The backend could not be set up on this machine (no libnccl, no GPU, ...).
    Unavailable(String),
    /// The backend failed (the run stops: its peers may be stuck in the call).
    Failed(String),
}

impl Status {
    /// A short label for table cells.
    pub fn label(&self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::NotImplemented(_) => "not implemented yet",
            Status::Unsupported(_) => "unsupported",
            Status::Unavailable(_) => "unavailable",
            Status::Failed(_) => "FAILED",
        }
    }

    /// The reason, if any.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Status::Ok => None,
            Status::NotImplemented(r) | Status::Unsupported(r) | Status::Unavailable(r) | Status::Failed(r) => Some(r),
        }
    }

    /// A small code to agree on across ranks.
    pub fn code(&self) -> u64 {
        match self {
            Status::Ok => 0,
            Status::NotImplemented(_) => 1,
            Status::Unsupported(_) => 2,
            Status::Unavailable(_) => 3,
            Status::Failed(_) => 4,
        }
    }
}

/// An error of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError {
    /// Not implemented yet (the same on every rank).
    NotImplemented(String),
    /// Not supported (the same on every rank).
    Unsupported(String),
    /// Anything else: the run stops.
    Failed(String),
}

impl From<CallError> for Status {
    fn from(e: CallError) -> Status {
        match e {
            CallError::NotImplemented(r) => Status::NotImplemented(r),
            CallError::Unsupported(r) => Status::Unsupported(r),
            CallError::Failed(r) => Status::Failed(r),
        }
    }
}

/// A collectives implementation under test, one instance per rank.
///
/// The backend owns its send and receive buffers (sized at set-up for the sweep's largest
/// case, allocated however it needs: `cuMemAlloc`, `ncclMemAlloc`, its own symmetric heap);
/// the runner fills the send buffer, poisons the receive buffer and reads it back through the
/// raw device pointers. [`Backend::enqueue`] issues one call on the rank's stream without
/// synchronizing, and must be capturable into a CUDA graph.
pub trait Backend {
    /// Which backend.
    fn kind(&self) -> BackendKind;
    /// The device pointer of the send buffer.
    fn send_ptr(&self) -> u64;
    /// The device pointer of the receive buffer.
    fn recv_ptr(&self) -> u64;
    /// Whether `case` can run; the answer must be the same on every rank.
    fn supports(&self, case: &Case) -> Result<(), CallError>;
    /// Issues one call of `case` on the stream.
    fn enqueue(&mut self, case: &Case) -> Result<(), CallError>;
    /// An asynchronous error the backend knows of (checked while waiting for the stream).
    fn async_error(&self) -> Option<String> {
        None
    }
    /// Called when the run stops on a failure: tear down without waiting for peers.
    fn abort(&mut self) {}
}
