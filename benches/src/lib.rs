//! Criterion benchmarks of Purlin live in `benches/benches/`; the collectives benchmark
//! that compares with NCCL is `cargo xtask bench`.
