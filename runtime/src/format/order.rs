//! When steps and buffers of a device's program happen relative to each other under its
//! stream plan: the happens-before relation of steps (stream order plus events; program
//! order for an empty plan) and where each buffer is touched. The compiler's buffer pass
//! lets two buffers share arena bytes only when every touch of one happens before every
//! touch of the other; the runner checks the same of the plan it is handed. Also how a plan
//! reads as text, the same in the compiler's `--dump-after streams` and in `meshc inspect`.

use std::fmt::Write as _;

use crate::format::program::{
    Attention, CollectiveOp, Concat, Exec, IntMatmul, Library, Matmul, Program, Protocol, Reduction, SoftmaxAlong,
    Step, StreamKind, Transfer, Transpose,
};

/// The happens-before relation of a device's steps under its stream plan: stream order plus
/// the events (and the inputs, copied in before any step).
pub struct Order {
    stream: Vec<usize>,
    pos: Vec<usize>,
    /// Per step and stream: how many of that stream's steps happen before the step, or are
    /// it.
    clock: Vec<Vec<usize>>,
}

impl Order {
    /// The relation of `p`'s plan (program order for an empty plan). The plan must be one
    /// the runner accepts (`crate::exec::runner`'s checks): every wait points to an earlier step.
    pub fn of(p: &Program) -> Order {
        let n = p.steps.len();
        let plan = &p.streams;
        let lists: Vec<Vec<usize>> = if plan.streams.is_empty() {
            vec![(0..n).collect()]
        } else {
            plan.streams.iter().map(|s| s.steps.clone()).collect()
        };
        let mut stream = vec![0; n];
        let mut pos = vec![0; n];
        for (s, list) in lists.iter().enumerate() {
            for (k, &i) in list.iter().enumerate() {
                stream[i] = s;
                pos[i] = k;
            }
        }
        let mut waits: Vec<Vec<usize>> = vec![Vec::new(); n];
        for w in &plan.waits {
            waits[w.before].push(plan.events[w.event].after);
        }
        let mut clock: Vec<Vec<usize>> = vec![vec![0; lists.len()]; n];
        for i in 0..n {
            let mut c = vec![0; lists.len()];
            let join = |c: &mut Vec<usize>, j: usize| {
                for (x, y) in c.iter_mut().zip(&clock[j]) {
                    *x = (*x).max(*y);
                }
            };
            if pos[i] > 0 {
                join(&mut c, lists[stream[i]][pos[i] - 1]);
            }
            for &j in &waits[i] {
                join(&mut c, j);
            }
            c[stream[i]] = pos[i] + 1;
            clock[i] = c;
        }
        Order { stream, pos, clock }
    }

    /// Whether step `a` finishes before step `b` starts.
    pub fn before(&self, a: usize, b: usize) -> bool {
        a != b && self.clock[b][self.stream[a]] > self.pos[a]
    }
}

/// Where a buffer is touched: copied in before any step, by a step, or read after all.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum At {
    In,
    Step(usize),
    Out,
}

/// Every place each buffer of `p` is touched (a buffer nothing touches: throughout).
pub fn accesses(p: &Program) -> Vec<Vec<At>> {
    let mut at: Vec<Vec<At>> = vec![Vec::new(); p.buffers.len()];
    for &b in &p.inputs {
        at[b].push(At::In);
    }
    for (i, s) in p.steps.iter().enumerate() {
        for &b in &s.buffers {
            if at[b].last() != Some(&At::Step(i)) {
                at[b].push(At::Step(i));
            }
        }
        // The receiver of a `move` reads the sent buffer in place until the run ends.
        if let Exec::Send(Transfer { protocol: Protocol::Move, .. }) = &s.exec {
            s.buffers.iter().for_each(|&b| at[b].push(At::Out));
        }
    }
    for &b in &p.outputs {
        at[b].push(At::Out);
    }
    for a in &mut at {
        if a.is_empty() {
            a.extend([At::In, At::Out]);
        }
    }
    at
}

/// Whether `a` is over before `b` starts.
pub fn happens_before(order: &Order, a: At, b: At) -> bool {
    match (a, b) {
        (At::In, At::Step(_) | At::Out) | (At::Step(_), At::Out) => true,
        (At::Step(x), At::Step(y)) => order.before(x, y),
        _ => false,
    }
}

/// Whether every touch of `x` is over before any touch of `y` starts.
pub fn all_before(order: &Order, x: &[At], y: &[At]) -> bool {
    x.iter().all(|&a| y.iter().all(|&b| happens_before(order, a, b)))
}

/// "s1 comm": how dumps and `meshc inspect` name stream `s` of `p`.
pub fn stream_name(p: &Program, s: usize) -> String {
    let kind = match p.streams.streams[s].kind {
        StreamKind::Compute => "compute",
        StreamKind::Comm => "comm",
    };
    format!("s{s} {kind}{}", if s == 0 { " (main)" } else { "" })
}

/// The one-line summary of `p`'s streams: each with its number of steps, the events, and
/// what the main stream joins.
pub fn streams_summary(p: &Program) -> String {
    let plan = &p.streams;
    let streams: Vec<String> = (0..plan.streams.len())
        .map(|k| format!("{}: {} steps", stream_name(p, k), plan.streams[k].steps.len()))
        .collect();
    let join: Vec<String> = plan.join.iter().map(|e| format!("e{e}")).collect();
    format!(
        "{}; {} events; join {}",
        streams.join(", "),
        plan.events.len(),
        if join.is_empty() { "-".to_string() } else { join.join(" ") }
    )
}

/// Step `i`'s stream and events: "s1 wait e0 record e1".
pub fn step_note(p: &Program, i: usize) -> String {
    let plan = &p.streams;
    let stream = plan.streams.iter().position(|s| s.steps.contains(&i)).unwrap_or(0);
    let mut note = format!("s{stream}");
    let waits: Vec<String> = plan.waits.iter().filter(|w| w.before == i).map(|w| format!("e{}", w.event)).collect();
    if !waits.is_empty() {
        let _ = write!(note, " wait {}", waits.join(" "));
    }
    let records: Vec<String> =
        plan.events.iter().enumerate().filter(|(_, e)| e.after == i).map(|(k, _)| format!("e{k}")).collect();
    if !records.is_empty() {
        let _ = write!(note, " record {}", records.join(" "));
    }
    note
}

/// ` + add,gelu` for an epilogue of those steps, nothing for none.
fn epilogue_text(steps: &[crate::format::epilogue::Step]) -> String {
    let names: Vec<&str> = steps.iter().map(crate::format::epilogue::Step::name).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" + {}", names.join(","))
    }
}

/// What runs step `st` of `p`: its kernel, library call (with its shapes, epilogue and
/// how its operands are stored), collective or transfer, as `inspect` and the compiler's
/// `--dump-after codegen` print it.
pub fn exec_text(p: &Program, st: &Step) -> String {
    match &st.exec {
        Exec::Kernel(k) => format!("kernel k{k}"),
        Exec::Library(Library::Matmul(Matmul { a, b, panels, epilogue, transposed, .. })) => {
            let epilogue = epilogue_text(epilogue);
            let stored = match (transposed.a, transposed.b) {
                (true, true) => " (a, b stored transposed)",
                (true, false) => " (a stored transposed)",
                (false, true) => " (b stored transposed)",
                (false, false) => "",
            };
            let panels = if *panels { " (weight in panels)" } else { "" };
            format!("library gemm {a:?}x{b:?}{epilogue}{panels}{stored}")
        }
        Exec::Library(Library::IntMatmul(IntMatmul { a, b, panels, a_bytes, epilogue, .. })) => {
            let panels = if *panels { " (weight packed)" } else { "" };
            let a_bytes = a_bytes.map_or(String::new(), |t| format!(" ({t:?} a less its zero point)").to_lowercase());
            format!("library integer gemm {a:?}x{b:?}{}{a_bytes}{panels}", epilogue_text(epilogue))
        }
        Exec::Library(Library::Attention(Attention { q, k, v, scale, mask, .. })) => {
            let scale = scale.map_or(String::new(), |s| format!(" {} scale", s.name()));
            let mask = mask.as_ref().map_or(String::new(), |m| format!(" + mask{m:?}"));
            format!("library attention {q:?}x{k:?}{scale}{mask} softmax x{v:?}")
        }
        Exec::Library(Library::Transpose(Transpose { shape, perm, .. })) => {
            format!("library transpose {shape:?} perm {perm:?}")
        }
        Exec::Library(Library::Reduce(Reduction { shape, axes, op })) => {
            format!("library reduce_{} {shape:?} axes {axes:?}", op.name())
        }
        Exec::Library(Library::Softmax(SoftmaxAlong { shape, axis })) => {
            format!("library softmax {shape:?} axis {axis}")
        }
        Exec::Library(Library::Concat(Concat { inputs, axis, .. })) => {
            format!("library concat {inputs:?} axis {axis}")
        }
        Exec::Collective(c) => {
            let group = c.groups.iter().find(|g| g.contains(&p.device)).cloned().unwrap_or_default();
            let group: Vec<String> = group.iter().map(usize::to_string).collect();
            format!("#{} {} {}{:?} group [{}]", c.id, collective_name(&c.op), c.dtype, c.shape, group.join(","))
        }
        Exec::Send(t) => format!("send -> {} {} {} B", t.peer, t.protocol.name(), t.bytes),
        Exec::Recv(t) => format!("recv <- {} {} {} B", t.peer, t.protocol.name(), t.bytes),
    }
}

pub fn collective_name(op: &CollectiveOp) -> String {
    match op {
        CollectiveOp::AllReduce { reduce } => format!("all_reduce {}", reduce.name()),
        CollectiveOp::AllGather { axis } => format!("all_gather axis {axis}"),
        CollectiveOp::ReduceScatter { axis, reduce } => format!("reduce_scatter axis {axis} {}", reduce.name()),
        CollectiveOp::AllToAll { split_axis, concat_axis } => format!("all_to_all {split_axis}->{concat_axis}"),
    }
}
