//! The CUDA sources the Atom exports to the executors.
//!
//! An executor and its Atom form one NVRTC translation unit: the executor includes only
//! [`ATOM_INTERFACE_NAME`]; the compiler supplies the interface and the chosen
//! generation's implementation as named headers.

/// The name under which the Atom interface header is included by executors.
pub const ATOM_INTERFACE_NAME: &str = "atom.cuh";
/// The Atom interface header (DESIGN.md §4): the device contract of `copy` and `reduce`.
pub const ATOM_INTERFACE: &str = include_str!("../../../kernels/atom/atom.cuh");
