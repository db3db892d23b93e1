//! Inputs: how every rank's input elements are drawn.
//!
//! Two kinds ([`Values`]):
//! - [`ValueRule`]: nonzero small integers from a counter-based hash of `(seed, rank, index)`,
//!   so any process can regenerate any peer's input (no exchange for the reference), chosen so
//!   that every summation order and every reduction is exact in the type;
//! - [`Values::Stress`]: fixed patterns that go where exactness does not: integer products that
//!   wrap, means that round, copies of arbitrary bit patterns.

use crate::{Dtype, Op};

/// How a case's inputs are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Small integers by a [`ValueRule`], from the case's seed.
    Rule(ValueRule),
    /// The stress patterns (see [`stress_element`]); the seed is unused.
    Stress,
}

/// The rule exact inputs are drawn by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRule {
    /// Values are `scale × u`, `u` uniform in `1..=hi`, or `u` itself when `pow2` (then `hi`
    /// is 2: the values are 1 and 2).
    pub hi: i64,
    /// Multiplier (the world size for `avg`, so the mean is an integer).
    pub scale: i64,
    /// Draw from {1, 2} (for `prod`).
    pub pow2: bool,
    /// Signed: `u` in `1..=hi` maps to `±(1..=hi/2)` (`u > hi/2` positive).
    pub signed: bool,
}

impl ValueRule {
    /// The rule for a dtype, op and world: positive, every reduction exact.
    pub fn new(dtype: Dtype, op: Option<Op>, world: usize) -> ValueRule {
        let n = world.max(1) as i64;
        let exact = dtype.max_exact();
        let rule = |hi, scale, pow2| ValueRule { hi, scale, pow2, signed: false };
        match op {
            None => rule(exact.min(100), 1, false),
            Some(Op::Sum) => rule((exact / n).clamp(1, 16), 1, false),
            Some(Op::Prod) => {
                if (world as u32) <= dtype.max_pow2_exp() {
                    rule(2, 1, true)
                } else {
                    rule(1, 1, false)
                }
            }
            Some(Op::Min) | Some(Op::Max) => rule(exact.min(100), 1, false),
            Some(Op::Avg) => rule((exact / (n * n)).clamp(1, 16), n, false),
        }
    }

    /// Nonzero integers in `-m..=m` (`signed`), or `1..=2m` (unsigned types): small enough
    /// that any sum or product of two of them, and their mean, is exact in every type but fp8.
    pub fn small(m: i64, signed: bool) -> ValueRule {
        ValueRule { hi: 2 * m, scale: 1, pow2: false, signed }
    }

    /// The largest magnitude of a value, and of a reduction of `world` values by `op`.
    pub fn max_abs(&self, op: Option<Op>, world: usize) -> i64 {
        let m = if self.signed {
            self.hi / 2
        } else if self.pow2 {
            2
        } else {
            self.hi.saturating_mul(self.scale)
        };
        let w = world.max(1) as i64;
        match op {
            None | Some(Op::Min) | Some(Op::Max) => m,
            Some(Op::Sum) | Some(Op::Avg) => m.saturating_mul(w),
            Some(Op::Prod) => (0..w).fold(1i64, |a, _| a.saturating_mul(m)),
        }
    }

    /// The input value of `rank` at element `idx` (never zero).
    #[inline]
    pub fn value(&self, seed: u64, rank: usize, idx: usize) -> i64 {
        let h = splitmix64(seed ^ ((rank as u64) << 48) ^ (idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let u = 1 + (((h >> 32) * self.hi as u64) >> 32) as i64;
        if self.signed {
            let half = self.hi / 2;
            return if u > half { u - half } else { -u };
        }
        if self.pow2 { u } else { u * self.scale }
    }
}

/// SplitMix64's output function: a counter-based hash.
#[inline]
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element `i` of rank `r`'s stress input, as `dtype` bytes. Without an op (data movement):
/// arbitrary bytes (NaN and other special patterns included: copies must not interpret them).
/// With one: integers whose sums and products wrap (and a zero among the factors); floats
/// that are small integers (so sums and products stay exact) whose means round.
pub fn stress_element(dtype: Dtype, op: Option<Op>, r: usize, i: usize) -> Vec<u8> {
    let es = dtype.size();
    let h = r * 7 + i * 3 + 1;
    let Some(op) = op else {
        return (0..es).map(|k| ((r * 37 + i * 11 + k * 101 + 5) % 251) as u8).collect();
    };
    let mut out = vec![0u8; es];
    if !dtype.is_float() {
        let v: i64 = match op {
            Op::Prod => [1, 2, 3, -1, 0x1234_5678][h % 5],
            _ => (h as i64).wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33,
        };
        dtype.encode(v, &mut out);
        return out;
    }
    let x: f64 = match (op, dtype) {
        (Op::Prod, _) => [1.0, 2.0, -1.0, 1.0][h % 4],
        (Op::Sum | Op::Avg, Dtype::F8E4M3) => (h % 4) as f64 - 1.0,
        (Op::Sum | Op::Avg, Dtype::F8E5M2) => (h % 3) as f64 - 1.0,
        (Op::Sum | Op::Avg, _) => (h % 16) as f64 - 8.0,
        (Op::Min | Op::Max, _) => ((r * 5 + i * 11) % 15) as f64 - 7.0,
    };
    dtype.encode_f64(x, &mut out);
    out
}

/// Encodes small integers fast: a table of every value's bytes in `-limit..=limit`.
pub(crate) struct Encoder {
    dtype: Dtype,
    limit: i64,
    table: Vec<u8>,
}

impl Encoder {
    /// An encoder whose table covers `-max_abs..=max_abs` (at most ±2^16; values beyond are
    /// encoded one by one).
    pub(crate) fn new(dtype: Dtype, max_abs: i64) -> Encoder {
        let limit = max_abs.clamp(1, 1 << 16);
        let es = dtype.size();
        let mut table = vec![0u8; (2 * limit as usize + 1) * es];
        for (k, ch) in table.chunks_exact_mut(es).enumerate() {
            dtype.encode(k as i64 - limit, ch);
        }
        Encoder { dtype, limit, table }
    }

    pub(crate) fn fill(&self, out: &mut [u8], f: impl Fn(usize) -> i64) {
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
            if (-self.limit..=self.limit).contains(&v) {
                let k = (v + self.limit) as usize * N;
                ch.copy_from_slice(&self.table[k..k + N]);
            } else {
                self.dtype.encode(v, ch);
            }
        }
    }
}

/// Fills `out` (elements of `es` bytes) in parallel chunks: `f(first_element, chunk)`.
pub(crate) fn par_fill(out: &mut [u8], es: usize, f: &(dyn Fn(usize, &mut [u8]) + Sync)) {
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

/// xorshift64: a tiny sequential generator for the tests' random choices and seeds.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator from `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        r.next();
        r
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A seed that differs from run to run, or `PURLIN_TEST_SEED` (print it, so a failure
/// reproduces).
pub fn fresh_seed() -> u64 {
    if let Ok(s) = std::env::var("PURLIN_TEST_SEED") {
        return s.trim().parse().expect("PURLIN_TEST_SEED");
    }
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)) | 1
}
