//! The reference against itself and against the definitions: a direct simulation of every
//! collective, the fast path against the byte path, exactness of the inputs, the poison, the
//! checker's rules, and worked examples of the rounding and wrapping rules.

use purlin_testkit::case::zipf_split;
use purlin_testkit::reference::{expected, expected_in_place, reduce_element};
use purlin_testkit::{Case, Collective, Compare, Counts, Dtype, Op, POISON, ValueRule, Values, check, count_wrong};

/// The reduction over i64 values, written independently of the kit's.
fn reduce(op: Op, mut vals: impl Iterator<Item = i64>) -> i64 {
    let first = vals.next().unwrap_or(0);
    match op {
        Op::Sum => vals.fold(first, |a, b| a + b),
        Op::Prod => vals.fold(first, |a, b| a * b),
        Op::Min => vals.fold(first, i64::min),
        Op::Max => vals.fold(first, i64::max),
        Op::Avg => {
            let mut n = 1;
            let s = vals.fold(first, |a, b| {
                n += 1;
                a + b
            });
            s / n
        }
    }
}

/// Every rank's output moved as the collective's definition says, from the inputs alone
/// (independently of `Case::segments`).
fn simulate(case: &Case, inputs: &[Vec<i64>], r: usize) -> Vec<i64> {
    let n = case.world;
    let red = |i: usize| reduce(case.op.unwrap_or(Op::Sum), (0..n).map(|p| inputs[p][i]));
    match case.collective {
        Collective::AllReduce => (0..case.count).map(red).collect(),
        Collective::AllGather | Collective::AllGatherV | Collective::Broadcast => inputs.concat(),
        Collective::ReduceScatter | Collective::ReduceScatterV | Collective::Reduce => {
            let off: usize = case.parts()[..r].iter().sum();
            (off..off + case.parts()[r]).map(red).collect()
        }
        Collective::AllToAll | Collective::AllToAllV | Collective::SendRecv => {
            let mut out = Vec::new();
            for (p, input) in inputs.iter().enumerate() {
                let off: usize = case.matrix[p][..r].iter().sum();
                out.extend_from_slice(&input[off..off + case.matrix[p][r]]);
            }
            out
        }
    }
}

fn encode(dtype: Dtype, vals: &[i64]) -> Vec<u8> {
    vals.iter().flat_map(|&v| dtype.bytes(v)).collect()
}

#[test]
fn expected_outputs_match_a_direct_simulation() {
    for world in [2, 3, 4] {
        for c in Collective::EVERY {
            for dtype in [Dtype::F32, Dtype::Bf16, Dtype::I8, Dtype::F8E4M3] {
                for op in [Op::Sum, Op::Prod, Op::Max, Op::Avg] {
                    let case = Case::new(c, dtype, op, world, 1000, 1.0, 7).unwrap();
                    let inputs: Vec<Vec<i64>> = (0..world).map(|r| case.input_values(r).unwrap()).collect();
                    for r in 0..world {
                        let want = encode(dtype, &simulate(&case, &inputs, r));
                        let exp = case.expected(r);
                        assert_eq!(case.count_wrong(&want, &exp).count, 0, "{} rank {r}", case.name());
                        assert_eq!(want, exp, "{} rank {r}: bitwise", case.name());
                    }
                }
            }
        }
    }
}

/// The fast path (i64 arithmetic on the rule's values) and the byte path agree bit for bit
/// wherever the fast path is taken.
#[test]
fn the_fast_path_agrees_with_the_byte_reference() {
    for world in [2, 3, 5, 8] {
        for c in Collective::EVERY {
            for dtype in Dtype::ALL {
                for op in Op::ALL {
                    let Some(case) = Case::new(c, dtype, op, world, 512, 1.0, 11) else { continue };
                    let inputs = case.inputs();
                    for r in 0..world {
                        assert_eq!(case.expected(r), expected(&case, &inputs, r), "{} rank {r}", case.name());
                    }
                }
            }
        }
    }
}

#[test]
fn inputs_are_exact_small_and_never_zero() {
    for dtype in Dtype::ALL {
        for op in Op::ALL {
            for world in [2, 8, 16] {
                let rule = ValueRule::new(dtype, Some(op), world);
                for i in 0..2000 {
                    let v = rule.value(1, i % world, i);
                    assert!(v != 0);
                    assert_eq!(dtype.decode(&dtype.bytes(v)), v as f64, "{dtype:?} {op:?} {v}");
                }
                // The reduced value is exact too.
                let worst = match op {
                    Op::Sum => rule.hi * rule.scale * world as i64,
                    Op::Prod if rule.pow2 => 1 << world,
                    Op::Prod => 1,
                    _ => rule.hi * rule.scale,
                };
                assert_eq!(dtype.decode(&dtype.bytes(worst)), worst as f64, "{dtype:?} {op:?} world {world}");
            }
        }
    }
    // The small signed rule: ±1..=m, both signs, never zero.
    let rule = ValueRule::small(4, true);
    let vals: Vec<i64> = (0..4000).map(|i| rule.value(3, 0, i)).collect();
    for v in -4..=4 {
        assert_eq!(vals.contains(&v), v != 0, "{v}");
    }
    for d in [Dtype::F8E4M3, Dtype::F8E5M2] {
        // Every integer up to max_exact survives the byte encoding (what the checks assume).
        for v in -d.max_exact()..=d.max_exact() {
            assert_eq!(d.decode(&d.bytes(v)), v as f64, "{d:?} {v}");
        }
    }
}

#[test]
fn a_planted_wrong_element_is_counted() {
    let case = Case::new(Collective::AllReduce, Dtype::F32, Op::Sum, 2, 4096, 0.0, 3).unwrap();
    let exp = case.expected(0);
    let mut got = exp.clone();
    assert_eq!(case.count_wrong(&got, &exp).count, 0);
    got[40..44].copy_from_slice(&12345.0f32.to_le_bytes());
    let w = case.count_wrong(&got, &exp);
    assert_eq!(w.count, 1);
    assert_eq!(w.first.unwrap().0, 10);
    assert!(check(Dtype::F32, Compare::Bitwise, &got, &exp).unwrap_err().contains("first at element 10"));
    // A poisoned (never written) output is all wrong, under every rule.
    let poisoned = vec![POISON; exp.len()];
    for compare in [Compare::Bitwise, Compare::Value, Compare::Relative(0.125)] {
        assert_eq!(count_wrong(Dtype::F32, compare, &poisoned, &exp).count, 1024, "{compare:?}");
    }
    // A short output counts the missing elements.
    assert_eq!(case.count_wrong(&exp[..exp.len() - 8], &exp).count, 2);
    assert!(case.count_wrong(&exp[..exp.len() - 8], &exp).first.is_some());
}

#[test]
fn the_comparison_rules_differ_where_they_say() {
    let (pz, nz) = (0.0f32.to_le_bytes(), (-0.0f32).to_le_bytes());
    assert_eq!(count_wrong(Dtype::F32, Compare::Bitwise, &nz, &pz).count, 1);
    assert_eq!(count_wrong(Dtype::F32, Compare::Value, &nz, &pz).count, 0);
    let nan = f32::NAN.to_le_bytes();
    assert_eq!(count_wrong(Dtype::F32, Compare::Value, &nan, &nan).count, 1, "NaN equals nothing");
    let (a, b) = (half::bf16::from_f32(100.0).to_le_bytes(), half::bf16::from_f32(100.5).to_le_bytes());
    let bf16_avg = Compare::for_op(Dtype::Bf16, Some(Op::Avg));
    assert_eq!(bf16_avg, Compare::Relative(1e-2));
    assert_eq!(count_wrong(Dtype::Bf16, bf16_avg, &a, &b).count, 0);
    assert_eq!(Compare::for_op(Dtype::Bf16, Some(Op::Sum)), Compare::Bitwise);
    assert_eq!(Compare::for_op(Dtype::I32, Some(Op::Avg)), Compare::Bitwise);
}

#[test]
fn poison_is_never_expected() {
    for dtype in Dtype::ALL {
        let p = dtype.decode(&vec![POISON; dtype.size()]);
        // Negative or fractional, or (u8) above every gathered value.
        assert!(p.is_nan() || p < 0.0 || p.fract() != 0.0 || p > 100.0, "{dtype:?}: {p}");
    }
}

#[test]
fn too_small_sizes_are_skipped() {
    assert!(Case::new(Collective::AllGather, Dtype::F64, Op::Sum, 2, 8, 0.0, 0).is_none());
    let c = Case::new(Collective::AllGather, Dtype::F32, Op::Sum, 2, 8, 0.0, 0).unwrap();
    assert_eq!((c.in_count(0), c.out_count(0), c.bytes()), (1, 2, 8));
    let c = Case::new(Collective::ReduceScatter, Dtype::F32, Op::Sum, 3, 40, 0.0, 0).unwrap();
    assert_eq!((c.count, c.in_count(1), c.out_count(1)), (9, 9, 3));
}

/// NCCL's in-place convention: AllGather's input at the rank's partition of the output,
/// ReduceScatter's output at the rank's partition of the input; no in-place AllToAll.
#[test]
fn in_place_layouts_follow_nccl() {
    let case = |c| Case::new(c, Dtype::F32, Op::Sum, 4, 4096, 1.0, 7).unwrap().in_place(true);
    let ar = case(Collective::AllReduce).in_place_layout(3).unwrap();
    assert_eq!((ar.len, ar.input_at, ar.output_at), (1024, 0, 0));
    let ag = case(Collective::AllGather).in_place_layout(3).unwrap();
    assert_eq!((ag.len, ag.input_at, ag.output_at), (1024, 768, 0));
    let rs = case(Collective::ReduceScatter).in_place_layout(2).unwrap();
    assert_eq!((rs.len, rs.input_at, rs.output_at), (1024, 0, 512));
    for c in [Collective::AllToAll, Collective::AllGatherV, Collective::ReduceScatterV, Collective::AllToAllV] {
        assert_eq!(case(c).in_place_layout(0), None, "{c:?}");
    }
    assert_eq!(case(Collective::AllReduce).in_place(false).in_place_layout(0), None);
}

#[test]
fn in_place_reduce_scatter_keeps_the_rest_of_the_input() {
    let case = Case::with_counts(Collective::ReduceScatter, Dtype::I32, Some(Op::Sum), 2, Counts::Uniform(2));
    let inputs = vec![encode(Dtype::I32, &[1, 2, 3, 4]), encode(Dtype::I32, &[10, 20, 30, 40])];
    assert_eq!(expected_in_place(&case, &inputs, 1), encode(Dtype::I32, &[10, 20, 33, 44]));
    assert_eq!(expected_in_place(&case, &inputs, 0), encode(Dtype::I32, &[11, 22, 3, 4]));
    assert_eq!(expected(&case, &inputs, 1), encode(Dtype::I32, &[33, 44]));
}

#[test]
fn zipf_sums_and_skews() {
    let p = zipf_split(1000, 4, 1.0);
    assert_eq!(p.iter().sum::<usize>(), 1000);
    assert!(p[0] > p[1] && p[1] > p[2] && p[2] > p[3]);
    assert_eq!(zipf_split(8, 4, 0.0), vec![2, 2, 2, 2]);
    assert_eq!(zipf_split(3, 4, 0.0).iter().sum::<usize>(), 3);
}

fn reduce1(dtype: Dtype, op: Op, vals: &[Vec<u8>]) -> Vec<u8> {
    let srcs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0u8; dtype.size()];
    reduce_element(dtype, op, &srcs, &mut out);
    out
}

/// Worked examples of the byte rules: integers wrap in their width and compare with their
/// sign, the mean truncates (integers) or divides once in f32 and rounds once (floats).
#[test]
fn the_byte_rules_on_worked_examples() {
    let i32s = |v: &[i64]| v.iter().map(|&x| Dtype::I32.bytes(x)).collect::<Vec<_>>();
    let u32s = |v: &[i64]| v.iter().map(|&x| Dtype::U32.bytes(x)).collect::<Vec<_>>();
    let big = 0x1234_5678;
    assert_eq!(reduce1(Dtype::I32, Op::Prod, &i32s(&[big, big])), ((big * big) as i32).to_le_bytes());
    assert_eq!(reduce1(Dtype::I32, Op::Sum, &i32s(&[i32::MAX as i64, 1])), i32::MIN.to_le_bytes());
    assert_eq!(reduce1(Dtype::I32, Op::Min, &i32s(&[-1, 2])), (-1i32).to_le_bytes());
    assert_eq!(reduce1(Dtype::U32, Op::Min, &u32s(&[-1, 2])), 2u32.to_le_bytes());
    assert_eq!(reduce1(Dtype::I32, Op::Avg, &i32s(&[-7, 0, 0])), (-2i32).to_le_bytes());
    assert_eq!(reduce1(Dtype::U8, Op::Sum, &[vec![200], vec![100]]), [44]);
    assert_eq!(reduce1(Dtype::I64, Op::Max, &[Dtype::I64.bytes(-5), Dtype::I64.bytes(3)]), 3i64.to_le_bytes());
    // 1 / 3 in f32, then to bf16: f32's quotient rounded again.
    let ones: Vec<Vec<u8>> =
        [1.0f64, 0.0, 0.0].iter().map(|&x| half::bf16::from_f64(x).to_le_bytes().to_vec()).collect();
    assert_eq!(reduce1(Dtype::Bf16, Op::Avg, &ones), half::bf16::from_f32(1.0f32 / 3.0).to_le_bytes());
    let e4 = |x: f64| {
        let mut b = [0u8];
        Dtype::F8E4M3.encode_f64(x, &mut b);
        b.to_vec()
    };
    // 5 / 3 = 1.666..: between e4m3's 1.625 and 1.75, nearer 1.625.
    assert_eq!(reduce1(Dtype::F8E4M3, Op::Avg, &[e4(2.0), e4(2.0), e4(1.0)]), e4(1.625));
    assert_eq!(Dtype::F8E4M3.decode(&e4(1.625)), 1.625);
}

/// Stress inputs reach the byte path, and it stays a function of the inputs alone.
#[test]
fn stress_cases_go_through_the_byte_reference() {
    for c in Collective::EVERY {
        for dtype in Dtype::ALL {
            let op = c.reduces().then_some(Op::Prod);
            let counts = match c {
                Collective::AllGatherV | Collective::ReduceScatterV => Counts::PerRank(vec![3, 0, 5]),
                Collective::AllToAllV => Counts::PerPair(vec![vec![0, 2, 1], vec![4, 0, 0], vec![1, 1, 1]]),
                _ => Counts::Uniform(7),
            };
            let case = Case::with_counts(c, dtype, op, 3, counts).with_values(Values::Stress);
            let inputs = case.inputs();
            for r in 0..3 {
                let e = case.expected(r);
                assert_eq!(e, expected(&case, &inputs, r), "{}", case.name());
                assert_eq!(e.len(), case.out_count(r) * dtype.size());
            }
        }
    }
}
