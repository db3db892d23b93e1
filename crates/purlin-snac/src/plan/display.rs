//! The readable forms of plans and their parts, for messages, traces and the verifier's
//! summaries.

use std::fmt;

use super::{EpochVal, Guard, Index, Len, Notify, NotifyKind, Offset, Plan, Region, Space, Step};

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sp = match self.space {
            Space::Input => "in".to_string(),
            Space::Output => "out".to_string(),
            Space::Staging(r) => format!("stg{r}"),
            Space::Window(r) => format!("win{r}"),
            Space::PeerOutput(r) => format!("out{r}"),
            Space::PeerInput(r) => format!("in{r}"),
        };
        let o = &self.offset;
        write!(f, "{sp}[{}", o.base)?;
        if o.chunk_stride != 0 {
            if o.chunk_modulus != 0 {
                write!(f, "+(c%{})*{}", o.chunk_modulus, o.chunk_stride)?;
            } else {
                write!(f, "+c*{}", o.chunk_stride)?;
            }
        }
        if o.sense_stride != 0 {
            write!(f, "+s*{}", o.sense_stride)?;
        }
        write!(f, "]")
    }
}

impl fmt::Display for EpochVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "E")?;
        if self.chunk_mul == 1 {
            write!(f, "+c")?;
        } else if self.chunk_mul > 1 {
            write!(f, "+{}c", self.chunk_mul)?;
        }
        match self.add {
            0 => Ok(()),
            a if a > 0 => write!(f, "+{a}"),
            a => write!(f, "{a}"),
        }
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.chunk_modulus == 0 {
            write!(f, "{}", self.base)
        } else {
            write!(f, "{}+c%{}", self.base, self.chunk_modulus)
        }
    }
}

impl fmt::Display for Notify {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = match self.kind {
            NotifyKind::Ready => "signal",
            NotifyKind::Drain => "drain",
        };
        write!(f, "{k} r{}.flag[{}]={}", self.peer, self.flag, self.value)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.guard();
        let gs = if g == Guard::ALWAYS {
            String::new()
        } else if g.until == u64::MAX {
            format!(" if c>={}", g.from)
        } else {
            format!(" if {}<=c<{}", g.from, g.until)
        };
        let l = |l: &Len| format!("{}B", l.max);
        match self {
            Step::ChunkLoop { trips, body } => write!(f, "loop c in 0..{trips} ({} steps)", body.len()),
            Step::Stage { dst, src, len, share: None, .. } => write!(f, "stage {dst} <- {src} {}{gs}", l(len)),
            Step::Stage { dst, src, len, share: Some(sh), .. } => write!(
                f,
                "stage {dst} <- {src} {} shared by {} in {}B pieces of ticket[{}]{gs}",
                l(len),
                sh.writers,
                sh.piece,
                sh.ticket
            ),
            Step::Gather { dst, src, len, expect, .. } => {
                write!(f, "gather {dst} <- {src} {}", l(len))?;
                if let Some(e) = expect {
                    write!(f, " (packets =={e})")?;
                }
                write!(f, "{gs}")
            }
            Step::Reduce { dst, srcs, len, expect, .. } => {
                let s: Vec<String> = srcs.iter().map(|r| r.to_string()).collect();
                write!(f, "reduce {dst} <- [{}] {}", s.join(", "), l(len))?;
                if let Some(e) = expect {
                    write!(f, " (packets =={e})")?;
                }
                write!(f, "{gs}")
            }
            Step::PutPackets { dst, src, len, flag, .. } => {
                write!(f, "put-packets {dst} <- {src} {} flag={flag}{gs}", l(len))
            }
            Step::Signal { notify, .. } => write!(f, "{notify}{gs}"),
            Step::Wait { flag, value, .. } => write!(f, "wait flag[{flag}] >= {value}{gs}"),
            Step::Arrive { counter, arrivals, then, reset, .. } => {
                let t: Vec<String> = then.iter().map(|n| n.to_string()).collect();
                let z = reset.map(|i| format!(" reset ticket[{i}]")).unwrap_or_default();
                write!(f, "arrive ctr[{counter}] of {arrivals}{z} then [{}]{gs}", t.join("; "))
            }
            Step::HandshakeSend { peer, dst, flag } => {
                write!(f, "handshake-send r{peer} {} flag={flag}", Region::window(*peer, *dst))
            }
            Step::HandshakeWait { peer, src, expect } => {
                write!(f, "handshake-wait r{peer} at {} =={expect}", Offset::at(src, 0, 0))
            }
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.resources;
        writeln!(
            f,
            "rank {} of {}: {} {:?}{} {:?}, {} blocks (bound {}), advance {:?}",
            self.rank,
            self.spec.world,
            self.spec.collective.name(),
            self.regime,
            self.staging_side.map(|s| format!("/{s:?}")).unwrap_or_default(),
            self.spec.dtype,
            self.blocks.len(),
            self.max_coresident_blocks,
            self.advance
        )?;
        writeln!(
            f,
            "  in {}B out {}B{} staging {}B window {}B flags {} counters {} epochs {}",
            r.input_bytes,
            r.output_bytes,
            r.alias.map(|a| format!(" (in-place {a:?})")).unwrap_or_default(),
            r.staging_bytes,
            r.window_bytes,
            r.flag_words,
            r.counter_words,
            r.epoch_words
        )?;
        for (b, block) in self.blocks.iter().enumerate() {
            writeln!(f, "  block {b} ({:?}):", block.role)?;
            for (i, s) in block.steps.iter().enumerate() {
                writeln!(f, "    {i}: {s}")?;
                if let Step::ChunkLoop { body, .. } = s {
                    for (j, t) in body.iter().enumerate() {
                        writeln!(f, "      {i}.{j}: {t}")?;
                    }
                }
            }
        }
        if let Some(eng) = &self.engine {
            writeln!(f, "  copy engine ({:?}, {} value words):", eng.after, r.ce_value_words)?;
            for (i, s) in eng.steps.iter().enumerate() {
                let as_step = match s {
                    super::EngineStep::Copy { dst, src, len, guard } => {
                        Step::Gather { dst: *dst, src: *src, len: *len, expect: None, guard: *guard }
                    }
                    super::EngineStep::Notify(n) => Step::Signal { notify: *n, guard: super::Guard::ALWAYS },
                };
                writeln!(f, "    {i}: {}", as_step.to_string().replacen("gather", "copy", 1))?;
            }
        }
        if let Some(l) = &self.landed {
            writeln!(f, "  landed:")?;
            for (q, s) in l.shards.iter().enumerate() {
                let when = s.flag.map_or("at launch".to_string(), |w| format!("flag[{w}] >= E+1"));
                writeln!(f, "    shard {q}: out[{}] {}B {when}", s.offset, s.len)?;
            }
        }
        Ok(())
    }
}
