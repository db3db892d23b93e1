//! One collective at one size in the benchmark's vocabulary: the test kit's [`purlin_testkit::Case`]
//! (layout, inputs, expected output, check: the one reference the library's tests use too),
//! with the collective, element type and op as [`crate::spec`] names them.

use std::ops::{Deref, DerefMut};

use crate::spec::{Collective, Dtype, Op};

pub use purlin_testkit::{InPlaceLayout, POISON, Segment, Wrong};

/// A case: the benchmark's names beside the kit's case, whose layout, [`input`](purlin_testkit::Case::input),
/// [`expected`](purlin_testkit::Case::expected) and [`count_wrong`](purlin_testkit::Case::count_wrong)
/// it reads through `Deref`.
///
/// Inputs are small integers drawn from a counter-based hash, so every rank can regenerate any
/// peer's input (no data exchange for the reference) and any summation order is exact. They are
/// never zero. Outputs are poisoned with [`POISON`] bytes before each checked call; the check is
/// bitwise, except Avg on floats (one rounding of the type: NCCL scales before it sums).
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: Dtype,
    /// Reduce op (None for gathers and all-to-alls).
    pub op: Option<Op>,
    kit: purlin_testkit::Case,
}

impl Case {
    /// The case for `bytes` nominal bytes (nccl-tests' sizes; V forms split by Zipf weights of
    /// `skew`), or `None` where the size holds fewer elements than the collective needs (one
    /// per rank, or per pair for all-to-all).
    pub fn new(
        collective: Collective,
        dtype: Dtype,
        op: Op,
        world: usize,
        bytes: usize,
        skew: f64,
        seed: u64,
    ) -> Option<Case> {
        let kit = purlin_testkit::Case::new(collective.kit(), dtype.kit(), op.kit(), world, bytes, skew, seed)?;
        Some(Case { collective, dtype, op: collective.reduces().then_some(op), kit })
    }
}

impl Deref for Case {
    type Target = purlin_testkit::Case;
    fn deref(&self) -> &purlin_testkit::Case {
        &self.kit
    }
}

/// For `in_place` (the collective, type and op stay as made).
impl DerefMut for Case {
    fn deref_mut(&mut self) -> &mut purlin_testkit::Case {
        &mut self.kit
    }
}

/// Counts the elements of `got` that differ from `expected` (bitwise, except `avg` on floats,
/// which allows one rounding), missing elements included.
pub fn count_wrong(dtype: Dtype, op: Option<Op>, got: &[u8], expected: &[u8]) -> Wrong {
    let d = dtype.kit();
    purlin_testkit::count_wrong(d, purlin_testkit::Compare::for_op(d, op.map(Op::kit)), got, expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's case is the kit's, for every collective, dtype and op.
    #[test]
    fn the_case_is_the_kits() {
        for c in Collective::every() {
            for dtype in Dtype::ALL {
                for op in Op::ALL {
                    let Some(case) = Case::new(c, dtype, op, 3, 4096, 1.0, 9) else { continue };
                    let kit = purlin_testkit::Case::new(c.kit(), dtype.kit(), op.kit(), 3, 4096, 1.0, 9).unwrap();
                    assert_eq!(*case, kit, "{c} {dtype} {op}");
                    assert_eq!(case.op.map(Op::kit), kit.op);
                    assert_eq!(case.expected(1), kit.expected(1));
                }
            }
        }
    }

    #[test]
    fn a_planted_wrong_element_is_counted() {
        let case = Case::new(Collective::AllReduce, Dtype::F32, Op::Sum, 2, 4096, 0.0, 3).unwrap();
        let exp = case.expected(0);
        let mut got = exp.clone();
        assert_eq!(case.count_wrong(&got, &exp).count, 0);
        got[40..44].copy_from_slice(&12345.0f32.to_le_bytes());
        let w = count_wrong(Dtype::F32, Some(Op::Sum), &got, &exp);
        assert_eq!((w.count, w.first.map(|f| f.0)), (1, Some(10)));
        assert_eq!(count_wrong(Dtype::F32, Some(Op::Sum), &vec![POISON; exp.len()], &exp).count, 1024);
        // Avg on bf16 allows one rounding, Sum none.
        let (a, b) = (half::bf16::from_f32(100.0).to_le_bytes(), half::bf16::from_f32(100.5).to_le_bytes());
        assert_eq!(count_wrong(Dtype::Bf16, Some(Op::Avg), &a, &b).count, 0);
        assert_eq!(count_wrong(Dtype::Bf16, Some(Op::Sum), &a, &b).count, 1);
    }
}
