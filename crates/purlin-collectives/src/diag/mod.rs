//! Diagnostics compiled into the library for the GPU tests, the examples and the benchmark's
//! probes: the flag ping-pong and workspace reads ([`crate::Comm::diag`]), the device smoke
//! tests, and the conformance harness that checks the device executor against the host one.

pub mod conformance;
pub mod smoke;

pub use crate::gpu::comm::diag::{CoResidency, Diag, PingPong, PingPongLaunch};
