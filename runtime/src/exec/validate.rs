//! The runner's checks of what it is handed, before anything runs: every number that
//! indexes something in range, every step's buffers large enough and aligned for what it
//! does, kernels at function starts of the code section, buffers that share arena bytes
//! never in use together, stream plans whose waits point back, collectives that fit
//! together and can all complete, sends and recvs that pair up, mask records that fit their
//! weights. A program that passes runs without reading or writing outside its buffers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::TensorType;

use crate::comm::traffic;
use crate::format::mask::Mask;
use crate::format::mesh::Mesh;
use crate::format::order::{accesses, all_before, happens_before, At, Order};
use crate::format::program::{Buffer, Collective, Exec, IoSpec, Library, Matmul, Meta, Program, Storage, Transfer};
use crate::kernels::call::{Kept, Planned};
use crate::kernels::library_call;

/// Checks program `d` of `meta`'s mesh on its own: its device, its buffers inside their
/// storage (`weights`: the weights section's length), its indices and steps, its stream
/// plan, and that buffers sharing arena bytes are never in use together. Returns each
/// step's library call as planned (`None` for the other steps).
pub(super) fn check_program(meta: &Meta, d: usize, program: &Program, weights: usize) -> Result<Plans> {
    if program.device != d {
        bail!("program {d} is for device {}", program.device);
    }
    if let Some(k) = program.kernels.iter().find(|k| k.parts == 0) {
        bail!("kernel {} splits into 0 parts", k.name);
    }
    let fits = |b: &Buffer| match b.storage {
        Storage::Arena { offset } => offset.checked_add(b.bytes).is_some_and(|end| end <= program.arena_bytes),
        Storage::Weights { offset } => offset.checked_add(b.bytes).is_some_and(|end| end <= weights),
        Storage::Sizes => meta.symbolic.as_ref().is_some_and(|s| b.bytes == 8 * s.sizes.len()),
    };
    if let Some(b) = program.buffers.iter().find(|b| !fits(b)) {
        bail!("buffer '{}' lies outside its storage", b.name);
    }
    check_indices(meta, program)?;
    let plans = check_steps(program)?;
    lanes(program)?;
    check_arena(program)?;
    Ok(plans)
}

/// Per step of a program, its library call as `LibraryCall::plan` made it.
pub(super) type Plans = Vec<Option<StepPlan>>;

/// A step's library call as planned at load (at the upper bounds, for symbolic dims), and
/// what every plan of the step shares (`sizes::Replans` plans it again per shape).
pub(super) struct StepPlan {
    pub(super) plan: Box<dyn Planned>,
    pub(super) kept: Arc<Kept>,
}

/// Checks an input's or output's layout against the mesh: one entry per dimension, axes
/// that exist, used once, splitting their dimension evenly; and that its dim names, if
/// any, are one per dimension too.
fn check_layout(mesh: &Mesh, spec: &IoSpec, what: &str) -> Result<()> {
    if spec.layout.len() != spec.shape.len() {
        bail!(
            "{what} '{}' has a layout of {} dims for a rank-{} tensor",
            spec.name,
            spec.layout.len(),
            spec.shape.len()
        );
    }
    if !spec.dims.is_empty() && spec.dims.len() != spec.shape.len() {
        bail!("{what} '{}' has {} dim names for a rank-{} tensor", spec.name, spec.dims.len(), spec.shape.len());
    }
    if !mesh.fits(&spec.shape, &spec.layout) {
        bail!(
            "{what} '{}' cannot be laid out {} on mesh {:?}",
            spec.name,
            mesh.layout_string(&spec.layout),
            mesh.shape
        );
    }
    Ok(())
}

/// Checks every number in the program that indexes something — buffer numbers, kernel
/// numbers, the input and output lists against the metadata and their sizes (each device's
/// block of the tensor) — so that a well-formed but wrong program is refused instead of
/// indexing out of bounds.
fn check_indices(meta: &Meta, p: &Program) -> Result<()> {
    let buffer = |b: usize, what: &str| -> Result<()> {
        if b >= p.buffers.len() {
            bail!("{what} names buffer {b}, but the program has {}", p.buffers.len());
        }
        Ok(())
    };
    for s in &p.steps {
        for &b in &s.buffers {
            buffer(b, &format!("step '{}'", s.node))?;
        }
        if let Exec::Kernel(k) = s.exec {
            if k >= p.kernels.len() {
                bail!("step '{}' names kernel {k}, but the program has {}", s.node, p.kernels.len());
            }
        }
    }
    for (list, specs, what) in [(&p.inputs, &meta.inputs, "input"), (&p.outputs, &meta.outputs, "output")] {
        if list.len() != specs.len() {
            bail!("the program has {} {what}s, the metadata {}", list.len(), specs.len());
        }
        for (&b, spec) in list.iter().zip(specs) {
            buffer(b, &format!("{what} '{}'", spec.name))?;
            check_stage(&meta.mesh, spec, what)?;
            check_layout(spec.mesh(&meta.mesh), spec, what)?;
            let ty = spec.ty().ok_or_else(|| anyhow!("{what} '{}' has unknown dtype {}", spec.name, spec.dtype))?;
            let local = TensorType::new(ty.dtype, spec.mesh(&meta.mesh).local_shape(&spec.shape, &spec.layout));
            // A device outside the tensor's stage is never read (its buffer may be a
            // placeholder, or a copy it received for a later stage).
            let held = spec.block(&meta.mesh, p.device).is_some();
            if held && local.checked_size_bytes() != Some(p.buffers[b].bytes) {
                bail!("{what} '{}' ({local}) does not fit its buffer of {} bytes", spec.name, p.buffers[b].bytes);
            }
        }
    }
    Ok(())
}

/// The alignment of every kernel's first byte in the code section (docs/artifact.md): a
/// kernel offset anywhere else is not the start of a function the compiler emitted.
const KERNEL_ALIGN: usize = 64;

/// Checks the kernel table of all programs against the code section: every kernel starts
/// on a kernel boundary, lies inside the section, and two kernels either are the same
/// function or do not overlap. The code itself cannot be validated (signatures can vouch
/// for it); this keeps a program from calling into the middle of a function.
pub(super) fn check_kernels(programs: &[Program], code_len: usize) -> Result<()> {
    let mut spans: Vec<(usize, usize, &str)> = Vec::new();
    for k in programs.iter().flat_map(|p| &p.kernels) {
        if k.args.is_empty() {
            bail!("kernel {} records no buffers (a kernel writes at least its result)", k.name);
        }
        if !k.offset.is_multiple_of(KERNEL_ALIGN) || k.len == 0 {
            bail!("kernel {} at offset {} does not start a function of the code section", k.name, k.offset);
        }
        if k.offset.checked_add(k.len).is_none_or(|end| end > code_len) {
            bail!("kernel {} lies outside the code section", k.name);
        }
        spans.push((k.offset, k.len, &k.name));
    }
    spans.sort();
    spans.dedup_by_key(|s| (s.0, s.1));
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].0 + w[0].1) {
        bail!("kernels {} and {} overlap in the code section", w[0].2, w[1].2);
    }
    Ok(())
}

/// Checks every step's buffers against what it does: the count each kind of step takes,
/// sizes at least what a kernel's code or a library call's shapes reach, and results in the
/// arena (nothing writes into the weights, which are read-only memory); plans the library
/// calls.
fn check_steps(p: &Program) -> Result<Plans> {
    let mut plans = Vec::with_capacity(p.steps.len());
    for st in &p.steps {
        let mut plan = None;
        let fail = |msg: String| anyhow!("step '{}': {msg}", st.node);
        let bytes = |i: usize| p.buffers[st.buffers[i]].bytes;
        let count = |want: usize| -> Result<()> {
            match st.buffers.len() == want {
                true => Ok(()),
                false => Err(fail(format!("{} buffers where its {} takes {want}", st.buffers.len(), st.exec.kind()))),
            }
        };
        match &st.exec {
            Exec::Kernel(k) => {
                let args = &p.kernels[*k].args;
                count(args.len())?;
                if let Some(i) = (0..args.len()).find(|&i| bytes(i) < args[i]) {
                    bail!(fail(format!(
                        "buffer {i} holds {} bytes, kernel {} reaches {}",
                        bytes(i),
                        p.kernels[*k].name,
                        args[i]
                    )));
                }
            }
            Exec::Library(l) => {
                let call = library_call(l);
                count(call.buffers())?;
                // A library call writes its result apart from its operands (the arena
                // check compares only distinct buffers).
                if st.buffers[1..].contains(&st.buffers[0]) {
                    bail!(fail(format!("its result buffer '{}' is also an operand", p.buffers[st.buffers[0]].name)));
                }
                let buffers: Vec<&Buffer> = st.buffers.iter().map(|&b| &p.buffers[b]).collect();
                let kept = Arc::default();
                plan = Some(StepPlan { plan: call.plan(&buffers, &kept).map_err(fail)?, kept });
            }
            Exec::Collective(_) => count(2)?,
            Exec::Send(_) | Exec::Recv(_) => count(1)?,
        }
        let writes = !matches!(st.exec, Exec::Send(_));
        if writes && matches!(p.buffers[st.buffers[0]].storage, Storage::Weights { .. } | Storage::Sizes) {
            bail!(fail(format!(
                "its result buffer '{}' lies in the weights or the size table",
                p.buffers[st.buffers[0]].name
            )));
        }
        plans.push(plan);
    }
    Ok(plans)
}

/// Checks that buffers sharing arena bytes are never in use at the same time under the
/// stream plan (`crate::format::order`), but for an operand handing its bytes to the result of the
/// kernel step where it dies, at a position the kernel allows (`Kernel::in_place`). A plan
/// that breaks this would run, and give wrong results.
fn check_arena(p: &Program) -> Result<()> {
    let order = Order::of(p);
    let at = accesses(p);
    let apart = |x: usize, y: usize| all_before(&order, &at[x], &at[y]) || all_before(&order, &at[y], &at[x]);
    // x hands its bytes to y at a step that allows it, and each stays on its side of it.
    let hands_over = |x: usize, y: usize| {
        p.steps.iter().enumerate().any(|(s, st)| {
            let Exec::Kernel(k) = st.exec else { return false };
            st.buffers[0] == y
                && (1..st.buffers.len()).filter(|&i| st.buffers[i] == x).all(|i| p.kernels[k].in_place.contains(&i))
                && st.buffers[1..].contains(&x)
                && at[x].iter().all(|&a| a == At::Step(s) || happens_before(&order, a, At::Step(s)))
                && at[y].iter().all(|&a| a == At::Step(s) || happens_before(&order, At::Step(s), a))
        })
    };
    let mut spans: Vec<(usize, usize, usize)> = (p.buffers.iter().enumerate())
        .filter_map(|(b, buf)| match buf.storage {
            Storage::Arena { offset } if buf.bytes > 0 => Some((offset, offset + buf.bytes, b)),
            _ => None,
        })
        .collect();
    spans.sort();
    for (i, &(_, end, x)) in spans.iter().enumerate() {
        for &(_, _, y) in spans[i + 1..].iter().take_while(|s| s.0 < end) {
            if !apart(x, y) && !hands_over(x, y) && !hands_over(y, x) {
                bail!(
                    "buffers '{}' and '{}' share arena bytes while both are in use",
                    p.buffers[x].name,
                    p.buffers[y].name
                );
            }
        }
    }
    Ok(())
}

/// Checks an input's or output's stage: devices of the mesh, one per device of its sub-mesh.
fn check_stage(mesh: &Mesh, spec: &IoSpec, what: &str) -> Result<()> {
    let Some(st) = &spec.stage else { return Ok(()) };
    let mut seen = BTreeSet::new();
    if st.devices.len() != st.mesh.devices() || st.devices.iter().any(|&d| d >= mesh.devices() || !seen.insert(d)) {
        bail!(
            "{what} '{}' names a stage of devices {:?} that is not a sub-mesh of {} devices",
            spec.name,
            st.devices,
            mesh.devices()
        );
    }
    Ok(())
}

/// Checks that the sends and recvs of all programs pair up: each key sent once and received
/// once, by the devices each end names, with the same size and protocol, and buffers of that
/// size (a recv's in the arena). Whether they can all complete in program order is left to
/// the run, whose waits time out (`crate::comm::exchange`).
pub(super) fn check_transfers(mesh: &Mesh, programs: &[Program]) -> Result<()> {
    let label = |d: usize| mesh.device_label(d);
    let mut sends: BTreeMap<&str, (usize, &Transfer, &str)> = BTreeMap::new();
    let mut recvs: BTreeMap<&str, (usize, &Transfer, &str)> = BTreeMap::new();
    for (d, p) in programs.iter().enumerate() {
        for st in &p.steps {
            let (t, list, what) = match &st.exec {
                Exec::Send(t) => (t, &mut sends, "sends"),
                Exec::Recv(t) => (t, &mut recvs, "receives"),
                _ => continue,
            };
            let at = || format!("{}: node '{}'", label(d), st.node);
            let [b] = st.buffers[..] else { bail!("{}: {} buffers for a transfer (one)", at(), st.buffers.len()) };
            if p.buffers[b].bytes != t.bytes {
                bail!("{}: a buffer of {} bytes for a transfer of {}", at(), p.buffers[b].bytes, t.bytes);
            }
            if matches!(st.exec, Exec::Recv(_)) && !matches!(p.buffers[b].storage, Storage::Arena { .. }) {
                bail!("{}: receives into the weights", at());
            }
            if t.peer >= programs.len() || t.peer == d {
                bail!("{}: transfer '{}' with device {}", at(), t.key, t.peer);
            }
            if let Some((d0, _, n0)) = list.insert(t.key.as_str(), (d, t, st.node.as_str())) {
                bail!("{}: {what} '{}' as node '{n0}' on {} does", at(), t.key, label(d0));
            }
        }
    }
    for (key, &(d, t, node)) in &sends {
        let Some(&(r, rt, _)) = recvs.get(key) else {
            bail!("{}: node '{node}' sends '{key}', which no device receives", label(d))
        };
        if r != t.peer || rt.peer != d || rt.bytes != t.bytes || rt.protocol != t.protocol {
            bail!("{}: node '{node}' sends '{key}' unlike {} receives it", label(d), label(r));
        }
    }
    if let Some((key, &(d, _, node))) = recvs.iter().find(|(k, _)| !sends.contains_key(*k)) {
        bail!("{}: node '{node}' receives '{key}', which no device sends", label(d));
    }
    Ok(())
}

/// Checks a collective step: its description (`traffic::result_shape`), and buffers
/// [result, operand] of the right sizes, the result in the arena and apart from the operand.
fn check_collective(mesh: &Mesh, p: &Program, c: &Collective, buffers: &[usize]) -> Result<()> {
    let result = traffic::result_shape(mesh, p.device, c)?;
    let [r, o] = buffers else { bail!("{} buffers for a collective (result, operand)", buffers.len()) };
    let (r, o) = (&p.buffers[*r], &p.buffers[*o]);
    let bytes = |s: &[usize]| s.iter().product::<usize>() * 4;
    if o.bytes != bytes(&c.shape) || r.bytes != bytes(&result) {
        bail!("buffers of {} and {} bytes for an f32 operand {:?} and result {result:?}", o.bytes, r.bytes, c.shape);
    }
    let Storage::Arena { offset: ro } = r.storage else { bail!("its result buffer '{}' lies in the weights", r.name) };
    if let Storage::Arena { offset: oo } = o.storage {
        if ro < oo + o.bytes && oo < ro + r.bytes {
            bail!("its result buffer '{}' overlaps its operand '{}'", r.name, o.name);
        }
    }
    Ok(())
}

/// Checks that the collectives of all programs fit together: every member of a group runs
/// each collective of its group once, described alike, and in an order that lets all of them
/// complete (simulated: the programs are straight lines, so this is exact). A run therefore
/// never waits for a collective that cannot happen.
/// Devices that are `absent` (degraded in the artifact: they run nothing) take no part.
pub(super) fn check_collectives(mesh: &Mesh, programs: &[Program], absent: &[bool]) -> Result<()> {
    let label = |d: usize| mesh.device_label(d);
    // Per device, its collectives in order: (id, node).
    let mut seqs: Vec<Vec<(usize, &str)>> = vec![Vec::new(); programs.len()];
    let mut first: BTreeMap<usize, (&Collective, usize, &str)> = BTreeMap::new();
    for (d, p) in programs.iter().enumerate().filter(|&(d, _)| !absent[d]) {
        for step in &p.steps {
            let Exec::Collective(c) = &step.exec else { continue };
            let node = step.node.as_str();
            check_collective(mesh, p, c, &step.buffers)
                .with_context(|| format!("{}: node '{node}' (collective #{})", label(d), c.id))?;
            match first.get(&c.id) {
                Some(&(c0, d0, n0)) if c0 != c => bail!(
                    "{}: node '{node}' describes collective #{} unlike node '{n0}' on {}",
                    label(d),
                    c.id,
                    label(d0)
                ),
                Some(_) => {}
                None => {
                    first.insert(c.id, (c, d, node));
                }
            }
            if seqs[d].iter().any(|s| s.0 == c.id) {
                bail!("{}: node '{node}' runs collective #{} a second time", label(d), c.id);
            }
            seqs[d].push((c.id, node));
        }
    }
    for (&id, &(c, _, node)) in &first {
        if let Some(&m) = c.groups.iter().flatten().find(|&&m| !absent[m] && !seqs[m].iter().any(|s| s.0 == id)) {
            bail!("{} never runs collective #{id} (node '{node}') of its group", label(m));
        }
    }
    let mut at = vec![0; programs.len()];
    loop {
        let mut progress = false;
        for d in 0..programs.len() {
            let Some(&(id, _)) = seqs[d].get(at[d]) else { continue };
            let group = traffic::group_of(first[&id].0, d)?;
            let present = group.iter().filter(|&&m| !absent[m]);
            if present.clone().all(|&m| seqs[m].get(at[m]).is_some_and(|s| s.0 == id)) {
                present.for_each(|&m| at[m] += 1);
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    let stuck: Vec<String> = (0..programs.len())
        .filter_map(|d| seqs[d].get(at[d]).map(|&(id, node)| format!("{} waits in #{id} ('{node}')", label(d))))
        .collect();
    if !stuck.is_empty() {
        bail!("the collectives cannot all complete in program order: {}", stuck.join(", "));
    }
    Ok(())
}

/// A device's streams as the runner runs them: `Program::streams` checked and indexed by
/// step, or one stream of all steps for a program without a plan.
pub(super) struct Lanes {
    /// The steps of each stream; stream 0 is the main one.
    pub(super) steps: Vec<Vec<usize>>,
    /// Per step: the events to wait for before it, and those it records.
    pub(super) wait: Vec<Vec<usize>>,
    pub(super) record: Vec<Vec<usize>>,
    pub(super) join: Vec<usize>,
    /// The event "the inputs are in" that every stream but the main one waits for first.
    pub(super) inputs_event: usize,
    /// The stream of each step.
    pub(super) stream_of: Vec<usize>,
}

impl Lanes {
    /// Streams that have something to run: the main one always.
    pub(super) fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.steps.len()).filter(|&k| k == 0 || !self.steps[k].is_empty())
    }
}

/// Checks a program's stream plan (every step on exactly one stream, in ascending order;
/// events after existing steps; each wait for an event of an earlier step, so no stream can
/// wait for itself) and indexes it.
pub(super) fn lanes(p: &Program) -> Result<Lanes> {
    let n = p.steps.len();
    let plan = &p.streams;
    if plan.streams.is_empty() {
        if !(plan.events.is_empty() && plan.waits.is_empty() && plan.join.is_empty()) {
            bail!("events without streams");
        }
        return Ok(Lanes {
            steps: vec![(0..n).collect()],
            wait: vec![Vec::new(); n],
            record: vec![Vec::new(); n],
            join: Vec::new(),
            inputs_event: 0,
            stream_of: vec![0; n],
        });
    }
    let mut seen = vec![false; n];
    for (k, st) in plan.streams.iter().enumerate() {
        for (j, &i) in st.steps.iter().enumerate() {
            if i >= n || seen[i] || (j > 0 && st.steps[j - 1] >= i) {
                bail!("stream {k} lists step {i} out of order, twice or beyond the {n} steps");
            }
            seen[i] = true;
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        bail!("step '{}' is on no stream", p.steps[i].node);
    }
    let mut record = vec![Vec::new(); n];
    for (e, ev) in plan.events.iter().enumerate() {
        if ev.after >= n {
            bail!("event {e} follows step {}, beyond the {n} steps", ev.after);
        }
        record[ev.after].push(e);
    }
    let mut wait = vec![Vec::new(); n];
    for w in &plan.waits {
        match plan.events.get(w.event) {
            Some(ev) if w.before < n && ev.after < w.before => wait[w.before].push(w.event),
            _ => bail!("a wait for event {} before step {} does not follow an earlier step", w.event, w.before),
        }
    }
    if let Some(e) = plan.join.iter().find(|&&e| e >= plan.events.len()) {
        bail!("the main stream joins event {e}, but there are {}", plan.events.len());
    }
    let mut stream_of = vec![0; n];
    for (k, st) in plan.streams.iter().enumerate() {
        st.steps.iter().for_each(|&i| stream_of[i] = k);
    }
    Ok(Lanes {
        stream_of,
        steps: plan.streams.iter().map(|s| s.steps.clone()).collect(),
        wait,
        record,
        join: plan.join.clone(),
        inputs_event: plan.events.len(),
    })
}

/// Decodes and checks the mask record before every masked weight of `p`: it must describe
/// the weight's matrices, and every matmul reading the weight must have their shape, since
/// kernels trust the record's runs.
pub(super) fn masks_of(p: &Program, weights: &[u8]) -> Result<HashMap<usize, Mask>> {
    let mut out = HashMap::new();
    for (i, b) in p.buffers.iter().enumerate() {
        let (Some(info), Storage::Weights { offset }) = (&b.mask, &b.storage) else { continue };
        let m = Mask::decode(weights, *offset, info.rows, info.cols)
            .and_then(|m| {
                let matrix = info.rows * info.cols * 4;
                if matrix == 0 || b.bytes % matrix != 0 || m.record_len() != info.bytes {
                    bail!("mask of {}x{} matrices on a weight of {} bytes", info.rows, info.cols, b.bytes);
                }
                Ok(m)
            })
            .with_context(|| format!("weight '{}'", b.name))?;
        for st in p.steps.iter().filter(|st| st.buffers.get(2) == Some(&i)) {
            if let Exec::Library(Library::Matmul(Matmul { b: shape, .. })) = &st.exec {
                if shape.len() < 2 || shape[shape.len() - 2..] != [info.rows, info.cols] {
                    bail!("node '{}': its weight's mask does not fit its shape {shape:?}", st.node);
                }
            }
        }
        out.insert(i, m);
    }
    Ok(out)
}
