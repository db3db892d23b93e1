//! Shared by the host and the device executor's conformance tests: the plan mutation and a
//! call of one plan per rank on the host executor.

use purlin_collectives::Error;
use purlin_collectives::internal::host_executor::{CallBuffers, HostWorld, TraceEntry};
use purlin_snac::{Plan, Step};

/// Runs `plans` (one per rank) on `host`, one thread per rank, reading `inputs[r]` and
/// writing `outputs[r]`; each rank's result (its trace when `trace`).
pub fn execute_on_host(
    host: &HostWorld,
    plans: &[Plan],
    inputs: &[Vec<u8>],
    outputs: &mut [Vec<u8>],
    trace: bool,
) -> Vec<Result<Vec<TraceEntry>, Error>> {
    // Every rank's input and output are registered for every rank (one-copy plans store into
    // peers' outputs and read peers' inputs; nothing writes an input).
    let mut peers = [(std::ptr::null_mut(), 0); purlin_collectives::MAX_WORLD];
    let mut peer_inputs = peers;
    for (slot, o) in peers.iter_mut().zip(outputs.iter_mut()) {
        *slot = (o.as_mut_ptr(), o.len());
    }
    for (slot, i) in peer_inputs.iter_mut().zip(inputs) {
        *slot = (i.as_ptr().cast_mut(), i.len());
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = plans
            .iter()
            .zip(peers)
            .zip(inputs)
            .map(|((p, (out, out_len)), i)| {
                let b = CallBuffers {
                    peer_outputs: peers,
                    peer_inputs,
                    ..CallBuffers::new(i.as_ptr(), i.len(), out, out_len)
                };
                s.spawn(move || host.execute(p, b, trace))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// Shifts, by one byte, the offset of the first region of `plan` that `pick` selects (a
/// stage's or gather's destination, a put's source). False when `pick` selects none.
pub fn shift_first(plan: &mut Plan, pick: impl Fn(&Step) -> bool) -> bool {
    fn visit(steps: &mut [Step], pick: &dyn Fn(&Step) -> bool) -> bool {
        for s in steps {
            if let Step::ChunkLoop { body, .. } = s {
                if visit(body, pick) {
                    return true;
                }
                continue;
            }
            if !pick(s) {
                continue;
            }
            match s {
                Step::Stage { dst, .. } | Step::Gather { dst, .. } => dst.offset.base += 1,
                Step::PutPackets { src, .. } => src.offset.base += 1,
                _ => continue,
            }
            return true;
        }
        false
    }
    plan.blocks.iter_mut().any(|b| visit(&mut b.steps, &pick))
}
