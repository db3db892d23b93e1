//! Interval maps of symbolic memory contents with access tags.

use std::rc::Rc;

/// What a byte holds, symbolically. A term describes the first byte of a segment; byte
/// `x` of the segment holds the term shifted by `x - start`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Term {
    /// Never written (or written by nothing the model knows).
    Uninit,
    /// Byte `base` of rank `rank`'s input of call `call`.
    In { call: u32, rank: u32, base: u64 },
    /// A reduction of these terms, combined in list order.
    Red(Rc<Vec<Term>>),
}

impl Term {
    pub fn shift(&self, d: u64) -> Term {
        if d == 0 {
            return self.clone();
        }
        match self {
            Term::Uninit => Term::Uninit,
            Term::In { call, rank, base } => Term::In { call: *call, rank: *rank, base: base + d },
            Term::Red(v) => Term::Red(Rc::new(v.iter().map(|t| t.shift(d)).collect())),
        }
    }

    /// Combines sources in order; a left operand that is itself a reduction is flattened
    /// (`(a+b)+c` is the left fold `a+b+c`), any other nesting is kept.
    pub fn reduce(srcs: Vec<Term>) -> Term {
        let mut out = vec![];
        for (i, t) in srcs.into_iter().enumerate() {
            match t {
                Term::Red(v) if i == 0 => out.extend(v.iter().cloned()),
                t => out.push(t),
            }
        }
        Term::Red(Rc::new(out))
    }

    /// Leaves of the term (for order-insensitive comparison).
    pub fn leaves(&self, out: &mut Vec<(u32, u32, u64)>) -> bool {
        match self {
            Term::Uninit => false,
            Term::In { call, rank, base } => {
                out.push((*call, *rank, *base));
                true
            }
            Term::Red(v) => v.iter().all(|t| t.leaves(out)),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Term::Uninit => "uninitialised".into(),
            Term::In { call, rank, base } => format!("in(call {call}, rank {rank}, +{base})"),
            Term::Red(v) => {
                let s: Vec<String> = v.iter().map(|t| t.describe()).collect();
                format!("red[{}]", s.join(", "))
            }
        }
    }
}

/// One access: `(process, its clock at the access)`.
pub type Access = (u32, u32);

/// A shared stage's round (see `crate::plan::Share`): the writers' rank, the ticket word at
/// the chunk, the chunk, and how many writers make the bytes complete.
pub type ShareTag = (u32, u32, u64, u32);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Seg {
    pub start: u64,
    pub end: u64,
    pub term: Term,
    /// `call + 1` of the write, 0 if never written.
    pub wcall: u32,
    pub writer: Option<Access>,
    /// A shared stage's earlier writers of these bytes in the same round (with `writer`, all
    /// of them so far; the bytes are complete when they number `share`'s writers).
    pub cowriters: Vec<Access>,
    pub share: Option<ShareTag>,
    /// The writer's clock vector, kept for packets (a packet read synchronizes with its put).
    pub wvc: Option<Rc<Vec<u32>>>,
    /// Packet flag (windows), if written by a put.
    pub flag: Option<u64>,
    pub readers: Vec<Access>,
}

/// A space's bytes as sorted, disjoint, contiguous segments covering `[0, size)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IMap {
    pub segs: Vec<Seg>,
}

impl IMap {
    pub fn new(size: u64) -> Self {
        let mut m = IMap { segs: vec![] };
        if size > 0 {
            m.segs.push(Seg {
                start: 0,
                end: size,
                term: Term::Uninit,
                wcall: 0,
                writer: None,
                cowriters: vec![],
                share: None,
                wvc: None,
                flag: None,
                readers: vec![],
            });
        }
        m
    }

    pub fn size(&self) -> u64 {
        self.segs.last().map_or(0, |s| s.end)
    }

    fn split_at(&mut self, x: u64) {
        let i = self.segs.partition_point(|s| s.end <= x);
        if self.segs.get(i).is_none_or(|s| s.start >= x) {
            return;
        }
        let s = &self.segs[i];
        let mut right = s.clone();
        right.term = s.term.shift(x - s.start);
        right.start = x;
        self.segs[i].end = x;
        self.segs.insert(i + 1, right);
    }

    /// Indices of the segments covering `[a, b)` after splitting at `a` and `b`.
    pub fn range(&mut self, a: u64, b: u64) -> std::ops::Range<usize> {
        self.split_at(a);
        self.split_at(b);
        let lo = self.segs.partition_point(|s| s.end <= a);
        let hi = self.segs.partition_point(|s| s.start < b);
        lo..hi
    }

    /// The segments that overlap `[a, b)`, found by binary search (the segments are sorted
    /// and disjoint): windows of wide grids hold thousands.
    pub fn overlapping(&self, a: u64, b: u64) -> &[Seg] {
        let lo = self.segs.partition_point(|s| s.end <= a);
        let hi = self.segs.partition_point(|s| s.start < b).max(lo);
        &self.segs[lo..hi]
    }

    /// Pieces `(relative start, relative end, term at relative start)` of `[a, b)`.
    pub fn read_terms(&self, a: u64, b: u64) -> Vec<(u64, u64, Term)> {
        self.overlapping(a, b)
            .iter()
            .map(|s| {
                let (x, y) = (s.start.max(a), s.end.min(b));
                (x - a, y - a, s.term.shift(x - s.start))
            })
            .collect()
    }

    /// Replaces `[a, b)` by the given pieces (relative offsets, covering `[0, b - a)`).
    pub fn write(
        &mut self,
        a: u64,
        b: u64,
        pieces: Vec<(u64, u64, Term)>,
        tag: (u32, Access, Option<Rc<Vec<u32>>>, Option<u64>),
        share: Option<ShareTag>,
    ) {
        let r = self.range(a, b);
        let (wcall, writer, wvc, flag) = tag;
        let new: Vec<Seg> = pieces
            .into_iter()
            .map(|(x, y, term)| Seg {
                start: a + x,
                end: a + y,
                term,
                wcall,
                writer: Some(writer),
                cowriters: vec![],
                share,
                wvc: wvc.clone(),
                flag,
                readers: vec![],
            })
            .collect();
        self.segs.splice(r, new);
        self.merge();
    }

    /// Records `earlier` as co-writers of `[a, b)` (a shared stage's writers before this one).
    pub fn add_cowriters(&mut self, a: u64, b: u64, earlier: &[Access]) {
        let r = self.range(a, b);
        for s in &mut self.segs[r] {
            s.cowriters = earlier.to_vec();
        }
        self.merge();
    }

    /// Merges neighbours that are the continuation of each other (keeps maps small).
    fn merge(&mut self) {
        let mut out: Vec<Seg> = Vec::with_capacity(self.segs.len());
        for s in self.segs.drain(..) {
            if let Some(l) = out.last_mut() {
                if l.wcall == s.wcall
                    && l.writer == s.writer
                    && l.cowriters == s.cowriters
                    && l.share == s.share
                    && l.flag == s.flag
                    && l.readers == s.readers
                    && l.wvc == s.wvc
                    && l.term.shift(l.end - l.start) == s.term
                {
                    l.end = s.end;
                    continue;
                }
            }
            out.push(s);
        }
        self.segs = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `overlapping` (binary search) returns exactly the segments a linear filter does, for
    /// every range over a map split by many writes, empty ranges included.
    #[test]
    fn overlapping_is_the_linear_filter() {
        let mut m = IMap::new(64);
        for (i, (a, b)) in [(3, 9), (9, 10), (20, 41), (0, 1), (33, 34), (50, 64), (5, 6)].into_iter().enumerate() {
            m.write(a, b, vec![(0, b - a, Term::Uninit)], (1, (i as u32, 1), None, Some(i as u64)), None);
        }
        assert!(m.segs.len() > 8);
        for a in 0..=64 {
            for b in a..=64 {
                let want: Vec<(u64, u64)> =
                    m.segs.iter().filter(|s| s.end > a && s.start < b).map(|s| (s.start, s.end)).collect();
                let got: Vec<(u64, u64)> = m.overlapping(a, b).iter().map(|s| (s.start, s.end)).collect();
                assert_eq!(got, want, "[{a}, {b})");
            }
        }
    }
}
