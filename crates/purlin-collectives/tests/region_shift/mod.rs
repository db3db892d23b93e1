//! The conformance tests' plan mutation, shared by the host and the device executor's tests.

use purlin_snac::{Plan, Step};

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
