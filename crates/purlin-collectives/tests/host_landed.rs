//! Shard-landed words on the host executor (what a fused kernel's `purlin::wait_shard` reads):
//! while each rank's plan runs, a consumer thread per rank waits for each shard's word and
//! copies the shard out of the output at once; what it copied must be the collective's result,
//! built here from the spec's definition (`CollectiveSpec::segments`). Staged, packet and
//! one-copy plans, in and out of place, uniform and V.

use std::time::{Duration, Instant};

use purlin_collectives::internal::host_executor::{CallBuffers, HostMemoryConfig, HostWorld};
use purlin_snac::{CollectiveSpec, DataType, Plan, PlanConfig, Regime, derive, in_place_alias};

/// The collective's result on `rank` from every rank's input: each output segment holds its
/// one source's bytes.
fn expected(spec: &CollectiveSpec, inputs: &[Vec<u8>], rank: u32) -> Vec<u8> {
    let mut out = vec![0u8; spec.output_bytes(rank) as usize];
    for seg in spec.segments(rank) {
        let (src, at) = seg.sources[0];
        let (o, n, a) = (seg.out_offset as usize, seg.len as usize, at as usize);
        out[o..o + n].copy_from_slice(&inputs[src as usize][a..a + n]);
    }
    out
}

/// Runs one call of `plans` with a consumer per rank; returns what each consumer copied.
fn run_with_consumers(plans: &[Plan], inputs: &[Vec<u8>], in_place: bool) -> Vec<Vec<u8>> {
    let world = plans.len();
    let host = HostWorld::new(world, HostMemoryConfig::default(), Duration::from_secs(20));
    let spec = &plans[0].spec;
    // Each rank's output buffer; in place, its input lies inside it at the alias offset.
    let mut outs: Vec<Vec<u8>> = (0..world)
        .map(|r| {
            let mut o = vec![0xEEu8; spec.output_bytes(r as u32) as usize];
            if in_place {
                if let Some(purlin_snac::Alias::InputInOutput(at)) = in_place_alias(spec, r as u32) {
                    o[at as usize..at as usize + inputs[r].len()].copy_from_slice(&inputs[r]);
                }
            }
            o
        })
        .collect();
    let out_ptrs: Vec<(usize, usize)> = outs.iter_mut().map(|o| (o.as_mut_ptr() as usize, o.len())).collect();
    let mut peers = [(std::ptr::null_mut(), 0); purlin_collectives::MAX_WORLD];
    let mut peer_inputs = peers;
    for (slot, &(p, n)) in peers.iter_mut().zip(&out_ptrs) {
        *slot = (p as *mut u8, n);
    }
    for (slot, i) in peer_inputs.iter_mut().zip(inputs) {
        *slot = (i.as_ptr().cast_mut(), i.len());
    }
    let host = &host;
    std::thread::scope(|s| {
        let mut consumers = vec![];
        for (r, plan) in plans.iter().enumerate() {
            let (out, out_len) = out_ptrs[r];
            let (input, input_len) = match (in_place, plan.resources.alias) {
                (true, Some(purlin_snac::Alias::InputInOutput(at))) => (out + at as usize, inputs[r].len()),
                _ => (inputs[r].as_ptr() as usize, inputs[r].len()),
            };
            let b = CallBuffers {
                peer_outputs: peers,
                peer_inputs,
                ..CallBuffers::new(input as *const u8, input_len, out as *mut u8, out_len)
            };
            s.spawn(move || host.execute(plan, b, false).expect("the call"));
            let landed = plan.landed.clone().expect("landed words");
            consumers.push(s.spawn(move || {
                let mut seen = vec![0u8; out_len];
                for step in 0..world {
                    let q = (r + step) % world;
                    let shard = landed.shards[q];
                    if let Some(f) = shard.flag {
                        let t0 = Instant::now();
                        // Zeroed at set-up, and this is the first call: `E + 1` is 1.
                        while host.flag(r, f as usize) < 1 {
                            assert!(t0.elapsed() < Duration::from_secs(20), "rank {r}: shard {q} never landed");
                            std::thread::yield_now();
                        }
                    }
                    let (o, n) = (shard.offset as usize, shard.len as usize);
                    // SAFETY: the output outlives the scope; the flag's acquire load above
                    // orders every write of the shard before this read, and no step writes
                    // the shard after its flag (the claim under test: a plan that broke it
                    // would make these bytes differ from the expected ones).
                    unsafe { std::ptr::copy_nonoverlapping((out as *const u8).add(o), seen.as_mut_ptr().add(o), n) };
                }
                seen
            }));
        }
        consumers.into_iter().map(|h| h.join().expect("consumer")).collect()
    })
}

fn cfg(regime: Regime, one_copy: bool, in_place: bool) -> PlanConfig {
    PlanConfig {
        regime,
        chunk_bytes: 4096,
        blocks_per_role: 2,
        slots: 4,
        staging_bytes: 1 << 20,
        window_bytes: 1 << 20,
        max_coresident_blocks: 16,
        flag_words: HostMemoryConfig::default().flag_words as u32,
        peer_outputs: one_copy,
        in_place,
        landed: true,
        ..PlanConfig::default()
    }
}

#[test]
fn consumers_that_wait_for_each_landed_shard_read_the_collectives_result() {
    let dt = DataType::F32;
    let mut specs = vec![];
    for w in [2u32, 3, 4] {
        specs.push(CollectiveSpec::all_gather(w, dt, 20_011));
        specs.push(CollectiveSpec::all_to_all(w, dt, 6_007));
        specs.push(CollectiveSpec::all_gather_v(w, dt, (0..w as u64).map(|r| r * 5_003).collect()));
    }
    let mut runs = 0;
    for spec in &specs {
        let inputs: Vec<Vec<u8>> = (0..spec.world)
            .map(|r| {
                (0..spec.input_bytes(r)).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(r) as u8).collect()
            })
            .collect();
        for in_place in [false, true] {
            if in_place && in_place_alias(spec, 0).is_none() {
                continue;
            }
            for (regime, one_copy) in
                [(Regime::Latency, false), (Regime::Throughput, false), (Regime::Throughput, true)]
            {
                let plans = derive(spec, &cfg(regime, one_copy, in_place)).expect("derive");
                let seen = run_with_consumers(&plans, &inputs, in_place);
                for (r, got) in seen.iter().enumerate() {
                    let want = expected(spec, &inputs, r as u32);
                    let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    assert_eq!(wrong, 0, "{spec:?} {regime:?} one-copy {one_copy} in place {in_place}: rank {r}");
                }
                runs += 1;
            }
        }
    }
    assert!(runs >= 30, "{runs} runs");
}
