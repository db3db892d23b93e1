//! The communicator's typed errors. Every error about another rank names it.

use std::time::Duration;

/// Errors of communicator set-up, host-side rendezvous, the symmetric workspace and calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {error}")]
    Driver {
        /// The driver function (or cudarc method).
        call: &'static str,
        /// The driver's error.
        error: cudarc::driver::DriverError,
    },
    /// The machine cannot run Purlin's peer path (no peer access, mixed GPUs, ...).
    #[error(transparent)]
    Topology(#[from] purlin_topo::TopoError),
    /// Kernel compilation or the kernel cache failed.
    #[error(transparent)]
    Nvrtc(#[from] purlin_atom::NvrtcError),
    /// An argument is invalid (nothing was changed).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A torchrun environment variable is missing or malformed.
    #[error("environment variable {var}: {problem}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A host-side wait for a peer expired (the peer is alive but did not arrive): set-up,
    /// barriers, symmetric allocation, teardown, bounded by `CommConfig::timeout`; every
    /// wait of a `CpuComm`, bounded by `CpuConfig::timeout`.
    #[error("rank {rank}: host wait for rank {peer} timed out after {waited:?} ({during})")]
    Timeout {
        /// This rank.
        rank: usize,
        /// The rank that did not arrive.
        peer: usize,
        /// How long we waited.
        waited: Duration,
        /// What we were doing.
        during: String,
    },
    /// A peer's connection closed: its process exited or was killed.
    #[error("rank {rank}: lost rank {peer} ({during}): its process exited or was killed")]
    PeerLost {
        /// This rank.
        rank: usize,
        /// The lost rank.
        peer: usize,
        /// What we were doing.
        during: String,
    },
    /// A device-side bounded wait of a collective expired: the peer did not signal in time
    /// (it skipped the call, died or hangs), bounded by `CommConfig::device_timeout`.
    #[error("rank {rank}: device wait for rank {peer} timed out after {waited:?} ({during})")]
    DeviceTimeout {
        /// This rank.
        rank: usize,
        /// The rank whose signal never came.
        peer: usize,
        /// The device wait's bound.
        waited: Duration,
        /// What the kernel was waiting for.
        during: String,
    },
    /// The communicator was poisoned by an earlier timeout or peer loss; it cannot be used.
    #[error("communicator poisoned: {0}")]
    Poisoned(String),
    /// Ranks disagree (world size, configuration, workspace layout, ...).
    #[error("rank {rank} and rank {peer} disagree: {what}")]
    Mismatch {
        /// This rank.
        rank: usize,
        /// The disagreeing rank.
        peer: usize,
        /// On what.
        what: String,
    },
    /// Another rank failed a set-up step (it reported its own error, quoted here).
    #[error("rank {rank}: rank {peer} failed {during}: {error}")]
    PeerFailed {
        /// This rank.
        rank: usize,
        /// The rank that failed.
        peer: usize,
        /// The step.
        during: String,
        /// Its error, as text.
        error: String,
    },
    /// A malformed or unexpected rendezvous message.
    #[error("rendezvous protocol error with rank {peer:?}: {what}")]
    Protocol {
        /// The rank it came from, if known.
        peer: Option<usize>,
        /// What was wrong.
        what: String,
    },
    /// A socket operation failed for a reason other than a timeout or a closed peer.
    #[error("rendezvous socket ({what}): {source}")]
    Io {
        /// The operation.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The operation, dtype or op is not supported (yet).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The call's arguments do not make a valid collective (sizes, counts, world, dtype/op).
    #[error(transparent)]
    Spec(#[from] purlin_snac::SpecError),
    /// No plan could be made for the call with this communicator's resources.
    #[error("no plan for this call: {0}")]
    Plan(#[from] purlin_snac::DeriveError),
    /// The NCCL step of a hierarchical communicator (`HierComm`) failed or did not settle in
    /// time; its NCCL communicators were aborted and it is poisoned.
    #[error("rank {rank}: NCCL {call} failed: {error}")]
    Nccl {
        /// This rank (global).
        rank: usize,
        /// The NCCL function.
        call: &'static str,
        /// NCCL's error, as text.
        error: String,
    },
}

impl Error {
    /// The peer this error names, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Timeout { peer, .. }
            | Error::PeerLost { peer, .. }
            | Error::DeviceTimeout { peer, .. }
            | Error::Mismatch { peer, .. }
            | Error::PeerFailed { peer, .. } => Some(*peer),
            Error::Protocol { peer, .. } => *peer,
            _ => None,
        }
    }

    /// Whether this error means a peer is gone or unresponsive (the communicator must not
    /// touch its memory again).
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::PeerLost { .. } | Error::DeviceTimeout { .. })
    }
}

/// What a call-check mismatch asks of the caller (both executors' `Error::Mismatch`).
pub(crate) const SAME_CALLS: &str = "every rank must make the same collective calls in the same order, with the same \
     counts, element type and operation, and all on symmetric buffers or none";

/// Maps a cudarc driver error, naming the call.
pub(crate) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |error| Error::Driver { call, error }
}
