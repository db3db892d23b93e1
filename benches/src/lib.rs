//! Purlin's benchmarks.
//!
//! - `purlin-bench` (`src/bin/purlin-bench.rs`, run by `cargo xtask bench`): the collectives
//!   sweep, Purlin beside NCCL plain and NCCL with symmetric windows, nccl-tests style
//!   (docs/design.md §6). The library below is its machinery, tested without a GPU. Without a GPU
//!   it runs Purlin's host executor instead (`host`), and says so.
//! - criterion benches of the launch path in `benches/`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod case;
pub mod cli;
pub mod coord;
pub mod gpu;
pub mod host;
pub mod launch;
pub mod nccl;
pub mod plot;
pub mod purlin;
pub mod report;
pub mod run;
pub mod spec;

/// The git commit this binary was built from ("unknown" outside a checkout).
pub const COMMIT: &str = env!("PURLIN_BENCH_COMMIT");
