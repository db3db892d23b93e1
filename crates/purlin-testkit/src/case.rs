//! One collective at one size on one world: every rank's layout, inputs and expected output.

use crate::check::{Compare, Wrong, count_wrong};
use crate::values::{Encoder, ValueRule, Values, par_fill, stress_element};
use crate::{Collective, Dtype, Op, POISON};

/// The element counts of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counts {
    /// `n` elements: AllReduce's buffer, each rank's AllGather contribution, each
    /// ReduceScatter partition, each AllToAll pair, the root's Broadcast / Reduce buffer, each
    /// SendRecv message; the V forms: `n` for every rank (or pair).
    Uniform(usize),
    /// The AllGatherV contributions / ReduceScatterV partitions, one per rank.
    PerRank(Vec<usize>),
    /// `m[p][q]`: elements rank `p` sends rank `q` (AllToAllV, or any SendRecv pattern).
    PerPair(Vec<Vec<usize>>),
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

/// Where an in-place call's input and output lie in its one buffer, in elements (NCCL's
/// convention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InPlaceLayout {
    /// The buffer's elements.
    pub len: usize,
    /// Where the input starts.
    pub input_at: usize,
    /// Where the output starts.
    pub output_at: usize,
}

/// One collective at one size: the layout of every rank's input and output, and its inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: Dtype,
    /// Reduce op (`None` for the collectives that do not reduce).
    pub op: Option<Op>,
    /// Ranks.
    pub world: usize,
    /// Elements of the nominal size (nccl-tests' "count": AllReduce's buffer, AllGather's
    /// output, ReduceScatter's input, AllToAll's send buffer, Broadcast / Reduce / SendRecv's
    /// buffer); for an uneven AllToAllV, the largest send buffer.
    pub count: usize,
    /// `m[p][q]`: elements rank p contributes to rank q's output (the AllToAll forms and
    /// SendRecv), or for the AllGather / ReduceScatter forms, Broadcast and Reduce, `m[0][p]`:
    /// elements of contribution / partition p; AllReduce: `[[count]]`.
    pub matrix: Vec<Vec<usize>>,
    /// Seed of the inputs.
    pub seed: u64,
    /// How the inputs are drawn.
    pub values: Values,
    /// In place: one buffer per rank (see [`Case::in_place_layout`] and
    /// [`crate::reference::expected_in_place`]).
    pub in_place: bool,
}

impl Case {
    /// The case for `bytes` nominal bytes (nccl-tests' sizes), V forms split by Zipf weights
    /// of `skew`, or `None` where the size holds fewer elements than the collective needs (one
    /// per rank, or per pair for all-to-all). `op` is dropped for collectives that do not reduce.
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
        let counts = match collective {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => {
                if elems == 0 {
                    return None;
                }
                Counts::Uniform(elems)
            }
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                if elems / n == 0 {
                    return None;
                }
                Counts::Uniform(elems / n)
            }
            Collective::AllGatherV | Collective::ReduceScatterV => {
                if elems < n {
                    return None;
                }
                Counts::PerRank(zipf_split(elems, n, skew))
            }
            Collective::AllToAllV => {
                if elems < n {
                    return None;
                }
                Counts::PerPair(vec![zipf_split(elems, n, skew); n])
            }
            Collective::SendRecv => {
                if elems == 0 || n < 2 {
                    return None;
                }
                Counts::Uniform(elems)
            }
        };
        Some(Case::with_counts(collective, dtype, op, world, counts).seeded(seed))
    }

    /// The case of `collective` with these counts, exact inputs ([`ValueRule::new`]) from seed 0.
    /// Panics where the counts do not fit the collective.
    pub fn with_counts(collective: Collective, dtype: Dtype, op: Option<Op>, world: usize, counts: Counts) -> Case {
        let w = world;
        let op = if collective.reduces() { Some(op.unwrap_or(Op::Sum)) } else { None };
        let (count, matrix) = match (collective, counts) {
            (Collective::AllReduce, Counts::Uniform(n)) => (n, vec![vec![n]]),
            (Collective::AllGather | Collective::ReduceScatter, Counts::Uniform(n)) => (n * w, vec![vec![n; w]]),
            (Collective::AllGatherV | Collective::ReduceScatterV, Counts::Uniform(n)) => (n * w, vec![vec![n; w]]),
            (Collective::AllGatherV | Collective::ReduceScatterV, Counts::PerRank(v)) => {
                assert_eq!(v.len(), w, "{collective:?}: one count per rank");
                (v.iter().sum(), vec![v])
            }
            (Collective::AllToAll | Collective::AllToAllV, Counts::Uniform(n)) => (n * w, vec![vec![n; w]; w]),
            (Collective::AllToAllV | Collective::SendRecv, Counts::PerPair(m)) => {
                assert!(m.len() == w && m.iter().all(|r| r.len() == w), "{collective:?}: a {w}×{w} matrix");
                (m.iter().map(|r| r.iter().sum()).max().unwrap_or(0), m)
            }
            // The root's (rank 0's) part only.
            (Collective::Broadcast | Collective::Reduce, Counts::Uniform(n)) => {
                (n, vec![(0..w).map(|p| if p == 0 { n } else { 0 }).collect()])
            }
            // The ring p → p + 1.
            (Collective::SendRecv, Counts::Uniform(n)) => {
                (n, (0..w).map(|p| (0..w).map(|q| if q == (p + 1) % w && w > 1 { n } else { 0 }).collect()).collect())
            }
            (c, counts) => panic!("{c:?} takes no {counts:?}"),
        };
        Case {
            collective,
            dtype,
            op,
            world,
            count,
            matrix,
            seed: 0,
            values: Values::Rule(ValueRule::new(dtype, op, world)),
            in_place: false,
        }
    }

    /// The same case with inputs drawn from `seed`.
    pub fn seeded(mut self, seed: u64) -> Case {
        self.seed = seed;
        self
    }

    /// The same case with inputs drawn by `values`.
    pub fn with_values(mut self, values: Values) -> Case {
        self.values = values;
        self
    }

    /// The same case, in place or not.
    pub fn in_place(mut self, in_place: bool) -> Case {
        self.in_place = in_place;
        self
    }

    /// Rank `rank`'s in-place layout, NCCL's convention: AllReduce on the whole buffer,
    /// AllGather with the rank's input at partition `rank` of the output, ReduceScatter
    /// with the output at partition `rank` of the input, Broadcast and Reduce on the whole
    /// buffer (the root's part at 0). `None`: an out-of-place case, or a collective with no
    /// NCCL in-place form (AllToAll, the V forms, SendRecv).
    pub fn in_place_layout(&self, rank: usize) -> Option<InPlaceLayout> {
        if !self.in_place {
            return None;
        }
        let (input, output) = (self.in_count(rank), self.out_count(rank));
        match self.collective {
            Collective::AllReduce => Some(InPlaceLayout { len: output, input_at: 0, output_at: 0 }),
            Collective::AllGather => Some(InPlaceLayout { len: output, input_at: rank * input, output_at: 0 }),
            Collective::ReduceScatter => Some(InPlaceLayout { len: input, input_at: 0, output_at: rank * output }),
            Collective::Broadcast | Collective::Reduce => {
                Some(InPlaceLayout { len: self.count, input_at: 0, output_at: 0 })
            }
            _ => None,
        }
    }

    /// The size in bytes (`count` elements).
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Partition sizes for the AllGather / ReduceScatter forms, Broadcast and Reduce
    /// (`parts()[p]` = rank p's contribution or partition).
    pub fn parts(&self) -> &[usize] {
        &self.matrix[0]
    }

    /// Offset of partition `p` in an AllGather / ReduceScatter form's full buffer.
    pub fn part_offset(&self, p: usize) -> usize {
        self.parts()[..p].iter().sum()
    }

    /// Elements rank `p` sends to rank `q` (all-to-all forms, SendRecv).
    pub fn pair(&self, p: usize, q: usize) -> usize {
        self.matrix[p][q]
    }

    /// Offset in rank `p`'s input of what it sends to `q` (all-to-all forms, SendRecv).
    pub fn send_offset(&self, p: usize, q: usize) -> usize {
        self.matrix[p][..q].iter().sum()
    }

    /// Offset in rank `r`'s output of what it receives from `p` (all-to-all forms, SendRecv).
    pub fn recv_offset(&self, r: usize, p: usize) -> usize {
        (0..p).map(|q| self.matrix[q][r]).sum()
    }

    /// Input elements of `rank`.
    pub fn in_count(&self, rank: usize) -> usize {
        match self.collective {
            Collective::AllReduce | Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
                self.parts().iter().sum()
            }
            Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => self.parts()[rank],
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => self.matrix[rank].iter().sum(),
        }
    }

    /// Output elements of `rank`.
    pub fn out_count(&self, rank: usize) -> usize {
        match self.collective {
            Collective::AllReduce => self.count,
            Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => self.parts().iter().sum(),
            Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => self.parts()[rank],
            Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
                (0..self.world).map(|p| self.matrix[p][rank]).sum()
            }
        }
    }

    /// The segments of `rank`'s expected output: the collective's definition.
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

    /// `rank`'s input element values, for a [`Values::Rule`] case (`None` for stress inputs).
    pub fn input_values(&self, rank: usize) -> Option<Vec<i64>> {
        let Values::Rule(rule) = self.values else { return None };
        Some((0..self.in_count(rank)).map(|i| rule.value(self.seed, rank, i)).collect())
    }

    /// `rank`'s input, encoded.
    pub fn input(&self, rank: usize) -> Vec<u8> {
        let es = self.dtype.size();
        match self.values {
            Values::Rule(rule) => {
                let mut out = vec![0u8; self.in_count(rank) * es];
                let enc = Encoder::new(self.dtype, rule.max_abs(None, 1));
                let seed = self.seed;
                par_fill(&mut out, es, &|first, chunk| enc.fill(chunk, |i| rule.value(seed, rank, first + i)));
                out
            }
            Values::Stress => {
                (0..self.in_count(rank)).flat_map(|i| stress_element(self.dtype, self.op, rank, i)).collect()
            }
        }
    }

    /// Every rank's input.
    pub fn inputs(&self) -> Vec<Vec<u8>> {
        (0..self.world).map(|r| self.input(r)).collect()
    }

    /// `rank`'s expected (out-of-place) output, encoded. Rule inputs whose every reduction is
    /// exact in integers take a fast path (what the benchmark needs at GiB sizes); the rest, and
    /// the tests of the fast path, go through [`crate::reference::expected`].
    pub fn expected(&self, rank: usize) -> Vec<u8> {
        match self.values {
            Values::Rule(rule) if self.integer_exact(rule) => self.expected_fast(rule, rank),
            _ => crate::reference::expected(self, &self.inputs(), rank),
        }
    }

    /// Whether the reductions of `rule`'s values are integers: Avg divides sums of multiples of
    /// the world (or truncates, for integer types).
    fn integer_exact(&self, rule: ValueRule) -> bool {
        let d = self.dtype;
        // Negative values in an unsigned type compare as large ones: the byte path's Min/Max.
        if rule.signed && !d.is_float() && !d.is_signed_int() {
            return false;
        }
        self.op != Some(Op::Avg) || !d.is_float() || (!rule.signed && rule.scale % self.world as i64 == 0)
    }

    /// [`Case::expected`] in i64 arithmetic on the rule's values.
    fn expected_fast(&self, rule: ValueRule, rank: usize) -> Vec<u8> {
        let es = self.dtype.size();
        let mut out = vec![POISON; self.out_count(rank) * es];
        let enc = Encoder::new(self.dtype, rule.max_abs(self.op, self.world));
        let (seed, n) = (self.seed, self.world);
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

    /// The comparison this case's outputs are held to ([`Compare::for_op`]).
    pub fn compare(&self) -> Compare {
        Compare::for_op(self.dtype, self.op)
    }

    /// Counts the elements of `got` that differ from `expected` under [`Case::compare`].
    pub fn count_wrong(&self, got: &[u8], expected: &[u8]) -> Wrong {
        count_wrong(self.dtype, self.compare(), got, expected)
    }

    /// A short name for messages.
    pub fn name(&self) -> String {
        let op = self.op.map_or(String::new(), |o| format!(" {o:?}"));
        let place = if self.in_place { " in-place" } else { "" };
        format!("{:?} {:?}{op} world {} count {}{place}", self.collective, self.dtype, self.world, self.count)
    }
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
