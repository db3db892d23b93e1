//! The reference on bytes: what every rank's output must hold, from the collective's definition
//! ([`Case::segments`]) and any inputs, one element's reduction at a time.
//!
//! Exactness rules, per type:
//! - integers: Sum and Prod wrap in the type's width, Min / Max compare signed or unsigned as
//!   the type is, Avg divides the wrapped sum by the world, truncating toward zero;
//! - floats: Sum, Prod, Min and Max are computed in f64 (exact for the small integers the tests
//!   reduce) and rounded once to the type; Avg divides the f64 sum, converted to f32, by the
//!   world in f32, then rounds to the type (the executors' Mean: one division in f32).

use crate::{Case, Collective, Dtype, Op, Segment};

/// The reduction over ranks of one element, `srcs[p]` being rank `p`'s element (in rank order),
/// written into `out` (one element).
pub fn reduce_element(dtype: Dtype, op: Op, srcs: &[&[u8]], out: &mut [u8]) {
    let world = srcs.len();
    if !dtype.is_float() {
        let bits = dtype.size() * 8;
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let signed = dtype.is_signed_int();
        // Sign-extended value of a width-`bits` pattern, for signed comparisons and division.
        let sext = |v: u64| -> i64 { ((v << (64 - bits)) as i64) >> (64 - bits) };
        let vals: Vec<u64> = srcs.iter().map(|b| dtype.bits(b)).collect();
        let fold = |f: &dyn Fn(u64, u64) -> u64| vals[1..].iter().fold(vals[0], |a, &b| f(a, b) & mask);
        let sum = || fold(&|a, b| a.wrapping_add(b));
        let r: u64 = match op {
            Op::Sum => sum(),
            Op::Prod => fold(&|a, b| a.wrapping_mul(b)),
            Op::Min if signed => fold(&|a, b| if sext(a) <= sext(b) { a } else { b }),
            Op::Max if signed => fold(&|a, b| if sext(a) >= sext(b) { a } else { b }),
            Op::Min => fold(&|a, b| a.min(b)),
            Op::Max => fold(&|a, b| a.max(b)),
            Op::Avg if signed => (sext(sum()) / world as i64) as u64 & mask,
            Op::Avg => sum() / world as u64,
        };
        out.copy_from_slice(&r.to_le_bytes()[..dtype.size()]);
        return;
    }
    let vals: Vec<f64> = srcs.iter().map(|b| dtype.decode(b)).collect();
    let fold = |f: fn(f64, f64) -> f64| vals[1..].iter().fold(vals[0], |a, &b| f(a, b));
    let v = match op {
        Op::Sum | Op::Avg => fold(|a, b| a + b),
        Op::Prod => fold(|a, b| a * b),
        Op::Min => fold(f64::min),
        Op::Max => fold(f64::max),
    };
    match (op, dtype) {
        (Op::Avg, Dtype::F64) => dtype.encode_f64(v / world as f64, out),
        (Op::Avg, _) => dtype.encode_f32(v as f32 / world as f32, out),
        _ => dtype.encode_f64(v, out),
    }
}

/// What rank `rank`'s (out-of-place) output must be, given every rank's input bytes.
pub fn expected(case: &Case, inputs: &[Vec<u8>], rank: usize) -> Vec<u8> {
    assert_eq!(inputs.len(), case.world, "{}: one input per rank", case.name());
    for (p, x) in inputs.iter().enumerate() {
        assert_eq!(x.len(), case.in_count(p) * case.dtype.size(), "{}: rank {p}'s input length", case.name());
    }
    let es = case.dtype.size();
    let mut out = vec![crate::POISON; case.out_count(rank) * es];
    let op = case.op.unwrap_or(Op::Sum);
    for seg in case.segments(rank) {
        match seg {
            Segment::Copy { out: o, from, input, len } => {
                out[o * es..(o + len) * es].copy_from_slice(&inputs[from][input * es..(input + len) * es]);
            }
            Segment::Reduce { out: o, input, len } => {
                let mut srcs: Vec<&[u8]> = Vec::with_capacity(case.world);
                for (i, dst) in out[o * es..(o + len) * es].chunks_exact_mut(es).enumerate() {
                    let at = (input + i) * es;
                    srcs.clear();
                    srcs.extend(inputs.iter().map(|x| &x[at..at + es]));
                    reduce_element(case.dtype, op, &srcs, dst);
                }
            }
        }
    }
    out
}

/// What rank `rank`'s one buffer must hold after an in-place call: AllReduce's and the
/// AllGather forms' whole output; for the ReduceScatter forms the rank's input with its own
/// partition replaced by the result (the rest untouched). Other collectives have no in-place
/// form here.
pub fn expected_in_place(case: &Case, inputs: &[Vec<u8>], rank: usize) -> Vec<u8> {
    let out = expected(case, inputs, rank);
    match case.collective {
        Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
            let es = case.dtype.size();
            let at = case.part_offset(rank) * es;
            let mut b = inputs[rank].clone();
            b[at..at + out.len()].copy_from_slice(&out);
            b
        }
        Collective::AllReduce | Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => out,
        c => panic!("{c:?} has no in-place form"),
    }
}
