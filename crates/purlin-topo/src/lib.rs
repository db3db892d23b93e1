//! What the machine is: the GPUs Purlin runs on and how they are linked.
//!
//! Architecture invariant: purlin-topo describes hardware only; it knows nothing about
//! collectives (no purlin-snac) or datapaths (no purlin-atom).
#![deny(unsafe_op_in_unsafe_fn)]

/// Whether the CUDA driver library can be loaded on this machine.
///
/// cudarc panics when a library is missing; every GPU path asks this first.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen libcuda and reports whether it could.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The number of CUDA devices, or 0 where there is no driver or no device.
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    cudarc::driver::result::init()
        .and_then(|()| cudarc::driver::result::device::get_count())
        .map_or(0, |n| usize::try_from(n).unwrap_or(0))
}
