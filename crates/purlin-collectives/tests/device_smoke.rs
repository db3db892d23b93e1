//! The device smoke test (needs GPUs; run by `cargo xtask gpu-round`'s run.sh).

use purlin_atom::KernelCache;

#[test]
#[ignore = "needs a CUDA GPU (two for the ping-pong); run with --ignored on the GPU machine"]
fn device_smoke() {
    let report = purlin_collectives::smoke::run(&KernelCache::default_location()).expect("smoke test");
    for d in &report.devices {
        println!(
            "SMOKE gpu{} {} {} kernel={} checked={} elements: ok",
            d.ordinal,
            d.name,
            d.arch,
            if d.kernel_from_cache { "prebuilt-cache" } else { "compiled-here" },
            d.elements_checked
        );
        assert!(d.elements_checked > 0);
    }
    for (i, j, ok) in &report.peer_access {
        println!("SMOKE peer access gpu{i} -> gpu{j}: {}", if *ok { "enabled" } else { "NOT available" });
    }
    if report.devices.len() >= 2 {
        assert!(report.peer_access.iter().all(|p| p.2), "peer access must work both ways");
        let (rounds, rtt_us) = report.ping_pong.expect("ping-pong ran");
        println!("SMOKE ping-pong gpu0<->gpu1: {rounds} rounds, round trip {rtt_us:.2} us (calibration: 1.55 us)");
    }
}
