//! What is measured: the test kit's vocabulary ([`Collective`], [`Dtype`], [`Op`], with their
//! names), what the benchmark adds to it (command-line parsing, the sweep groups, nccl-tests'
//! bus-bandwidth factor and size convention, the names results.json spells), the modes and the
//! sizes. One collective at one size, with its inputs, expected output and check, is a
//! [`Case`] (the test kit's reference).

use std::fmt;

use anyhow::{Result, bail};
use serde::Serialize;

pub use crate::case::{Case, POISON};
pub use purlin_testkit::{Collective, Dtype, Op};

/// The rooted collectives (root 0), swept only when named (`all` is [`Collective::ALL`]).
pub const ROOTED: [Collective; 2] = [Collective::Broadcast, Collective::Reduce];

/// Point-to-point, swept only when named.
pub const POINT_TO_POINT: [Collective; 1] = [Collective::SendRecv];

/// Parses `all` or a comma-separated list of collective names ([`Collective::name`]).
pub fn parse_collectives(s: &str) -> Result<Vec<Collective>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "all" {
            out.extend(Collective::ALL);
            continue;
        }
        match Collective::EVERY.into_iter().find(|c| c.name() == part) {
            Some(c) => out.push(c),
            None => bail!(
                "unknown collective {part:?}; expected all or one of {}",
                Collective::EVERY.map(Collective::name).join(", ")
            ),
        }
    }
    dedup(&mut out);
    if out.is_empty() {
        bail!("--collective: empty list");
    }
    Ok(out)
}

/// Parses a dtype name ([`Dtype::name`]), or its NCCL/torch spelling (`float`, `half`,
/// `bfloat16`, `int32`, ...).
pub fn parse_dtype(s: &str) -> Result<Dtype> {
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
        other => bail!("unknown dtype {other:?}; expected one of {}", Dtype::ALL.map(Dtype::name).join(", ")),
    };
    Ok(d)
}

/// Parses an op name ([`Op::name`]).
pub fn parse_op(s: &str) -> Result<Op> {
    match Op::ALL.into_iter().find(|o| o.name() == s.trim()) {
        Some(o) => Ok(o),
        None => bail!("unknown op {s:?}; expected one of sum, prod, min, max, avg"),
    }
}

/// nccl-tests' bus-bandwidth factor: busbw = algbw × factor. AllReduce 2(n−1)/n, Broadcast,
/// Reduce and SendRecv 1, the others (n−1)/n (the V forms use their non-V form's factor on the
/// nominal size).
pub fn busbw_factor(collective: Collective, world: usize) -> f64 {
    let n = world as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        _ => (n - 1.0) / n,
    }
}

/// What `bytes` (the size column) means for `collective`, as nccl-tests defines it.
pub fn bytes_meaning(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "the buffer each rank reduces (= its output)",
        Collective::AllGather | Collective::AllGatherV => "each rank's whole output (all contributions)",
        Collective::ReduceScatter | Collective::ReduceScatterV => "each rank's whole input (all partitions)",
        Collective::AllToAll | Collective::AllToAllV => "each rank's whole input (all it sends)",
        Collective::Broadcast => "the buffer broadcast (every rank's output)",
        Collective::Reduce => "the buffer each rank reduces (the root's output)",
        Collective::SendRecv => "the buffer each rank sends (= the one it receives)",
    }
}

/// results.json's dtype name: the [name](Dtype::name), except that the fp8 types are spelled
/// `f8e4m3` / `f8e5m2` (the variant, lowercase), as the files always have.
pub fn json_dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::F8E4M3 => "f8e4m3",
        Dtype::F8E5M2 => "f8e5m2",
        d => d.name(),
    }
}

/// Serializes a collective, dtype or op (`#[serde(serialize_with)]`) by its results.json name.
pub mod json {
    use serde::Serializer;

    use super::{Collective, Dtype, Op, json_dtype_name};

    /// A collective by [`Collective::name`].
    pub fn collective<S: Serializer>(c: &Collective, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    /// Collectives by [`Collective::name`].
    pub fn collectives<S: Serializer>(cs: &[Collective], s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(cs.iter().map(|c| c.name()))
    }

    /// A dtype by [`json_dtype_name`].
    pub fn dtype<S: Serializer>(d: &Dtype, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(json_dtype_name(*d))
    }

    /// An op by [`Op::name`].
    pub fn op<S: Serializer>(o: &Op, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(o.name())
    }

    /// An optional op by [`Op::name`] (`null` for none).
    pub fn op_option<S: Serializer>(o: &Option<Op>, s: S) -> std::result::Result<S::Ok, S::Error> {
        match o {
            Some(o) => s.serialize_some(o.name()),
            None => s.serialize_none(),
        }
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
        assert_eq!(busbw_factor(Collective::AllReduce, 2), 1.0);
        assert_eq!(busbw_factor(Collective::AllReduce, 8), 1.75);
        for c in Collective::ALL.into_iter().filter(|c| *c != Collective::AllReduce) {
            assert_eq!(busbw_factor(c, 2), 0.5);
            assert_eq!(busbw_factor(c, 8), 0.875);
        }
        for c in ROOTED.into_iter().chain(POINT_TO_POINT) {
            assert_eq!(busbw_factor(c, 8), 1.0);
        }
    }

    #[test]
    fn parse_lists() {
        assert_eq!(parse_collectives("all").unwrap().len(), 7);
        assert_eq!(
            parse_collectives("all-reduce,all-to-all-v").unwrap(),
            vec![Collective::AllReduce, Collective::AllToAllV]
        );
        // The rooted collectives only when named.
        assert_eq!(parse_collectives("broadcast,reduce").unwrap(), ROOTED.to_vec());
        assert!(!parse_collectives("all").unwrap().contains(&Collective::Broadcast));
        assert!(parse_collectives("gather").is_err());
        // Every name parses to its collective.
        for c in Collective::EVERY {
            assert_eq!(parse_collectives(c.name()).unwrap(), vec![c]);
        }
        assert_eq!(parse_dtype("bfloat16").unwrap(), Dtype::Bf16);
        assert_eq!(parse_dtype("float8_e4m3fn").unwrap(), Dtype::F8E4M3);
        assert_eq!(parse_dtype("e5m2").unwrap(), Dtype::F8E5M2);
        for d in Dtype::ALL {
            assert_eq!(parse_dtype(d.name()).unwrap(), d);
        }
        assert_eq!(parse_op("avg").unwrap(), Op::Avg);
        assert_eq!(Mode::parse_list("both").unwrap().len(), 2);
    }

    /// The sweep groups cover the kit's collectives once each, in its order.
    #[test]
    fn the_groups_are_every_collective() {
        let groups: Vec<Collective> = Collective::ALL.into_iter().chain(ROOTED).chain(POINT_TO_POINT).collect();
        assert_eq!(groups, Collective::EVERY);
    }

    /// results.json keeps its names: kebab-case collectives, lowercase dtypes and ops.
    #[test]
    fn json_names() {
        #[derive(serde::Serialize)]
        struct Doc {
            #[serde(serialize_with = "json::collectives")]
            cs: Vec<Collective>,
            #[serde(serialize_with = "json::dtype")]
            d: Dtype,
            #[serde(serialize_with = "json::op")]
            o: Op,
            #[serde(serialize_with = "json::op_option")]
            some: Option<Op>,
            #[serde(serialize_with = "json::op_option")]
            none: Option<Op>,
        }
        let doc = Doc {
            cs: vec![Collective::AllGatherV, Collective::SendRecv],
            d: Dtype::F8E4M3,
            o: Op::Prod,
            some: Some(Op::Avg),
            none: None,
        };
        assert_eq!(
            serde_json::to_string(&doc).unwrap(),
            r#"{"cs":["all-gather-v","send-recv"],"d":"f8e4m3","o":"prod","some":"avg","none":null}"#
        );
        assert_eq!(Dtype::ALL.map(json_dtype_name)[..10], Dtype::ALL.map(Dtype::name)[..10]);
    }
}
