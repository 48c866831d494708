//! Buffer assignment (docs/design.md §4.4): plans each device's arena from the liveness of
//! its logical buffers (`Program::buffers`, numbered by the compiler: one per tensor, reshape
//! results sharing their operand's, one per kernel scratch area), and the dump of the plan.
//!
//! Liveness follows the step order: a buffer is live from the step that writes it to its
//! last reader, both inclusive. Graph inputs are written before step 0 (so live from 0) and
//! graph outputs are read after the last step (live to `steps.len()`, "end"). A collective
//! step's operand may be read by the other members until the step returns and its result may
//! be written by them during the step, so both are simply live at that step. Weights live in
//! the weights section and are not planned.
//!
//! Streams: the steps of a device run on several streams (`passes::streams`), so program
//! order alone does not say what may run at the same time. Two buffers may share bytes only
//! if every touch of one happens before every touch of the other under the stream plan
//! (stream order and events, `meshc_runtime::format::order`; the inputs are copied in before any
//! step, the outputs read after all); an operand may hand its slot to the result only if
//! all its other touches happen before that step. On one stream this is exactly the
//! interval test of program order; `Live` (program order) is what the dump shows.
//!
//! Heuristic (greedy by size with best fit, as TFLite's arena planner and XLA's heap
//! simulator do it offline): in-place pairs are merged into one slot first; slots are placed
//! largest first, each at the smallest gap, between the already placed slots that may be
//! touched at the same time as it, that can hold it, or above the highest of them when no
//! gap can. Sizes are rounded up to `ALIGN` and every offset is a multiple of it.
//!
//! In place: the compiler names, per step, the operand positions whose kernel tolerates
//! sharing the result's memory (fused elementwise kernels read every element before writing
//! it, for operands of the result's shape and element size; never broadcast operands, GEMMs
//! or collectives). Such an operand whose buffer dies at that step (and is not a graph
//! output, which must survive to the end) hands its slot to the result. Buffers whose
//! lifetimes intersect therefore never share bytes, except an operand and the result of the
//! step where the operand dies.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use meshc_runtime::format::order::{accesses, all_before, happens_before, At, Order};
use meshc_runtime::format::program::{align_up, Exec, Program, Protocol, Storage, Transfer, ALIGN};

/// The steps a buffer is live at, both inclusive; `last == steps.len()` means the buffer is
/// a graph output, read after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    pub first: usize,
    pub last: usize,
}

impl Live {
    pub fn intersects(&self, o: &Live) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// The live range of every arena buffer of `p` (`None` for weights). A buffer that no step,
/// input or output names (the compiler makes none) is taken as live throughout.
pub fn liveness(p: &Program) -> Vec<Option<Live>> {
    let mut live: Vec<Option<Live>> = vec![None; p.buffers.len()];
    let mut touch = |b: usize, at: usize| {
        let l = live[b].get_or_insert(Live { first: at, last: at });
        l.first = l.first.min(at);
        l.last = l.last.max(at);
    };
    for &b in &p.inputs {
        touch(b, 0);
    }
    for (i, s) in p.steps.iter().enumerate() {
        for &b in &s.buffers {
            touch(b, i);
        }
        // The receiver of a `move` reads the sent buffer in place until the run ends.
        if let Exec::Send(Transfer { protocol: Protocol::Move, .. }) = &s.exec {
            s.buffers.iter().for_each(|&b| touch(b, p.steps.len()));
        }
    }
    for &b in &p.outputs {
        touch(b, p.steps.len());
    }
    let whole = Live { first: 0, last: p.steps.len() };
    live.iter()
        .zip(&p.buffers)
        .map(|(l, b)| matches!(b.storage, Storage::Arena { .. }).then(|| l.unwrap_or(whole)))
        .collect()
}

fn arena_bytes(bytes: usize) -> usize {
    align_up(bytes, ALIGN)
}

/// The arena of the naive layout: every arena buffer in its own slot.
pub fn naive_bytes(p: &Program) -> usize {
    p.buffers.iter().filter(|b| matches!(b.storage, Storage::Arena { .. })).map(|b| arena_bytes(b.bytes)).sum()
}

/// The naive layout: arena buffers one after the other in buffer order, nothing reused.
pub fn naive(p: &mut Program) {
    let mut at = 0;
    for b in &mut p.buffers {
        if let Storage::Arena { offset } = &mut b.storage {
            *offset = at;
            at += arena_bytes(b.bytes);
        }
    }
    p.arena_bytes = at;
}

/// Buffers sharing one place in the arena, one after the other in time.
struct Slot {
    members: Vec<usize>,
    bytes: usize,
    live: Live,
}

/// Plans `p`'s arena (see the module doc). `in_place[i]` lists the positions in
/// `p.steps[i].buffers` (operands, so at least 1) whose kernel tolerates the result sharing
/// their memory.
pub fn plan(p: &mut Program, in_place: &[Vec<usize>]) {
    let live = liveness(p);
    let order = Order::of(p);
    let at = accesses(p);
    // Buffers may share bytes only when one is done before the other starts on every
    // stream: in program order alone, the streams' overlap would corrupt data.
    let apart = |x: usize, y: usize| all_before(&order, &at[x], &at[y]) || all_before(&order, &at[y], &at[x]);
    let mut slot_of: Vec<Option<usize>> = vec![None; p.buffers.len()];
    let mut slots: Vec<Slot> = Vec::new();
    for (b, l) in live.iter().enumerate() {
        if let Some(l) = *l {
            slot_of[b] = Some(slots.len());
            slots.push(Slot { members: vec![b], bytes: arena_bytes(p.buffers[b].bytes), live: l });
        }
    }
    for (i, step) in p.steps.iter().enumerate() {
        let Some(&r) = step.buffers.first() else { continue };
        if live[r].is_none_or(|l| l.first != i) {
            continue;
        }
        let allowed = in_place.get(i).map(Vec::as_slice).unwrap_or(&[]);
        // Kernels only (never collectives or library calls, whatever the caller allows), an
        // operand in the arena, and every position it takes in this step must tolerate the
        // sharing.
        let fits = |o: usize| {
            matches!(step.exec, Exec::Kernel(_))
                && o != r
                // Weights are not in the arena: a result never takes their place.
                && live[o].is_some()
                && at[o].iter().all(|&a| a == At::Step(i) || happens_before(&order, a, At::Step(i)))
                && p.buffers[o].bytes == p.buffers[r].bytes
                && (1..step.buffers.len()).filter(|&k| step.buffers[k] == o).all(|k| allowed.contains(&k))
        };
        let Some(o) = allowed.iter().map(|&k| step.buffers[k]).find(|&o| fits(o)) else { continue };
        let (so, sr) = (slot_of[o].expect("a live buffer"), slot_of[r].expect("a live buffer"));
        let moved = std::mem::take(&mut slots[sr].members);
        slots[so].live.last = slots[so].live.last.max(slots[sr].live.last);
        for &m in &moved {
            slot_of[m] = Some(so);
        }
        slots[so].members.extend(moved);
    }
    slots.retain(|s| !s.members.is_empty());
    // Largest first; ties by start, then by buffer number, so the plan is deterministic.
    slots.sort_by_key(|s| (std::cmp::Reverse(s.bytes), s.live.first, s.members[0]));
    let mut placed: Vec<(usize, usize, &Slot)> = Vec::new(); // (offset, bytes, slot)
    let mut top = 0;
    for s in &slots {
        let clash = |t: &Slot| s.members.iter().any(|&x| t.members.iter().any(|&y| !apart(x, y)));
        let taken: BTreeSet<(usize, usize)> =
            placed.iter().filter(|(_, _, t)| clash(t)).map(|&(o, n, _)| (o, n)).collect();
        let mut cursor = 0;
        let mut best: Option<(usize, usize)> = None; // (gap, offset)
        for &(o, n) in &taken {
            if o >= cursor + s.bytes && best.is_none_or(|(gap, _)| o - cursor < gap) {
                best = Some((o - cursor, cursor));
            }
            cursor = cursor.max(o + n);
        }
        let offset = best.map_or(cursor, |(_, at)| at);
        placed.push((offset, s.bytes, s));
        top = top.max(offset + s.bytes);
        for &m in &s.members {
            p.buffers[m].storage = Storage::Arena { offset };
        }
    }
    p.arena_bytes = top;
}

/// The operand of step `i` whose memory its result reuses, if any.
fn in_place_of(p: &Program, live: &[Option<Live>], i: usize) -> Option<usize> {
    let s = &p.steps[i];
    let r = *s.buffers.first()?;
    let Storage::Arena { offset } = p.buffers[r].storage else { return None };
    s.buffers[1..].iter().copied().find(|&o| {
        o != r
            && p.buffers[o].storage == (Storage::Arena { offset })
            && live[o].is_some_and(|l| l.last == i)
            && !matches!(s.exec, Exec::Collective(_))
    })
}

/// The `--dump-after buffers` text: per device, every buffer with its tensor, size, place
/// and live range (`in`: written before step 0, `end`: read after the last step), then the
/// arena against the naive sum.
pub fn dump(programs: &[Program]) -> String {
    let mut s = String::new();
    for p in programs {
        let live = liveness(p);
        let _ = writeln!(s, "device {}: {} buffers, {} steps", p.device, p.buffers.len(), p.steps.len());
        let _ = writeln!(s, "  {:<5} {:<28} {:>10}  {:>10}  live", "buf", "tensor", "bytes", "offset");
        let mut shares: Vec<Option<usize>> = vec![None; p.buffers.len()];
        for i in 0..p.steps.len() {
            if let Some(o) = in_place_of(p, &live, i) {
                shares[p.steps[i].buffers[0]] = Some(o);
            }
        }
        for (b, buf) in p.buffers.iter().enumerate() {
            let (at, range) = match (buf.storage.clone(), live[b]) {
                (Storage::Weights { .. }, _) => ("weights".to_string(), String::new()),
                (Storage::Sizes, _) => ("sizes".to_string(), String::new()),
                (Storage::Arena { offset }, l) => {
                    let l = l.expect("arena buffers have a live range");
                    let first = if p.inputs.contains(&b) { "in".to_string() } else { l.first.to_string() };
                    let last = if l.last == p.steps.len() { "end".to_string() } else { l.last.to_string() };
                    let shared = shares[b].map(|o| format!("  in place of b{o}")).unwrap_or_default();
                    (offset.to_string(), format!("[{first}, {last}]{shared}"))
                }
            };
            let line = format!("  b{b:<4} {:<28} {:>10}  {at:>10}  {range}", buf.name, buf.bytes);
            let _ = writeln!(s, "{}", line.trim_end());
        }
        let naive = naive_bytes(p);
        let pct = if naive == 0 { 100.0 } else { 100.0 * p.arena_bytes as f64 / naive as f64 };
        let _ = writeln!(s, "  arena {} bytes, naive {naive} bytes ({pct:.1}%)", p.arena_bytes);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshc_runtime::format::program::{Buffer, Collective, CollectiveOp, Reduce, Step};

    /// A program over arena buffers of these sizes; steps as (result, operands, collective).
    fn program(sizes: &[usize], steps: &[(usize, &[usize], bool)], inputs: &[usize], outputs: &[usize]) -> Program {
        let buffers = (sizes.iter().enumerate())
            .map(|(i, &bytes)| Buffer {
                name: format!("t{i}"),
                bytes,
                storage: Storage::Arena { offset: 0 },
                mask: None,
            })
            .collect();
        let steps = (steps.iter())
            .map(|&(r, ops, collective)| Step {
                node: format!("t{r}"),
                exec: if collective {
                    Exec::Collective(Collective {
                        op: CollectiveOp::AllReduce { reduce: Reduce::Sum },
                        id: 0,
                        groups: vec![vec![0]],
                        dtype: "f32".into(),
                        shape: vec![],
                    })
                } else {
                    Exec::Kernel(0)
                },
                buffers: [&[r][..], ops].concat(),
                why: None,
                scaling: None,
            })
            .collect();
        Program {
            device: 0,
            arena_bytes: 0,
            buffers,
            kernels: vec![],
            steps,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            streams: Default::default(),
        }
    }

    fn offsets(p: &Program) -> Vec<usize> {
        p.buffers
            .iter()
            .map(|b| match b.storage {
                Storage::Arena { offset } => offset,
                Storage::Weights { .. } | Storage::Sizes => unreachable!("no weights or sizes here"),
            })
            .collect()
    }

    #[test]
    fn a_chain_runs_in_place_while_its_operands_die() {
        // t0 -> t1 -> t2 (output), all elementwise of one size; t3 reads t0 later.
        let mut p = program(&[256, 256, 256], &[(1, &[0], false), (2, &[1], false)], &[0], &[2]);
        plan(&mut p, &[vec![1], vec![1]]);
        assert_eq!(offsets(&p), [0, 0, 0]);
        assert_eq!((p.arena_bytes, naive_bytes(&p)), (256, 768));
        // Without permission nothing is shared, but t0 is dead by step 1: t2 takes its place.
        plan(&mut p, &[vec![], vec![]]);
        assert_eq!(offsets(&p), [0, 256, 0]);
        assert_eq!(liveness(&p)[2], Some(Live { first: 1, last: 2 }));
    }

    #[test]
    fn no_sharing_with_live_operands_outputs_other_sizes_or_collectives() {
        // t0 is read again at step 1; t1 is an output read by the last step; t3 differs in size.
        let mut p = program(
            &[256, 256, 256, 320, 256],
            &[(1, &[0], false), (2, &[1, 0], false), (3, &[2], false), (4, &[2], true)],
            &[0],
            &[1, 4],
        );
        plan(&mut p, &[vec![1], vec![1, 2], vec![1], vec![1]]);
        let o = offsets(&p);
        assert_ne!(o[1], o[0], "t0 is still read at step 1");
        assert_ne!(o[2], o[1], "t1 is an output");
        assert_ne!(o[4], o[2], "a collective's result is apart from its operand");
        assert!(o.iter().all(|o| o % ALIGN == 0));
        // The peak: t1, t2 and t3 at step 2 (t3 reuses t0's bytes).
        assert_eq!(p.arena_bytes, 2 * 256 + 320);
    }

    #[test]
    fn an_operand_at_a_position_that_may_not_share_is_not_shared() {
        // Step 0 reads t0 twice (positions 1 and 2); only position 1 may share.
        let mut p = program(&[64, 64], &[(1, &[0, 0], false)], &[0], &[1]);
        plan(&mut p, &[vec![1]]);
        assert_ne!(offsets(&p)[0], offsets(&p)[1]);
        plan(&mut p, &[vec![1, 2]]);
        assert_eq!(offsets(&p)[0], offsets(&p)[1]);
    }

    #[test]
    fn the_best_fitting_gap_is_chosen() {
        // t1 (512) and t3 (128) die at step 0 and leave holes between buffers still live at
        // step 1; t6 (128), written at step 1, takes the small hole, not the first one.
        let mut p = program(
            &[1024, 512, 512, 128, 512, 128, 128],
            &[(5, &[1, 3], false), (6, &[0, 2, 4, 5], false)],
            &[0, 1, 2, 3, 4],
            &[6],
        );
        plan(&mut p, &[vec![], vec![]]);
        let o = offsets(&p);
        assert_eq!((o[1], o[3]), (1024, 2560), "{o:?}");
        assert_eq!(o[6], o[3], "{o:?}");
        assert_eq!(p.arena_bytes, 2816);
    }
}
