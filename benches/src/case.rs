//! One collective at one size: the test kit's [`Case`] (layout, inputs, expected output and
//! check: the one reference the library's tests use too), in the kit's vocabulary, which is the
//! benchmark's ([`crate::spec`]).
//!
//! Inputs are small integers drawn from a counter-based hash, so every rank can regenerate any
//! peer's input (no data exchange for the reference) and any summation order is exact. They are
//! never zero. Outputs are poisoned with [`POISON`] bytes before each checked call; the check is
//! bitwise, except Avg on floats (one rounding of the type: NCCL scales before it sums).

pub use purlin_testkit::{Case, InPlaceLayout, POISON, Segment, Wrong};
