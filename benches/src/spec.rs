//! What is measured: collectives, element types, reduce ops, modes, and one [`Case`] (a
//! collective at one size) with its per-rank layout, its inputs, its expected output and the
//! check that counts wrong elements.
//!
//! Inputs are small integers drawn from a counter-based hash, so every rank can regenerate any
//! peer's input (no data exchange for the reference) and any summation order is exact. They are
//! never zero. Outputs are poisoned with [`POISON`] bytes before each checked call.

use std::fmt;

use anyhow::{Result, bail};
use serde::Serialize;

/// The byte every output buffer is filled with before a checked call. As f16, bf16, f32 and
/// f64 it is a small negative non-integer; as an integer it is negative (signed) or larger
/// than any expected value (unsigned): never a value a correct collective produces.
pub const POISON: u8 = 0xA5;

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

    /// The largest integer up to which every integer is exactly representable (capped).
    pub fn max_exact(self) -> i64 {
        match self {
            Dtype::F16 => 2048,
            Dtype::Bf16 => 256,
            Dtype::F8E4M3 => 16,
            Dtype::F8E5M2 => 8,
            Dtype::F32 => 1 << 24,
            Dtype::I8 => 127,
            Dtype::U8 => 255,
            Dtype::F64 | Dtype::I32 | Dtype::U32 | Dtype::I64 | Dtype::U64 => 1 << 30,
        }
    }

    /// The largest `k` such that `2^k` is exact and in range.
    fn max_pow2_exp(self) -> u32 {
        match self {
            Dtype::F16 => 15,
            Dtype::I8 => 6,
            Dtype::U8 => 7,
            Dtype::I32 => 30,
            Dtype::U32 => 31,
            Dtype::I64 => 62,
            Dtype::U64 => 63,
            Dtype::F8E4M3 => 8,
            Dtype::F8E5M2 => 15,
            Dtype::Bf16 | Dtype::F32 => 127,
            Dtype::F64 => 1023,
        }
    }

    /// Encodes a (small, exactly representable) integer as this type's bytes, little-endian.
    pub fn encode(self, v: i64, out: &mut [u8]) {
        match self {
            Dtype::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            Dtype::F16 => out.copy_from_slice(&half::f16::from_f64(v as f64).to_le_bytes()),
            Dtype::Bf16 => out.copy_from_slice(&half::bf16::from_f64(v as f64).to_le_bytes()),
            Dtype::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
            Dtype::I8 => out.copy_from_slice(&(v as i8).to_le_bytes()),
            Dtype::U8 => out.copy_from_slice(&(v as u8).to_le_bytes()),
            Dtype::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
            Dtype::U32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
            Dtype::I64 => out.copy_from_slice(&v.to_le_bytes()),
            Dtype::U64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
            Dtype::F8E4M3 => out[0] = purlin_atom::host::f32_to_e4m3(v as f32),
            Dtype::F8E5M2 => out[0] = purlin_atom::host::f32_to_e5m2(v as f32),
        }
    }

    /// Decodes one element to f64 (for tolerant comparisons and diagnostics).
    pub fn decode(self, b: &[u8]) -> f64 {
        match self {
            Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::F64 => f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])),
            Dtype::I8 => b[0] as i8 as f64,
            Dtype::U8 => b[0] as f64,
            Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::I64 => i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
            Dtype::U64 => u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64,
            Dtype::F8E4M3 => purlin_atom::host::e4m3_to_f32(b[0]) as f64,
            Dtype::F8E5M2 => purlin_atom::host::e5m2_to_f32(b[0]) as f64,
        }
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

/// Splits `total` elements over `n` parts with Zipf weights `1/(p+1)^skew` (skew 0: even).
/// Parts sum to `total` exactly; remainders go to the lowest parts.
pub fn zipf_split(total: usize, n: usize, skew: f64) -> Vec<usize> {
    let w: Vec<f64> = (0..n).map(|p| 1.0 / ((p + 1) as f64).powf(skew)).collect();
    let sum: f64 = w.iter().sum();
    let mut parts: Vec<usize> = w.iter().map(|x| ((total as f64) * x / sum).floor() as usize).collect();
    let assigned: usize = parts.iter().sum();
    let mut left = total.saturating_sub(assigned);
    let mut p = 0;
    while left > 0 {
        parts[p % n] += 1;
        left -= 1;
        p += 1;
    }
    parts
}

/// One contiguous piece of a rank's expected output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Segment {
    /// `len` elements at `out` are rank `from`'s input elements at `input`.
    Copy {
        /// Output offset (elements).
        out: usize,
        /// Source rank.
        from: usize,
        /// Source input offset (elements).
        input: usize,
        /// Elements.
        len: usize,
    },
    /// `len` elements at `out` are the reduction over all ranks of their input at `input`.
    Reduce {
        /// Output offset (elements).
        out: usize,
        /// Input offset (elements), the same on every rank.
        input: usize,
        /// Elements.
        len: usize,
    },
}

/// The rule inputs are drawn by: small positive integers that keep the expected result exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRule {
    /// Values are `scale × u`, `u` uniform in `1..=hi`, or powers of two when `pow2`.
    pub hi: i64,
    /// Multiplier (the world size for `avg`, so the mean is an integer).
    pub scale: i64,
    /// Draw from {1, 2} (for `prod`).
    pub pow2: bool,
}

impl ValueRule {
    /// The rule for a collective, dtype, op and world.
    pub fn new(dtype: Dtype, op: Option<Op>, world: usize) -> ValueRule {
        let n = world.max(1) as i64;
        let exact = dtype.max_exact();
        match op {
            None => ValueRule { hi: exact.min(100), scale: 1, pow2: false },
            Some(Op::Sum) => ValueRule { hi: (exact / n).clamp(1, 16), scale: 1, pow2: false },
            Some(Op::Prod) => {
                if (world as u32) <= dtype.max_pow2_exp() {
                    ValueRule { hi: 2, scale: 1, pow2: true }
                } else {
                    ValueRule { hi: 1, scale: 1, pow2: false }
                }
            }
            Some(Op::Min) | Some(Op::Max) => ValueRule { hi: exact.min(100), scale: 1, pow2: false },
            Some(Op::Avg) => ValueRule { hi: (exact / (n * n)).clamp(1, 16), scale: n, pow2: false },
        }
    }

    /// The input value of `rank` at element `idx` (never zero).
    #[inline]
    pub fn value(&self, seed: u64, rank: usize, idx: usize) -> i64 {
        let h = splitmix64(seed ^ ((rank as u64) << 48) ^ (idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let u = 1 + (((h >> 32) * self.hi as u64) >> 32) as i64;
        if self.pow2 { u } else { u * self.scale }
    }
}

#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Encodes small integers fast: a table of every value's bytes in `-LIMIT..=LIMIT`.
struct Encoder {
    dtype: Dtype,
    table: Vec<u8>,
}

const LIMIT: i64 = 1 << 16;

impl Encoder {
    fn new(dtype: Dtype) -> Encoder {
        let es = dtype.size();
        let mut table = vec![0u8; (2 * LIMIT as usize + 1) * es];
        for (k, ch) in table.chunks_exact_mut(es).enumerate() {
            dtype.encode(k as i64 - LIMIT, ch);
        }
        Encoder { dtype, table }
    }

    fn fill(&self, out: &mut [u8], f: impl Fn(usize) -> i64) {
        match self.dtype.size() {
            1 => self.fill_n::<1>(out, f),
            2 => self.fill_n::<2>(out, f),
            4 => self.fill_n::<4>(out, f),
            _ => self.fill_n::<8>(out, f),
        }
    }

    fn fill_n<const N: usize>(&self, out: &mut [u8], f: impl Fn(usize) -> i64) {
        for (i, ch) in out.chunks_exact_mut(N).enumerate() {
            let v = f(i);
            if (-LIMIT..=LIMIT).contains(&v) {
                let k = (v + LIMIT) as usize * N;
                ch.copy_from_slice(&self.table[k..k + N]);
            } else {
                self.dtype.encode(v, ch);
            }
        }
    }
}

/// Fills `out` (elements of `es` bytes) in parallel chunks: `f(first_element, chunk)`.
fn par_fill(out: &mut [u8], es: usize, f: &(dyn Fn(usize, &mut [u8]) + Sync)) {
    let n = out.len() / es;
    let threads =
        if out.len() < (4 << 20) { 1 } else { std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, 8) };
    if threads == 1 {
        f(0, out);
        return;
    }
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (k, chunk) in out.chunks_mut(per * es).enumerate() {
            s.spawn(move || f(k * per, chunk));
        }
    });
}

/// One collective at one size: the layout of every rank's input and output.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: Dtype,
    /// Reduce op (None for gathers and all-to-alls).
    pub op: Option<Op>,
    /// Ranks.
    pub world: usize,
    /// Elements of the nccl-tests "size" (see [`Collective::bytes_meaning`]).
    pub count: usize,
    /// `m[p][q]`: elements rank p contributes to rank q's output (A2A), or for AG/RS forms
    /// `m[0][p]`: elements of partition / contribution p.
    pub matrix: Vec<Vec<usize>>,
    /// Seed of this case's inputs (fresh per size).
    pub seed: u64,
    /// The input rule.
    pub rule: ValueRule,
    /// In place (NCCL's convention, nccl-tests' in-place columns): one buffer per rank, the
    /// receive buffer, laid out as [`Case::in_place_layout`] says.
    pub in_place: bool,
}

/// Where an in-place call's input and output lie in its one buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPlaceLayout {
    /// The buffer's elements.
    pub len: usize,
    /// Where the input starts.
    pub input_at: usize,
    /// Where the output starts.
    pub output_at: usize,
}

impl Case {
    /// The case for `bytes` nominal bytes, or `None` where the size holds fewer elements
    /// than the collective needs (one per rank, or per pair for all-to-all).
    pub fn new(
        collective: Collective,
        dtype: Dtype,
        op: Op,
        world: usize,
        bytes: usize,
        skew: f64,
        seed: u64,
    ) -> Option<Case> {
        let n = world;
        let elems = bytes / dtype.size();
        let op = collective.reduces().then_some(op);
        let (count, matrix) = match collective {
            Collective::AllReduce => {
                if elems == 0 {
                    return None;
                }
                (elems, vec![vec![elems]])
            }
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                let c = elems / n;
                if c == 0 {
                    return None;
                }
                let rows = if collective == Collective::AllToAll { n } else { 1 };
                (c * n, vec![vec![c; n]; rows])
            }
            Collective::AllGatherV | Collective::ReduceScatterV => {
                if elems < n {
                    return None;
                }
                (elems, vec![zipf_split(elems, n, skew)])
            }
            Collective::AllToAllV => {
                if elems < n {
                    return None;
                }
                let row = zipf_split(elems, n, skew);
                (elems, vec![row; n])
            }
            // The AllGatherV / ReduceScatterV whose only nonzero part is the root's (rank 0).
            Collective::Broadcast | Collective::Reduce => {
                if elems == 0 {
                    return None;
                }
                (elems, vec![(0..n).map(|p| if p == 0 { elems } else { 0 }).collect()])
            }
            // The AllToAllV whose only pairs are p → p + 1 (mod n).
            Collective::SendRecv => {
                if elems == 0 || n < 2 {
                    return None;
                }
                (elems, (0..n).map(|p| (0..n).map(|q| if q == (p + 1) % n { elems } else { 0 }).collect()).collect())
            }
        };
        Some(Case {
            collective,
            dtype,
            op,
            world,
            count,
            matrix,
            seed,
            rule: ValueRule::new(dtype, op, world),
            in_place: false,
        })
    }

    /// Rank `rank`'s in-place layout, NCCL's convention: AllReduce on the whole buffer,
    /// AllGather with the rank's input at partition `rank` of the output, ReduceScatter
    /// with the output at partition `rank` of the input, Broadcast and Reduce on the whole
    /// buffer (the root's part at 0). `None`: an out-of-place case, or a collective with no
    /// in-place form (AllToAll and the V forms).
    pub fn in_place_layout(&self, rank: usize) -> Option<InPlaceLayout> {
        if !self.in_place {
            return None;
        }
        let (input, output) = (self.in_count(rank), self.out_count(rank));
        match self.collective {
            Collective::AllReduce => Some(InPlaceLayout { len: output, input_at: 0, output_at: 0 }),
            Collective::AllGather => Some(InPlaceLayout { len: output, input_at: rank * input, output_at: 0 }),
            Collective::ReduceScatter => Some(InPlaceLayout { len: input, input_at: 0, output_at: rank * output }),
            // The root's part at offset 0, the whole buffer on every rank.
            Collective::Broadcast | Collective::Reduce => {
                Some(InPlaceLayout { len: self.count, input_at: 0, output_at: 0 })
            }
            _ => None,
        }
    }

    /// The size in bytes (nccl-tests' definition, see [`Collective::bytes_meaning`]).
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Partition sizes for AG/RS forms (`parts()[p]` = rank p's contribution or partition).
    pub fn parts(&self) -> &[usize] {
        &self.matrix[0]
    }

    /// Offset of partition `p` in an AG/RS form's full buffer.
    pub fn part_offset(&self, p: usize) -> usize {
        self.parts()[..p].iter().sum()
    }

    /// Elements rank `p` sends to rank `q` (all-to-all forms).
    pub fn pair(&self, p: usize, q: usize) -> usize {
        self.matrix[p][q]
    }

    /// Offset in rank `p`'s input of what it sends to `q` (all-to-all forms).
    pub fn send_offset(&self, p: usize, q: usize) -> usize {
        self.matrix[p][..q].iter().sum()
    }

    /// Offset in rank `r`'s output of what it receives from `p` (all-to-all forms).
    pub fn recv_offset(&self, r: usize, p: usize) -> usize {
        (0..p).map(|q| self.matrix[q][r]).sum()
    }

    /// Input elements of `rank`.
    pub fn in_count(&self, rank: usize) -> usize {
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
                self.count
            }
            Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => self.parts()[rank],
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => self.matrix[rank].iter().sum(),
        }
    }

    /// Output elements of `rank`.
    pub fn out_count(&self, rank: usize) -> usize {
        match self.collective {
            Collective::AllReduce | Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => {
                self.count
            }
            Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => self.parts()[rank],
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
                (0..self.world).map(|p| self.matrix[p][rank]).sum()
            }
        }
    }

    /// The segments of `rank`'s expected output.
    pub fn segments(&self, rank: usize) -> Vec<Segment> {
        let n = self.world;
        match self.collective {
            Collective::AllReduce => vec![Segment::Reduce { out: 0, input: 0, len: self.count }],
            Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => (0..n)
                .map(|p| Segment::Copy { out: self.part_offset(p), from: p, input: 0, len: self.parts()[p] })
                .collect(),
            Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
                vec![Segment::Reduce { out: 0, input: self.part_offset(rank), len: self.parts()[rank] }]
            }
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => (0..n)
                .map(|p| Segment::Copy {
                    out: self.recv_offset(rank, p),
                    from: p,
                    input: self.send_offset(p, rank),
                    len: self.pair(p, rank),
                })
                .collect(),
        }
    }

    /// `rank`'s input, encoded.
    pub fn input(&self, rank: usize) -> Vec<u8> {
        let es = self.dtype.size();
        let mut out = vec![0u8; self.in_count(rank) * es];
        let enc = Encoder::new(self.dtype);
        let (rule, seed) = (self.rule, self.seed);
        par_fill(&mut out, es, &|first, chunk| enc.fill(chunk, |i| rule.value(seed, rank, first + i)));
        out
    }

    /// `rank`'s expected output, encoded.
    pub fn expected(&self, rank: usize) -> Vec<u8> {
        let es = self.dtype.size();
        let mut out = vec![POISON; self.out_count(rank) * es];
        let enc = Encoder::new(self.dtype);
        let (rule, seed, n) = (self.rule, self.seed, self.world);
        for seg in self.segments(rank) {
            match seg {
                Segment::Copy { out: o, from, input, len } => {
                    par_fill(&mut out[o * es..(o + len) * es], es, &|first, chunk| {
                        enc.fill(chunk, |i| rule.value(seed, from, input + first + i))
                    });
                }
                Segment::Reduce { out: o, input, len } => {
                    let dst = &mut out[o * es..(o + len) * es];
                    let v = |p: usize, i: usize| rule.value(seed, p, i);
                    match self.op.unwrap_or(Op::Sum) {
                        Op::Sum => {
                            par_fill(dst, es, &|f, c| enc.fill(c, |i| (0..n).map(|p| v(p, input + f + i)).sum()))
                        }
                        Op::Prod => {
                            par_fill(dst, es, &|f, c| enc.fill(c, |i| (0..n).map(|p| v(p, input + f + i)).product()))
                        }
                        Op::Min => par_fill(dst, es, &|f, c| {
                            enc.fill(c, |i| (0..n).map(|p| v(p, input + f + i)).min().unwrap_or(0))
                        }),
                        Op::Max => par_fill(dst, es, &|f, c| {
                            enc.fill(c, |i| (0..n).map(|p| v(p, input + f + i)).max().unwrap_or(0))
                        }),
                        Op::Avg => par_fill(dst, es, &|f, c| {
                            enc.fill(c, |i| (0..n).map(|p| v(p, input + f + i)).sum::<i64>() / n as i64)
                        }),
                    }
                }
            }
        }
        out
    }

    /// Counts the elements of `got` that differ from `expected` (exactly, except `avg` on
    /// floats, which allows a rounding error). Also counts missing elements.
    pub fn count_wrong(&self, got: &[u8], expected: &[u8]) -> Wrong {
        count_wrong(self.dtype, self.op, got, expected)
    }
}

/// The wrong elements of one check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Wrong {
    /// How many elements differ.
    pub count: u64,
    /// The first wrong element's index, with the value found and the one expected.
    pub first: Option<(usize, f64, f64)>,
}

/// See [`Case::count_wrong`].
pub fn count_wrong(dtype: Dtype, op: Option<Op>, got: &[u8], expected: &[u8]) -> Wrong {
    let es = dtype.size();
    let n_exp = expected.len() / es;
    let n_got = got.len() / es;
    let mut w = Wrong { count: n_exp.abs_diff(n_got) as u64, first: None };
    let tolerant = op == Some(Op::Avg) && dtype.is_float();
    if !tolerant && got == expected {
        return w; // the common case, at memcmp speed
    }
    let tol = match dtype {
        Dtype::F16 | Dtype::Bf16 => 1e-2,
        // One rounding of a 3- or 2-bit mantissa: up to 2^-4 / 2^-3 of the value.
        Dtype::F8E4M3 | Dtype::F8E5M2 => 0.125,
        _ => 1e-5,
    };
    for (i, (g, e)) in got.chunks_exact(es).zip(expected.chunks_exact(es)).enumerate() {
        let bad = if tolerant {
            let (g, e) = (dtype.decode(g), dtype.decode(e));
            g.is_nan() || (g - e).abs() > tol * e.abs().max(1.0)
        } else {
            g != e
        };
        if bad {
            w.count += 1;
            if w.first.is_none() {
                w.first = Some((i, dtype.decode(g), dtype.decode(e)));
            }
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reduction, written independently of `Case::expected`.
    fn reduce(op: Op, mut vals: impl Iterator<Item = i64>) -> i64 {
        let first = vals.next().unwrap_or(0);
        match op {
            Op::Sum => vals.fold(first, |a, b| a + b),
            Op::Prod => vals.fold(first, |a, b| a * b),
            Op::Min => vals.fold(first, i64::min),
            Op::Max => vals.fold(first, i64::max),
            Op::Avg => {
                let mut n = 1;
                let s = vals.fold(first, |a, b| {
                    n += 1;
                    a + b
                });
                s / n
            }
        }
    }

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
        for d in [Dtype::F8E4M3, Dtype::F8E5M2] {
            // Every integer up to max_exact survives the byte encoding (what the checks assume).
            for v in -d.max_exact()..=d.max_exact() {
                let mut b = [0u8];
                d.encode(v, &mut b);
                assert_eq!(d.decode(&b), v as f64, "{d:?} {v}");
            }
        }
        assert_eq!(Op::parse("avg").unwrap(), Op::Avg);
        assert_eq!(Mode::parse_list("both").unwrap().len(), 2);
    }

    #[test]
    fn zipf_sums_and_skews() {
        let p = zipf_split(1000, 4, 1.0);
        assert_eq!(p.iter().sum::<usize>(), 1000);
        assert!(p[0] > p[1] && p[1] > p[2] && p[2] > p[3]);
        assert_eq!(zipf_split(8, 4, 0.0), vec![2, 2, 2, 2]);
        assert_eq!(zipf_split(3, 4, 0.0).iter().sum::<usize>(), 3);
    }

    /// Simulates every collective on the host from the inputs alone (moving data as the
    /// collective's definition says, independently of `segments`) and checks that the
    /// expected outputs agree.
    #[test]
    fn expected_outputs_match_a_direct_simulation() {
        for world in [2, 3, 4] {
            for c in Collective::every() {
                for dtype in [Dtype::F32, Dtype::Bf16, Dtype::I8] {
                    for op in [Op::Sum, Op::Prod, Op::Max, Op::Avg] {
                        let case = Case::new(c, dtype, op, world, 1000, 1.0, 7).unwrap();
                        let inputs: Vec<Vec<i64>> = (0..world)
                            .map(|r| (0..case.in_count(r)).map(|i| case.rule.value(case.seed, r, i)).collect())
                            .collect();
                        for r in 0..world {
                            let want: Vec<i64> = simulate(&case, &inputs, r);
                            let es = dtype.size();
                            let mut enc = vec![0u8; want.len() * es];
                            for (v, ch) in want.iter().zip(enc.chunks_exact_mut(es)) {
                                dtype.encode(*v, ch);
                            }
                            let exp = case.expected(r);
                            assert_eq!(
                                case.count_wrong(&enc, &exp).count,
                                0,
                                "{c} {dtype} {op} world {world} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    fn simulate(case: &Case, inputs: &[Vec<i64>], r: usize) -> Vec<i64> {
        let n = case.world;
        let red = |i: usize| reduce(case.op.unwrap_or(Op::Sum), (0..n).map(|p| inputs[p][i]));
        match case.collective {
            Collective::AllReduce => (0..case.count).map(red).collect(),
            Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => inputs.concat(),
            Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
                let off: usize = case.parts()[..r].iter().sum();
                (off..off + case.parts()[r]).map(red).collect()
            }
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
                let mut out = Vec::new();
                for (p, input) in inputs.iter().enumerate() {
                    let off: usize = case.matrix[p][..r].iter().sum();
                    out.extend_from_slice(&input[off..off + case.matrix[p][r]]);
                }
                out
            }
        }
    }

    #[test]
    fn inputs_are_exact_small_and_never_zero() {
        for dtype in Dtype::ALL {
            for op in Op::ALL {
                for world in [2, 8, 16] {
                    let rule = ValueRule::new(dtype, Some(op), world);
                    for i in 0..2000 {
                        let v = rule.value(1, i % world, i);
                        assert!(v != 0);
                        let mut b = vec![0u8; dtype.size()];
                        dtype.encode(v, &mut b);
                        assert_eq!(dtype.decode(&b), v as f64, "{dtype} {op} {v}");
                    }
                    // The reduced value is exact too.
                    let worst = match op {
                        Op::Sum => rule.hi * rule.scale * world as i64,
                        Op::Prod => {
                            if rule.pow2 {
                                1 << world
                            } else {
                                1
                            }
                        }
                        _ => rule.hi * rule.scale,
                    };
                    let mut b = vec![0u8; dtype.size()];
                    dtype.encode(worst, &mut b);
                    assert_eq!(dtype.decode(&b), worst as f64, "{dtype} {op} world {world}: {worst}");
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
        let w = case.count_wrong(&got, &exp);
        assert_eq!(w.count, 1);
        assert_eq!(w.first.unwrap().0, 10);
        // A poisoned (never written) output is all wrong.
        let poisoned = vec![POISON; exp.len()];
        assert_eq!(case.count_wrong(&poisoned, &exp).count, 1024);
        // A short output counts the missing elements.
        assert_eq!(case.count_wrong(&exp[..exp.len() - 8], &exp).count, 2);
    }

    #[test]
    fn poison_is_never_expected() {
        for dtype in Dtype::ALL {
            let p = dtype.decode(&vec![POISON; dtype.size()]);
            // Negative or fractional, or (u8) above every gathered value.
            assert!(p.is_nan() || p < 0.0 || p.fract() != 0.0 || p > 100.0, "{dtype}: {p}");
        }
    }

    #[test]
    fn too_small_sizes_are_skipped() {
        assert!(Case::new(Collective::AllGather, Dtype::F64, Op::Sum, 2, 8, 0.0, 0).is_none());
        let c = Case::new(Collective::AllGather, Dtype::F32, Op::Sum, 2, 8, 0.0, 0).unwrap();
        assert_eq!((c.in_count(0), c.out_count(0), c.bytes()), (1, 2, 8));
        let c = Case::new(Collective::ReduceScatter, Dtype::F32, Op::Sum, 3, 40, 0.0, 0).unwrap();
        assert_eq!((c.count, c.in_count(1), c.out_count(1)), (9, 9, 3));
    }

    /// NCCL's in-place convention: AllGather's input at the rank's partition of the output,
    /// ReduceScatter's output at the rank's partition of the input; no in-place AllToAll.
    #[test]
    fn in_place_layouts_follow_nccl() {
        let case = |c| Case { in_place: true, ..Case::new(c, Dtype::F32, Op::Sum, 4, 4096, 1.0, 7).unwrap() };
        let ar = case(Collective::AllReduce).in_place_layout(3).unwrap();
        assert_eq!((ar.len, ar.input_at, ar.output_at), (1024, 0, 0));
        let ag = case(Collective::AllGather).in_place_layout(3).unwrap();
        assert_eq!((ag.len, ag.input_at, ag.output_at), (1024, 768, 0));
        let rs = case(Collective::ReduceScatter).in_place_layout(2).unwrap();
        assert_eq!((rs.len, rs.input_at, rs.output_at), (1024, 0, 512));
        for c in [Collective::AllToAll, Collective::AllGatherV, Collective::ReduceScatterV, Collective::AllToAllV] {
            assert_eq!(case(c).in_place_layout(0), None, "{c}");
        }
        let out_of_place = Case { in_place: false, ..case(Collective::AllReduce) };
        assert_eq!(out_of_place.in_place_layout(0), None);
    }
}
