//! The one reference of what every Purlin collective must produce, shared by the host tests,
//! the GPU tests and `purlin-bench`.
//!
//! - [`Case`]: a collective at one size on one world (AllReduce, AllGather, ReduceScatter,
//!   AllToAll, their V forms, Broadcast, Reduce, SendRecv), its per-rank layout, its inputs and
//!   its expected output ([`Case::expected`], from the collective's definition and the inputs
//!   alone);
//! - [`Dtype`] with its own codecs (`half` for f16/bf16, [`fp8`] for e4m3/e5m2) and [`Op`]
//!   (Sum, Prod, Min, Max, Avg), reduced by [`reference::reduce_element`];
//! - their names ([`Collective::name`], [`Dtype::name`], [`Op::name`], also their `Display`),
//!   the ones `purlin-bench` parses and prints;
//! - input generation ([`ValueRule`], [`Values`], [`Rng`]);
//! - [`POISON`], the byte outputs are filled with before a checked call;
//! - the check ([`count_wrong`], [`check()`]) under a [`Compare`] rule.
//!
//! The kit depends on no Purlin crate (`tests/independence.rs`): a reference that shared code
//! with the library would share its bugs.

pub mod case;
pub mod check;
pub mod collective;
pub mod dtype;
pub mod fp8;
pub mod reference;
pub mod values;

pub use case::{Case, Counts, InPlaceLayout, Segment};
pub use check::{Compare, POISON, Wrong, check, count_wrong, poisoned};
pub use collective::{Collective, Op};
pub use dtype::Dtype;
pub use values::{Rng, ValueRule, Values, fresh_seed, splitmix64};

/// The one `#[ignore]` reason of every GPU test. `#[ignore = ...]` takes a literal, so the
/// tests spell it out; `tests/independence.rs` holds every `gpu_*.rs` test file to this text.
pub const GPU_IGNORE: &str = "needs a GPU: cargo xtask gpu-round, then --ignored on the GPU machine";
