//! Stream assignment (docs/design.md §4.4): orders each device's steps and splits
//! them into streams — a compute stream (the main stream, 0), optionally more compute
//! streams for independent branches, and a communication stream for the collectives — with
//! cross-stream dependencies as events; `--dump-after streams` prints the plan.
//!
//! Dependencies: a step follows every earlier step it shares a buffer number with where one
//! of the two writes it (the result is a step's first buffer); collectives also keep their
//! program order among themselves, which is what lets the members of a group meet (the
//! runner checks that order across devices).
//!
//! Scheduling heuristic (`schedule`, a list scheduler over those dependencies): a ready
//! collective or send is issued at once, so the communication starts as early as the data
//! allows; a receive, which waits for another device, is deferred like the readers below. Among ready compute steps: first the ancestors of the next collective (the
//! communication waits for them: running them first costs no time and lets the collective
//! overlap what follows), then the steps that do not read a collective's result (reading
//! one stalls the compute stream until the collective is done, so they are deferred while
//! anything else can run), and within each class the step that grows the live bytes the
//! least (its result and scratch, minus the operands it is the last reader of) — that is
//! where memory is saved without costing time, as one compute stream does the same work in
//! any order. Ties keep the graph's order.
//!
//! Streams (`assign`): a collective goes to the communication stream when enough compute
//! could run meanwhile — steps that neither feed it nor need its result, touching at least
//! `OVERLAP_BYTES` — as XLA makes a collective asynchronous only when something can be
//! scheduled between its start and its end. Any other collective stays on the compute
//! stream: on the communication stream it would only add two cross-thread hand-offs (the
//! testdata transformer's Megatron layout is a chain, and ran 2.1x slower with both its
//! all_reduces moved).
//! `Config::comm_always` moves every collective (to measure exactly that). The
//! communication stream is kept even when empty, so every device has one of each. With `Config::compute_streams` > 1 a compute step
//! continues the stream of a compute predecessor that is still that stream's last step
//! (chains stay on one stream), and otherwise opens the least-loaded stream (bytes touched as
//! the cost), so independent branches spread out. The default is one compute stream: with
//! one host thread per device and stream, 8 devices already fill the 2 cores of the test
//! machine, so a second compute stream does not pay there. `Config::single` forces one
//! stream (the baseline the benchmarks compare against).
//!
//! Events: a step waits for each dependency on another stream, unless another dependency
//! (or its own stream's order) already implies it. That is the transitive reduction of the
//! happens-before DAG — stream order, the dependencies across streams, and an end node
//! after the last step of every stream — computed by petgraph's `algo::tred`: its edges
//! across streams are the waits, and those into the end node from streams other than the
//! main one are what the main stream joins at the end. A DAG has exactly one transitive
//! reduction, so no rule is needed to choose among equivalent waits. Every edge points from
//! an earlier step to a later one, so program order is the topological order `tred` wants.
//! The closure of the dependencies themselves (the same `tred` call) tells which compute
//! steps a collective could overlap.
//!
//! Buffer assignment (`passes::buffers`) reads the resulting happens-before relation
//! (`Order`) to decide which buffers may share arena bytes, so the overlap cannot corrupt
//! data.

use std::fmt::Write as _;

use meshc_runtime::format::order::{step_note, streams_summary};
use meshc_runtime::format::program::{Event, Exec, Program, Step, Storage, Stream, StreamKind, StreamPlan, Wait};
use petgraph::adj::UnweightedList;
use petgraph::algo::tred;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::IntoNeighbors;

/// The least compute (bytes its steps touch) a collective must be able to overlap to go to
/// the communication stream: each move costs two cross-thread hand-offs, ~10–50 µs on the
/// test machine (8 device threads on 2 cores), while its kernels stream ~10 GB/s. Measured
/// (`make bench`, streams): the testdata transformer on mp-8, whose q/k/v all_gathers can
/// overlap ~30 KiB of projections, ran 0.313 ms with them moved, 0.204 ms on one stream.
pub const OVERLAP_BYTES: usize = 512 << 10;

/// How to split the steps into streams.
#[derive(Clone, Debug)]
pub struct Config {
    /// Everything on one stream, in program order (no communication stream, no events).
    pub single: bool,
    /// Compute streams per device (at least 1).
    pub compute_streams: usize,
    /// Every collective on the communication stream, even with nothing to overlap.
    pub comm_always: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { single: false, compute_streams: 1, comm_always: false }
    }
}

/// Collectives, sends and receives: the steps that meet other devices (kept in program
/// order among themselves, and the ones the communication stream takes).
fn is_communication(p: &Program, i: usize) -> bool {
    matches!(p.steps[i].exec, Exec::Collective(_) | Exec::Send(_) | Exec::Recv(_))
}

/// The buffer step `s` writes, if any (its first; a send only reads its one buffer).
fn result(s: &Step) -> Option<usize> {
    match s.exec {
        Exec::Send(_) => None,
        _ => s.buffers.first().copied(),
    }
}

/// The buffers step `s` reads (and its scratch).
fn operands(s: &Step) -> &[usize] {
    match s.exec {
        Exec::Send(_) => &s.buffers,
        _ => s.buffers.get(1..).unwrap_or(&[]),
    }
}

/// Per step, the earlier steps it depends on (module doc), ascending, without repeats.
pub fn deps(p: &Program) -> Vec<Vec<usize>> {
    let mut writer: Vec<Option<usize>> = vec![None; p.buffers.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); p.buffers.len()];
    let mut last_collective = None;
    let mut deps = Vec::with_capacity(p.steps.len());
    for (i, s) in p.steps.iter().enumerate() {
        let mut d: Vec<usize> = Vec::new();
        for &b in operands(s) {
            d.extend(writer[b]);
        }
        if let Some(r) = result(s) {
            d.extend(writer[r]);
            d.extend(readers[r].iter().copied());
        }
        if is_communication(p, i) {
            d.extend(last_collective);
            last_collective = Some(i);
        }
        d.retain(|&j| j != i);
        d.sort_unstable();
        d.dedup();
        for &b in operands(s) {
            readers[b].push(i);
        }
        if let Some(r) = result(s) {
            writer[r] = Some(i);
            readers[r].clear();
        }
        deps.push(d);
    }
    deps
}

/// Reorders `p`'s steps (module doc); `in_place[i]`, the in-place permissions of step `i`,
/// moves with its step.
pub fn schedule(p: &mut Program, in_place: &mut Vec<Vec<usize>>) {
    let n = p.steps.len();
    let deps = deps(p);
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, d) in deps.iter().enumerate() {
        for &j in d {
            succs[j].push(i);
        }
    }
    let collectives: Vec<usize> = (0..n).filter(|&i| is_communication(p, i)).collect();
    // The first collective (by its rank among collectives) each step leads to.
    let mut feeds = vec![usize::MAX; n];
    for i in (0..n).rev() {
        if let Some(k) = collectives.iter().position(|&c| c == i) {
            feeds[i] = k;
        } else {
            feeds[i] = succs[i].iter().map(|&s| feeds[s]).min().unwrap_or(usize::MAX);
        }
    }
    let reads_collective: Vec<bool> = deps.iter().map(|d| d.iter().any(|&j| is_communication(p, j))).collect();
    let bytes = |b: usize| match p.buffers[b].storage {
        Storage::Arena { .. } => p.buffers[b].bytes,
        Storage::Weights { .. } | Storage::Sizes => 0,
    };
    let mut reads_left = vec![0usize; p.buffers.len()];
    for s in &p.steps {
        for &b in operands(s) {
            reads_left[b] += 1;
        }
    }
    let mut written = vec![false; p.buffers.len()];
    p.inputs.iter().for_each(|&b| written[b] = true);
    p.steps.iter().filter_map(result).for_each(|b| written[b] = true);
    let mut pending: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    let mut next_collective = 0;
    while !ready.is_empty() {
        let growth = |i: usize| -> i64 {
            let s = &p.steps[i];
            let mut grow = result(s).map_or(0, bytes) as i64;
            let mut seen = Vec::new();
            for &b in operands(s) {
                if seen.contains(&b) {
                    continue;
                }
                seen.push(b);
                let here = operands(s).iter().filter(|&&x| x == b).count();
                // Scratch space (written by no step) comes and goes within its step.
                if reads_left[b] == here && written[b] && !p.outputs.contains(&b) {
                    grow -= bytes(b) as i64;
                }
            }
            grow
        };
        let pick = (0..ready.len())
            .min_by_key(|&k| {
                let i = ready[k];
                // A receive waits for another device: deferred like a reader of a
                // collective, so that the compute it does not feed runs first.
                let class = if matches!(p.steps[i].exec, Exec::Recv(_)) {
                    3
                } else if is_communication(p, i) {
                    0
                } else if feeds[i] == next_collective {
                    1
                } else if !reads_collective[i] {
                    2
                } else {
                    3
                };
                (class, growth(i), i)
            })
            .expect("a ready step");
        let i = ready.swap_remove(pick);
        if is_communication(p, i) {
            next_collective += 1;
        }
        for &b in operands(&p.steps[i]) {
            reads_left[b] -= 1;
        }
        for &s in &succs[i] {
            pending[s] -= 1;
            if pending[s] == 0 {
                ready.push(s);
            }
        }
        order.push(i);
    }
    debug_assert_eq!(order.len(), n, "the dependencies point backwards, so every step gets ready");
    let mut steps: Vec<Option<Step>> = std::mem::take(&mut p.steps).into_iter().map(Some).collect();
    let mut perms: Vec<Vec<usize>> = std::mem::take(in_place);
    perms.resize(n, Vec::new());
    p.steps = order.iter().map(|&i| steps[i].take().expect("each step once")).collect();
    *in_place = order.iter().map(|&i| std::mem::take(&mut perms[i])).collect();
}

/// The stream plan of `p` (module doc).
pub fn assign(p: &Program, cfg: &Config) -> StreamPlan {
    let n = p.steps.len();
    if cfg.single {
        return StreamPlan {
            streams: vec![Stream { kind: StreamKind::Compute, steps: (0..n).collect() }],
            ..StreamPlan::default()
        };
    }
    let computes = cfg.compute_streams.max(1);
    let comm = computes;
    let mut streams: Vec<Stream> =
        (0..computes).map(|_| Stream { kind: StreamKind::Compute, steps: Vec::new() }).collect();
    streams.push(Stream { kind: StreamKind::Comm, steps: Vec::new() });
    let deps = deps(p);
    let comm_step = |x: usize| is_communication(p, x);
    // A step's cost: the bytes it touches.
    let work = |x: usize| p.steps[x].buffers.iter().map(|&b| p.buffers[b].bytes).sum::<usize>();
    // What a collective can overlap: all the compute work but that of the steps it feeds or
    // needs (its descendants and ancestors in the closure of the dependencies).
    let (_, closure) = reduction_closure(n, deps.iter().enumerate().flat_map(|(i, d)| d.iter().map(move |&j| (j, i))));
    let mut related = vec![0usize; n];
    for x in 0..n {
        for y in closure.neighbors(x as u32).map(|y| y as usize) {
            match (comm_step(x), comm_step(y)) {
                (true, false) => related[x] += work(y),
                (false, true) => related[y] += work(x),
                _ => {}
            }
        }
    }
    let compute_work: usize = (0..n).filter(|&x| !comm_step(x)).map(work).sum();
    let overlaps = |c: usize| compute_work - related[c] >= OVERLAP_BYTES;
    let mut stream_of = vec![0; n];
    let mut load = vec![0usize; computes];
    for i in 0..n {
        let s = if comm_step(i) && (cfg.comm_always || overlaps(i)) {
            comm
        } else {
            let tail = deps[i]
                .iter()
                .map(|&j| stream_of[j])
                .find(|&s| s != comm && streams[s].steps.last().is_some_and(|&t| deps[i].contains(&t)));
            tail.unwrap_or_else(|| (0..computes).min_by_key(|&s| (load[s], s)).expect("a compute stream"))
        };
        if s != comm {
            load[s] += work(i);
        }
        stream_of[i] = s;
        streams[s].steps.push(i);
    }
    // The happens-before DAG: stream order, the dependencies across streams, and a last node
    // `end` after the main stream's last step and every other stream's. Its reduction keeps
    // exactly the edges no path of other edges implies: across streams, the waits (and into
    // `end` from another stream, the joins). A DAG has one transitive reduction, so the plan
    // does not depend on how it is computed.
    let end = n;
    let order = streams.iter().flat_map(|st| st.steps.windows(2).map(|w| (w[0], w[1])));
    let stream_of = &stream_of;
    let across = deps
        .iter()
        .enumerate()
        .flat_map(|(i, d)| d.iter().filter(move |&&j| stream_of[j] != stream_of[i]).map(move |&j| (j, i)));
    let tails = streams.iter().filter_map(|st| st.steps.last().map(|&t| (t, end)));
    let (reduction, _) = reduction_closure(n + 1, order.chain(across).chain(tails));
    let mut waits: Vec<(usize, usize)> = Vec::new();
    let mut joined: Vec<usize> = Vec::new();
    for u in 0..n {
        for v in reduction.neighbors(u as u32).map(|v| v as usize) {
            if v == end {
                if stream_of[u] != 0 {
                    joined.push(u);
                }
            } else if stream_of[v] != stream_of[u] {
                waits.push((u, v));
            }
        }
    }
    // One event per step another stream waits for, numbered in step order, so the plan
    // reads in order; waits in the order of the steps that wait.
    let mut recorded: Vec<usize> = waits.iter().map(|w| w.0).chain(joined.iter().copied()).collect();
    recorded.sort_unstable();
    recorded.dedup();
    let event = |u: usize| recorded.binary_search(&u).expect("a recorded step");
    waits.sort_unstable_by_key(|&(u, v)| (v, u));
    let waits = waits.into_iter().map(|(u, v)| Wait { event: event(u), before: v }).collect();
    let mut join: Vec<usize> = joined.into_iter().map(event).collect();
    join.sort_unstable();
    let events = recorded.iter().map(|&u| Event { after: u }).collect();
    StreamPlan { streams, events, waits, join }
}

/// The transitive reduction and closure (petgraph's `tred`) of the DAG on nodes `0..nodes`
/// whose `edges` each go from an earlier node to a later one, as adjacency lists indexed by
/// node. (The node order is then a topological order, and the lists keep its numbering.)
fn reduction_closure(
    nodes: usize,
    edges: impl IntoIterator<Item = (usize, usize)>,
) -> (UnweightedList<u32>, UnweightedList<u32>) {
    let mut g = DiGraph::<(), (), u32>::with_capacity(nodes, 0);
    for _ in 0..nodes {
        g.add_node(());
    }
    for (a, b) in edges {
        debug_assert!(a < b, "edge {a} -> {b} points backwards");
        g.add_edge(NodeIndex::new(a), NodeIndex::new(b), ());
    }
    let topo: Vec<NodeIndex> = g.node_indices().collect();
    let (list, _) = tred::dag_to_toposorted_adjacency_list::<_, u32>(&g, &topo);
    tred::dag_transitive_reduction_closure(&list)
}

/// The `--dump-after streams` text: per device, its streams, then every step in program
/// order with its stream, the events it waits for and those it records.
pub fn dump(programs: &[Program]) -> String {
    let mut s = String::new();
    for p in programs {
        let _ = writeln!(s, "device {}: {} steps; {}", p.device, p.steps.len(), streams_summary(p));
        for (i, step) in p.steps.iter().enumerate() {
            let _ = writeln!(s, "  {i:>4}  {:<28} {}", step.node, step_note(p, i));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshc_runtime::format::order::Order;
    use meshc_runtime::format::program::{Buffer, Collective, CollectiveOp, Reduce, Step};

    /// A program over 256 KiB arena buffers (two make a step worth overlapping); steps as
    /// (result, operands, collective).
    fn program(buffers: usize, steps: &[(usize, &[usize], bool)]) -> Program {
        let collective = |id| {
            Exec::Collective(Collective {
                op: CollectiveOp::AllReduce { reduce: Reduce::Sum },
                id,
                groups: vec![vec![0]],
                dtype: "f32".into(),
                shape: vec![16],
            })
        };
        Program {
            buffers: (0..buffers)
                .map(|i| Buffer {
                    name: format!("t{i}"),
                    bytes: 256 << 10,
                    storage: Storage::Arena { offset: 0 },
                    mask: None,
                })
                .collect(),
            steps: (steps.iter().enumerate())
                .map(|(i, &(r, ops, c))| Step {
                    node: format!("t{r}"),
                    exec: if c { collective(i) } else { Exec::Kernel(0) },
                    buffers: [&[r][..], ops].concat(),
                    why: None,
                    scaling: None,
                })
                .collect(),
            inputs: vec![0],
            outputs: vec![buffers - 1],
            ..Program::default()
        }
    }

    #[test]
    fn a_collective_overlaps_the_independent_branch_with_irredundant_events() {
        // t1 = f(t0); t2 = all_reduce(t1); t3 = g(t0) and t4 = g(t3), independent of the
        // collective; t5 = t2 + t4 + t1 (t1's dependency is implied by t2's).
        let mut p = program(
            6,
            &[(1, &[0], false), (2, &[1], true), (3, &[0], false), (4, &[3], false), (5, &[2, 4, 1], false)],
        );
        p.streams = assign(&p, &Config::default());
        let plan = &p.streams;
        assert_eq!(plan.streams.iter().map(|s| s.steps.clone()).collect::<Vec<_>>(), [vec![0, 2, 3, 4], vec![1]]);
        assert_eq!(plan.events, [Event { after: 0 }, Event { after: 1 }]);
        assert_eq!(plan.waits, [Wait { event: 0, before: 1 }, Wait { event: 1, before: 4 }]);
        assert!(plan.join.is_empty(), "the last step of the main stream waits for the collective");
        let order = Order::of(&p);
        assert!(order.before(0, 1) && order.before(1, 4) && order.before(0, 4));
        assert!(!order.before(2, 1) && !order.before(1, 2) && !order.before(3, 1));
        // One stream: no events, program order.
        p.streams = assign(&p, &Config { single: true, ..Config::default() });
        assert!(p.streams.events.is_empty() && Order::of(&p).before(2, 3) && Order::of(&p).before(1, 2));
    }

    #[test]
    fn a_collective_with_too_little_to_overlap_stays_on_the_compute_stream_unless_forced() {
        let mut p = program(5, &[(1, &[0], false), (2, &[1], true), (3, &[0], false), (4, &[2, 3], false)]);
        assert_eq!(assign(&p, &Config::default()).streams[1].steps, [1]);
        p.buffers.iter_mut().for_each(|b| b.bytes = 64);
        assert!(assign(&p, &Config::default()).streams[1].steps.is_empty());
        assert_eq!(assign(&p, &Config { comm_always: true, ..Config::default() }).streams[1].steps, [1]);
    }

    #[test]
    fn a_collective_with_nothing_to_overlap_stays_on_the_compute_stream_unless_forced() {
        let p = program(4, &[(1, &[0], false), (2, &[1], true), (3, &[2], false)]);
        let plan = assign(&p, &Config::default());
        assert_eq!(plan.streams[0].steps, [0, 1, 2]);
        assert!(plan.streams[1].steps.is_empty() && plan.waits.is_empty());
        let plan = assign(&p, &Config { comm_always: true, ..Config::default() });
        assert_eq!((plan.streams[0].steps.clone(), plan.streams[1].steps.clone()), (vec![0, 2], vec![1]));
        assert_eq!(plan.waits.len(), 2);
    }

    #[test]
    fn the_main_stream_joins_a_stream_whose_result_it_never_reads() {
        // The collective's result t2 is an output nobody reads: the main stream joins it.
        let mut p = program(4, &[(1, &[0], false), (2, &[1], true), (3, &[0], false)]);
        p.outputs = vec![2, 3];
        let plan = assign(&p, &Config::default());
        assert_eq!(plan.streams[1].steps, [1]);
        assert_eq!(plan.join, [1]);
        assert_eq!(plan.events[1], Event { after: 1 });
    }

    #[test]
    fn the_schedule_issues_collectives_early_and_defers_their_readers() {
        // In graph order: t1 = f(t0), t2 = all_reduce(t1), t3 = g(t2) reads it at once,
        // t4 = h(t0) is independent; the schedule runs t4 before t3.
        let mut p =
            program(6, &[(1, &[0], false), (2, &[1], true), (3, &[2], false), (4, &[0], false), (5, &[3, 4], false)]);
        let mut perms = vec![vec![]; 5];
        schedule(&mut p, &mut perms);
        let order: Vec<&str> = p.steps.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(order, ["t1", "t2", "t4", "t3", "t5"]);
    }
}
