mod common;
use common::*;
use purlin_snac::verify::*;
use purlin_snac::*;

#[test]
fn smoke() {
    for regime in [Regime::Latency, Regime::Throughput] {
        for side in [StagingSide::Own, StagingSide::Peer] {
            for c in Collective::ALL {
                for world in [2u32, 3] {
                    let cfg = PlanConfig {
                        regime,
                        staging_side: side,
                        chunk_bytes: 32,
                        blocks_per_role: 1,
                        slots: 2,
                        staging_bytes: 1024,
                        window_bytes: 4096,
                        ..Default::default()
                    };
                    let spec = spec_of(c, world, DataType::U8, 80, vec![80, 0, 17, 50]);
                    let plans = derive(&spec, &cfg).unwrap();
                    let t = std::time::Instant::now();
                    let calls = vec![plans.clone(), plans.clone(), plans];
                    let r = verify(&calls, &Options { max_states: 20_000, schedules: 20, ..Default::default() });
                    println!(
                        "{c:?} w{world} {regime:?} {side:?}: {} {:?} {:?}",
                        r.coverage,
                        t.elapsed(),
                        r.result.as_ref().err().map(|v| v.to_string())
                    );
                }
            }
        }
    }
}
