//! Poisoning outputs and checking them against the reference.

use crate::{Dtype, Op};

/// The byte every output buffer is filled with before a checked call. As f16, bf16, f32 and
/// f64 it is a small negative non-integer; as an integer it is negative (signed) or larger
/// than any value the exact inputs produce (unsigned): never what a correct call writes there.
pub const POISON: u8 = 0xA5;

/// `elems` poisoned elements of `dtype`.
pub fn poisoned(dtype: Dtype, elems: usize) -> Vec<u8> {
    vec![POISON; elems * dtype.size()]
}

/// How an output element is compared with the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Compare {
    /// The same bytes: where the library promises bit-exact results (every host test, and
    /// the benchmark except Avg on floats).
    Bitwise,
    /// The same value (−0 equals +0; NaN equals nothing): the GPU tests' rule.
    Value,
    /// Within `tol` of the expected value, relative (absolute below 1); NaN is wrong. The
    /// benchmark's rule for Avg on floats, where NCCL scales each input before summing.
    Relative(f64),
}

impl Compare {
    /// Bitwise, except Avg on floats: one rounding of the type (f16/bf16 1e-2, fp8 1/8 (one
    /// rounding of a 3- or 2-bit mantissa), others 1e-5).
    pub fn for_op(dtype: Dtype, op: Option<Op>) -> Compare {
        if op != Some(Op::Avg) || !dtype.is_float() {
            return Compare::Bitwise;
        }
        Compare::Relative(match dtype {
            Dtype::F16 | Dtype::Bf16 => 1e-2,
            Dtype::F8E4M3 | Dtype::F8E5M2 => 0.125,
            _ => 1e-5,
        })
    }
}

/// The wrong elements of one check.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Wrong {
    /// How many elements differ (missing or extra ones included).
    pub count: u64,
    /// The first wrong element's index, with the value found and the one expected.
    pub first: Option<(usize, f64, f64)>,
}

/// Counts the elements of `got` that differ from `expected` under `compare`, and the elements
/// one has and the other lacks.
pub fn count_wrong(dtype: Dtype, compare: Compare, got: &[u8], expected: &[u8]) -> Wrong {
    let es = dtype.size();
    let (n_exp, n_got) = (expected.len() / es, got.len() / es);
    let mut w = Wrong { count: n_exp.abs_diff(n_got) as u64, first: None };
    if compare == Compare::Bitwise && got == expected {
        return w; // the common case, at memcmp speed
    }
    for (i, (g, e)) in got.chunks_exact(es).zip(expected.chunks_exact(es)).enumerate() {
        let bad = match compare {
            Compare::Bitwise => g != e,
            Compare::Value => dtype.decode(g) != dtype.decode(e),
            Compare::Relative(tol) => {
                let (g, e) = (dtype.decode(g), dtype.decode(e));
                g.is_nan() || (g - e).abs() > tol * e.abs().max(1.0)
            }
        };
        if bad {
            w.count += 1;
            if w.first.is_none() {
                w.first = Some((i, dtype.decode(g), dtype.decode(e)));
            }
        }
    }
    if w.first.is_none() && w.count > 0 {
        let i = n_exp.min(n_got);
        let at = |b: &[u8]| b.get(i * es..(i + 1) * es).map_or(f64::NAN, |x| dtype.decode(x));
        w.first = Some((i, at(got), at(expected)));
    }
    w
}

/// [`count_wrong`] as a result: `Err` says how many elements are wrong and shows the first
/// one's bytes and value, found and expected.
pub fn check(dtype: Dtype, compare: Compare, got: &[u8], expected: &[u8]) -> Result<(), String> {
    let w = count_wrong(dtype, compare, got, expected);
    let Some((i, g, e)) = w.first else { return Ok(()) };
    let es = dtype.size();
    let show = |b: &[u8], v: f64| b.get(i * es..(i + 1) * es).map_or("-".into(), |x| format!("{x:02x?} = {v}"));
    Err(format!(
        "{} of {} {dtype:?} elements wrong ({} bytes, expected {}); first at element {i}: got {} expected {}",
        w.count,
        expected.len() / es,
        got.len(),
        expected.len(),
        show(got, g),
        show(expected, e)
    ))
}
