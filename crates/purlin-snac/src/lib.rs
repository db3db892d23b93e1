//! SNAC — Stage, Notify, And Consume: the one protocol that decides where and when
//! data moves, derived from a collective's input and output layouts.
//!
//! Architecture invariant: this crate knows nothing about CUDA, pointers or Atoms. It has
//! no GPU dependency (checked from `cargo metadata` by `xtask/tests/architecture.rs`) and
//! forbids unsafe code, so plans can be derived and verified on any machine.
#![forbid(unsafe_code)]

/// Smallest and largest world (number of ranks) one scale-up domain supports.
pub const WORLD_RANGE: std::ops::RangeInclusive<usize> = 2..=16;
