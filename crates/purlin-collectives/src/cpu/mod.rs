//! The CPU backend: [`CpuComm`], every collective on CPU threads through the same verified
//! plans as the GPU, executed by the host executor over host memory. CI runs the whole plan
//! path with it, without a GPU.

pub mod buffer;
pub mod comm;
pub mod executor;

pub use buffer::{CpuBuffer, CpuBufferMut, CpuSymmetricBuffer, CpuType};
pub use comm::{CallInfo, CpuComm, CpuConfig, CpuGroup};
