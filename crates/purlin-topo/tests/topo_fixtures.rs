//! Decisions on machines we do not have, from JSON fixtures (CI, no GPU).

use purlin_topo::{ComputeCapability, GenerationHint, Link, TopoError, Topology};

fn fixture(name: &str) -> Topology {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    Topology::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn two_h200_over_nvlink() {
    let t = fixture("2x-h200-nvlink.json");
    assert_eq!(t.len(), 2);
    let path = t.peer_path(&[0, 1]).expect("peer path on 2x H200");
    assert_eq!(path.compute_capability, ComputeCapability { major: 9, minor: 0 });
    assert_eq!(path.generation, GenerationHint::Hopper);
    assert_eq!(path.all_nvlink, Some(true));
    assert!(path.native_atomics);
    assert_eq!(path.min_sm_count, 132);
    // Rank order may differ from ordinal order.
    assert_eq!(t.peer_path(&[1, 0]).unwrap().ordinals, vec![1, 0]);
    let m = t.matrix();
    assert!(m.contains("NV18"), "{m}");
    assert!(m.contains("NVIDIA H200"), "{m}");
}

#[test]
fn eight_h100_through_nvswitch() {
    let t = fixture("8x-h100-nvswitch.json");
    let all: Vec<usize> = (0..8).collect();
    let path = t.peer_path(&all).expect("peer path on 8x H100");
    assert_eq!(path.generation, GenerationHint::Hopper);
    assert_eq!(path.all_nvlink, Some(true));
    assert!(matches!(t.peer(3, 6).unwrap().link, Link::NvSwitch { lanes: 18 }));
    // Any subset works too.
    assert!(t.peer_path(&[2, 5, 7]).is_ok());
    assert!(matches!(t.peer_path(&[2, 2]), Err(TopoError::DuplicateDevice { ordinal: 2 })));
    assert!(matches!(t.peer_path(&[0, 8]), Err(TopoError::NoSuchDevice { ordinal: 8, count: 8 })));
    assert!(matches!(t.peer_path(&[]), Err(TopoError::WorldSize { world: 0 })));
}

#[test]
fn four_pcie_gpus_without_peer_access_get_a_clear_error() {
    let t = fixture("4x-pcie-no-p2p.json");
    let err = t.peer_path(&[0, 1, 2, 3]).expect_err("no peer access, no peer path");
    assert!(matches!(err, TopoError::NoPeerAccess { from: 0, to: 1 }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("GPU 0") && msg.contains("GPU 1") && msg.contains("peer access"), "{msg}");
    // A single GPU needs no peers.
    let one = t.peer_path(&[2]).unwrap();
    assert_eq!(one.generation, GenerationHint::Ampere);
    assert_eq!(one.all_nvlink, None);
    let m = t.matrix();
    assert!(m.contains("NODE") && m.contains("SYS"), "{m}");
}

#[test]
fn json_round_trips() {
    for name in ["2x-h200-nvlink.json", "8x-h100-nvswitch.json", "4x-pcie-no-p2p.json"] {
        let t = fixture(name);
        let back = Topology::from_json(&t.to_json().unwrap()).unwrap();
        assert_eq!(t, back, "{name}");
    }
}

#[test]
fn mixed_and_old_generations_are_refused() {
    let mut t = fixture("2x-h200-nvlink.json");
    t.devices[1].compute_capability = ComputeCapability { major: 8, minor: 0 };
    assert!(matches!(t.peer_path(&[0, 1]), Err(TopoError::MixedGenerations { a: 0, b: 1, .. })));
    t.devices[0].compute_capability = ComputeCapability { major: 7, minor: 0 };
    let err = t.peer_path(&[0]).unwrap_err();
    assert!(matches!(err, TopoError::UnsupportedComputeCapability { ordinal: 0, .. }), "{err:?}");
    assert_eq!(ComputeCapability { major: 7, minor: 5 }.generation_hint(), Some(GenerationHint::Generic));
    assert_eq!(ComputeCapability { major: 10, minor: 0 }.generation_hint(), Some(GenerationHint::Blackwell));
    assert_eq!(ComputeCapability { major: 12, minor: 0 }.generation_hint(), Some(GenerationHint::Blackwell));
}

#[test]
fn inconsistent_json_is_rejected() {
    let t = fixture("2x-h200-nvlink.json");
    let mut bad = t.clone();
    bad.peers.pop();
    assert!(matches!(Topology::from_json(&bad.to_json().unwrap()), Err(TopoError::Invalid(_))));
    let mut bad = t.clone();
    bad.devices[1].ordinal = 5;
    assert!(matches!(Topology::from_json(&bad.to_json().unwrap()), Err(TopoError::Invalid(_))));
    let mut bad = t;
    bad.peers[0][1].link = Link::SelfLink;
    assert!(matches!(Topology::from_json(&bad.to_json().unwrap()), Err(TopoError::Invalid(_))));
    assert!(matches!(Topology::from_json("{"), Err(TopoError::Json(_))));
}

#[test]
fn probing_without_a_driver_is_an_error_not_a_panic() {
    if purlin_topo::driver_present() {
        return; // the GPU test below covers this machine
    }
    assert!(matches!(Topology::probe(), Err(TopoError::NoDriver)));
    assert_eq!(purlin_topo::device_count(), 0);
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn probe_this_machine() {
    let t = Topology::probe().expect("probe");
    println!("{}", t.matrix());
    println!("{}", t.to_json().unwrap());
    assert!(!t.is_empty());
    let all: Vec<usize> = (0..t.len()).collect();
    match t.peer_path(&all) {
        Ok(p) => println!(
            "TOPO peer path on {} GPUs: {:?} {:?} nvlink={:?}",
            t.len(),
            p.compute_capability,
            p.generation,
            p.all_nvlink
        ),
        Err(e) => println!("TOPO no peer path: {e}"),
    }
    if t.len() >= 2 {
        t.peer_path(&[0, 1]).expect("the GPU machines have peer access between GPU 0 and 1");
    }
}
