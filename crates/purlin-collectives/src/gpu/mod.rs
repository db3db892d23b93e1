//! The GPU backend: [`Comm`] (shaped like `cudarc::nccl::Comm`), the device executor that
//! launches a plan as one kernel, the catalogue of CUDA translation units, and the CUDA-IPC
//! and peer-access backends of the symmetric workspace; [`hier::HierComm`], the world across
//! nodes (Purlin inside each, NCCL between).

pub mod comm;
pub mod executor;
#[cfg(feature = "nccl")]
pub mod hier;
pub mod ipc;
pub mod kernels;
