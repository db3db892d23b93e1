//! The classes of equivalent mutants (the crate README's mutation testing section): a
//! survivor of `mutation_testing_kills_every_non_equivalent_mutant` must fall in one, decided
//! here from the plans alone, by unrolling every call into the step instances it runs. Nothing
//! here uses the verifier.

use purlin_snac::*;

/// What one step instance does: guards applied, offsets, lengths and epoch values evaluated.
/// A data step of length 0 does nothing (the plan contract) and is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    Data {
        name: &'static str,
        dst: (Space, u64),
        srcs: Vec<(Space, u64)>,
        len: u64,
        expect: Option<u64>,
        shared: bool,
    },
    /// A `Signal` (`counter: None`) or an `Arrive` `(counter, arrivals, resets)`: the stores
    /// `(peer, flag word, value)` it issues.
    Notify {
        stores: Vec<(u32, u32, u64)>,
        counter: Option<(u32, u32, bool)>,
    },
    /// A wait on this rank's flag word for `>= value`.
    Wait {
        word: u32,
        value: u64,
    },
    HandshakeSend {
        peer: u32,
        dst: u64,
        flag: u64,
    },
    HandshakeWait {
        peer: u32,
        src: u64,
        expect: u64,
    },
}

/// `[call][rank][block]`: the instances each block runs, in order.
pub type Unrolled = Vec<Vec<Vec<Vec<Ev>>>>;

/// The class of an equivalent mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Every instance runs as in the original (a partition's end no chunk reaches, a skipped
    /// chunk whose data step has length 0).
    Identity,
    /// A notification's value raised where no wait's threshold lies between the two values.
    UnobservedValue,
    /// A notification instance dropped whose every store an earlier store of the same block
    /// to the same word already satisfies every threshold of.
    DominatedNotification,
    /// A wait instance dropped after the block's last access, whose store carries no more
    /// than an earlier wait of the block already acquires.
    RedundantWait,
    /// A read moved to another rank's staging copy of the same bytes, made by the same block
    /// next to the original's with no synchronization between.
    ReplicatedCopy,
    /// A handshake wait dropped that another block of the rank (or the block's packet reads
    /// from that peer) still makes the rank wait for, with the block's advance unchanged.
    CoveredHandshake,
}

/// The epoch each call starts at (all ranks equal; 0 at set-up) and its advance.
fn epochs(calls: &[Vec<Plan>]) -> Vec<(u64, u64)> {
    let mut e = 0;
    calls
        .iter()
        .map(|plans| {
            let a = match plans.first().map(|p| p.advance) {
                Some(Advance::Fixed(a)) => a,
                Some(Advance::AgreedMaxChunks { .. }) => {
                    plans
                        .iter()
                        .map(|p| match p.advance {
                            Advance::AgreedMaxChunks { local } => local,
                            Advance::Fixed(a) => a,
                        })
                        .max()
                        .unwrap_or(0)
                        | 1
                }
                None => 0,
            };
            e += a;
            (e - a, a)
        })
        .collect()
}

fn instance(s: &Step, e: u64, c: u64) -> Option<Ev> {
    let sense = e & 1;
    let at = |r: &Region| (r.space, r.offset.at(c, sense));
    let val = |v: &EpochVal| v.eval(e, c).expect("derived plans' values are not negative");
    if !s.guard().admits(c) {
        return None;
    }
    Some(match s {
        Step::Stage { dst, src, len, share, .. } => Ev::Data {
            name: "stage",
            dst: at(dst),
            srcs: vec![at(src)],
            len: len.at(c),
            expect: None,
            shared: share.is_some(),
        },
        Step::Gather { dst, src, len, expect, .. } => Ev::Data {
            name: "gather",
            dst: at(dst),
            srcs: vec![at(src)],
            len: len.at(c),
            expect: expect.as_ref().map(val),
            shared: false,
        },
        Step::Reduce { dst, srcs, len, expect, .. } => Ev::Data {
            name: "reduce",
            dst: at(dst),
            srcs: srcs.iter().map(at).collect(),
            len: len.at(c),
            expect: expect.as_ref().map(val),
            shared: false,
        },
        Step::PutPackets { dst, src, len, flag, .. } => Ev::Data {
            name: "put-packets",
            dst: at(dst),
            srcs: vec![at(src)],
            len: len.at(c),
            expect: Some(val(flag)),
            shared: false,
        },
        Step::Signal { notify, .. } => {
            Ev::Notify { stores: vec![(notify.peer, notify.flag.at(c), val(&notify.value))], counter: None }
        }
        Step::Arrive { counter, arrivals, then, reset, .. } => Ev::Notify {
            stores: then.iter().map(|n| (n.peer, n.flag.at(c), val(&n.value))).collect(),
            counter: Some((counter.at(c), *arrivals, reset.is_some())),
        },
        Step::Wait { flag, value, .. } => Ev::Wait { word: flag.at(c), value: val(value) },
        Step::HandshakeSend { peer, dst, flag } => {
            Ev::HandshakeSend { peer: *peer, dst: dst.at(c, sense), flag: val(flag) }
        }
        Step::HandshakeWait { peer, src, expect } => {
            Ev::HandshakeWait { peer: *peer, src: src.at(c, sense), expect: val(expect) }
        }
        Step::ChunkLoop { .. } => return None,
    })
    .filter(|ev| !matches!(ev, Ev::Data { len: 0, shared: false, .. }))
}

/// Every call's instances.
pub fn unroll(calls: &[Vec<Plan>]) -> Unrolled {
    calls
        .iter()
        .zip(epochs(calls))
        .map(|(plans, (e, _))| {
            plans
                .iter()
                .map(|p| {
                    p.blocks
                        .iter()
                        .map(|b| {
                            let mut out = vec![];
                            for s in &b.steps {
                                match s {
                                    Step::ChunkLoop { trips, body } => {
                                        for c in 0..*trips {
                                            out.extend(body.iter().filter_map(|t| instance(t, e, c)));
                                        }
                                    }
                                    s => out.extend(instance(s, e, 0)),
                                }
                            }
                            out
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// An instance: `(call, rank, block, index)`.
type At = (usize, usize, usize, usize);

/// Whether `a` runs before `b` on one rank: the same block earlier in a call, or any block of
/// an earlier call (a rank's calls run in stream order).
fn po_before(a: At, b: At) -> bool {
    a.1 == b.1 && (a.0 < b.0 || (a.0 == b.0 && a.2 == b.2 && a.3 < b.3))
}

fn all(u: &Unrolled) -> impl Iterator<Item = (At, &Ev)> {
    u.iter().enumerate().flat_map(|(k, ranks)| {
        ranks.iter().enumerate().flat_map(move |(r, blocks)| {
            blocks
                .iter()
                .enumerate()
                .flat_map(move |(b, evs)| evs.iter().enumerate().map(move |(i, ev)| ((k, r, b, i), ev)))
        })
    })
}

/// The thresholds of every wait on rank `r`'s flag word `word`, over every call.
fn thresholds(u: &Unrolled, r: usize, word: u32) -> Vec<u64> {
    all(u)
        .filter_map(|(at, ev)| match ev {
            Ev::Wait { word: w, value } if at.1 == r && *w == word => Some(*value),
            _ => None,
        })
        .collect()
}

/// The stores into rank `r`'s word `word` with a value `>= t`, where they are issued.
fn satisfiers(u: &Unrolled, r: usize, word: u32, t: u64) -> Vec<At> {
    all(u)
        .filter(|(_, ev)| match ev {
            Ev::Notify { stores, .. } => stores.iter().any(|&(q, w, v)| q as usize == r && w == word && v >= t),
            _ => false,
        })
        .map(|(at, _)| at)
        .collect()
}

/// Whether an instance of a notification acquires nothing: a signal, or an arrival alone on a
/// counter word no other block of its rank uses in that call.
fn acquires_nothing(u: &Unrolled, at: At, ev: &Ev) -> bool {
    match ev {
        Ev::Notify { counter: None, .. } => true,
        Ev::Notify { counter: Some((word, 1, false)), .. } => all(u).all(|(o, e)| {
            o.0 != at.0
                || o.1 != at.1
                || o.2 == at.2
                || !matches!(e, Ev::Notify { counter: Some((w, ..)), .. } if w == word)
        }),
        _ => false,
    }
}

/// The instance the lists differ in: `Some((i, removed))` where `b` is `a` without `a[i]`.
fn one_removed(a: &[Ev], b: &[Ev]) -> Option<usize> {
    if a.len() != b.len() + 1 {
        return None;
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(b.len());
    (a[i + 1..] == b[i..]).then_some(i)
}

/// The class of the mutant `mutant` of `orig` (both: back-to-back calls of a plan set), if it
/// is equivalent by one of the README's arguments.
pub fn classify(orig: &[Vec<Plan>], mutant: &[Vec<Plan>]) -> Option<Class> {
    let strip = |calls: &[Vec<Plan>]| -> Vec<Vec<Plan>> {
        calls.iter().map(|ps| ps.iter().map(|p| Plan { blocks: vec![], ..p.clone() }).collect()).collect()
    };
    if strip(orig) != strip(mutant) {
        return None; // resources, advances: no argued class
    }
    let (ua, ub) = (unroll(orig), unroll(mutant));
    let mut class = Class::Identity;
    for (k, (ra, rb)) in ua.iter().zip(&ub).enumerate() {
        for (r, (ba, bb)) in ra.iter().zip(rb).enumerate() {
            for (blk, (a, b)) in ba.iter().zip(bb).enumerate() {
                if a == b {
                    continue;
                }
                let c = differing(&ua, &ub, orig, (k, r, blk), a, b)?;
                if class != Class::Identity && class != c {
                    return None;
                }
                class = c;
            }
        }
    }
    Some(class)
}

fn differing(
    ua: &Unrolled,
    ub: &Unrolled,
    orig: &[Vec<Plan>],
    (k, r, blk): (usize, usize, usize),
    a: &[Ev],
    b: &[Ev],
) -> Option<Class> {
    if a.len() == b.len() {
        // Every instance that differs must differ alike (one step, every chunk it runs).
        let classes: Option<Vec<Class>> = (0..a.len())
            .filter(|&i| a[i] != b[i])
            .map(|i| match (&a[i], &b[i]) {
                (Ev::Notify { stores: sa, counter: ca }, Ev::Notify { stores: sb, counter: cb }) if ca == cb => {
                    unobserved_values(ub, epochs(orig)[k], sa, sb).then_some(Class::UnobservedValue)
                }
                (Ev::Data { srcs: xa, .. }, Ev::Data { srcs: xb, .. }) => {
                    replicated_copy(ua, ub, (k, r, blk, i), xa, xb).then_some(Class::ReplicatedCopy)
                }
                _ => None,
            })
            .collect();
        let classes = classes?;
        return classes.iter().all(|c| *c == classes[0]).then_some(classes[0]);
    }
    let i = one_removed(a, b)?;
    let at = (k, r, blk, i);
    match &a[i] {
        Ev::Notify { stores, .. } => dominated(ua, at, stores).then_some(Class::DominatedNotification),
        Ev::Wait { word, value } => redundant_wait(ua, at, *word, *value).then_some(Class::RedundantWait),
        Ev::HandshakeWait { peer, src, expect } => {
            covered_handshake(ua, orig, at, (*peer, *src, *expect)).then_some(Class::CoveredHandshake)
        }
        _ => None,
    }
}

/// Raised store values `v -> v'` that no wait's threshold tells apart: none in `(v, v']`
/// (waits compare with `>=`, so every wait the old value satisfied the new one does, and no
/// other), and `v'` within the call's advance `a` of its epoch `e` (the contract's rule that
/// keeps a call's values below the next call's, whatever the chunk counts).
fn unobserved_values(ub: &Unrolled, (e, a): (u64, u64), sa: &[(u32, u32, u64)], sb: &[(u32, u32, u64)]) -> bool {
    sa.len() == sb.len()
        && sa.iter().zip(sb).all(|(&(q, w, v), &(q2, w2, v2))| {
            q == q2
                && w == w2
                && v <= v2
                && v2 <= e + a
                && thresholds(ub, q as usize, w).iter().all(|&t| t <= v || t > v2)
        })
}

/// A dropped notification instance at `at` (an arrival alone on its own counter, or a
/// signal), each of whose stores `(q, w, v)` is dominated: an earlier store `v0` of the same
/// rank's program (this block earlier, or an earlier call) into the same word, with no
/// threshold on that word in `(v0, v]`.
fn dominated(ua: &Unrolled, at: At, stores: &[(u32, u32, u64)]) -> bool {
    let ev = &ua[at.0][at.1][at.2][at.3];
    acquires_nothing(ua, at, ev)
        && stores.iter().all(|&(q, w, v)| {
            let v0 = all(ua)
                .filter(|(o, _)| po_before(*o, at))
                .filter_map(|(_, e)| match e {
                    Ev::Notify { stores, .. } => stores.iter().filter(|s| s.0 == q && s.1 == w).map(|s| s.2).max(),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            thresholds(ua, q as usize, w).iter().all(|&t| t <= v0 || t > v)
        })
}

/// A dropped wait at `at` for word `w` `>= t`: after it the block only waits (its acquire
/// reaches nothing but the block's exit); the first store that satisfies it, `S`, is issued by
/// the process that issues `S0`, the first store an earlier wait of the block accepts, and
/// between them that process only notifies (acquiring nothing); and no wait of a later call
/// on `w` is satisfied by a store of this call (so `S` landing late satisfies nothing).
fn redundant_wait(ua: &Unrolled, at: At, w: u32, t: u64) -> bool {
    let (k, r, blk, i) = at;
    let evs = &ua[k][r][blk];
    if !evs[i + 1..].iter().all(|e| matches!(e, Ev::Wait { .. })) {
        return false;
    }
    // The po-first of a set of stores, where every other is po-after it.
    let first = |set: Vec<At>| -> Option<At> {
        let f = *set.iter().min()?;
        set.iter().all(|&o| o == f || po_before(f, o)).then_some(f)
    };
    let Some(s) = first(satisfiers(ua, r, w, t)) else { return false };
    let covered = evs[..i].iter().any(|e| {
        let Ev::Wait { word: w0, value: t0 } = e else { return false };
        let Some(s0) = first(satisfiers(ua, r, *w0, *t0)) else { return false };
        (s0.0, s0.1, s0.2) == (s.0, s.1, s.2)
            && s0.3 < s.3
            && (s0.3 + 1..=s.3).all(|j| {
                let o = (s.0, s.1, s.2, j);
                acquires_nothing(ua, o, &ua[s.0][s.1][s.2][j])
            })
    });
    let this_call_max = all(ua)
        .filter(|(o, _)| o.0 == k)
        .filter_map(|(_, e)| match e {
            Ev::Notify { stores, .. } => stores.iter().filter(|x| x.0 as usize == r && x.1 == w).map(|x| x.2).max(),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let later_unaffected = all(ua)
        .filter(|(o, _)| o.0 > k && o.1 == r)
        .all(|(_, e)| !matches!(e, Ev::Wait { word, value } if *word == w && *value <= this_call_max));
    covered && later_unaffected
}

/// The writers of `len` bytes of staging at `(space, off)` in call `k`: `(at, dst offset,
/// srcs, len)`.
fn writers(u: &Unrolled, k: usize, space: Space, off: u64, len: u64) -> Vec<At> {
    all(u)
        .filter(|(o, e)| {
            o.0 == k
                && matches!(e, Ev::Data { dst, len: n, .. } if dst.0 == space && dst.1 < off + len && off < dst.1 + n)
        })
        .map(|(o, _)| o)
        .collect()
}

/// A read moved from one rank's staging to another's, `(q, off) -> (q', off)`: in every call,
/// the one writer of the new bytes is a stage of the same block as the one writer of the old
/// bytes, adjacent to it (no synchronization between), copying the same source.
fn replicated_copy(ua: &Unrolled, ub: &Unrolled, at: At, xa: &[(Space, u64)], xb: &[(Space, u64)]) -> bool {
    let (k, r, blk, i) = at;
    let diff: Vec<usize> = (0..xa.len()).filter(|&j| xa[j] != xb[j]).collect();
    let [j] = diff[..] else { return false };
    let (Space::Staging(_), Space::Staging(_)) = (xa[j].0, xb[j].0) else { return false };
    if xa[j].1 != xb[j].1 {
        return false;
    }
    let Ev::Data { len, .. } = ub[k][r][blk][i] else { return false };
    (0..ua.len()).all(|call| {
        let (wa, wb) = (writers(ua, call, xa[j].0, xa[j].1, len), writers(ua, call, xb[j].0, xb[j].1, len));
        match (&wa[..], &wb[..]) {
            ([], []) => call != k,
            ([x], [y]) => {
                let (ex, ey) = (&ua[x.0][x.1][x.2][x.3], &ua[y.0][y.1][y.2][y.3]);
                (x.0, x.1, x.2) == (y.0, y.1, y.2)
                    && x.3.abs_diff(y.3) == 1
                    && matches!((ex, ey), (
                        Ev::Data { name: "stage", dst: da, srcs: sa, len: la, shared: false, .. },
                        Ev::Data { name: "stage", dst: db, srcs: sb, len: lb, shared: false, .. },
                    ) if sa == sb && la == lb && *la == len && da.1 == xa[j].1 && db.1 == xb[j].1)
            }
            _ => false,
        }
    })
}

/// A dropped handshake wait for `peer`'s cell: another block of the rank waits for the same
/// cell, or this block reads packets only `peer` puts in this call (its entry is then waited
/// for through the data); and the block's advance is the same without the cell's value.
fn covered_handshake(ua: &Unrolled, orig: &[Vec<Plan>], at: At, (peer, src, expect): (u32, u64, u64)) -> bool {
    let (k, r, blk, i) = at;
    let me = &ua[k][r];
    let twin = me.iter().enumerate().any(|(b, evs)| b != blk && evs.contains(&Ev::HandshakeWait { peer, src, expect }));
    let through_packets = me[blk].iter().any(|e| {
        let Ev::Data { srcs, len, expect: Some(_), name, .. } = e else { return false };
        *name != "put-packets"
            && srcs.iter().filter(|s| s.0 == Space::Window(r as u32)).any(|s| {
                let w = writers(ua, k, s.0, s.1, *len);
                !w.is_empty() && w.iter().all(|o| o.1 == peer as usize)
            })
    });
    let local = |q: usize| match orig[k][q].advance {
        Advance::AgreedMaxChunks { local } => Some(local),
        Advance::Fixed(_) => None,
    };
    let same_advance = match local(r) {
        None => true,
        Some(own) => {
            let read = |skip: bool| {
                me[blk]
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| !(skip && j == i))
                    .filter_map(|(_, e)| match e {
                        Ev::HandshakeWait { peer, .. } => local(*peer as usize),
                        _ => None,
                    })
                    .fold(own, u64::max)
            };
            read(true) | 1 == read(false) | 1
        }
    };
    (twin || through_packets) && same_advance
}
