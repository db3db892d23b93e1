//! NVLink state from NVML, loaded at run time and optional: without `libnvidia-ml.so.1`
//! (or if any call fails) links are reported as [`Link::Unknown`].
//!
//! Only six NVML functions are used, all with plain C signatures; the one struct read
//! (`nvmlPciInfo_t`) is read into an oversized zeroed buffer so a layout change can at worst
//! misreport a link, never overrun memory.

use std::ffi::{CString, c_char, c_int, c_uint, c_void};

use crate::{Link, PcieLevel};

type Handle = *mut c_void;
type InitFn = unsafe extern "C" fn() -> c_int;
type ByBusIdFn = unsafe extern "C" fn(*const c_char, *mut Handle) -> c_int;
type LinkStateFn = unsafe extern "C" fn(Handle, c_uint, *mut c_int) -> c_int;
type RemotePciFn = unsafe extern "C" fn(Handle, c_uint, *mut u8) -> c_int;
type RemoteTypeFn = unsafe extern "C" fn(Handle, c_uint, *mut c_int) -> c_int;
type AncestorFn = unsafe extern "C" fn(Handle, Handle, *mut c_int) -> c_int;

const NVML_SUCCESS: c_int = 0;
/// `NVML_NVLINK_MAX_LINKS` (18 on Hopper; later headers may grow it, extra links answer
/// "not supported").
const MAX_LINKS: c_uint = 18;
const REMOTE_GPU: c_int = 0;
const REMOTE_SWITCH: c_int = 2;
/// `nvmlPciInfo_t`: `char busIdLegacy[16]; unsigned domain, bus, device, ...`.
const PCI_DOMAIN_OFFSET: usize = 16;

/// `(domain, bus, device)` of a CUDA PCI bus id such as `0000:19:00.0`.
pub(crate) fn parse_bus_id(id: &str) -> Option<(u32, u32, u32)> {
    let mut parts = id.split(':');
    let (d, b, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let dev = rest.split('.').next()?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(d)?, hex(b)?, hex(dev)?))
}

struct Nvml {
    lib: libloading::Library,
}

impl Nvml {
    fn open() -> Option<Self> {
        // SAFETY: loading the NVML library runs its ELF initialisers only; NVML has no
        // preconditions for being loaded.
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.ok()?;
        let nvml = Self { lib };
        // SAFETY: nvmlInit_v2 takes no arguments and is safe to call more than once (NVML
        // reference-counts initialisation); it is paired with nvmlShutdown in Drop.
        let status = unsafe { nvml.sym::<InitFn>(b"nvmlInit_v2\0")?() };
        (status == NVML_SUCCESS).then_some(nvml)
    }

    fn sym<T: Copy>(&self, name: &[u8]) -> Option<T> {
        // SAFETY: every call site names an NVML function with the C signature `T` declares
        // (checked against nvml.h by hand; see the type aliases above).
        unsafe { self.lib.get::<T>(name) }.ok().map(|s| *s)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(shutdown) = self.sym::<InitFn>(b"nvmlShutdown\0") {
            // SAFETY: pairs the successful nvmlInit_v2 of `open`.
            let _ = unsafe { shutdown() };
        }
    }
}

/// The link matrix for GPUs with these PCI bus ids, or `None` without NVML.
pub(crate) fn links(bus_ids: &[&str]) -> Option<Vec<Vec<Link>>> {
    let nvml = Nvml::open()?;
    let by_bus = nvml.sym::<ByBusIdFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")?;
    let state = nvml.sym::<LinkStateFn>(b"nvmlDeviceGetNvLinkState\0")?;
    let remote_pci = nvml.sym::<RemotePciFn>(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0")?;
    let remote_type = nvml.sym::<RemoteTypeFn>(b"nvmlDeviceGetNvLinkRemoteDeviceType\0");
    let ancestor = nvml.sym::<AncestorFn>(b"nvmlDeviceGetTopologyCommonAncestor\0");
    let ids: Vec<(u32, u32, u32)> = bus_ids.iter().map(|b| parse_bus_id(b)).collect::<Option<_>>()?;
    let mut handles = Vec::with_capacity(bus_ids.len());
    for b in bus_ids {
        let c = CString::new(*b).ok()?;
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: `c` is NUL-terminated; `h` is a valid out-pointer.
        if unsafe { by_bus(c.as_ptr(), &mut h) } != NVML_SUCCESS {
            return None;
        }
        handles.push(h);
    }
    let n = bus_ids.len();
    // direct[i][j]: links from i that end at GPU j; switch[i]: links from i that end at a switch.
    let mut direct = vec![vec![0u32; n]; n];
    let mut switch = vec![0u32; n];
    for (i, &h) in handles.iter().enumerate() {
        for link in 0..MAX_LINKS {
            let mut active: c_int = 0;
            // SAFETY: valid handle from NVML, out-pointer valid.
            if unsafe { state(h, link, &mut active) } != NVML_SUCCESS || active != 1 {
                continue;
            }
            let mut kind: c_int = REMOTE_GPU;
            if let Some(f) = remote_type {
                // SAFETY: valid handle, out-pointer valid.
                if unsafe { f(h, link, &mut kind) } != NVML_SUCCESS {
                    kind = -1;
                }
            }
            if kind == REMOTE_SWITCH {
                switch[i] += 1;
                continue;
            }
            let mut pci = [0u8; 512];
            // SAFETY: the buffer is far larger than nvmlPciInfo_t (68 bytes); handle valid.
            if unsafe { remote_pci(h, link, pci.as_mut_ptr()) } != NVML_SUCCESS {
                continue;
            }
            let word = |k: usize| {
                let o = PCI_DOMAIN_OFFSET + 4 * k;
                u32::from_ne_bytes([pci[o], pci[o + 1], pci[o + 2], pci[o + 3]])
            };
            let remote = (word(0), word(1), word(2));
            if let Some(j) = ids.iter().position(|&id| id == remote) {
                direct[i][j] += 1;
            }
        }
    }
    let mut out = vec![vec![Link::Unknown; n]; n];
    for i in 0..n {
        for j in 0..n {
            out[i][j] = if i == j {
                Link::SelfLink
            } else if direct[i][j] > 0 {
                Link::NvLink { lanes: direct[i][j] }
            } else if switch[i] > 0 && switch[j] > 0 {
                Link::NvSwitch { lanes: switch[i] }
            } else {
                let mut level: c_int = -1;
                if let Some(f) = ancestor {
                    // SAFETY: two valid handles, out-pointer valid.
                    if unsafe { f(handles[i], handles[j], &mut level) } != NVML_SUCCESS {
                        level = -1;
                    }
                }
                Link::Pcie { level: pcie_level(level) }
            };
        }
    }
    Some(out)
}

fn pcie_level(level: c_int) -> PcieLevel {
    match level {
        0 => PcieLevel::Internal,
        10 => PcieLevel::Pix,
        20 => PcieLevel::Pxb,
        30 => PcieLevel::Phb,
        40 => PcieLevel::Node,
        50 => PcieLevel::Sys,
        _ => PcieLevel::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse() {
        assert_eq!(parse_bus_id("0000:19:00.0"), Some((0, 0x19, 0)));
        assert_eq!(parse_bus_id("00000001:AB:1f.0"), Some((1, 0xab, 0x1f)));
        assert_eq!(parse_bus_id("nonsense"), None);
    }

    #[test]
    fn levels_map_like_nvidia_smi() {
        assert_eq!(pcie_level(10), PcieLevel::Pix);
        assert_eq!(pcie_level(50), PcieLevel::Sys);
        assert_eq!(pcie_level(7), PcieLevel::Unknown);
    }
}
