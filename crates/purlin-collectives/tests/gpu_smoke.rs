//! The device smoke test (needs GPUs; run by `cargo xtask gpu-round`'s run.sh).

use purlin_atom::KernelCache;

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn device_smoke() {
    let report = purlin_collectives::internal::smoke::run(&KernelCache::default_location()).expect("smoke test");
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

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn sixteen_byte_packets_do_not_tear() {
    // 32 block pairs × 4096 packets per block per round × 7700 rounds ≈ 1.01e9 packets per
    // direction, both directions at once.
    let (pairs, per_block, rounds) = (32, 4096, 7700);
    let r =
        purlin_collectives::internal::smoke::packet_stress(&KernelCache::default_location(), pairs, per_block, rounds)
            .expect("packet stress");
    println!(
        "PACKETS 16-byte packets over NVLink, both directions: {} checked, {} torn, {} timed-out blocks, {:.2} s",
        r.packets, r.torn, r.timed_out_blocks, r.seconds
    );
    assert_eq!(r.timed_out_blocks, 0);
    assert_eq!(r.packets, 2 * u64::from(pairs) * u64::from(per_block) * u64::from(rounds));
    assert_eq!(r.torn, 0, "torn 16-byte packets: the latency regime must use 8-byte packets");
}

#[test]
#[ignore = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine"]
fn packet_payloads_round_trip_at_every_length_and_offset() {
    for packet_bytes in [8, 16] {
        let cases =
            purlin_collectives::internal::smoke::payload_round_trip(&KernelCache::default_location(), packet_bytes)
                .unwrap_or_else(|e| panic!("{e}"));
        println!("PAYLOADS {packet_bytes}-byte packets: {cases} (length, from, to) cases byte-exact");
        assert_eq!(cases, 64 * (packet_bytes as usize / 2 + 1));
    }
}
