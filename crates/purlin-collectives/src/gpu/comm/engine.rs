//! Copy-engine calls on the GPU (docs/perf/copy-engines.md §3.5): a plan with an engine
//! program runs as the entry kernel, the engine's copies (`CopyEngine::copy_batch`), one
//! `write_value_from` per notify, and the exit kernel, in that order on the call's stream,
//! eager or captured.
//!
//! The two kernels are the plan's entry and exit blocks launched as plans of their own. A
//! launch advances every epoch word (`advance_epochs` strides by its own grid), so the entry
//! kernel ends with every word at `E + a`: that word is the value each notify writes (a plan
//! whose notify values are `E + a` only, which is what `derive_ce` makes), read by the copy
//! when it runs, so graph replays write the current call's value. The exit kernel then starts
//! at `E + a`: its waits are shifted down by `a` and it advances by 0. It runs without the call
//! check's block, so a call still takes one call number.

use cudarc::driver::CudaStream;
use purlin_atom::copy_engine::{CopyEngine, CopyOp};
use purlin_snac::plan::engine::Kernel;
use purlin_snac::{Advance, EngineStep, Phase, Plan, Region, Space, Step};

use crate::error::Error;
use crate::gpu::executor::{DeviceExecutor, ExecParams, ExecRuntime};

/// A copy-engine plan made ready to launch: the exit kernel and the engine's work (the entry
/// kernel is the prepared plan's own parameter block).
#[derive(Debug)]
pub(crate) struct CeLaunch {
    pub(crate) entry: Plan,
    exit: Plan,
    exit_params: ExecParams,
    /// `(destination, source, bytes)` of each copy, one batch.
    copies: Vec<(Region, Region, u64)>,
    /// `(peer, flag word)` of each notify.
    notifies: Vec<(usize, u64)>,
}

fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!("copy-engine plan on the GPU: {what}"))
}

/// A copy-engine plan's parts: entry kernel, exit kernel, the copies `(destination, source,
/// bytes)` and the notifies `(peer, flag word)`.
type Parts = (Plan, Plan, Vec<(Region, Region, u64)>, Vec<(usize, u64)>);

/// Splits `plan` (with an engine program) into its entry and exit kernels and the engine's
/// work, or says why the device cannot run it yet (a main kernel, a forked program, notify
/// values other than `E + advance`, several batches).
pub(crate) fn split(plan: &Plan) -> Result<Parts, Error> {
    let Some(eng) = &plan.engine else { return Err(unsupported("no engine program")) };
    let Advance::Fixed(a) = plan.advance else { return Err(unsupported("an agreed advance")) };
    let kernel = |k: Kernel| -> Vec<_> { plan.blocks.iter().filter(|b| Kernel::of(b.role) == k).cloned().collect() };
    if eng.after != Phase::Sequential || !kernel(Kernel::Main).is_empty() {
        return Err(unsupported("a main kernel or a forked program"));
    }
    let mut copies = vec![];
    let mut notifies = vec![];
    for s in &eng.steps {
        match s {
            EngineStep::Copy { dst, src, len, guard } => {
                if !notifies.is_empty() {
                    return Err(unsupported("copies after a notify (one batch only)"));
                }
                if guard.admits(0) && len.at(0) > 0 {
                    copies.push((*dst, *src, len.at(0)));
                }
            }
            EngineStep::Notify(n) => {
                if n.value.chunk_mul != 0 || n.value.add != a as i64 {
                    return Err(unsupported("a notify value other than E + advance"));
                }
                notifies.push((n.peer as usize, u64::from(n.flag.at(0))));
            }
        }
    }
    let mut entry = plan.clone();
    entry.engine = None;
    entry.resources.ce_value_words = 0;
    entry.blocks = kernel(Kernel::Entry);
    let mut exit = entry.clone();
    exit.blocks = kernel(Kernel::Exit);
    exit.advance = Advance::Fixed(0);
    for b in &mut exit.blocks {
        for s in &mut b.steps {
            let value = match s {
                Step::Wait { value, .. } => value,
                Step::Signal { notify, .. } => &mut notify.value,
                _ => return Err(unsupported("an exit kernel step other than a wait or a signal")),
            };
            value.add = value.add.checked_sub(a as i64).ok_or_else(|| unsupported("an epoch value"))?;
        }
    }
    Ok((entry, exit, copies, notifies))
}

impl CeLaunch {
    /// [`split`], with the exit kernel's parameter block.
    pub(crate) fn new(exec: &DeviceExecutor, plan: &Plan) -> Result<(Self, Plan), Error> {
        let (entry, exit, copies, notifies) = split(plan)?;
        exec.check_supported(&entry)?;
        exec.check_supported(&exit)?;
        // By value always: the exit kernel's block is small and graphs take it so anyway.
        let exit_params = exec.params(&exit, false)?;
        Ok((CeLaunch { entry: entry.clone(), exit, exit_params, copies, notifies }, entry))
    }

    /// The engine's copies and notifies, then the exit kernel, on `stream` (after the entry
    /// kernel the caller launched there).
    ///
    /// # Safety
    /// `rt` holds the call's live pointers as for `DeviceExecutor::launch`: this rank's input
    /// and output, every peer's symmetric output mapped here, every rank's flag words and this
    /// rank's epoch words, all allocated until the work completes.
    pub(crate) unsafe fn launch_rest(
        &self,
        engine: &CopyEngine,
        exec: &DeviceExecutor,
        stream: &CudaStream,
        rt: &ExecRuntime,
    ) -> Result<(), Error> {
        let ce = |e: purlin_atom::copy_engine::CopyEngineError| Error::Unsupported(format!("copy engine: {e}"));
        let addr = |r: &Region| -> Result<u64, Error> {
            let base = match r.space {
                Space::Input => rt.input,
                Space::Output => rt.output,
                Space::PeerOutput(q) => rt.peer_output.get(q as usize).copied().unwrap_or(0),
                _ => 0,
            };
            if base == 0 {
                return Err(unsupported(&format!("no address for {:?}", r.space)));
            }
            Ok(base + r.offset.base)
        };
        let ops = self
            .copies
            .iter()
            .map(|(d, s, n)| Ok(CopyOp { dst: addr(d)?, src: addr(s)?, bytes: *n as usize }))
            .collect::<Result<Vec<_>, Error>>()?;
        // SAFETY: the addresses are the call's buffers and peers' symmetric outputs (the
        // caller's promise), at offsets `Plan::check` bounded by their sizes; the copies of the
        // batch write disjoint bytes (`Plan::check`).
        unsafe { engine.copy_batch(stream, &ops) }.map_err(ce)?;
        for &(peer, word) in &self.notifies {
            let flag = rt.flags.get(peer).copied().unwrap_or(0) + 8 * word;
            // SAFETY: the peer's flag word (in its workspace, mapped here) and this rank's epoch
            // word 0, both 8-byte aligned device words live until the call completes.
            unsafe { engine.write_value_from(stream, flag, rt.epochs) }.map_err(ce)?;
        }
        let mut exit_rt = *rt;
        exit_rt.call_number = 0;
        // SAFETY: forwarded from the caller; the exit kernel reads only flag and epoch words.
        unsafe { exec.launch(stream, &self.exit, &self.exit_params, &exit_rt) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use purlin_snac::{CollectiveSpec, DataType, PlanConfig, derive};

    use super::*;
    use crate::cpu::executor::{CallBuffers, HostMemoryConfig, HostWorld};

    fn cfg() -> PlanConfig {
        PlanConfig { peer_outputs: true, copy_engine: true, staging_bytes: 1 << 16, ..PlanConfig::default() }
    }

    #[test]
    fn the_split_has_the_launch_sequences_shape_and_refuses_what_it_cannot_run() {
        let plans = derive(&CollectiveSpec::all_gather(3, DataType::U8, 100), &cfg()).expect("derive");
        let (entry, exit, copies, notifies) = split(&plans[1]).expect("split");
        assert_eq!((entry.grid(), exit.grid()), (1, 1));
        assert!(entry.engine.is_none() && exit.engine.is_none());
        assert_eq!((entry.advance, exit.advance), (Advance::Fixed(1), Advance::Fixed(0)));
        // Every exit wait is one below the plan's (the exit kernel starts one epoch on).
        let waits = |p: &Plan| -> Vec<i64> {
            p.blocks
                .iter()
                .flat_map(|b| &b.steps)
                .filter_map(|s| match s {
                    Step::Wait { value, .. } => Some(value.add),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(waits(&exit), vec![0, 0]);
        assert_eq!(waits(&plans[1]).len(), waits(&entry).len() + 2);
        assert_eq!(copies.len(), 3, "own part and two peers'");
        assert_eq!(notifies.iter().map(|n| n.0).collect::<Vec<_>>(), vec![0, 2]);
        let mut forked = plans[1].clone();
        forked.engine.as_mut().expect("a program").after = Phase::Forked;
        assert!(matches!(split(&forked), Err(Error::Unsupported(_))));
        let mut other_value = plans[1].clone();
        if let Some(EngineStep::Notify(n)) = other_value.engine.as_mut().and_then(|e| e.steps.last_mut()) {
            n.value.add = 0;
        }
        assert!(matches!(split(&other_value), Err(Error::Unsupported(_))));
    }

    /// The device's sequence run on the host executor: the entry kernel as a plan of its own
    /// (which advances every epoch word), the copies, each notify writing this rank's epoch
    /// word 0, the exit kernel with shifted waits and no advance; three calls back to back on
    /// one world, every output exact, every epoch word where the whole plan would leave it.
    #[test]
    fn the_split_plans_run_like_the_plan_on_the_host_executor() {
        let world = 3usize;
        let specs = [
            CollectiveSpec::all_gather(3, DataType::U8, 100),
            CollectiveSpec::all_to_all_v(3, DataType::U8, vec![vec![5, 0, 40], vec![7, 9, 0], vec![0, 30, 2]]),
            CollectiveSpec::all_gather(3, DataType::U8, 64),
        ];
        let mem = HostMemoryConfig { staging_bytes: 1 << 16, ..HostMemoryConfig::default() };
        let host = HostWorld::new(world, mem, Duration::from_secs(20));
        for (k, spec) in specs.iter().enumerate() {
            let plans = derive(spec, &cfg()).expect("derive");
            let inputs: Vec<Vec<u8>> = (0..world)
                .map(|r| (0..spec.input_bytes(r as u32)).map(|i| (k * 50 + r * 17 + i as usize) as u8).collect())
                .collect();
            let mut outputs: Vec<Vec<u8>> =
                (0..world).map(|r| vec![0xA5; spec.output_bytes(r as u32) as usize]).collect();
            let mut peers = [(std::ptr::null_mut(), 0); purlin_snac::MAX_WORLD];
            for (slot, o) in peers.iter_mut().zip(outputs.iter_mut()) {
                *slot = (o.as_mut_ptr(), o.len());
            }
            let before = host.epoch(0, 0);
            std::thread::scope(|s| {
                for (r, plan) in plans.iter().enumerate() {
                    let (host, input) = (&host, &inputs[r]);
                    let mut b = CallBuffers::new(input.as_ptr(), input.len(), peers[r].0, peers[r].1);
                    b.peer_outputs = peers;
                    s.spawn(move || {
                        let (entry, exit, copies, notifies) = split(plan).expect("split");
                        host.execute(&entry, b, false).expect("entry kernel");
                        for (dst, src, n) in &copies {
                            let at = |reg: &Region| match reg.space {
                                Space::Input => b.input as *mut u8,
                                Space::Output => b.output,
                                Space::PeerOutput(q) => b.peer_outputs[q as usize].0,
                                _ => unreachable!("an engine copy's space"),
                            };
                            let (d, src_at) = (at(dst), at(src));
                            // SAFETY: `Plan::check` bounded both regions by their buffers, which
                            // outlive the scope; the verified plan gives these bytes to this copy
                            // alone until its notify, which follows.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src_at.add(src.offset.base as usize),
                                    d.add(dst.offset.base as usize),
                                    *n as usize,
                                )
                            };
                        }
                        for &(peer, word) in &notifies {
                            host.store_flag(peer, word as usize, host.epoch(r, 0));
                        }
                        host.execute(&exit, b, false).expect("exit kernel");
                    });
                }
            });
            for (r, got) in outputs.iter().enumerate() {
                let mut want = vec![0u8; spec.output_bytes(r as u32) as usize];
                for seg in spec.segments(r as u32) {
                    let (from, off) = seg.sources[0];
                    let (a, n, off) = (seg.out_offset as usize, seg.len as usize, off as usize);
                    want[a..a + n].copy_from_slice(&inputs[from as usize][off..off + n]);
                }
                assert_eq!(*got, want, "call {k} rank {r}");
                assert_eq!(host.epoch(r, 7), before + 1, "call {k} rank {r}: the plan advances by 1");
            }
        }
    }
}
