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
/// values other than `E + advance`, several batches). Every plan `derive_ce` makes (the
/// AllGather, the AllToAll, their V forms, Broadcast, and the AllReduce, whose entry kernel
/// holds the SM blocks that reduce the shard the copies then read from the output; all with a
/// fixed advance of 1, which `Plan::check` demands of every engine plan) splits, so no call
/// the device plans for the copy engines meets these refusals
/// (`every_derived_copy_engine_plan_splits`).
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
            let Some(&flags) = rt.flags.get(peer).filter(|&&f| f != 0) else {
                return Err(unsupported(&format!("no flag words of rank {peer}")));
            };
            let flag = flags + 8 * word;
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

    use purlin_testkit as kit;

    use super::*;
    use crate::cpu::executor::{CallBuffers, HostMemoryConfig, HostWorld};

    fn cfg() -> PlanConfig {
        PlanConfig {
            peer_outputs: true,
            peer_inputs: true,
            copy_engine: true,
            staging_bytes: 1 << 16,
            ..PlanConfig::default()
        }
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
        // An AllReduce: the entry kernel is the reducing blocks, the copies read the output.
        let cfg = PlanConfig { blocks_per_role: 2, ..cfg() };
        let ar = derive(&CollectiveSpec::all_reduce(3, DataType::F32, purlin_snac::ReduceOp::Sum, 100), &cfg)
            .expect("derive");
        let (entry, exit, copies, notifies) = split(&ar[1]).expect("split");
        assert_eq!((entry.grid(), exit.grid()), (2, 1));
        let reduces = format!("{:?}", entry.blocks).matches("Reduce {").count();
        assert_eq!(reduces, 2, "every entry block reduces its slice");
        assert_eq!(copies.len(), 2, "the shard to each peer");
        assert!(copies.iter().all(|(d, s, _)| s.space == Space::Output && matches!(d.space, Space::PeerOutput(_))));
        assert_eq!(notifies.iter().map(|n| n.0).collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(waits(&exit), vec![0, 0]);
    }

    /// Every plan `derive_ce` makes splits: AllGather, AllToAll, their V forms with empty
    /// partitions and pairs (all of them empty too), Broadcast from every root, the AllReduce
    /// (with empty shards too), in place where
    /// the collective has that form, worlds 2 to 8. So no eligible call the device plans for
    /// the copy engines meets `split`'s refusals.
    #[test]
    fn every_derived_copy_engine_plan_splits() {
        let mut split_plans = 0;
        for world in 2..=8u32 {
            let w = world as u64;
            let skew = |s: u64, d: u64| if (s + d) % 3 == 0 { 0 } else { 7 * s + d + 1 };
            let mut specs = vec![
                CollectiveSpec::all_gather(world, DataType::F32, 33),
                CollectiveSpec::all_to_all(world, DataType::U8, 10),
                CollectiveSpec::all_gather_v(world, DataType::U8, (0..w).map(|r| r % 2 * 11).collect()),
                CollectiveSpec::all_gather_v(world, DataType::U8, vec![0; world as usize]),
                CollectiveSpec::all_to_all_v(
                    world,
                    DataType::U8,
                    (0..w).map(|s| (0..w).map(|d| skew(s, d)).collect()).collect(),
                ),
                CollectiveSpec::all_to_all_v(world, DataType::F32, vec![vec![0; world as usize]; world as usize]),
            ];
            // The AllReduce's gather half; 2 elements leave some ranks' shards empty.
            specs.push(CollectiveSpec::all_reduce(world, DataType::F32, purlin_snac::ReduceOp::Sum, 33));
            specs.push(CollectiveSpec::all_reduce(world, DataType::Bf16, purlin_snac::ReduceOp::Max, 2));
            for root in 0..w {
                specs.push(CollectiveSpec::all_gather_v(
                    world,
                    DataType::F32,
                    (0..w).map(|r| if r == root { 9 } else { 0 }).collect(),
                ));
            }
            for spec in &specs {
                for in_place in [false, true] {
                    if in_place && purlin_snac::derive::in_place_alias(spec, 0).is_none() {
                        continue;
                    }
                    let plans = derive(spec, &PlanConfig { in_place, ..cfg() }).expect("derive");
                    for p in &plans {
                        assert!(p.engine.is_some(), "{:?} world {world}: a copy-engine plan", spec.collective);
                        split(p)
                            .unwrap_or_else(|e| panic!("{:?} world {world} in place {in_place}: {e}", spec.collective));
                        split_plans += 1;
                    }
                }
            }
        }
        assert!(split_plans > 400, "{split_plans} plans split");
    }

    /// One call of the sequence below: the spec, purlin-testkit's statement of it (inputs and
    /// reference), and whether it runs on the copy engines (the device's split) or SM blocks.
    struct SeqCall {
        spec: CollectiveSpec,
        kit: kit::Case,
        ce: bool,
    }

    fn seq_call(spec: CollectiveSpec, kit: kit::Case, ce: bool) -> SeqCall {
        SeqCall { spec, kit, ce }
    }

    /// The device's sequence for a copy-engine call run on the host executor: the entry kernel
    /// as a plan of its own (which advances every epoch word), the copies, each notify writing
    /// this rank's epoch word 0, the exit kernel with shifted waits and no advance.
    fn run_split(host: &HostWorld, plan: &Plan, r: usize, b: CallBuffers) {
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
            // SAFETY: `Plan::check` bounded both regions by their buffers, which outlive the
            // call; the verified plan gives these bytes to this copy alone until its notify,
            // which follows.
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
    }

    /// The device's sequence run on the host executor for every copy-engine collective (the
    /// AllGather, the AllToAll, their V forms with empty partitions and pairs, Broadcast from
    /// root 0 and root 1, the AllReduce: Sum on f32, Max on bf16, sizes the world does not
    /// divide), three copy-engine calls back to back and SM calls between them on
    /// the same flag and epoch words, twice over: every output exact against purlin-testkit,
    /// every epoch word where the whole plan leaves it.
    #[test]
    fn the_split_plans_run_like_the_plan_on_the_host_executor() {
        let world = 3usize;
        let w = world as u32;
        let (u8k, f32k) = (kit::Dtype::U8, kit::Dtype::F32);
        let case = |c, dt, op, counts| kit::Case::with_counts(c, dt, op, world, counts);
        let ag_v = vec![40u64, 0, 13];
        let a2a_v = vec![vec![5u64, 0, 40], vec![7, 9, 0], vec![0, 30, 2]];
        let usize_of = |v: &[u64]| v.iter().map(|&c| c as usize).collect::<Vec<_>>();
        // Broadcast from `root`: the AllGatherV with counts at the root only (`Call::Broadcast`).
        let bcast = |root: usize, n: u64| {
            let counts: Vec<u64> = (0..world).map(|p| if p == root { n } else { 0 }).collect();
            let kit = if root == 0 {
                case(kit::Collective::Broadcast, f32k, None, kit::Counts::Uniform(n as usize))
            } else {
                case(kit::Collective::AllGatherV, f32k, None, kit::Counts::PerRank(usize_of(&counts)))
            };
            seq_call(CollectiveSpec::all_gather_v(w, DataType::F32, counts), kit, true)
        };
        let sequence = [
            seq_call(
                CollectiveSpec::all_gather(w, DataType::U8, 100),
                case(kit::Collective::AllGather, u8k, None, kit::Counts::Uniform(100)),
                true,
            ),
            seq_call(
                CollectiveSpec::all_to_all_v(w, DataType::U8, a2a_v.clone()),
                case(
                    kit::Collective::AllToAllV,
                    u8k,
                    None,
                    kit::Counts::PerPair(a2a_v.iter().map(|r| usize_of(r)).collect()),
                ),
                true,
            ),
            seq_call(
                CollectiveSpec::all_gather_v(w, DataType::F32, ag_v.clone()),
                case(kit::Collective::AllGatherV, f32k, None, kit::Counts::PerRank(usize_of(&ag_v))),
                true,
            ),
            seq_call(
                CollectiveSpec::all_reduce(w, DataType::F32, purlin_snac::ReduceOp::Sum, 96),
                case(kit::Collective::AllReduce, f32k, Some(kit::Op::Sum), kit::Counts::Uniform(96)),
                false,
            ),
            seq_call(
                CollectiveSpec::all_reduce(w, DataType::F32, purlin_snac::ReduceOp::Sum, 97),
                case(kit::Collective::AllReduce, f32k, Some(kit::Op::Sum), kit::Counts::Uniform(97)),
                true,
            ),
            bcast(0, 77),
            bcast(1, 64),
            seq_call(
                CollectiveSpec::all_reduce(w, DataType::Bf16, purlin_snac::ReduceOp::Max, 50),
                case(kit::Collective::AllReduce, kit::Dtype::Bf16, Some(kit::Op::Max), kit::Counts::Uniform(50)),
                true,
            ),
            seq_call(
                CollectiveSpec::all_to_all(w, DataType::F32, 21),
                case(kit::Collective::AllToAll, f32k, None, kit::Counts::Uniform(21)),
                true,
            ),
            seq_call(
                CollectiveSpec::all_gather(w, DataType::U8, 50),
                case(kit::Collective::AllGather, u8k, None, kit::Counts::Uniform(50)),
                false,
            ),
            seq_call(
                CollectiveSpec::all_to_all_v(w, DataType::U8, vec![vec![0; 3]; 3]),
                case(kit::Collective::AllToAllV, u8k, None, kit::Counts::PerPair(vec![vec![0; 3]; 3])),
                true,
            ),
        ];
        let mem = HostMemoryConfig { staging_bytes: 1 << 16, ..HostMemoryConfig::default() };
        let host = HostWorld::new(world, mem, Duration::from_secs(20));
        let mut ce_calls = 0;
        for round in 0..2u64 {
            for (k, call) in sequence.iter().enumerate() {
                let what = format!("round {round} call {k} ({:?})", call.spec.collective);
                let cfg = PlanConfig { copy_engine: call.ce, chunk_bytes: 4096, ..cfg() };
                let plans = derive(&call.spec, &cfg).expect("derive");
                assert!(
                    plans.iter().all(|p| p.engine.is_some() == call.ce),
                    "{what}: the derived plans run on the copy engines: {}",
                    call.ce
                );
                let kit = call.kit.clone().seeded(round * 100 + k as u64);
                let mut inputs = kit.inputs();
                let mut outputs: Vec<Vec<u8>> =
                    (0..world).map(|r| vec![0xA5; call.spec.output_bytes(r as u32) as usize]).collect();
                let mut peers = [(std::ptr::null_mut(), 0); purlin_snac::MAX_WORLD];
                for (slot, o) in peers.iter_mut().zip(outputs.iter_mut()) {
                    *slot = (o.as_mut_ptr(), o.len());
                }
                // The one-copy AllReduces read every rank's input (the others ignore these).
                let mut peer_inputs = [(std::ptr::null_mut(), 0); purlin_snac::MAX_WORLD];
                for (slot, x) in peer_inputs.iter_mut().zip(inputs.iter_mut()) {
                    *slot = (x.as_mut_ptr(), x.len());
                }
                let before: Vec<u64> = (0..world).map(|r| host.epoch(r, 0)).collect();
                std::thread::scope(|s| {
                    for (r, plan) in plans.iter().enumerate() {
                        let (host, (input, input_len)) = (&host, peer_inputs[r]);
                        assert_eq!(input_len as u64, call.spec.input_bytes(r as u32), "{what}: rank {r}'s input");
                        let mut b = CallBuffers::new(input.cast_const(), input_len, peers[r].0, peers[r].1);
                        b.peer_outputs = peers;
                        b.peer_inputs = peer_inputs;
                        s.spawn(move || {
                            if plan.engine.is_some() {
                                run_split(host, plan, r, b);
                            } else {
                                host.execute(plan, b, false).expect("SM call");
                            }
                        });
                    }
                });
                for (r, got) in outputs.iter().enumerate() {
                    assert_eq!(*got, kit.expected(r), "{what}: rank {r}");
                    if call.ce {
                        for word in [0, 1, 7] {
                            assert_eq!(host.epoch(r, word), before[r] + 1, "{what}: rank {r} word {word}: advance 1");
                        }
                    }
                }
                ce_calls += usize::from(call.ce);
            }
        }
        assert_eq!(ce_calls, 18);
    }
}
