//! One collective at one size: the test kit's [`Case`] (layout, inputs, expected output and
//! check: the one reference the library's tests use too), in the kit's vocabulary, which is the
//! benchmark's ([`crate::spec`]).
//!
//! Inputs are small integers drawn from a counter-based hash, so every rank can regenerate any
//! peer's input (no data exchange for the reference) and any summation order is exact. They are
//! never zero. Outputs are poisoned with [`POISON`] bytes before each checked call; the check is
//! bitwise, except Avg on floats (one rounding of the type: NCCL scales before it sums).

pub use purlin_testkit::{Case, InPlaceLayout, POISON, Segment, Wrong};

#[cfg(test)]
mod tests {
    use purlin_testkit::{Compare, count_wrong};

    use super::*;
    use crate::spec::{Collective, Dtype, Op};

    /// The check the sweep's `#wrong` counts with.
    #[test]
    fn a_planted_wrong_element_is_counted() {
        let case = Case::new(Collective::AllReduce, Dtype::F32, Op::Sum, 2, 4096, 0.0, 3).unwrap();
        let exp = case.expected(0);
        let mut got = exp.clone();
        assert_eq!(case.count_wrong(&got, &exp).count, 0);
        got[40..44].copy_from_slice(&12345.0f32.to_le_bytes());
        let w = case.count_wrong(&got, &exp);
        assert_eq!((w.count, w.first.map(|f| f.0)), (1, Some(10)));
        assert_eq!(case.count_wrong(&vec![POISON; exp.len()], &exp).count, 1024);
        // Avg on bf16 allows one rounding, Sum none.
        let (a, b) = (half::bf16::from_f32(100.0).to_le_bytes(), half::bf16::from_f32(100.5).to_le_bytes());
        let bf16 = |op| count_wrong(Dtype::Bf16, Compare::for_op(Dtype::Bf16, Some(op)), &a, &b).count;
        assert_eq!(bf16(Op::Avg), 0);
        assert_eq!(bf16(Op::Sum), 1);
    }
}
