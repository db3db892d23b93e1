//! The run-time parameter block: a plan's numbers as a flat array of little-endian `u64`
//! words, read by the device executor as a `__grid_constant__` kernel parameter.
//!
//! # Layout (version 5)
//!
//! Words `0..HEADER_WORDS` are [`ParamHeader`], a `#[repr(C)]` struct of `u64` fields whose
//! byte offsets [`header_fields`] lists (and [`c_header`] turns into a C struct with
//! `static_assert(offsetof(...) == N)` lines). Then, at word `block_table`, three words per
//! block: `role | shape << 32` (`role`: see [`role_code`]; `shape`: which compiled step
//! sequence runs the block — [`encode`] writes the block's index in
//! [`crate::KernelKey::shapes`], and a runtime with its own numbering of shapes may replace
//! it; an interpreter ignores it), the word index of the block's first step record, the
//! number of top-level steps. Then the step records, block by block: each block's records
//! start where the previous block's end, and the last block's end at `total_words` (the
//! device executor copies a block's records into shared memory by that range; [`decode`]
//! refuses a block that does not end there). A record starts with a tag word:
//! `opcode | record_words << 8 | count << 24` (`count`: sources of a reduce, notifications of
//! an arrive, body steps of a loop). Field groups, in words:
//!
//! - guard (2): `from, until` · offset (4): `base, chunk_stride, chunk_modulus, sense_stride`
//! - region (5): `space` (`kind << 32 | rank`, kinds 0 input, 1 output, 2 staging, 3 window, 4 a peer's registered output, 5 a peer's registered input), offset
//! - len (4): `max, total, base, chunk_stride` · epoch value (2): `chunk_mul, add` (two's complement)
//! - index (1): `base | chunk_modulus << 32` · notify (4): `kind << 32 | peer` (0 ready, 1 drain), index, value
//!
//! Records by opcode:
//!
//! | op | step | fields after the tag |
//! |---|---|---|
//! | 1 | loop | `trips`; the body's records follow |
//! | 2 | stage | guard, dst region, src region, len, `piece` (0: not shared), ticket index, `writers` |
//! | 3 | gather | guard, dst region, src region, len, `has_expect`, expect value |
//! | 4 | reduce | guard, dst region, len, `has_expect`, expect value, `count` src regions |
//! | 5 | put-packets | guard, dst region, src region, len, flag value |
//! | 6 | signal/drain | guard, notify |
//! | 7 | wait | guard, index, value |
//! | 8 | arrive | guard, counter index, `arrivals`, `count` notifies, `has_reset`, reset index |
//! | 9 | handshake-send | `peer`, offset, flag value |
//! | 10 | handshake-wait | `peer`, offset, expect value |

use crate::plan::{
    Advance, Alias, BlockProgram, EpochVal, Guard, Index, Len, Notify, NotifyKind, Offset, Plan, Region, Role, Share,
    Space, Step,
};

/// `"SNACPAR1"` as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SNACPAR1");
/// Layout version (2: shared stages and ticket resets; 3: shape indices in the block table;
/// 4: the call digest; 5: the alias in one word and the digest in the other, so that the
/// header is 19 words again).
pub const VERSION: u64 = 5;
/// Words in the header.
pub const HEADER_WORDS: usize = std::mem::size_of::<ParamHeader>() / 8;

/// The fixed header of the parameter block.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParamHeader {
    pub magic: u64,
    pub version: u64,
    pub rank: u64,
    pub world: u64,
    pub grid: u64,
    /// 0: fixed advance `advance_value`; 1: agreed maximum, `advance_value` = this rank's local.
    pub advance_kind: u64,
    pub advance_value: u64,
    pub epoch_words: u64,
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// `offset << 2 | kind`, kind 0 none, 1 input in output, 2 output in input ([`Alias`]).
    /// One word for both, so that `call_digest` takes a word no executor reads and the words
    /// they read keep their pre-check offsets (round 149 measured what moving them costs).
    pub alias: u64,
    /// [`Plan::call_digest`]: what every rank's plan of one call agrees on. The executors
    /// exchange it at every call and fail a call whose ranks' digests differ.
    pub call_digest: u64,
    pub staging_bytes: u64,
    pub window_bytes: u64,
    pub flag_words: u64,
    pub counter_words: u64,
    pub max_coresident_blocks: u64,
    /// Word index of the block table.
    pub block_table: u64,
    /// Total words of the parameter block.
    pub total_words: u64,
}

macro_rules! fields {
    ($($f:ident),*) => {
        /// `(field name, byte offset)` of every [`ParamHeader`] field, in order.
        pub fn header_fields() -> Vec<(&'static str, usize)> {
            vec![$((stringify!($f), std::mem::offset_of!(ParamHeader, $f))),*]
        }
        impl ParamHeader {
            fn to_words(self) -> Vec<u64> {
                vec![$(self.$f),*]
            }
            fn from_words(w: &[u64]) -> Option<Self> {
                let mut it = w.iter().copied();
                Some(ParamHeader { $($f: it.next()?),* })
            }
        }
    };
}
fields!(
    magic,
    version,
    rank,
    world,
    grid,
    advance_kind,
    advance_value,
    epoch_words,
    input_bytes,
    output_bytes,
    alias,
    call_digest,
    staging_bytes,
    window_bytes,
    flag_words,
    counter_words,
    max_coresident_blocks,
    block_table,
    total_words
);

/// C source of the header struct with one `static_assert(offsetof(...) == N)` per field, for
/// the executor's side to compile (NVRTC) against this layout.
pub fn c_header() -> String {
    let mut s = String::from("struct SnacParamHeader {\n");
    for (name, _) in header_fields() {
        s += &format!("    unsigned long long {name};\n");
    }
    s += "};\n";
    for (name, off) in header_fields() {
        s += &format!("static_assert(offsetof(SnacParamHeader, {name}) == {off}, \"{name}\");\n");
    }
    s += &format!("static_assert(sizeof(SnacParamHeader) == {}, \"size\");\n", HEADER_WORDS * 8);
    s
}

/// Step opcodes: the low byte of a record's first word (`enum Op` in
/// kernels/snac/params.cuh, whose values a CI test checks against [`OPCODES`]).
pub mod opcode {
    /// A chunk loop over the records that follow.
    pub const LOOP: u64 = 1;
    /// A copy into staging (a share of it, when writers split one).
    pub const STAGE: u64 = 2;
    /// A copy to the output (from packets, when it waits for them).
    pub const GATHER: u64 = 3;
    /// An element-wise reduction of several sources.
    pub const REDUCE: u64 = 4;
    /// Flagged packets stored into a peer's window.
    pub const PUT_PACKETS: u64 = 5;
    /// A notification stored into a peer's flag word.
    pub const SIGNAL: u64 = 6;
    /// A wait until a flag word of this rank reaches a value.
    pub const WAIT: u64 = 7;
    /// An arrival on a counter; the last arrival notifies.
    pub const ARRIVE: u64 = 8;
    /// A packet carrying this rank's advance bound, stored into a peer's window.
    pub const HANDSHAKE_SEND: u64 = 9;
    /// A wait for a peer's advance-bound packet.
    pub const HANDSHAKE_WAIT: u64 = 10;
}

/// Every opcode with its name in kernels/snac/params.cuh.
pub const OPCODES: [(&str, u64); 10] = [
    ("kLoop", opcode::LOOP),
    ("kStage", opcode::STAGE),
    ("kGather", opcode::GATHER),
    ("kReduce", opcode::REDUCE),
    ("kPutPackets", opcode::PUT_PACKETS),
    ("kSignal", opcode::SIGNAL),
    ("kWait", opcode::WAIT),
    ("kArrive", opcode::ARRIVE),
    ("kHandshakeSend", opcode::HANDSHAKE_SEND),
    ("kHandshakeWait", opcode::HANDSHAKE_WAIT),
];

/// Role codes of the block table.
pub fn role_code(r: Role) -> u64 {
    match r {
        Role::Packets => 0,
        Role::Producer => 1,
        Role::Consumer => 2,
        Role::Head => 3,
        Role::Tail => 4,
        Role::CeEntry => 5,
        Role::CeExit => 6,
        Role::CopyEngine => 7,
        Role::ShardReader => 8,
        Role::Custom(x) => 0x100 + x as u64,
    }
}

fn role_from(c: u64) -> Option<Role> {
    Some(match c {
        0 => Role::Packets,
        1 => Role::Producer,
        2 => Role::Consumer,
        3 => Role::Head,
        4 => Role::Tail,
        5 => Role::CeEntry,
        6 => Role::CeExit,
        7 => Role::CopyEngine,
        8 => Role::ShardReader,
        x if x >= 0x100 => Role::Custom(u32::try_from(x - 0x100).ok()?),
        _ => return None,
    })
}

/// Why a parameter block could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed parameter block at word {at}: {what}")]
pub struct ParamError {
    pub at: usize,
    pub what: &'static str,
}

struct W(Vec<u64>);

impl W {
    fn guard(&mut self, g: Guard) {
        self.0.extend([g.from, g.until]);
    }
    fn off(&mut self, o: Offset) {
        self.0.extend([o.base, o.chunk_stride, o.chunk_modulus, o.sense_stride]);
    }
    fn region(&mut self, r: Region) {
        let sp = match r.space {
            Space::Input => 0,
            Space::Output => 1 << 32,
            Space::Staging(p) => 2 << 32 | p as u64,
            Space::Window(p) => 3 << 32 | p as u64,
            Space::PeerOutput(p) => 4 << 32 | p as u64,
            Space::PeerInput(p) => 5 << 32 | p as u64,
        };
        self.0.push(sp);
        self.off(r.offset);
    }
    fn len(&mut self, l: Len) {
        self.0.extend([l.max, l.total, l.base, l.chunk_stride]);
    }
    fn val(&mut self, v: EpochVal) {
        self.0.extend([v.chunk_mul, v.add as u64]);
    }
    fn idx(&mut self, i: Index) {
        self.0.push(i.base as u64 | (i.chunk_modulus as u64) << 32);
    }
    fn notify(&mut self, n: &Notify) {
        let k = match n.kind {
            NotifyKind::Ready => 0u64,
            NotifyKind::Drain => 1,
        };
        self.0.push(k << 32 | n.peer as u64);
        self.idx(n.flag);
        self.val(n.value);
    }
    fn step(&mut self, s: &Step) {
        let start = self.0.len();
        self.0.push(0);
        let (op, count) = match s {
            Step::ChunkLoop { trips, body } => {
                self.0.push(*trips);
                (opcode::LOOP, body.len())
            }
            Step::Stage { dst, src, len, guard, share } => {
                self.guard(*guard);
                self.region(*dst);
                self.region(*src);
                self.len(*len);
                let sh = share.unwrap_or(Share { ticket: Index::fixed(0), writers: 0, piece: 0 });
                self.0.push(sh.piece);
                self.idx(sh.ticket);
                self.0.push(sh.writers as u64);
                (opcode::STAGE, 0)
            }
            Step::Gather { dst, src, len, expect, guard } => {
                self.guard(*guard);
                self.region(*dst);
                self.region(*src);
                self.len(*len);
                self.0.push(expect.is_some() as u64);
                self.val(expect.unwrap_or(EpochVal::at(0)));
                (opcode::GATHER, 0)
            }
            Step::Reduce { dst, srcs, len, expect, guard } => {
                self.guard(*guard);
                self.region(*dst);
                self.len(*len);
                self.0.push(expect.is_some() as u64);
                self.val(expect.unwrap_or(EpochVal::at(0)));
                srcs.iter().for_each(|r| self.region(*r));
                (opcode::REDUCE, srcs.len())
            }
            Step::PutPackets { dst, src, len, flag, guard } => {
                self.guard(*guard);
                self.region(*dst);
                self.region(*src);
                self.len(*len);
                self.val(*flag);
                (opcode::PUT_PACKETS, 0)
            }
            Step::Signal { notify, guard } => {
                self.guard(*guard);
                self.notify(notify);
                (opcode::SIGNAL, 0)
            }
            Step::Wait { flag, value, guard } => {
                self.guard(*guard);
                self.idx(*flag);
                self.val(*value);
                (opcode::WAIT, 0)
            }
            Step::Arrive { counter, arrivals, then, guard, reset } => {
                self.guard(*guard);
                self.idx(*counter);
                self.0.push(*arrivals as u64);
                then.iter().for_each(|n| self.notify(n));
                self.0.push(reset.is_some() as u64);
                self.idx(reset.unwrap_or(Index::fixed(0)));
                (opcode::ARRIVE, then.len())
            }
            Step::HandshakeSend { peer, dst, flag } => {
                self.0.push(*peer as u64);
                self.off(*dst);
                self.val(*flag);
                (opcode::HANDSHAKE_SEND, 0)
            }
            Step::HandshakeWait { peer, src, expect } => {
                self.0.push(*peer as u64);
                self.off(*src);
                self.val(*expect);
                (opcode::HANDSHAKE_WAIT, 0)
            }
        };
        let words = (self.0.len() - start) as u64;
        self.0[start] = op | words << 8 | (count as u64) << 24;
        if let Step::ChunkLoop { body, .. } = s {
            body.iter().for_each(|t| self.step(t));
        }
    }
}

/// Words of `step`'s own record (a loop's record without its body's).
pub fn record_words(step: &Step) -> u32 {
    let mut w = W(vec![]);
    w.step(step);
    ((w.0[0] >> 8) & 0xffff) as u32
}

/// Encodes a plan's numbers as parameter words (layout in the module docs).
pub fn encode(plan: &Plan) -> Vec<u64> {
    let r = &plan.resources;
    let (advance_kind, advance_value) = match plan.advance {
        Advance::Fixed(v) => (0, v),
        Advance::AgreedMaxChunks { local } => (1, local),
    };
    let alias = match r.alias {
        None => 0,
        Some(Alias::InputInOutput(o)) => o << 2 | 1,
        Some(Alias::OutputInInput(o)) => o << 2 | 2,
    };
    let mut h = ParamHeader {
        magic: MAGIC,
        version: VERSION,
        rank: plan.rank as u64,
        world: plan.spec.world as u64,
        grid: plan.blocks.len() as u64,
        advance_kind,
        advance_value,
        epoch_words: r.epoch_words as u64,
        input_bytes: r.input_bytes,
        output_bytes: r.output_bytes,
        alias,
        call_digest: u64::from(plan.call_digest()),
        staging_bytes: r.staging_bytes,
        window_bytes: r.window_bytes,
        flag_words: r.flag_words as u64,
        counter_words: r.counter_words as u64,
        max_coresident_blocks: plan.max_coresident_blocks as u64,
        block_table: HEADER_WORDS as u64,
        total_words: 0,
    };
    let table = HEADER_WORDS;
    let mut w = W(vec![0; table + 3 * plan.blocks.len()]);
    let shapes = plan.block_shape_ids();
    for (b, block) in plan.blocks.iter().enumerate() {
        let first = w.0.len() as u64;
        block.steps.iter().for_each(|s| w.step(s));
        w.0[table + 3 * b] = role_code(block.role) | (shapes[b] as u64) << 32;
        w.0[table + 3 * b + 1] = first;
        w.0[table + 3 * b + 2] = block.steps.len() as u64;
    }
    h.total_words = w.0.len() as u64;
    w.0[..HEADER_WORDS].copy_from_slice(&h.to_words());
    w.0
}

/// The parameter words as little-endian bytes.
pub fn to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

struct R<'a> {
    w: &'a [u64],
    at: usize,
}

impl R<'_> {
    fn err(&self, what: &'static str) -> ParamError {
        ParamError { at: self.at, what }
    }
    fn next(&mut self) -> Result<u64, ParamError> {
        let v = *self.w.get(self.at).ok_or(self.err("truncated"))?;
        self.at += 1;
        Ok(v)
    }
    fn u32(&mut self) -> Result<u32, ParamError> {
        let v = self.next()?;
        u32::try_from(v).map_err(|_| self.err("value exceeds 32 bits"))
    }
    fn guard(&mut self) -> Result<Guard, ParamError> {
        Ok(Guard { from: self.next()?, until: self.next()? })
    }
    fn off(&mut self) -> Result<Offset, ParamError> {
        Ok(Offset {
            base: self.next()?,
            chunk_stride: self.next()?,
            chunk_modulus: self.next()?,
            sense_stride: self.next()?,
        })
    }
    fn region(&mut self) -> Result<Region, ParamError> {
        let sp = self.next()?;
        let p = (sp & 0xffff_ffff) as u32;
        let space = match sp >> 32 {
            0 => Space::Input,
            1 => Space::Output,
            2 => Space::Staging(p),
            3 => Space::Window(p),
            4 => Space::PeerOutput(p),
            5 => Space::PeerInput(p),
            _ => return Err(self.err("unknown space")),
        };
        Ok(Region { space, offset: self.off()? })
    }
    fn len(&mut self) -> Result<Len, ParamError> {
        Ok(Len { max: self.next()?, total: self.next()?, base: self.next()?, chunk_stride: self.next()? })
    }
    fn val(&mut self) -> Result<EpochVal, ParamError> {
        Ok(EpochVal { chunk_mul: self.next()?, add: self.next()? as i64 })
    }
    fn idx(&mut self) -> Result<Index, ParamError> {
        let v = self.next()?;
        Ok(Index { base: (v & 0xffff_ffff) as u32, chunk_modulus: (v >> 32) as u32 })
    }
    fn notify(&mut self) -> Result<Notify, ParamError> {
        let k = self.next()?;
        let kind = match k >> 32 {
            0 => NotifyKind::Ready,
            1 => NotifyKind::Drain,
            _ => return Err(self.err("unknown notify kind")),
        };
        Ok(Notify { kind, peer: (k & 0xffff_ffff) as u32, flag: self.idx()?, value: self.val()? })
    }
    fn step(&mut self, in_loop: bool) -> Result<Step, ParamError> {
        let start = self.at;
        let tag = self.next()?;
        let (op, words, count) = (tag & 0xff, ((tag >> 8) & 0xffff) as usize, (tag >> 24) as usize);
        let s = match op {
            opcode::LOOP if !in_loop => {
                let trips = self.next()?;
                let end = self.at;
                let body = (0..count).map(|_| self.step(true)).collect::<Result<Vec<_>, _>>()?;
                if end - start != words {
                    return Err(self.err("record length"));
                }
                return Ok(Step::ChunkLoop { trips, body });
            }
            opcode::STAGE => {
                let (guard, dst, src, len) = (self.guard()?, self.region()?, self.region()?, self.len()?);
                let (piece, ticket, writers) = (self.next()?, self.idx()?, self.u32()?);
                let share = (piece != 0).then_some(Share { ticket, writers, piece });
                Step::Stage { dst, src, len, guard, share }
            }
            opcode::GATHER => {
                let (guard, dst, src, len) = (self.guard()?, self.region()?, self.region()?, self.len()?);
                let has = self.next()? != 0;
                let v = self.val()?;
                Step::Gather { dst, src, len, expect: has.then_some(v), guard }
            }
            opcode::REDUCE => {
                let (guard, dst, len) = (self.guard()?, self.region()?, self.len()?);
                let has = self.next()? != 0;
                let v = self.val()?;
                let srcs = (0..count).map(|_| self.region()).collect::<Result<Vec<_>, _>>()?;
                Step::Reduce { dst, srcs, len, expect: has.then_some(v), guard }
            }
            opcode::PUT_PACKETS => Step::PutPackets {
                guard: self.guard()?,
                dst: self.region()?,
                src: self.region()?,
                len: self.len()?,
                flag: self.val()?,
            },
            opcode::SIGNAL => Step::Signal { guard: self.guard()?, notify: self.notify()? },
            opcode::WAIT => Step::Wait { guard: self.guard()?, flag: self.idx()?, value: self.val()? },
            opcode::ARRIVE => {
                let (guard, counter, arrivals) = (self.guard()?, self.idx()?, self.u32()?);
                let then = (0..count).map(|_| self.notify()).collect::<Result<Vec<_>, _>>()?;
                let (has_reset, ticket) = (self.next()? != 0, self.idx()?);
                Step::Arrive { counter, arrivals, then, guard, reset: has_reset.then_some(ticket) }
            }
            opcode::HANDSHAKE_SEND => Step::HandshakeSend { peer: self.u32()?, dst: self.off()?, flag: self.val()? },
            opcode::HANDSHAKE_WAIT => Step::HandshakeWait { peer: self.u32()?, src: self.off()?, expect: self.val()? },
            _ => return Err(self.err("unknown opcode")),
        };
        if self.at - start != words {
            return Err(self.err("record length"));
        }
        Ok(s)
    }
}

/// Decodes the header and the block programs of a parameter block (the inverse of [`encode`]
/// for everything but the spec, which is not part of it).
pub fn decode(words: &[u64]) -> Result<(ParamHeader, Vec<BlockProgram>), ParamError> {
    let h = ParamHeader::from_words(words).ok_or(ParamError { at: 0, what: "truncated header" })?;
    if h.magic != MAGIC || h.version != VERSION {
        return Err(ParamError { at: 0, what: "bad magic or version" });
    }
    if h.total_words != words.len() as u64 {
        return Err(ParamError { at: 0, what: "total_words disagrees with the length" });
    }
    let mut blocks = vec![];
    for b in 0..h.grid as usize {
        let t = h.block_table as usize + 3 * b;
        let mut r = R { w: words, at: t };
        let role = role_from(r.next()? & 0xffff_ffff).ok_or(r.err("unknown role"))?;
        let first = r.next()? as usize;
        let n = r.next()? as usize;
        let mut r = R { w: words, at: first };
        let steps = (0..n).map(|_| r.step(false)).collect::<Result<Vec<_>, _>>()?;
        let end = if b + 1 < h.grid as usize { words.get(t + 4).copied() } else { Some(h.total_words) };
        if end != Some(r.at as u64) {
            return Err(r.err("a block's records do not end where the next block's start"));
        }
        blocks.push(BlockProgram { role, steps });
    }
    Ok((h, blocks))
}

impl Plan {
    /// The run-time parameter block of this plan (see [`crate::params`]).
    pub fn params(&self) -> Vec<u64> {
        encode(self)
    }
}
