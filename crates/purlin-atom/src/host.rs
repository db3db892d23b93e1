//! The host Atom: the device contract (docs/design.md §4) on CPU memory, bit for bit.
//!
//! The host executor runs SNAC plans on CPU threads with it. Its arithmetic is the device
//! Atom's: 8- and 16-bit floats are decoded exactly to f32, combined in rank order with
//! f32 operations, and rounded once to nearest even; so for the same inputs the host and
//! device results are identical (NaN payloads aside). The conversions are written out here
//! (no `half` arithmetic) and tested against the `half` crate as an independent reference.

use crate::dtype::{AtomElem, DType, ReduceOp};

/// A bad request to the host Atom.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAtomError {
    /// A source's or the destination's length differs from the others.
    #[error("length mismatch: destination holds {dst} bytes, source {index} holds {src}")]
    LengthMismatch {
        /// Destination bytes.
        dst: usize,
        /// The offending source.
        index: usize,
        /// Its bytes.
        src: usize,
    },
    /// A length is not a whole number of elements.
    #[error("{bytes} bytes is not a whole number of {dtype} elements")]
    Ragged {
        /// The length in bytes.
        bytes: usize,
        /// The element type.
        dtype: DType,
    },
    /// No sources, or more than [`crate::MAX_SOURCES`].
    #[error("reduce takes 1..={max} sources, got {got}", max = crate::MAX_SOURCES)]
    SourceCount {
        /// The number given.
        got: usize,
    },
}

// ------------------------------------------------------------------ conversions

/// f16 code to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let e = u32::from(h >> 10) & 0x1f;
    let m = u32::from(h) & 0x3ff;
    let bits = if e == 0x1f {
        sign | 0x7f80_0000 | (m << 13) | if m != 0 { 0x0040_0000 } else { 0 }
    } else if e == 0 {
        // m * 2^-24, exact.
        return f32::from_bits((m as f32 * f32::from_bits((127 - 24) << 23)).to_bits() | sign);
    } else {
        sign | ((e + 127 - 15) << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

/// f32 to f16, round to nearest even; overflow gives ±Inf; NaN stays NaN.
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let a = x & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7e00 | ((a >> 13) & 0x3ff) as u16;
    }
    if a >= 0x477f_f000 {
        return sign | 0x7c00; // 65520 and above (and Inf) round to Inf
    }
    if a < 0x3880_0000 {
        // Below 2^-14: m = rne(|f| * 2^24); m == 0x400 is the smallest normal's code.
        let m = (f32::from_bits(a) * f32::from_bits((127 + 24) << 23)).round_ties_even() as u16;
        return sign | m;
    }
    let e = (a >> 23) as i32 - 127;
    let mant = a & 0x7f_ffff;
    let mut code = (((e + 15) as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && code & 1 == 1) {
        code += 1;
    }
    sign | code as u16
}

/// bf16 code to f32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// f32 to bf16, round to nearest even; NaN stays NaN (quieted, sign kept).
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if x & 0x7fff_ffff > 0x7f80_0000 {
        return ((x >> 16) | 0x0040) as u16;
    }
    (x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16) as u16
}

/// Decodes an fp8 code with `exp` exponent bits, `man` mantissa bits and `bias`; `fn_`:
/// no infinities, only all-ones is NaN.
fn fp8_to_f32(c: u8, exp: u32, man: u32, bias: i32, fn_: bool) -> f32 {
    let sign = u32::from(c & 0x80) << 24;
    let e = (u32::from(c) >> man) & ((1 << exp) - 1);
    let m = u32::from(c) & ((1 << man) - 1);
    let emax = (1 << exp) - 1;
    if fn_ {
        if e == emax && m == (1 << man) - 1 {
            return f32::from_bits(sign | 0x7fc0_0000);
        }
    } else if e == emax {
        return f32::from_bits(sign | if m != 0 { 0x7fc0_0000 } else { 0x7f80_0000 });
    }
    if e == 0 {
        let scale = f32::from_bits(((127 + 1 - bias - man as i32) as u32) << 23);
        return f32::from_bits((m as f32 * scale).to_bits() | sign);
    }
    f32::from_bits(sign | (((e as i32 - bias + 127) as u32) << 23) | (m << (23 - man)))
}

/// Encodes to fp8, round to nearest even, with the device's branch-free recipe: the
/// normal-range code from adding the rounding bias to the f32 bits (a mantissa carry moves
/// into the exponent), subnormal codes from `rne(|f| * 2^(bias-1+man))`.
fn f32_to_fp8(f: f32, exp: u32, man: u32, bias: i32, fn_: bool) -> u8 {
    let inf = ((1u32 << exp) - 1) << man;
    let max = if fn_ { (1u32 << (exp + man)) - 2 } else { inf - 1 };
    let sat = if fn_ { max } else { inf };
    let nan = if fn_ { 0x7f } else { inf | (1 << (man - 1)) };
    let min_normal = ((127 + 1 - bias) as u32) << 23;
    let sub_scale = f32::from_bits(((127 + bias - 1 + man as i32) as u32) << 23);
    let x = f.to_bits();
    let sign = (x >> 24) & 0x80;
    let a = x & 0x7fff_ffff;
    let r = a + ((1 << (22 - man)) - 1) + ((a >> (23 - man)) & 1);
    let mut code = (r >> (23 - man)).wrapping_sub(((127 - bias) as u32) << man);
    if code > max {
        code = sat;
    }
    if a < min_normal {
        code = (f32::from_bits(a) * sub_scale).round_ties_even() as u32;
    }
    if a > 0x7f80_0000 {
        code = nan;
    }
    (sign | code) as u8
}

/// e4m3 code to f32 (exact; `0x7f`/`0xff` are NaN).
pub fn e4m3_to_f32(c: u8) -> f32 {
    fp8_to_f32(c, 4, 3, 7, true)
}
/// f32 to e4m3: round to nearest even, saturate to ±448 (also ±Inf), NaN stays NaN.
pub fn f32_to_e4m3(f: f32) -> u8 {
    f32_to_fp8(f, 4, 3, 7, true)
}
/// e5m2 code to f32 (exact).
pub fn e5m2_to_f32(c: u8) -> f32 {
    fp8_to_f32(c, 5, 2, 15, false)
}
/// f32 to e5m2: round to nearest even, overflow to ±Inf, NaN stays NaN.
pub fn f32_to_e5m2(f: f32) -> u8 {
    f32_to_fp8(f, 5, 2, 15, false)
}

/// Decodes one element code of `dtype` (its little-endian bits in the low bytes of `code`)
/// to f32 bits; for integer types, returns the code itself. What the device's decode
/// kernels return.
pub fn decode_bits(dtype: DType, code: u32) -> u32 {
    match dtype {
        DType::F16 => f16_to_f32(code as u16).to_bits(),
        DType::BF16 => bf16_to_f32(code as u16).to_bits(),
        DType::E4M3 => e4m3_to_f32(code as u8).to_bits(),
        DType::E5M2 => e5m2_to_f32(code as u8).to_bits(),
        DType::F32 | DType::I32 | DType::U32 => code,
    }
}

/// Encodes f32 bits to an element code of `dtype` (identity for 32-bit types).
pub fn encode_bits(dtype: DType, bits: u32) -> u32 {
    let f = f32::from_bits(bits);
    match dtype {
        DType::F16 => u32::from(f32_to_f16(f)),
        DType::BF16 => u32::from(f32_to_bf16(f)),
        DType::E4M3 => u32::from(f32_to_e4m3(f)),
        DType::E5M2 => u32::from(f32_to_e5m2(f)),
        DType::F32 | DType::I32 | DType::U32 => bits,
    }
}

/// Whether a code of `dtype` is a NaN.
pub fn is_nan_code(dtype: DType, code: u32) -> bool {
    dtype.is_float() && f32::from_bits(decode_bits(dtype, code)).is_nan()
}

// ------------------------------------------------------------------ the combine kernels

trait Kind {
    type S: Copy;
    type A: Copy;
    fn dec(s: Self::S) -> Self::A;
    fn enc(a: Self::A) -> Self::S;
}

macro_rules! kind {
    ($name:ident, $s:ty, $a:ty, $dec:expr, $enc:expr) => {
        struct $name;
        impl Kind for $name {
            type S = $s;
            type A = $a;
            #[inline(always)]
            fn dec(s: $s) -> $a {
                $dec(s)
            }
            #[inline(always)]
            fn enc(a: $a) -> $s {
                $enc(a)
            }
        }
    };
}
kind!(KF32, u32, f32, f32::from_bits, f32::to_bits);
kind!(KF16, u16, f32, f16_to_f32, f32_to_f16);
kind!(KBF16, u16, f32, bf16_to_f32, f32_to_bf16);
kind!(KE4M3, u8, f32, e4m3_to_f32, f32_to_e4m3);
kind!(KE5M2, u8, f32, e5m2_to_f32, f32_to_e5m2);
kind!(KI32, u32, i32, |s: u32| s as i32, |a: i32| a as u32);
kind!(KU32, u32, u32, |s: u32| s, |a: u32| a);

trait Apply<A> {
    fn apply(a: A, b: A) -> A;
    /// Applied once to the accumulator of `n` sources before it is encoded.
    #[inline(always)]
    fn finish(a: A, _n: u32) -> A {
        a
    }
}
struct OSum;
struct OProd;
struct OMin;
struct OMax;
struct OMean;

impl Apply<f32> for OMean {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        OSum::apply(a, b)
    }
    #[inline(always)]
    fn finish(a: f32, n: u32) -> f32 {
        a / n as f32
    }
}

impl Apply<f32> for OSum {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        a + b
    }
}
impl Apply<f32> for OProd {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        a * b
    }
}
impl Apply<f32> for OMin {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        if a.is_nan() {
            a
        } else if b.is_nan() || b < a {
            b
        } else {
            a
        }
    }
}
impl Apply<f32> for OMax {
    #[inline(always)]
    fn apply(a: f32, b: f32) -> f32 {
        if a.is_nan() {
            a
        } else if b.is_nan() || b > a {
            b
        } else {
            a
        }
    }
}
macro_rules! int_ops {
    ($t:ty) => {
        impl Apply<$t> for OSum {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
        }
        impl Apply<$t> for OProd {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
        }
        impl Apply<$t> for OMin {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                if b < a { b } else { a }
            }
        }
        impl Apply<$t> for OMax {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                if b > a { b } else { a }
            }
        }
        impl Apply<$t> for OMean {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                <OSum as Apply<$t>>::apply(a, b)
            }
            #[inline(always)]
            fn finish(a: $t, n: u32) -> $t {
                // Truncating division, as C's; n is 1..=MAX_SOURCES, so it fits and is not -1.
                a / n as $t
            }
        }
    };
}
int_ops!(i32);
int_ops!(u32);

/// # Safety
/// `dst` is valid for `count` element writes and every `srcs[r]` for `count` element reads
/// (unaligned is fine); a source may equal `dst` exactly but not partially overlap it.
unsafe fn combine<K: Kind, O: Apply<K::A>>(dst: *mut u8, srcs: &[*const u8], count: usize) {
    let dst = dst.cast::<K::S>();
    for i in 0..count {
        // SAFETY: i < count; the caller guarantees `count` readable elements per source.
        let mut a = K::dec(unsafe { srcs[0].cast::<K::S>().add(i).read_unaligned() });
        for s in &srcs[1..] {
            // SAFETY: as above.
            a = O::apply(a, K::dec(unsafe { s.cast::<K::S>().add(i).read_unaligned() }));
        }
        let a = O::finish(a, srcs.len() as u32);
        // SAFETY: i < count; element i of every source was read above, before this write.
        unsafe { dst.add(i).write_unaligned(K::enc(a)) };
    }
}

unsafe fn combine_op<K: Kind>(op: ReduceOp, dst: *mut u8, srcs: &[*const u8], count: usize)
where
    OSum: Apply<K::A>,
    OProd: Apply<K::A>,
    OMin: Apply<K::A>,
    OMax: Apply<K::A>,
    OMean: Apply<K::A>,
{
    // SAFETY: forwarded from the caller.
    unsafe {
        match op {
            ReduceOp::Sum => combine::<K, OSum>(dst, srcs, count),
            ReduceOp::Prod => combine::<K, OProd>(dst, srcs, count),
            ReduceOp::Min => combine::<K, OMin>(dst, srcs, count),
            ReduceOp::Max => combine::<K, OMax>(dst, srcs, count),
            ReduceOp::Mean => combine::<K, OMean>(dst, srcs, count),
        }
    }
}

// ------------------------------------------------------------------ the host Atom

/// Copies `bytes` bytes from `src` to `dst` (the host `copy()` of the contract).
///
/// # Safety
/// `src` is valid for `bytes` reads and `dst` for `bytes` writes; they may overlap.
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, bytes: usize) {
    // SAFETY: forwarded from the caller; `copy` allows overlap.
    unsafe { std::ptr::copy(src, dst, bytes) }
}

/// `dst[i] = srcs[0][i] op srcs[1][i] op ...` for `i < count` elements of `dtype`, in rank
/// order (the host `reduce()` of the contract). No alignment is required.
///
/// # Safety
/// `dst` is valid for `count` element writes and each source for `count` element reads;
/// `dst` may equal a source exactly (in place) but must not partially overlap one; no
/// other thread writes these ranges during the call.
pub unsafe fn reduce_raw(
    dtype: DType,
    op: ReduceOp,
    dst: *mut u8,
    srcs: &[*const u8],
    count: usize,
) -> Result<(), HostAtomError> {
    if srcs.is_empty() || srcs.len() > crate::MAX_SOURCES {
        return Err(HostAtomError::SourceCount { got: srcs.len() });
    }
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => combine_op::<KF32>(op, dst, srcs, count),
            DType::F16 => combine_op::<KF16>(op, dst, srcs, count),
            DType::BF16 => combine_op::<KBF16>(op, dst, srcs, count),
            DType::E4M3 => combine_op::<KE4M3>(op, dst, srcs, count),
            DType::E5M2 => combine_op::<KE5M2>(op, dst, srcs, count),
            DType::I32 => combine_op::<KI32>(op, dst, srcs, count),
            DType::U32 => combine_op::<KU32>(op, dst, srcs, count),
        }
    }
    Ok(())
}

/// Copies `src` into `dst`; the lengths must match.
pub fn copy(dst: &mut [u8], src: &[u8]) -> Result<(), HostAtomError> {
    if dst.len() != src.len() {
        return Err(HostAtomError::LengthMismatch { dst: dst.len(), index: 0, src: src.len() });
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// One source of [`reduce_bytes_with`]: a slice, or the destination's current contents
/// (an in-place reduce where the destination is also rank `k`'s input).
#[derive(Debug, Clone, Copy)]
pub enum HostSrc<'a> {
    /// A separate buffer.
    Slice(&'a [u8]),
    /// The destination itself.
    Dst,
}

/// Reduces byte buffers holding elements of `dtype` into `dst`, in rank order.
pub fn reduce_bytes(dtype: DType, op: ReduceOp, dst: &mut [u8], srcs: &[&[u8]]) -> Result<(), HostAtomError> {
    let srcs: Vec<HostSrc<'_>> = srcs.iter().map(|s| HostSrc::Slice(s)).collect();
    reduce_bytes_with(dtype, op, dst, &srcs)
}

/// [`reduce_bytes`] where some sources may be the destination itself (in place).
pub fn reduce_bytes_with(
    dtype: DType,
    op: ReduceOp,
    dst: &mut [u8],
    srcs: &[HostSrc<'_>],
) -> Result<(), HostAtomError> {
    if srcs.is_empty() || srcs.len() > crate::MAX_SOURCES {
        return Err(HostAtomError::SourceCount { got: srcs.len() });
    }
    if dst.len() % dtype.size() != 0 {
        return Err(HostAtomError::Ragged { bytes: dst.len(), dtype });
    }
    let mut ptrs = Vec::with_capacity(srcs.len());
    for (index, s) in srcs.iter().enumerate() {
        match s {
            HostSrc::Slice(s) if s.len() != dst.len() => {
                return Err(HostAtomError::LengthMismatch { dst: dst.len(), index, src: s.len() });
            }
            HostSrc::Slice(s) => ptrs.push(s.as_ptr()),
            HostSrc::Dst => ptrs.push(dst.as_ptr()),
        }
    }
    let count = dst.len() / dtype.size();
    // SAFETY: every source holds exactly dst.len() bytes; `dst` is a unique borrow, so a
    // separate source slice cannot overlap it, and `HostSrc::Dst` aliases it exactly.
    unsafe { reduce_raw(dtype, op, dst.as_mut_ptr(), &ptrs, count) }
}

/// Typed reduce: `dst[i] = srcs[0][i] op ... op srcs[n-1][i]`, in rank order.
pub fn reduce<T: AtomElem>(op: ReduceOp, dst: &mut [T], srcs: &[&[T]]) -> Result<(), HostAtomError> {
    if srcs.is_empty() || srcs.len() > crate::MAX_SOURCES {
        return Err(HostAtomError::SourceCount { got: srcs.len() });
    }
    for (index, s) in srcs.iter().enumerate() {
        if s.len() != dst.len() {
            let (dst, src) = (std::mem::size_of_val(dst), std::mem::size_of_val(*s));
            return Err(HostAtomError::LengthMismatch { dst, index, src });
        }
    }
    let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr().cast::<u8>()).collect();
    // SAFETY: `AtomElem` types have the device storage layout of `T::DTYPE` (sealed: f32,
    // f16, bf16, two repr(transparent) u8 codes, i32, u32); every source holds dst.len()
    // elements and cannot overlap the uniquely borrowed `dst`.
    unsafe { reduce_raw(T::DTYPE, op, dst.as_mut_ptr().cast::<u8>(), &ptrs, dst.len()) }
}
