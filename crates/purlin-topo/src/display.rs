//! `nvidia-smi topo -m`-style rendering.

use std::fmt::Write;

use crate::{Link, PcieLevel, Topology};

fn link_cell(link: Link) -> String {
    match link {
        Link::SelfLink => "X".into(),
        Link::NvLink { lanes } | Link::NvSwitch { lanes } => format!("NV{lanes}"),
        Link::Pcie { level } => match level {
            PcieLevel::Internal => "INT".into(),
            PcieLevel::Pix => "PIX".into(),
            PcieLevel::Pxb => "PXB".into(),
            PcieLevel::Phb => "PHB".into(),
            PcieLevel::Node => "NODE".into(),
            PcieLevel::Sys => "SYS".into(),
            PcieLevel::Unknown => "PCI".into(),
        },
        Link::Unknown => "?".into(),
    }
}

fn table(out: &mut String, topo: &Topology, title: &str, cell: impl Fn(usize, usize) -> String) {
    let n = topo.devices.len();
    let _ = writeln!(out, "{title}");
    let _ = write!(out, "{:8}", "");
    for j in 0..n {
        let _ = write!(out, "{:>8}", format!("GPU{j}"));
    }
    out.push('\n');
    for i in 0..n {
        let _ = write!(out, "{:8}", format!("GPU{i}"));
        for j in 0..n {
            let _ = write!(out, "{:>8}", cell(i, j));
        }
        out.push('\n');
    }
    out.push('\n');
}

pub(crate) fn matrix(topo: &Topology) -> String {
    let mut out = String::new();
    let links_title = if topo.provenance.nvml { "Links" } else { "Links (NVML unavailable: unknown)" };
    table(&mut out, topo, links_title, |i, j| link_cell(topo.peers[i][j].link));
    table(&mut out, topo, "Peer access (P2P) / performance rank / native atomics", |i, j| {
        let p = &topo.peers[i][j];
        if i == j {
            "X".into()
        } else if !p.can_access_peer {
            "-".into()
        } else {
            let rank = p.performance_rank.map_or("?".into(), |r| r.to_string());
            format!("OK/{rank}/{}", if p.native_atomics { "A" } else { "-" })
        }
    });
    let _ =
        writeln!(out, "{:<6}{:<24}{:<8}{:>5}{:>10}  {:<14}UUID", "GPU", "name", "arch", "SMs", "memory", "PCI bus id");
    for d in &topo.devices {
        let _ = writeln!(
            out,
            "{:<6}{:<24}{:<8}{:>5}{:>7} GiB  {:<14}{}",
            format!("GPU{}", d.ordinal),
            d.name,
            d.compute_capability.to_string(),
            d.sm_count,
            d.total_memory_bytes >> 30,
            d.pci_bus_id,
            d.uuid.as_deref().unwrap_or("?")
        );
    }
    let _ = writeln!(
        out,
        "\nLegend: X = self, NV# = # NVLink links (direct or through NVSwitch), PIX/PXB/PHB/NODE/SYS = PCIe \
         paths as in nvidia-smi, ? = unknown; OK/r/A = peer access, performance rank r, native atomics.\n\
         Source: {}, driver {}, NVML {}",
        topo.provenance.source,
        topo.provenance.driver_version.map_or("?".into(), |v| v.to_string()),
        if topo.provenance.nvml { "yes" } else { "no" }
    );
    out
}
