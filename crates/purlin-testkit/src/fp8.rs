//! The two fp8 formats (OCP 8-bit floats, NCCL's `ncclFloat8e4m3` / `ncclFloat8e5m2`), written
//! here from their definitions rather than taken from the library.
//!
//! - e4m3 ("fn"): 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN is `S.1111.111`,
//!   largest finite 448;
//! - e5m2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (infinities and NaNs at exponent
//!   31), largest finite 57344.
//!
//! Encoding rounds to nearest, ties to the even code. Beyond the largest finite value it
//! saturates: the values the tests reduce never get there (the Atom's overflow rules are its
//! own tests' business).

/// Which fp8 format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// 4 exponent bits, 3 mantissa bits.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits.
    E5M2,
}

impl Format {
    /// The value of `code`.
    pub fn value(self, code: u8) -> f64 {
        match self {
            Format::E4M3 => e4m3_value(code),
            Format::E5M2 => e5m2_value(code),
        }
    }

    /// The largest positive finite code (the positive codes are ordered by value up to it).
    fn max_finite(self) -> u8 {
        match self {
            Format::E4M3 => 0x7e,
            Format::E5M2 => 0x7b,
        }
    }

    /// A NaN code.
    fn nan(self) -> u8 {
        match self {
            Format::E4M3 => 0x7f,
            Format::E5M2 => 0x7e,
        }
    }

    /// `x` rounded to the nearest finite code, ties to the even code (saturating). NaN gives NaN.
    pub fn encode(self, x: f64) -> u8 {
        if x.is_nan() {
            return self.nan();
        }
        let a = x.abs();
        // The positive finite codes 0..=max are ordered by value: the last one not above `a`.
        let (mut lo, mut hi) = (0u8, self.max_finite());
        if a >= self.value(hi) {
            lo = hi;
        } else {
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if self.value(mid) <= a {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
        }
        let mut code = lo;
        if lo < self.max_finite() {
            let (below, above) = (a - self.value(lo), self.value(lo + 1) - a);
            if above < below || (above == below && lo & 1 == 1) {
                code = lo + 1;
            }
        }
        // The sign, except on zero (the encoding gives +0, as a search over codes would).
        if x < 0.0 && code != 0 { code | 0x80 } else { code }
    }
}

/// The value of an e4m3 code.
pub fn e4m3_value(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xF, (b & 7) as f64);
    if e == 0xF && b & 7 == 7 {
        return f64::NAN;
    }
    if e == 0 { s * m / 8.0 * 2f64.powi(-6) } else { s * (1.0 + m / 8.0) * 2f64.powi(e as i32 - 7) }
}

/// The value of an e5m2 code.
pub fn e5m2_value(b: u8) -> f64 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 2) & 0x1F, (b & 3) as f64);
    if e == 31 {
        return if b & 3 == 0 { s * f64::INFINITY } else { f64::NAN };
    }
    if e == 0 { s * m / 4.0 * 2f64.powi(-14) } else { s * (1.0 + m / 4.0) * 2f64.powi(e as i32 - 15) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoding by exhaustive search: the nearest finite code, ties to the even one.
    fn search(f: Format, x: f64) -> u8 {
        let mut best: Option<(f64, u8)> = None;
        for c in 0..=255u8 {
            let v = f.value(c);
            if !v.is_finite() || (v == 0.0 && c != 0) {
                continue;
            }
            let d = (v - x).abs();
            best = match best {
                Some((bd, bc)) if bd < d || (bd == d && bc & 1 == 0) => Some((bd, bc)),
                _ => Some((d, c)),
            };
        }
        best.map(|(_, c)| c).unwrap_or(0)
    }

    #[test]
    fn encoding_agrees_with_the_exhaustive_search() {
        for f in [Format::E4M3, Format::E5M2] {
            let mut probes = vec![0.0, -0.0, 1e9, -1e9, 1e-12, -1e-12];
            for c in 0..=255u8 {
                let v = f.value(c);
                if !v.is_finite() {
                    continue;
                }
                probes.push(v);
                // Midpoints to both neighbours (the ties) and points just off them.
                for d in [f.value(c.wrapping_add(1)), f.value(c.wrapping_sub(1))] {
                    if d.is_finite() {
                        let m = (v + d) / 2.0;
                        probes.extend([m, m * (1.0 + 1e-9), m * (1.0 - 1e-9)]);
                    }
                }
            }
            for x in probes {
                assert_eq!(f.encode(x), search(f, x), "{f:?} {x}");
            }
        }
    }

    #[test]
    fn codes_round_trip_and_specials_are_where_the_formats_put_them() {
        for f in [Format::E4M3, Format::E5M2] {
            for c in 0..=255u8 {
                let v = f.value(c);
                if v.is_finite() && c != 0x80 {
                    assert_eq!(f.encode(v), c, "{f:?} {c:#x}");
                }
            }
            assert!(f.value(f.encode(f64::NAN)).is_nan());
        }
        assert_eq!(e4m3_value(0x7e), 448.0);
        assert_eq!(e5m2_value(0x7b), 57344.0);
        assert_eq!(e5m2_value(0x7c), f64::INFINITY);
        assert_eq!(Format::E4M3.encode(1000.0), 0x7e, "saturates");
    }
}
