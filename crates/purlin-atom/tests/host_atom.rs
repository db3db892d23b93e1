//! The host Atom against independent references: the `half` crate for f16/bf16, a
//! brute-force nearest-value search for fp8, and a plain rank-order fold for reduce.

mod random_data;

use purlin_atom::host::{self, HostAtomError, HostSrc};
use purlin_atom::{DType, F8E4M3, F8E5M2, ReduceOp};
use random_data::{Rng, first_mismatch, random_elements};

fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// f32 inputs that probe rounding: every decoded code of a type, the midpoints between
/// neighbours (ties), a hair either side of them, specials, and random bit patterns.
fn probe_inputs(decoded: &[f32], rng: &mut Rng) -> Vec<f32> {
    let mut finite: Vec<f64> = decoded.iter().filter(|v| v.is_finite()).map(|&v| v as f64).collect();
    finite.sort_by(|a, b| a.partial_cmp(b).unwrap());
    finite.dedup();
    let mut out: Vec<f32> = decoded.to_vec();
    for w in finite.windows(2) {
        let mid = ((w[0] + w[1]) / 2.0) as f32; // exact in f32 for these narrow types
        out.extend([mid, f32::from_bits(mid.to_bits().wrapping_add(1)), f32::from_bits(mid.to_bits().wrapping_sub(1))]);
    }
    out.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::MAX, f32::MIN, 1e-45, -1e-45]);
    out.extend((0..200_000).map(|_| f32::from_bits(rng.next_u32())));
    out
}

#[test]
fn f16_matches_the_half_crate_on_every_code_and_rounding_probe() {
    let decoded: Vec<f32> = (0..=u16::MAX).map(host::f16_to_f32).collect();
    for (c, &d) in decoded.iter().enumerate() {
        assert!(same_f32(d, half::f16::from_bits(c as u16).to_f32()), "decode {c:#06x}");
    }
    for x in probe_inputs(&decoded, &mut Rng::new(1)) {
        let (ours, theirs) = (host::f32_to_f16(x), half::f16::from_f32(x).to_bits());
        let both_nan = x.is_nan() && (ours & 0x7fff) > 0x7c00 && (theirs & 0x7fff) > 0x7c00;
        assert!(ours == theirs || both_nan, "encode {x:e} ({:#010x}): {ours:#06x} vs {theirs:#06x}", x.to_bits());
    }
}

#[test]
fn bf16_matches_the_half_crate_on_every_code_and_rounding_probe() {
    let decoded: Vec<f32> = (0..=u16::MAX).map(host::bf16_to_f32).collect();
    for (c, &d) in decoded.iter().enumerate() {
        assert!(same_f32(d, half::bf16::from_bits(c as u16).to_f32()), "decode {c:#06x}");
    }
    for x in probe_inputs(&decoded, &mut Rng::new(2)) {
        let (ours, theirs) = (host::f32_to_bf16(x), half::bf16::from_f32(x).to_bits());
        let both_nan = x.is_nan() && (ours & 0x7fff) > 0x7f80 && (theirs & 0x7fff) > 0x7f80;
        assert!(ours == theirs || both_nan, "encode {x:e}: {ours:#06x} vs {theirs:#06x}");
    }
}

/// The fp8 reference: every code's value from the format's definition (f64 arithmetic).
fn fp8_value(c: u8, exp: i32, man: i32, bias: i32, fn_: bool) -> f64 {
    let s = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((c & 0x7f) as i32) >> man;
    let m = (c as i32) & ((1 << man) - 1);
    let emax = (1 << exp) - 1;
    if fn_ && e == emax && m == (1 << man) - 1 {
        return f64::NAN;
    }
    if !fn_ && e == emax {
        return if m == 0 { s * f64::INFINITY } else { f64::NAN };
    }
    let frac = m as f64 / (1 << man) as f64;
    if e == 0 { s * frac * 2f64.powi(1 - bias) } else { s * (1.0 + frac) * 2f64.powi(e - bias) }
}

/// The fp8 reference encoder: the nearest finite code by brute force (ties to the even
/// code), then the overflow rule: e4m3 saturates, e5m2 goes to Inf past the rounding
/// boundary of its largest value.
fn fp8_encode_ref(x: f32, exp: i32, man: i32, bias: i32, fn_: bool) -> Option<u8> {
    if x.is_nan() {
        return None; // any NaN code
    }
    let neg = x.is_sign_negative();
    let a = (x as f64).abs();
    let codes: Vec<u8> = (0u8..0x80).filter(|&c| fp8_value(c, exp, man, bias, fn_).is_finite()).collect();
    let max = codes.iter().map(|&c| fp8_value(c, exp, man, bias, fn_)).fold(0.0, f64::max);
    let max_code = *codes.iter().find(|&&c| fp8_value(c, exp, man, bias, fn_) == max).unwrap();
    let ulp_at_max = 2f64.powi(((max.log2().floor()) as i32) - man);
    let code = if a.is_infinite() || a >= max + ulp_at_max / 2.0 {
        if fn_ { max_code } else { ((1u8 << exp) - 1) << man }
    } else {
        let mut best = codes[0];
        for &c in &codes {
            let (d, db) =
                ((fp8_value(c, exp, man, bias, fn_) - a).abs(), (fp8_value(best, exp, man, bias, fn_) - a).abs());
            if d < db || (d == db && c & 1 == 0) {
                best = c;
            }
        }
        best
    };
    Some(code | if neg { 0x80 } else { 0 })
}

fn check_fp8(name: &str, exp: i32, man: i32, bias: i32, fn_: bool, dec: fn(u8) -> f32, enc: fn(f32) -> u8) {
    let decoded: Vec<f32> = (0..=255u8).map(dec).collect();
    for c in 0..=255u8 {
        let want = fp8_value(c, exp, man, bias, fn_);
        let got = decoded[c as usize] as f64;
        assert!(got == want || (got.is_nan() && want.is_nan()), "{name} decode {c:#04x}: {got} vs {want}");
        assert!(got != 0.0 || (decoded[c as usize].is_sign_negative() == (c & 0x80 != 0)), "{name} sign of zero");
    }
    let mut rng = Rng::new(3);
    let mut probes = probe_inputs(&decoded, &mut rng);
    probes.truncate(probes.len() - 150_000); // the brute-force reference is slow
    for x in probes {
        let got = enc(x);
        match fp8_encode_ref(x, exp, man, bias, fn_) {
            None => assert!(dec(got).is_nan(), "{name} encode NaN gave {got:#04x}"),
            Some(want) => assert_eq!(got, want, "{name} encode {x:e} ({:#010x})", x.to_bits()),
        }
    }
}

#[test]
fn e4m3_matches_the_reference_on_every_code_and_rounding_probe() {
    check_fp8("e4m3", 4, 3, 7, true, host::e4m3_to_f32, host::f32_to_e4m3);
    assert_eq!(F8E4M3::from_f32(1e9).to_f32(), 448.0);
    assert_eq!(F8E4M3::from_f32(f32::NEG_INFINITY).to_f32(), -448.0);
    assert_eq!(F8E4M3::from_f32(464.0).to_f32(), 448.0);
}

#[test]
fn e5m2_matches_the_reference_on_every_code_and_rounding_probe() {
    check_fp8("e5m2", 5, 2, 15, false, host::e5m2_to_f32, host::f32_to_e5m2);
    assert_eq!(F8E5M2::from_f32(1e9).to_f32(), f32::INFINITY);
    assert_eq!(F8E5M2::from_f32(57344.0).to_f32(), 57344.0);
    assert_eq!(F8E5M2::from_f32(61440.0).to_f32(), f32::INFINITY);
    assert_eq!(F8E5M2::from_f32(61439.0).to_f32(), 57344.0);
}

/// The independent reduce reference: decode with the references above, fold in rank
/// order with plain f32 / wrapping integer arithmetic, encode with the references.
fn reduce_ref(dtype: DType, op: ReduceOp, srcs: &[Vec<u8>]) -> Vec<u8> {
    let count = srcs[0].len() / dtype.size();
    let mut out = Vec::with_capacity(srcs[0].len());
    let dec = |code: u32| -> f32 {
        match dtype {
            DType::F32 => f32::from_bits(code),
            DType::F16 => half::f16::from_bits(code as u16).to_f32(),
            DType::BF16 => half::bf16::from_bits(code as u16).to_f32(),
            DType::E4M3 => fp8_value(code as u8, 4, 3, 7, true) as f32,
            DType::E5M2 => fp8_value(code as u8, 5, 2, 15, false) as f32,
            DType::I32 | DType::U32 => unreachable!(),
        }
    };
    let enc = |x: f32| -> u32 {
        match dtype {
            DType::F32 => x.to_bits(),
            DType::F16 => u32::from(half::f16::from_f32(x).to_bits()),
            DType::BF16 => u32::from(half::bf16::from_f32(x).to_bits()),
            DType::E4M3 => u32::from(fp8_encode_ref(x, 4, 3, 7, true).unwrap_or(0x7f)),
            DType::E5M2 => u32::from(fp8_encode_ref(x, 5, 2, 15, false).unwrap_or(0x7e)),
            DType::I32 | DType::U32 => unreachable!(),
        }
    };
    for i in 0..count {
        let codes: Vec<u32> = srcs.iter().map(|s| random_data::code_at(dtype, s, i)).collect();
        let code = match dtype {
            DType::I32 => {
                let mut a = codes[0] as i32;
                for &c in &codes[1..] {
                    let b = c as i32;
                    a = match op {
                        ReduceOp::Sum | ReduceOp::Mean => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                    };
                }
                if op == ReduceOp::Mean {
                    a /= srcs.len() as i32; // truncates toward zero
                }
                a as u32
            }
            DType::U32 => {
                let mut a = codes[0];
                for &b in &codes[1..] {
                    a = match op {
                        ReduceOp::Sum | ReduceOp::Mean => a.wrapping_add(b),
                        ReduceOp::Prod => a.wrapping_mul(b),
                        ReduceOp::Min => a.min(b),
                        ReduceOp::Max => a.max(b),
                    };
                }
                if op == ReduceOp::Mean {
                    a /= srcs.len() as u32;
                }
                a
            }
            _ => {
                let mut a = dec(codes[0]);
                for &c in &codes[1..] {
                    let b = dec(c);
                    a = match op {
                        ReduceOp::Sum | ReduceOp::Mean => a + b,
                        ReduceOp::Prod => a * b,
                        // NaN-propagating; on ties (incl. -0 vs +0) the earlier rank stays.
                        ReduceOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
                        ReduceOp::Max if a.is_nan() || b.is_nan() => f32::NAN,
                        ReduceOp::Min => {
                            if b < a {
                                b
                            } else {
                                a
                            }
                        }
                        ReduceOp::Max => {
                            if b > a {
                                b
                            } else {
                                a
                            }
                        }
                    };
                }
                // Mean: divided once, in f32, then rounded once into the element type.
                if op == ReduceOp::Mean {
                    a /= srcs.len() as f32;
                }
                enc(a)
            }
        };
        out.extend_from_slice(&code.to_le_bytes()[..dtype.size()]);
    }
    out
}

#[test]
fn reduce_matches_the_reference_for_every_dtype_and_op() {
    let mut rng = Rng::new(4);
    let mut cases = 0;
    for dtype in DType::ALL {
        for op in ReduceOp::ALL {
            for &n in &[1usize, 2, 3, 7, 16] {
                for &count in &[0usize, 1, 3, 15, 17, 63, 257] {
                    let srcs: Vec<Vec<u8>> = (0..n).map(|_| random_elements(&mut rng, dtype, count, true)).collect();
                    let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
                    let mut dst = rng.bytes(count * dtype.size());
                    host::reduce_bytes(dtype, op, &mut dst, &refs).unwrap();
                    let want = reduce_ref(dtype, op, &srcs);
                    if let Some((i, g, w)) = first_mismatch(dtype, &dst, &want) {
                        panic!("{dtype} {op} n={n} count={count}: element {i} is {g:#x}, want {w:#x}");
                    }
                    cases += 1;
                }
            }
        }
    }
    assert_eq!(cases, 7 * ReduceOp::ALL.len() * 5 * 7);
}

#[test]
fn in_place_and_typed_reduce_agree_with_the_byte_form() {
    let mut rng = Rng::new(5);
    for dtype in DType::ALL {
        let srcs: Vec<Vec<u8>> = (0..3).map(|_| random_elements(&mut rng, dtype, 101, false)).collect();
        let refs: Vec<&[u8]> = srcs.iter().map(|s| s.as_slice()).collect();
        let mut want = vec![0u8; srcs[0].len()];
        host::reduce_bytes(dtype, ReduceOp::Sum, &mut want, &refs).unwrap();
        // The destination is rank 1's input.
        let mut dst = srcs[1].clone();
        host::reduce_bytes_with(
            dtype,
            ReduceOp::Sum,
            &mut dst,
            &[HostSrc::Slice(&srcs[0]), HostSrc::Dst, HostSrc::Slice(&srcs[2])],
        )
        .unwrap();
        assert!(first_mismatch(dtype, &dst, &want).is_none(), "{dtype} in place");
    }
    let a = [1.5f32, -2.0, 3.25];
    let b = [0.5f32, 4.0, -1.0];
    let mut out = [0f32; 3];
    host::reduce(ReduceOp::Max, &mut out, &[&a, &b]).unwrap();
    assert_eq!(out, [1.5, 4.0, 3.25]);
    let x = [half::bf16::from_f32(1.0); 5];
    let mut y = [half::bf16::ZERO; 5];
    host::reduce(ReduceOp::Sum, &mut y, &[&x, &x, &x]).unwrap();
    assert!(y.iter().all(|v| v.to_f32() == 3.0));
}

#[test]
fn bad_requests_get_typed_errors_and_change_nothing() {
    let a = vec![1u8; 8];
    let b = vec![2u8; 12];
    let mut dst = vec![7u8; 8];
    assert_eq!(
        host::reduce_bytes(DType::F32, ReduceOp::Sum, &mut dst, &[&a, &b]),
        Err(HostAtomError::LengthMismatch { dst: 8, index: 1, src: 12 })
    );
    assert_eq!(
        host::reduce_bytes(DType::F32, ReduceOp::Sum, &mut dst, &[]),
        Err(HostAtomError::SourceCount { got: 0 })
    );
    let many: Vec<&[u8]> = vec![&a; 17];
    assert_eq!(
        host::reduce_bytes(DType::F32, ReduceOp::Sum, &mut dst, &many),
        Err(HostAtomError::SourceCount { got: 17 })
    );
    let mut ragged = vec![0u8; 6];
    assert_eq!(
        host::reduce_bytes(DType::F32, ReduceOp::Sum, &mut ragged, &[&a[..6]]),
        Err(HostAtomError::Ragged { bytes: 6, dtype: DType::F32 })
    );
    assert_eq!(host::copy(&mut dst, &b), Err(HostAtomError::LengthMismatch { dst: 8, index: 0, src: 12 }));
    assert_eq!(dst, vec![7u8; 8]);
    host::copy(&mut dst, &a).unwrap();
    assert_eq!(dst, a);
}

/// The device Mean's division for fp8 (`div_rn_small` in `kernels/atom/atom_common.cuh`),
/// step for step: q = a * RN(1/n) (`rcp.rn` there, f32 division here: both IEEE), then
/// Markstein's correction with two FMAs; zero, Inf and NaN quotients as they come.
fn div_rn_small(a: f32, n: u32) -> f32 {
    let d = n as f32;
    let r = 1.0 / d;
    let q = a * r;
    if q == 0.0 || !q.is_finite() {
        return q;
    }
    (-q).mul_add(d, a).mul_add(r, q)
}

/// The recipe equals IEEE division for every source count 1..16 and every f32 significand:
/// scaling `a` by a power of two scales both sides exactly while the quotient stays normal,
/// so one binade of `a` covers every fp8 sum (zero, or at least 2^-16 in magnitude, at most
/// 16 · 57344); signs, zeros, Inf, NaN and the fp8 extremes besides.
#[test]
fn mean_division_by_fma_matches_ieee() {
    let mut checked = 0u64;
    for n in 1..=16u32 {
        for m in 0..1u32 << 23 {
            let a = f32::from_bits(0x3f80_0000 | m);
            let (got, want) = (div_rn_small(a, n), a / n as f32);
            assert_eq!(got.to_bits(), want.to_bits(), "{a:e} / {n}");
            checked += 1;
        }
        let specials = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 2f32.powi(-16), -2f32.powi(-16)];
        let extremes = [448.0 * 16.0, 57344.0 * 16.0, -57344.0 * 15.0, 3.0 * 2f32.powi(-16), 2f32.powi(-9)];
        for a in specials.into_iter().chain(extremes) {
            let (got, want) = (div_rn_small(a, n), a / n as f32);
            let same_sign = got.is_nan() || got.is_sign_negative() == want.is_sign_negative();
            assert!(same_f32(got, want) && same_sign, "{a:e} / {n}: {got:e} against {want:e}");
            checked += 1;
        }
    }
    assert_eq!(checked, 16 * ((1 << 23) + 12));
}

/// The test kit's own fp8 codec (the collectives' reference) and the host Atom's agree on every
/// code's value and on the rounding of every value in range: two independent writings of the
/// formats.
#[test]
fn the_test_kit_fp8_codec_agrees_with_the_host_atom() {
    use purlin_testkit::fp8::Format;
    type Codec = (fn(u8) -> f32, fn(f32) -> u8);
    let formats: [(Format, Codec, f32); 2] = [
        (Format::E4M3, (host::e4m3_to_f32, host::f32_to_e4m3), 448.0),
        (Format::E5M2, (host::e5m2_to_f32, host::f32_to_e5m2), 57344.0),
    ];
    let mut rng = Rng::new(48);
    for (f, (decode, encode), max) in formats {
        let mut probes = vec![];
        for c in 0..=255u8 {
            let (kit, atom) = (f.value(c), decode(c) as f64);
            assert!(kit.to_bits() == atom.to_bits() || (kit.is_nan() && atom.is_nan()), "{f:?} {c:#x}");
            if kit.is_finite() {
                probes.push(kit as f32);
            }
        }
        probes.extend((0..20_000).map(|_| rng.f32(max)));
        for x in probes.into_iter().filter(|x| x.abs() <= max) {
            let (kit, atom) = (f.encode(x as f64), encode(x));
            // Both zeros are the one value 0 (the kit never writes -0).
            assert!(kit == atom || (f.value(kit) == 0.0 && f.value(atom) == 0.0), "{f:?} {x}: {kit:#x} {atom:#x}");
        }
    }
}
