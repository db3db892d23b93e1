//! Random data for the Atom tests: a deterministic generator (the test kit's SplitMix64) and
//! elements of every type, specials included.
#![allow(dead_code)]

use purlin_atom::DType;

/// SplitMix64: deterministic, seedable, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        let z = purlin_testkit::splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z
    }
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in [-scale, scale).
    pub fn f32(&mut self, scale: f32) -> f32 {
        ((self.next_u32() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// An f32 drawn to exercise a float type: mostly moderate values, sometimes tiny, huge or
/// special ones.
pub fn interesting_f32(rng: &mut Rng) -> f32 {
    match rng.below(100) {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => -0.0,
        4 => f32::from_bits(rng.next_u32()), // any bit pattern
        5..=9 => rng.f32(1.0) * 1e-6,
        10..=14 => rng.f32(1.0) * 6e4,
        15..=19 => rng.f32(1.0) * 500.0,
        _ => rng.f32(4.0),
    }
}

/// `count` random elements of `dtype`, as little-endian bytes: floats mostly moderate
/// (with specials now and then), integers uniform; `small_ints` keeps integers in -8..8.
pub fn random_elements(rng: &mut Rng, dtype: DType, count: usize, specials: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let f = if specials { interesting_f32(rng) } else { rng.f32(4.0) };
        let code = match dtype {
            DType::I32 | DType::U32 => rng.next_u32(),
            DType::F32 => f.to_bits(),
            // 1 in 8 elements: a uniformly random code (all codes, NaNs included, if specials).
            d if specials && rng.below(8) == 0 => rng.next_u32() & ((1u64 << (8 * d.size())) - 1) as u32,
            d => purlin_atom::host::encode_bits(d, f.to_bits()),
        };
        out.extend_from_slice(&code.to_le_bytes()[..dtype.size()]);
    }
    out
}

/// Reads element `i` of `dtype` from bytes as a u32 code.
pub fn code_at(dtype: DType, bytes: &[u8], i: usize) -> u32 {
    let s = dtype.size();
    let mut b = [0u8; 4];
    b[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    u32::from_le_bytes(b)
}

/// Compares two element buffers: bitwise, except that any NaN equals any NaN. Returns the
/// first mismatch as (index, got, want).
pub fn first_mismatch(dtype: DType, got: &[u8], want: &[u8]) -> Option<(usize, u32, u32)> {
    assert_eq!(got.len(), want.len());
    (0..got.len() / dtype.size()).find_map(|i| {
        let (g, w) = (code_at(dtype, got, i), code_at(dtype, want, i));
        let both_nan = purlin_atom::host::is_nan_code(dtype, g) && purlin_atom::host::is_nan_code(dtype, w);
        (g != w && !both_nan).then_some((i, g, w))
    })
}
