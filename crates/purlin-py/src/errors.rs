//! Purlin's typed errors as Python exceptions: one class per kind of failure, all subclasses
//! of `PurlinError` (a `RuntimeError`), each instance carrying `rank` (the rank that raised it,
//! where known) and `peer` (the other rank it names, or `None`).

use purlin_collectives::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

pyo3::create_exception!(_purlin, PurlinError, PyRuntimeError, "Every error Purlin raises.");
pyo3::create_exception!(_purlin, InvalidArgumentError, PurlinError, "An argument is invalid; nothing was changed.");
pyo3::create_exception!(
    _purlin,
    UnsupportedError,
    PurlinError,
    "The call, element type or operation is not supported."
);
pyo3::create_exception!(_purlin, SpecError, InvalidArgumentError, "The arguments do not make a valid collective.");
pyo3::create_exception!(_purlin, PlanError, PurlinError, "No plan fits the call with this communicator's resources.");
pyo3::create_exception!(_purlin, PeerError, PurlinError, "A peer is gone, late or failed (`peer` names it).");
pyo3::create_exception!(_purlin, TimeoutError, PeerError, "A wait for a peer expired (host or device).");
pyo3::create_exception!(_purlin, PeerLostError, PeerError, "A peer's process exited or was killed.");
pyo3::create_exception!(_purlin, PeerFailedError, PeerError, "A peer failed a set-up step.");
pyo3::create_exception!(_purlin, MismatchError, PurlinError, "Ranks disagree (their calls or configuration differ).");
pyo3::create_exception!(_purlin, PoisonedError, PurlinError, "The communicator was poisoned by an earlier failure.");
pyo3::create_exception!(_purlin, DriverError, PurlinError, "A CUDA driver call failed.");
pyo3::create_exception!(_purlin, SetupError, PurlinError, "The machine, environment or kernel compiler is not usable.");
pyo3::create_exception!(_purlin, ProtocolError, PurlinError, "The ranks' rendezvous failed (protocol or socket).");

/// The Python exception of `e`, raised on `rank` (where the error itself does not say).
pub fn to_py(e: Error, rank: Option<usize>) -> PyErr {
    let msg = e.to_string();
    let own_rank = match &e {
        Error::Timeout { rank, .. }
        | Error::PeerLost { rank, .. }
        | Error::DeviceTimeout { rank, .. }
        | Error::Mismatch { rank, .. }
        | Error::PeerFailed { rank, .. } => Some(*rank),
        _ => rank,
    };
    let peer = e.peer();
    let err = match &e {
        Error::InvalidArgument(_) => InvalidArgumentError::new_err(msg),
        Error::Spec(_) => SpecError::new_err(msg),
        Error::Unsupported(_) => UnsupportedError::new_err(msg),
        Error::Plan(_) => PlanError::new_err(msg),
        Error::Timeout { .. } | Error::DeviceTimeout { .. } => TimeoutError::new_err(msg),
        Error::PeerLost { .. } => PeerLostError::new_err(msg),
        Error::PeerFailed { .. } => PeerFailedError::new_err(msg),
        Error::Mismatch { .. } => MismatchError::new_err(msg),
        Error::Poisoned(_) => PoisonedError::new_err(msg),
        Error::Driver { .. } => DriverError::new_err(msg),
        Error::Topology(_) | Error::Nvrtc(_) | Error::Env { .. } => SetupError::new_err(msg),
        Error::Protocol { .. } | Error::Io { .. } => ProtocolError::new_err(msg),
        // A kind of error added later is still a PurlinError.
        #[allow(unreachable_patterns)]
        _ => PurlinError::new_err(msg),
    };
    Python::attach(|py| {
        let value = err.value(py);
        // Attributes on a fresh exception instance: setting them cannot fail but for memory.
        let _ = value.setattr("rank", own_rank);
        let _ = value.setattr("peer", peer);
    });
    err
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PurlinError", py.get_type::<PurlinError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("SpecError", py.get_type::<SpecError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("PeerError", py.get_type::<PeerError>())?;
    m.add("TimeoutError", py.get_type::<TimeoutError>())?;
    m.add("PeerLostError", py.get_type::<PeerLostError>())?;
    m.add("PeerFailedError", py.get_type::<PeerFailedError>())?;
    m.add("MismatchError", py.get_type::<MismatchError>())?;
    m.add("PoisonedError", py.get_type::<PoisonedError>())?;
    m.add("DriverError", py.get_type::<DriverError>())?;
    m.add("SetupError", py.get_type::<SetupError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    Ok(())
}
