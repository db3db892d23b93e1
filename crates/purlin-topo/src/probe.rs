//! Asking the CUDA driver (and NVML) about the GPUs. No context is created: every query
//! here is a device query.

use std::ffi::{CStr, c_char, c_int};

use cudarc::driver::{result, sys};

use crate::{ComputeCapability, Device, Link, PeerLink, Provenance, TopoError, Topology};

fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> TopoError {
    move |error| TopoError::Driver { call, error }
}

fn init() -> Result<usize, TopoError> {
    if !crate::driver_present() {
        return Err(TopoError::NoDriver);
    }
    result::init().map_err(driver("cuInit"))?;
    let n = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

fn cu_device(ordinal: usize) -> Result<sys::CUdevice, TopoError> {
    let o = c_int::try_from(ordinal).map_err(|_| TopoError::NoSuchDevice { ordinal, count: 0 })?;
    result::device::get(o).map_err(driver("cuDeviceGet"))
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32, TopoError> {
    // SAFETY: `dev` came from cuDeviceGet after cuInit; the attribute is a valid enum value.
    unsafe { result::device::get_attribute(dev, attr) }.map_err(driver("cuDeviceGetAttribute"))
}

fn pci_bus_id(dev: sys::CUdevice) -> Result<String, TopoError> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the buffer holds 64 bytes and we pass its length; the driver NUL-terminates.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev) }
        .result()
        .map_err(driver("cuDeviceGetPCIBusId"))?;
    // SAFETY: the buffer is NUL-terminated (zero-initialised and written by the driver
    // with at most len - 1 characters).
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().to_lowercase())
}

fn uuid_string(uuid: &sys::CUuuid) -> String {
    let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// Describes one GPU (by ordinal, under this process's `CUDA_VISIBLE_DEVICES`).
pub fn local_device(ordinal: usize) -> Result<Device, TopoError> {
    let count = init()?;
    if ordinal >= count {
        return Err(TopoError::NoSuchDevice { ordinal, count });
    }
    describe(ordinal)
}

fn describe(ordinal: usize) -> Result<Device, TopoError> {
    use sys::CUdevice_attribute as A;
    let dev = cu_device(ordinal)?;
    let attr = |a| attribute(dev, a).map(|v| u32::try_from(v).unwrap_or(0));
    Ok(Device {
        ordinal,
        name: result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?,
        uuid: result::device::get_uuid(dev).ok().map(|u| uuid_string(&u)),
        compute_capability: ComputeCapability {
            major: attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        },
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        // SAFETY: `dev` is a valid device after cuInit.
        total_memory_bytes: unsafe { result::device::total_mem(dev) }.map_err(driver("cuDeviceTotalMem"))? as u64,
        pci_bus_id: pci_bus_id(dev)?,
        max_shared_memory_per_block_optin: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        cooperative_launch: attr(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
    })
}

fn p2p_attribute(attr: sys::CUdevice_P2PAttribute, from: sys::CUdevice, to: sys::CUdevice) -> Option<i32> {
    let mut v: c_int = 0;
    // SAFETY: out-pointer valid; both devices valid after cuInit and distinct.
    let status = unsafe { sys::cuDeviceGetP2PAttribute(&mut v, attr, from, to) };
    (status == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

fn peer_link(from: usize, to: usize, link: Link) -> Result<PeerLink, TopoError> {
    use sys::CUdevice_P2PAttribute as P;
    let (a, b) = (cu_device(from)?, cu_device(to)?);
    let mut can: c_int = 0;
    // SAFETY: out-pointer valid; both devices valid after cuInit.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }.result().map_err(driver("cuDeviceCanAccessPeer"))?;
    let can_access_peer = can == 1;
    Ok(PeerLink {
        can_access_peer,
        performance_rank: if can_access_peer {
            p2p_attribute(P::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, a, b)
        } else {
            None
        },
        native_atomics: p2p_attribute(P::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, a, b) == Some(1),
        link,
    })
}

pub(crate) fn probe() -> Result<Topology, TopoError> {
    let count = init()?;
    let devices = (0..count).map(describe).collect::<Result<Vec<_>, _>>()?;
    let mut version: c_int = 0;
    // SAFETY: out-pointer valid.
    let driver_version =
        (unsafe { sys::cuDriverGetVersion(&mut version) } == sys::CUresult::CUDA_SUCCESS).then_some(version);
    let bus_ids: Vec<&str> = devices.iter().map(|d| d.pci_bus_id.as_str()).collect();
    let links = crate::nvml::links(&bus_ids);
    let mut peers = Vec::with_capacity(count);
    for i in 0..count {
        let mut row = Vec::with_capacity(count);
        for j in 0..count {
            if i == j {
                row.push(PeerLink::SELF);
            } else {
                let link = links.as_ref().map_or(Link::Unknown, |m| m[i][j]);
                row.push(peer_link(i, j, link)?);
            }
        }
        peers.push(row);
    }
    let topo = Topology {
        provenance: Provenance { source: "probe".into(), driver_version, nvml: links.is_some() },
        devices,
        peers,
    };
    topo.validate()?;
    Ok(topo)
}
