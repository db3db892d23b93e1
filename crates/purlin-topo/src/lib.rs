//! What the machine is: the GPUs Purlin runs on and how they are linked.
//!
//! - [`Topology::probe`] asks the CUDA driver (and NVML, when it can be loaded) about every
//!   visible GPU: compute capability, SMs, memory, PCI bus id, and for every ordered pair the
//!   peer-access and P2P attributes and the NVLink path.
//! - A [`Topology`] is plain serde data, saved and loaded as JSON ([`Topology::to_json`],
//!   [`Topology::from_json`]), so decisions can be tested on fixtures of machines we do not
//!   have (`tests/fixtures/`).
//! - [`Topology::peer_path`] decides whether the single-kernel peer path is possible for a
//!   set of GPUs and which Atom generation they call for, or says why not ([`TopoError`]).
//! - [`Topology::matrix`] renders it like `nvidia-smi topo -m`.
//!
//! Architecture invariant: purlin-topo describes hardware only; it knows nothing about
//! collectives (no purlin-snac) or datapaths (no purlin-atom). The generation it decides is a
//! *hint* ([`GenerationHint`]); purlin-collectives maps it onto an Atom.
#![deny(unsafe_op_in_unsafe_fn)]

mod display;
mod nvml;
mod probe;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use probe::local_device;

/// The largest world Purlin supports in one scale-up domain (purlin-snac's).
pub use purlin_snac::MAX_WORLD;

/// Whether the CUDA driver library can be loaded on this machine.
///
/// cudarc (with `dynamic-loading`) panics when a library is missing; every GPU path asks this
/// first. Without this crate's `dynamic-loading` feature, libcuda is linked into the program,
/// which could not have started without it: always `true`.
pub fn driver_present() -> bool {
    #[cfg(feature = "dynamic-loading")]
    // SAFETY: `is_culib_present` only tries to dlopen libcuda and reports whether it could.
    return unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(not(feature = "dynamic-loading"))]
    true
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

/// Errors of probing a machine and of deciding what can run on it.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// No CUDA driver library on this machine.
    #[error("no CUDA driver (libcuda.so.1 could not be loaded)")]
    NoDriver,
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {error}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The driver's error.
        error: cudarc::driver::DriverError,
    },
    /// A device ordinal is not in the topology.
    #[error("GPU {ordinal} does not exist (the topology has {count} GPUs)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many GPUs there are.
        count: usize,
    },
    /// A GPU appears twice in a set that must hold distinct GPUs.
    #[error("GPU {ordinal} appears more than once; one rank per GPU")]
    DuplicateDevice {
        /// The repeated ordinal.
        ordinal: usize,
    },
    /// The number of GPUs is outside 1..=16.
    #[error("{world} GPUs: Purlin supports 1 to {MAX_WORLD} GPUs in one scale-up domain")]
    WorldSize {
        /// The number asked for.
        world: usize,
    },
    /// A GPU cannot access a peer's memory: no single-kernel peer path.
    #[error(
        "GPU {from} cannot access GPU {to}'s memory (no peer access): Purlin's single-kernel \
         collectives need peer access between every pair of GPUs (NVLink or PCIe P2P)"
    )]
    NoPeerAccess {
        /// The accessing GPU.
        from: usize,
        /// The GPU whose memory cannot be reached.
        to: usize,
    },
    /// The GPUs do not share one compute capability (one kernel key per communicator).
    #[error("GPU {a} is {cc_a} and GPU {b} is {cc_b}: all GPUs of a communicator must be one generation")]
    MixedGenerations {
        /// One GPU.
        a: usize,
        /// Its compute capability.
        cc_a: ComputeCapability,
        /// Another GPU.
        b: usize,
        /// Its compute capability.
        cc_b: ComputeCapability,
    },
    /// The GPU is older than the oldest Atom (sm_75, CUDA 13's NVRTC floor).
    #[error("GPU {ordinal} is {cc}; Purlin needs compute capability 7.5 or newer")]
    UnsupportedComputeCapability {
        /// The GPU.
        ordinal: usize,
        /// Its compute capability.
        cc: ComputeCapability,
    },
    /// The topology is inconsistent (a hand-edited or truncated JSON file).
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// JSON could not be parsed or written.
    #[error("topology JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A CUDA compute capability, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version (9 for Hopper).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// Which Atom generation a compute capability calls for (docs/design.md §4). A hint: the Atom
/// crate decides what it implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum GenerationHint {
    /// sm_75..sm_80: 16-byte vector loads/stores through registers.
    Generic,
    /// sm_80..sm_90: `cp.async` pipeline.
    Ampere,
    /// sm_90: `cp.async` pipeline (bulk copy optional).
    Hopper,
    /// sm_100 and newer.
    Blackwell,
}

impl ComputeCapability {
    /// The Atom generation for this compute capability, `None` below sm_75.
    pub fn generation_hint(self) -> Option<GenerationHint> {
        match (self.major, self.minor) {
            (0..=6, _) | (7, 0..=4) => None,
            (7, _) => Some(GenerationHint::Generic),
            (8, _) => Some(GenerationHint::Ampere),
            (9, _) => Some(GenerationHint::Hopper),
            _ => Some(GenerationHint::Blackwell),
        }
    }
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// CUDA device ordinal (under the process's `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// The GPU's UUID (`GPU-…`), stable across processes and `CUDA_VISIBLE_DEVICES`.
    #[serde(default)]
    pub uuid: Option<String>,
    /// Compute capability.
    pub compute_capability: ComputeCapability,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Total device memory in bytes.
    pub total_memory_bytes: u64,
    /// PCI bus id as CUDA prints it, e.g. `0000:19:00.0`.
    pub pci_bus_id: String,
    /// Largest opt-in shared memory per block, in bytes.
    #[serde(default)]
    pub max_shared_memory_per_block_optin: u32,
    /// Whether the device supports cooperative launches (needed for co-residency checks).
    #[serde(default)]
    pub cooperative_launch: bool,
}

/// What the link between two GPUs is, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Link {
    /// The GPU itself (the matrix diagonal).
    SelfLink,
    /// Direct NVLink: `lanes` links between the two GPUs (`NV18` in `nvidia-smi topo -m`).
    NvLink {
        /// Active NVLink links from the first GPU to the second.
        lanes: u32,
    },
    /// NVLink through NVSwitch: `lanes` active links from the first GPU into the switches.
    NvSwitch {
        /// Active NVLink links of the first GPU that end at a switch.
        lanes: u32,
    },
    /// No NVLink between them: traffic crosses PCIe (and perhaps the CPU interconnect).
    Pcie {
        /// The closest common PCIe ancestor, as NVML reports it.
        level: PcieLevel,
    },
    /// NVML was not available: whether the pair shares NVLink is unknown.
    Unknown,
}

/// NVML's topology levels, named as `nvidia-smi topo -m` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PcieLevel {
    /// Same board (multi-GPU board).
    Internal,
    /// At most one PCIe bridge (`PIX`).
    Pix,
    /// Several PCIe bridges, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge (`PHB`).
    Phb,
    /// Across host bridges within a NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    Sys,
    /// Not reported.
    Unknown,
}

impl Link {
    /// Whether the pair is linked by NVLink: `Some(true/false)`, or `None` when unknown.
    pub fn is_nvlink(self) -> Option<bool> {
        match self {
            Link::NvLink { .. } | Link::NvSwitch { .. } => Some(true),
            Link::Pcie { .. } => Some(false),
            Link::SelfLink | Link::Unknown => None,
        }
    }
}

/// What GPU `from` can do with GPU `to`'s memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLink {
    /// `cuDeviceCanAccessPeer(from, to)`.
    pub can_access_peer: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better), if the driver gave one.
    #[serde(default)]
    pub performance_rank: Option<i32>,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    #[serde(default)]
    pub native_atomics: bool,
    /// The physical link, if known.
    pub link: Link,
}

impl PeerLink {
    /// The diagonal entry.
    pub const SELF: PeerLink =
        PeerLink { can_access_peer: true, performance_rank: None, native_atomics: true, link: Link::SelfLink };
}

/// Where a topology came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// `probe` for a live machine, or a description (fixtures).
    pub source: String,
    /// `cuDriverGetVersion`, e.g. 13000.
    #[serde(default)]
    pub driver_version: Option<i32>,
    /// Whether NVML answered (otherwise links are [`Link::Unknown`]).
    pub nvml: bool,
}

/// The GPUs of one machine (as visible to this process) and every pair's peer link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Where this description came from.
    pub provenance: Provenance,
    /// The GPUs, indexed by ordinal.
    pub devices: Vec<Device>,
    /// `peers[i][j]`: what GPU `i` can do with GPU `j`'s memory; `peers[i][i]` is [`PeerLink::SELF`].
    pub peers: Vec<Vec<PeerLink>>,
}

/// The decision for a set of GPUs: the single-kernel peer path is possible, with these traits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerPath {
    /// The GPUs, in rank order.
    pub ordinals: Vec<usize>,
    /// Their common compute capability (the kernel key's architecture).
    pub compute_capability: ComputeCapability,
    /// The Atom generation it calls for.
    pub generation: GenerationHint,
    /// Whether every pair is linked by NVLink (`None`: not known, NVML unavailable).
    pub all_nvlink: Option<bool>,
    /// Whether every ordered pair supports native peer atomics.
    pub native_atomics: bool,
    /// The fewest SMs among the GPUs.
    pub min_sm_count: u32,
}

impl Topology {
    /// Probes every GPU visible to this process.
    pub fn probe() -> Result<Topology, TopoError> {
        probe::probe()
    }

    /// Parses a topology from JSON and checks that it is consistent.
    pub fn from_json(text: &str) -> Result<Topology, TopoError> {
        let topo: Topology = serde_json::from_str(text)?;
        topo.validate()?;
        Ok(topo)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> Result<String, TopoError> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Loads a JSON file.
    pub fn load(path: impl AsRef<Path>) -> Result<Topology, TopoError> {
        let path = path.as_ref();
        let text =
            std::fs::read_to_string(path).map_err(|source| TopoError::Io { path: path.to_path_buf(), source })?;
        Self::from_json(&text)
    }

    /// Saves as a JSON file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TopoError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()?).map_err(|source| TopoError::Io { path: path.to_path_buf(), source })
    }

    /// Checks the shape: ordinals `0..n` in order, an `n × n` peer matrix with self links on
    /// the diagonal only.
    pub fn validate(&self) -> Result<(), TopoError> {
        let n = self.devices.len();
        for (i, d) in self.devices.iter().enumerate() {
            if d.ordinal != i {
                return Err(TopoError::Invalid(format!("device {i} has ordinal {}", d.ordinal)));
            }
        }
        if self.peers.len() != n || self.peers.iter().any(|row| row.len() != n) {
            return Err(TopoError::Invalid(format!("the peer matrix must be {n} x {n}")));
        }
        for (i, row) in self.peers.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if (i == j) != (p.link == Link::SelfLink) {
                    return Err(TopoError::Invalid(format!("peers[{i}][{j}] link {:?}", p.link)));
                }
            }
        }
        Ok(())
    }

    /// The number of GPUs.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether there are no GPUs.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device with this ordinal.
    pub fn device(&self, ordinal: usize) -> Result<&Device, TopoError> {
        self.devices.get(ordinal).ok_or(TopoError::NoSuchDevice { ordinal, count: self.devices.len() })
    }

    /// What GPU `from` can do with GPU `to`'s memory.
    pub fn peer(&self, from: usize, to: usize) -> Result<&PeerLink, TopoError> {
        let count = self.devices.len();
        self.peers
            .get(from)
            .ok_or(TopoError::NoSuchDevice { ordinal: from, count })?
            .get(to)
            .ok_or(TopoError::NoSuchDevice { ordinal: to, count })
    }

    /// Decides whether the single-kernel peer path is possible on these GPUs (in rank
    /// order): 1..=16 distinct GPUs of one compute capability ≥ 7.5, every ordered pair
    /// with peer access. Otherwise a [`TopoError`] that names the offending GPUs.
    pub fn peer_path(&self, ordinals: &[usize]) -> Result<PeerPath, TopoError> {
        if ordinals.is_empty() || ordinals.len() > MAX_WORLD {
            return Err(TopoError::WorldSize { world: ordinals.len() });
        }
        let mut devices = Vec::with_capacity(ordinals.len());
        for (k, &o) in ordinals.iter().enumerate() {
            if ordinals[..k].contains(&o) {
                return Err(TopoError::DuplicateDevice { ordinal: o });
            }
            devices.push(self.device(o)?);
        }
        let (compute_capability, generation) = common_generation(&devices)?;
        let (mut all_nvlink, mut native_atomics) = (Some(true), true);
        for &i in ordinals {
            for &j in ordinals {
                if i == j {
                    continue;
                }
                let p = self.peer(i, j)?;
                if !p.can_access_peer {
                    return Err(TopoError::NoPeerAccess { from: i, to: j });
                }
                native_atomics &= p.native_atomics;
                all_nvlink = match (all_nvlink, p.link.is_nvlink()) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                };
            }
        }
        if ordinals.len() == 1 {
            all_nvlink = None;
        }
        let min_sm_count = devices.iter().map(|d| d.sm_count).min().unwrap_or(0);
        Ok(PeerPath {
            ordinals: ordinals.to_vec(),
            compute_capability,
            generation,
            all_nvlink,
            native_atomics,
            min_sm_count,
        })
    }

    /// Renders the topology like `nvidia-smi topo -m`, followed by a device table.
    pub fn matrix(&self) -> String {
        display::matrix(self)
    }
}

/// The common compute capability of `devices` and its generation, or why there is none.
/// Works on devices gathered from several processes too (each rank's [`Device`]).
pub fn common_generation(devices: &[&Device]) -> Result<(ComputeCapability, GenerationHint), TopoError> {
    let Some(first) = devices.first() else {
        return Err(TopoError::WorldSize { world: 0 });
    };
    for d in devices {
        if d.compute_capability != first.compute_capability {
            return Err(TopoError::MixedGenerations {
                a: first.ordinal,
                cc_a: first.compute_capability,
                b: d.ordinal,
                cc_b: d.compute_capability,
            });
        }
    }
    let cc = first.compute_capability;
    let generation =
        cc.generation_hint().ok_or(TopoError::UnsupportedComputeCapability { ordinal: first.ordinal, cc })?;
    Ok((cc, generation))
}
