//! Helpers shared by the xtask binary and its tests: the workspace root and the
//! architecture checks of ARCHITECTURE.md.

pub mod architecture;
pub mod docs;

use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The pinned NVRTC wheel (docs/dev/device.md: keep 13.0; a newer NVRTC's output can be refused by
/// the 13.0 driver on the GPU machine).
pub const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc==13.0.88";

/// Where `cargo xtask nvrtc` installs the pinned wheel.
pub fn nvrtc_install_dir() -> PathBuf {
    workspace_root().join("target/nvrtc-13.0.88")
}

/// The library directory inside the installed wheel.
pub fn nvrtc_lib_dir() -> PathBuf {
    nvrtc_install_dir().join("nvidia/cu13/lib")
}
