//! What is measured: the benchmark's vocabulary (collectives, element types, reduce ops, modes,
//! with their command-line names) and its sizes. One collective at one size, with its inputs,
//! expected output and check, is a [`Case`] (`crate::case`, the test kit's reference).

use std::fmt;

use anyhow::{Result, bail};
use serde::Serialize;

pub use crate::case::{Case, POISON};

/// A collective the benchmark sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Reduce everything, everyone gets the result.
    AllReduce,
    /// Everyone's contribution, concatenated in rank order, to everyone.
    AllGather,
    /// Reduce, rank `r` keeps partition `r`.
    ReduceScatter,
    /// Partition `p` of rank `r` goes to partition `r` of rank `p`.
    AllToAll,
    /// AllGather with per-rank contribution sizes (Zipf-skewed).
    AllGatherV,
    /// ReduceScatter with per-rank partition sizes (Zipf-skewed).
    ReduceScatterV,
    /// AllToAll with per-pair sizes (Zipf-skewed towards low destination ranks).
    AllToAllV,
    /// Rank 0's buffer to every rank (nccl-tests' `broadcast_perf`, root 0).
    Broadcast,
    /// Reduce everything, rank 0 gets the result (nccl-tests' `reduce_perf`, root 0).
    Reduce,
    /// Each rank sends its buffer to rank + 1 and receives rank − 1's (nccl-tests'
    /// `sendrecv_perf`); Purlin's `send_recv` runs it at world 2, where the pair is the world.
    SendRecv,
}

impl Collective {
    /// Every collective, in sweep order.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllGatherV,
        Collective::ReduceScatterV,
        Collective::AllToAllV,
    ];

    /// The rooted collectives (root 0), swept only when named (`all` is [`Collective::ALL`]).
    pub const ROOTED: [Collective; 2] = [Collective::Broadcast, Collective::Reduce];

    /// Point-to-point, swept only when named.
    pub const POINT_TO_POINT: [Collective; 1] = [Collective::SendRecv];

    /// Every collective the benchmark knows: [`Collective::ALL`], [`Collective::ROOTED`], then
    /// [`Collective::POINT_TO_POINT`].
    pub fn every() -> impl Iterator<Item = Collective> {
        Collective::ALL.into_iter().chain(Collective::ROOTED).chain(Collective::POINT_TO_POINT)
    }

    /// The command-line (and CSV) name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::AllGather => "all-gather",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllToAll => "all-to-all",
            Collective::AllGatherV => "all-gather-v",
            Collective::ReduceScatterV => "reduce-scatter-v",
            Collective::AllToAllV => "all-to-all-v",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::SendRecv => "send-recv",
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(s: &str) -> Result<Vec<Collective>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(Collective::ALL);
                continue;
            }
            match Collective::every().find(|c| c.name() == part) {
                Some(c) => out.push(c),
                None => bail!(
                    "unknown collective {part:?}; expected all or one of {}",
                    Collective::every().map(|c| c.name()).collect::<Vec<_>>().join(", ")
                ),
            }
        }
        dedup(&mut out);
        if out.is_empty() {
            bail!("--collective: empty list");
        }
        Ok(out)
    }

    /// The test kit's collective.
    pub fn kit(self) -> purlin_testkit::Collective {
        match self {
            Collective::AllReduce => purlin_testkit::Collective::AllReduce,
            Collective::AllGather => purlin_testkit::Collective::AllGather,
            Collective::ReduceScatter => purlin_testkit::Collective::ReduceScatter,
            Collective::AllToAll => purlin_testkit::Collective::AllToAll,
            Collective::AllGatherV => purlin_testkit::Collective::AllGatherV,
            Collective::ReduceScatterV => purlin_testkit::Collective::ReduceScatterV,
            Collective::AllToAllV => purlin_testkit::Collective::AllToAllV,
            Collective::Broadcast => purlin_testkit::Collective::Broadcast,
            Collective::Reduce => purlin_testkit::Collective::Reduce,
            Collective::SendRecv => purlin_testkit::Collective::SendRecv,
        }
    }

    /// Whether the collective reduces (takes a reduce op).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce
        )
    }

    /// Whether partition sizes vary per rank.
    pub fn is_v(self) -> bool {
        matches!(self, Collective::AllGatherV | Collective::ReduceScatterV | Collective::AllToAllV)
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw × factor. AllReduce 2(n−1)/n,
    /// Broadcast, Reduce and SendRecv 1, the others (n−1)/n (the V forms use their non-V
    /// form's factor on the nominal size).
    pub fn busbw_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
            _ => (n - 1.0) / n,
        }
    }

    /// What `bytes` (the size column) means for this collective, as nccl-tests defines it.
    pub fn bytes_meaning(self) -> &'static str {
        match self {
            Collective::AllReduce => "the buffer each rank reduces (= its output)",
            Collective::AllGather | Collective::AllGatherV => "each rank's whole output (all contributions)",
            Collective::ReduceScatter | Collective::ReduceScatterV => "each rank's whole input (all partitions)",
            Collective::AllToAll | Collective::AllToAllV => "each rank's whole input (all it sends)",
            Collective::Broadcast => "the buffer broadcast (every rank's output)",
            Collective::Reduce => "the buffer each rank reduces (the root's output)",
            Collective::SendRecv => "the buffer each rank sends (= the one it receives)",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 64-bit float.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// fp8 e4m3 (NCCL's `ncclFloat8e4m3`).
    F8E4M3,
    /// fp8 e5m2 (NCCL's `ncclFloat8e5m2`).
    F8E5M2,
}

impl Dtype {
    /// Every element type.
    pub const ALL: [Dtype; 12] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F64,
        Dtype::I8,
        Dtype::U8,
        Dtype::I32,
        Dtype::U32,
        Dtype::I64,
        Dtype::U64,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ];

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F64 => "f64",
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::I32 => "i32",
            Dtype::U32 => "u32",
            Dtype::I64 => "i64",
            Dtype::U64 => "u64",
            Dtype::F8E4M3 => "e4m3",
            Dtype::F8E5M2 => "e5m2",
        }
    }

    /// Parses a name (also the NCCL/torch spellings `float`, `half`, `bfloat16`, `int32`, ...).
    pub fn parse(s: &str) -> Result<Dtype> {
        let d = match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float" | "float32" => Dtype::F32,
            "f16" | "half" | "float16" => Dtype::F16,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "f64" | "double" | "float64" => Dtype::F64,
            "i8" | "int8" => Dtype::I8,
            "u8" | "uint8" => Dtype::U8,
            "i32" | "int" | "int32" => Dtype::I32,
            "u32" | "uint32" => Dtype::U32,
            "i64" | "int64" => Dtype::I64,
            "u64" | "uint64" => Dtype::U64,
            "e4m3" | "f8e4m3" | "fp8e4m3" | "float8_e4m3fn" => Dtype::F8E4M3,
            "e5m2" | "f8e5m2" | "fp8e5m2" | "float8_e5m2" => Dtype::F8E5M2,
            other => bail!("unknown dtype {other:?}; expected one of {}", Dtype::ALL.map(|d| d.name()).join(", ")),
        };
        Ok(d)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::I8 | Dtype::U8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F64 | Dtype::F8E4M3 | Dtype::F8E5M2)
    }

    /// The test kit's element type.
    pub fn kit(self) -> purlin_testkit::Dtype {
        match self {
            Dtype::F32 => purlin_testkit::Dtype::F32,
            Dtype::F16 => purlin_testkit::Dtype::F16,
            Dtype::Bf16 => purlin_testkit::Dtype::Bf16,
            Dtype::F64 => purlin_testkit::Dtype::F64,
            Dtype::I8 => purlin_testkit::Dtype::I8,
            Dtype::U8 => purlin_testkit::Dtype::U8,
            Dtype::I32 => purlin_testkit::Dtype::I32,
            Dtype::U32 => purlin_testkit::Dtype::U32,
            Dtype::I64 => purlin_testkit::Dtype::I64,
            Dtype::U64 => purlin_testkit::Dtype::U64,
            Dtype::F8E4M3 => purlin_testkit::Dtype::F8E4M3,
            Dtype::F8E5M2 => purlin_testkit::Dtype::F8E5M2,
        }
    }

    /// Encodes a (small, exactly representable) integer as this type's bytes, little-endian
    /// (the test kit's codecs).
    pub fn encode(self, v: i64, out: &mut [u8]) {
        self.kit().encode(v, out)
    }

    /// Decodes one element to f64 (for tolerant comparisons and diagnostics).
    pub fn decode(self, b: &[u8]) -> f64 {
        self.kit().decode(b)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduce op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Mean over ranks.
    Avg,
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
            Op::Avg => "avg",
        }
    }

    /// The test kit's op.
    pub fn kit(self) -> purlin_testkit::Op {
        match self {
            Op::Sum => purlin_testkit::Op::Sum,
            Op::Prod => purlin_testkit::Op::Prod,
            Op::Min => purlin_testkit::Op::Min,
            Op::Max => purlin_testkit::Op::Max,
            Op::Avg => purlin_testkit::Op::Avg,
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Op> {
        match Op::ALL.iter().find(|o| o.name() == s.trim()) {
            Some(o) => Ok(*o),
            None => bail!("unknown op {s:?}; expected one of sum, prod, min, max, avg"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How calls are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Back-to-back launches from the host.
    Eager,
    /// Replays of a CUDA graph that captured the back-to-back calls.
    Graph,
}

impl Mode {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Eager => "eager",
            Mode::Graph => "graph",
        }
    }

    /// Parses `eager`, `graph` or `both`.
    pub fn parse_list(s: &str) -> Result<Vec<Mode>> {
        match s.trim() {
            "eager" => Ok(vec![Mode::Eager]),
            "graph" => Ok(vec![Mode::Graph]),
            "both" => Ok(vec![Mode::Eager, Mode::Graph]),
            other => bail!("unknown mode {other:?}; expected eager, graph or both"),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn dedup<T: PartialEq + Copy>(v: &mut Vec<T>) {
    let mut seen = Vec::new();
    v.retain(|x| {
        if seen.contains(x) {
            false
        } else {
            seen.push(*x);
            true
        }
    });
}

/// Parses a size: a number of bytes with an optional binary suffix K, M, G (or KB/KiB, ...).
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let stripped = upper.trim_end_matches("IB").trim_end_matches('B');
    let (digits, shift) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 10),
        Some('M') => (&stripped[..stripped.len() - 1], 20),
        Some('G') => (&stripped[..stripped.len() - 1], 30),
        _ => (stripped, 0),
    };
    let n: usize = match digits.trim().parse() {
        Ok(n) => n,
        Err(_) => bail!("bad size {s:?}: expected bytes like 8, 1K, 64M, 1G"),
    };
    match n.checked_mul(1usize << shift) {
        Some(v) if v > 0 => Ok(v),
        Some(_) => bail!("bad size {s:?}: must be positive"),
        None => bail!("bad size {s:?}: too large"),
    }
}

/// Formats bytes the short way (8, 1K, 64M, 1G) where exact, else as a number.
pub fn format_size(b: usize) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", b >> shift);
        }
    }
    b.to_string()
}

/// The sizes of a sweep: `min`, `min·factor`, … up to `max` inclusive.
pub fn sweep_sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        out.push(s);
        match s.checked_mul(factor.max(2)) {
            Some(n) => s = n,
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("2kb").unwrap(), 2048);
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(96), "96");
        assert_eq!(format_size(3 << 20), "3M");
    }

    #[test]
    fn sweep_doubles() {
        let s = sweep_sizes(8, 1 << 30, 2);
        assert_eq!(s.len(), 28);
        assert_eq!(s[0], 8);
        assert_eq!(*s.last().unwrap(), 1 << 30);
        assert_eq!(sweep_sizes(8, 64, 4), vec![8, 32]);
    }

    #[test]
    fn busbw_factors_match_nccl_tests() {
        assert_eq!(Collective::AllReduce.busbw_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.busbw_factor(8), 1.75);
        for c in Collective::ALL.into_iter().filter(|c| *c != Collective::AllReduce) {
            assert_eq!(c.busbw_factor(2), 0.5);
            assert_eq!(c.busbw_factor(8), 0.875);
        }
    }

    #[test]
    fn parse_lists() {
        assert_eq!(Collective::parse_list("all").unwrap().len(), 7);
        assert_eq!(
            Collective::parse_list("all-reduce,all-to-all-v").unwrap(),
            vec![Collective::AllReduce, Collective::AllToAllV]
        );
        // The rooted collectives only when named.
        assert_eq!(Collective::parse_list("broadcast,reduce").unwrap(), Collective::ROOTED.to_vec());
        assert!(!Collective::parse_list("all").unwrap().contains(&Collective::Broadcast));
        assert!(Collective::parse_list("gather").is_err());
        assert_eq!(Dtype::parse("bfloat16").unwrap(), Dtype::Bf16);
        assert_eq!(Dtype::parse("float8_e4m3fn").unwrap(), Dtype::F8E4M3);
        assert_eq!(Dtype::parse("e5m2").unwrap(), Dtype::F8E5M2);
        // The test kit's vocabulary, variant for variant.
        assert_eq!(Dtype::ALL.map(Dtype::kit), purlin_testkit::Dtype::ALL);
        assert_eq!(Op::ALL.map(Op::kit), purlin_testkit::Op::ALL);
        assert_eq!(Collective::every().map(Collective::kit).collect::<Vec<_>>(), purlin_testkit::Collective::EVERY);
        assert_eq!(Op::parse("avg").unwrap(), Op::Avg);
        assert_eq!(Mode::parse_list("both").unwrap().len(), 2);
    }
}
