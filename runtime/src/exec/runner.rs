//! The runner: executes the programs of a compiled graph, one per device of its mesh, over
//! their buffers. It knows nothing of the passes, only what the artifact (or an in-memory
//! compile) provides: metadata, the programs, their kernels in executable memory, and the
//! weights.
//!
//! A single-device program runs on the calling thread (its library matmuls on all cores).
//! A multi-device one runs one thread per device and stream (`Devices`: started by the
//! first run, kept parked between runs, joined when the `Loaded` drops), each device over
//! its own arena: inputs are scattered (each device's main stream copies its block of every
//! input), each stream runs its steps in order (`Program::streams`; without a plan one
//! stream runs them all), waiting for the events of other streams with blocking waits,
//! collectives meet in the fabric (`crate::comm::fabric`), and the devices that hold the
//! write-back copy of an output block gather it into the result. A stream that waits for
//! another one whose thread has not started the step yet runs that stream's steps itself
//! (`Loaded::drive`), so the extra threads cost a hand-off only when they overlap work. A
//! failing or panicking device poisons the fabric, so that every other device stops at its
//! next rendezvous; one that goes silent is detected by the fabric's heartbeat watch.
//! Degraded devices (`Meta::degraded`, or `Loaded::degrade`) run nothing: outputs are taken
//! from a healthy holder of each block. A training run's state stays on the devices between
//! runs (`crate::exec::resident`, `Loaded::upload`, `run_resident`): its input buffers point at
//! each device's block, and its outputs land in the block's second buffer.
//!
//! Over hosts (`Loaded::set_transport`, `crate::comm::transport`): this process runs the devices
//! of its own host only, the fabric and the exchange carry what crosses hosts over the
//! transport, and the other hosts send their devices' output blocks to host 0, whose run
//! returns the outputs (the others' return none).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::{DType, Tensor, TensorType};

use crate::comm::error::RunError;
use crate::comm::exchange::Exchange;
use crate::comm::fabric::{self, Delivery, Fabric, LinkStats};
pub use crate::comm::memory::AlignedBuf;
use crate::comm::sync::{spin_until, Condvar, Mutex, MutexGuard};
use crate::comm::traffic;
use crate::comm::transport::{Hosts, Incoming, Outgoing, Stall, Transport};
use crate::exec::resident::{Resident, Slot};
use crate::format::abi::{self, KernelFn, KernelTable};
use crate::format::artifact::{Artifact, SectionKind};
use crate::format::epilogue::Step;
use crate::format::mask::Mask;
use crate::format::mesh::Mesh;
use crate::format::order::{accesses, all_before, happens_before, At, Order};
use crate::format::program::{Buffer, Collective, Elem, Exec, IoSpec, Library, Meta, Program, Storage, Transfer};
use crate::kernels::epilogue::Bound;
use crate::kernels::library::{self, Threads};
use crate::kernels::pool;

/// Where the kernels are: an artifact's code section mapped executable, or executable
/// memory an in-memory compile owns (the `Loaded` keeps it alive).
pub enum Code {
    Mapped(memmap2::Mmap),
    InProcess(Box<dyn KernelTable>),
}

/// The weights a loaded program reads: the artifact's weights section where the artifact
/// is mapped (the `Loaded` keeps the mapping alive), or an aligned copy from an in-memory
/// compile.
pub enum Weights {
    Artifact(Artifact),
    Owned(AlignedBuf),
}

impl Weights {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Weights::Artifact(a) => a.section(SectionKind::Weights).unwrap_or(&[]),
            Weights::Owned(b) => b.as_slice(),
        }
    }
}

/// Checks an input's or output's layout against the mesh: one entry per dimension, axes
/// that exist, used once, splitting their dimension evenly.
fn check_layout(mesh: &Mesh, spec: &IoSpec, what: &str) -> Result<()> {
    if spec.layout.len() != spec.shape.len() {
        bail!(
            "{what} '{}' has a layout of {} dims for a rank-{} tensor",
            spec.name,
            spec.layout.len(),
            spec.shape.len()
        );
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
fn check_kernels(programs: &[Program], code_len: usize) -> Result<()> {
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
/// arena (nothing writes into the weights, which are mapped read-only from the file).
fn check_steps(p: &Program) -> Result<()> {
    for st in &p.steps {
        let fail = |msg: String| anyhow!("step '{}': {msg}", st.node);
        let bytes = |i: usize| p.buffers[st.buffers[i]].bytes;
        let count = |want: usize| -> Result<()> {
            match st.buffers.len() == want {
                true => Ok(()),
                false => Err(fail(format!("{} buffers where its {} takes {want}", st.buffers.len(), st.exec.kind()))),
            }
        };
        // Buffer `i` holds an f32 tensor of `shape` at an offset aligned for it.
        let f32_buffer = |i: usize, shape: &[usize]| -> Result<()> {
            let need = shape.iter().try_fold(4usize, |n, &d| n.checked_mul(d));
            if need.is_none_or(|n| bytes(i) < n) {
                bail!(fail(format!("buffer {i} holds {} bytes, too few for F32{shape:?}", bytes(i))));
            }
            let (Storage::Arena { offset } | Storage::Weights { offset }) = p.buffers[st.buffers[i]].storage;
            if !offset.is_multiple_of(4) {
                bail!(fail(format!("buffer {i} at offset {offset} is not aligned for F32")));
            }
            Ok(())
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
            Exec::Library(Library::Matmul { a, b, out, b_elem, panels, epilogue, transposed }) => {
                count(3 + crate::format::epilogue::operands(epilogue).count())?;
                crate::kernels::matmul_shape::MatmulShape::new(a, b, out).map_err(|e| fail(e.to_string()))?;
                if !epilogue.is_empty() && (a.len() < 2 || b.len() < 2) {
                    bail!(fail("an epilogue follows a product of matrices".to_string()));
                }
                for (i, shape) in (3..).zip(crate::format::epilogue::operands(epilogue)) {
                    meshc_ir::ops::check_epilogue_operand(shape, out).map_err(fail)?;
                    f32_buffer(i, shape)?;
                }
                let b_panels = [crate::kernels::panels::packed_elems(b).unwrap_or(usize::MAX)];
                let b_stored = if *panels { &b_panels[..] } else { b };
                for (i, s, elem) in [(0, &out[..], Elem::F32), (1, a, Elem::F32), (2, b_stored, *b_elem)] {
                    let need = s.iter().try_fold(elem.size(), |n, &d| n.checked_mul(d));
                    if need.is_none_or(|n| bytes(i) < n) {
                        bail!(fail(format!("buffer {i} holds {} bytes, too few for {elem:?}{s:?}", bytes(i))));
                    }
                    // The library reads its operands as slices of their element type.
                    let (Storage::Arena { offset } | Storage::Weights { offset }) = p.buffers[st.buffers[i]].storage;
                    if !offset.is_multiple_of(elem.size()) {
                        bail!(fail(format!("buffer {i} at offset {offset} is not aligned for {elem:?}")));
                    }
                }
                let weight = &p.buffers[st.buffers[2]];
                if !b_elem.is_f32() && weight.mask.is_some() {
                    bail!(fail("a pruned weight is f32, not a half type".to_string()));
                }
                if *panels && (!b_elem.is_f32() || weight.mask.is_some()) {
                    bail!(fail("weights in panels are f32 and unpruned".to_string()));
                }
                let matrices = (!transposed.a || a.len() >= 2) && (!transposed.b || b.len() >= 2);
                if !transposed.is_none() && (*panels || !b_elem.is_f32() || weight.mask.is_some() || !matrices) {
                    bail!(fail("only f32 matrices that are not weights are stored transposed".to_string()));
                }
            }
            Exec::Library(Library::Attention { q, k, v, out, scale, mask }) => {
                count(4 + usize::from(scale.is_some()) + usize::from(mask.is_some()))?;
                crate::kernels::attention::Shapes::new(q, k, v, out, mask.as_deref())
                    .map_err(|e| fail(e.to_string()))?;
                let scale: Option<&[usize]> = scale.map(|_| &[1][..]);
                let shapes = [&out[..], q, k, v].into_iter().chain(scale).chain(mask.as_deref());
                for (i, shape) in shapes.enumerate() {
                    f32_buffer(i, shape)?;
                }
            }
            Exec::Collective(_) => count(2)?,
            Exec::Send(_) | Exec::Recv(_) => count(1)?,
        }
        let writes = !matches!(st.exec, Exec::Send(_));
        if writes && matches!(p.buffers[st.buffers[0]].storage, Storage::Weights { .. }) {
            bail!(fail(format!("its result buffer '{}' lies in the weights", p.buffers[st.buffers[0]].name)));
        }
    }
    Ok(())
}

/// A library matmul's epilogue bound to its operands' buffers (the step's after `b`).
fn bind_epilogue<'s>(steps: &'s [Step], operands: &[*mut u8], out: &[usize]) -> Bound<'s> {
    let operands: Vec<*const f32> = operands.iter().map(|&p| p as *const f32).collect();
    // SAFETY: `check_program` checked each operand's buffer against its shape and that
    // shape against the result; the buffers outlive the step.
    unsafe { Bound::new(steps, &operands, out) }
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
fn check_transfers(mesh: &Mesh, programs: &[Program]) -> Result<()> {
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
fn check_collectives(mesh: &Mesh, programs: &[Program], absent: &[bool]) -> Result<()> {
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

/// One step's wall time in a run, for profiles and traces. Times count from the start of
/// the run; `waits` are the spans a collective spent blocked for other devices.
#[derive(Clone, Debug)]
pub struct StepTime {
    pub device: usize,
    /// The stream that ran it (`Program::streams`; 0 without a plan).
    pub stream: usize,
    pub step: usize,
    pub start: Duration,
    pub dur: Duration,
    pub waits: Vec<(Duration, Duration)>,
}

/// A pointer that crosses threads: a device's output buffers, read after its job has finished.
#[derive(Clone, Copy)]
struct SendPtr(*const u8);

// SAFETY: only read once the job that wrote through it has finished (`Devices::run`).
unsafe impl Send for SendPtr {}

/// What the devices of one run share: the inputs, the bytes of those split over the mesh
/// (`None` for the replicated ones), which are resident state, when the run started, whether to time the steps, and
/// every device's shared state (so a failing stream can wake all waiters).
#[derive(Clone, Copy)]
struct RunCtx<'a> {
    inputs: &'a HashMap<String, Tensor>,
    split: &'a [Option<Vec<u8>>],
    /// Per input: whether it is resident state, already on the device.
    resident: &'a [bool],
    epoch: Instant,
    timed: bool,
    devices: &'a [DeviceShared],
}

/// The events of one device in a run, plus one more: the inputs are in (`inputs_event`).
/// Streams block on a condition variable (after a short spin), never spin for long.
struct Board {
    done: Vec<AtomicBool>,
    lock: Mutex<()>,
    cv: Condvar,
    poisoned: AtomicBool,
}

impl Board {
    fn new(events: usize) -> Board {
        Board {
            done: (0..events).map(|_| AtomicBool::new(false)).collect(),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            poisoned: AtomicBool::new(false),
        }
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    fn record(&self, e: usize) {
        self.done[e].store(true, Ordering::Release);
        // Under the lock: a waiter checks the flag under it before sleeping.
        let _g = self.guard();
        self.cv.notify_all();
    }

    fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        let _g = self.guard();
        self.cv.notify_all();
    }

    /// Waits until event `e` is recorded; false if the run was abandoned meanwhile.
    fn wait(&self, e: usize) -> bool {
        let settled = || self.done[e].load(Ordering::Acquire) || self.poisoned.load(Ordering::SeqCst);
        if !spin_until(settled) {
            let mut g = self.guard();
            while !settled() {
                self.cv.wait(&mut g);
            }
        }
        self.done[e].load(Ordering::Acquire)
    }
}

/// What the streams of one device share in a run: where each buffer is (a collective may
/// leave its result in the fabric, moving the buffer there), the device's events, and per
/// stream the position of its next step — whichever thread holds it runs that step.
struct DeviceShared {
    ptrs: Vec<AtomicPtr<u8>>,
    board: Board,
    cursors: Vec<Mutex<usize>>,
}

/// One thread's state while it runs steps of a device (its own stream's, or another's it
/// took over): its step times and scratch space.
struct StepRun<'a> {
    device: usize,
    /// The cores its steps may use: the run's `threads` for the only stream of the run, else 1.
    threads: usize,
    ctx: RunCtx<'a>,
    step: &'a Cell<usize>,
    times: Vec<StepTime>,
    waits: Vec<fabric::Wait>,
    args: Vec<*mut u8>,
}

/// A device's streams as the runner runs them: `Program::streams` checked and indexed by
/// step, or one stream of all steps for a program without a plan.
struct Lanes {
    /// The steps of each stream; stream 0 is the main one.
    steps: Vec<Vec<usize>>,
    /// Per step: the events to wait for before it, and those it records.
    wait: Vec<Vec<usize>>,
    record: Vec<Vec<usize>>,
    join: Vec<usize>,
    /// The event "the inputs are in" that every stream but the main one waits for first.
    inputs_event: usize,
    /// The stream of each step.
    stream_of: Vec<usize>,
}

impl Lanes {
    /// Streams that have something to run: the main one always.
    fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.steps.len()).filter(|&k| k == 0 || !self.steps[k].is_empty())
    }
}

/// Checks a program's stream plan (every step on exactly one stream, in ascending order;
/// events after existing steps; each wait for an event of an earlier step, so no stream can
/// wait for itself) and indexes it.
fn lanes(p: &Program) -> Result<Lanes> {
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

/// What one device's run leaves: where its outputs are, and its step times.
struct DeviceRun {
    outputs: Vec<SendPtr>,
    times: Vec<StepTime>,
}

/// One device's work in a run: its `device_thread`, answering where its outputs are.
type Job<'a> = Box<dyn FnOnce() -> Option<DeviceRun> + Send + 'a>;

/// The device threads of a multi-device `Loaded`: one per device but the first, whose jobs
/// the calling thread runs (saving a wake-up), each blocked on its channel between runs.
/// Starting a thread per device and run cost more than small graphs take to run: the
/// transformer block on 2x4 devices ran in ~0.5 ms that way, ~0.19 ms on these threads
/// (one device: ~0.03 ms).
///
/// A job borrows the run: the `Loaded`, the device's arena and the inputs, for a lifetime
/// the threads outlive. `run` is what makes that sound: it returns only once every job it
/// handed out has finished (see the SAFETY comment there), and between runs the threads
/// hold nothing but their channels.
struct Devices {
    jobs: Vec<mpsc::Sender<Job<'static>>>,
    /// (device, its job's answer): exactly one per job taken, panicking or not.
    done: mpsc::Receiver<(usize, Option<DeviceRun>)>,
    threads: Vec<JoinHandle<()>>,
}

impl Devices {
    fn start(devices: usize) -> Result<Devices> {
        let (answer, done) = mpsc::channel();
        // Built up in place, so that if a spawn fails `Drop` joins the threads started.
        let mut pool = Devices { jobs: Vec::new(), done, threads: Vec::new() };
        for d in 1..devices {
            let (tx, rx) = mpsc::channel::<Job<'static>>();
            let answer = answer.clone();
            let thread = std::thread::Builder::new().name(format!("meshc device {d}")).spawn(move || {
                for job in rx {
                    // `device_thread` catches the device's own panics; catching here too
                    // keeps the promise `run` relies on: every job taken is answered, after
                    // it has finished (unwinding included).
                    let run = std::panic::catch_unwind(AssertUnwindSafe(job)).ok().flatten();
                    if answer.send((d, run)).is_err() {
                        break;
                    }
                }
            });
            pool.threads.push(thread.context("cannot start the device threads")?);
            pool.jobs.push(tx);
        }
        Ok(pool)
    }

    /// Hands job `d` to device `d`'s thread, runs job 0, and waits for all of them; `None`
    /// for a device whose job failed (it poisoned the fabric) or could not be handed out.
    fn run<'a>(&self, jobs: Vec<Job<'a>>) -> Vec<Option<DeviceRun>> {
        let mut runs: Vec<Option<DeviceRun>> = jobs.iter().map(|_| None).collect();
        let mut jobs = jobs.into_iter();
        let Some(own) = jobs.next() else { return runs };
        let mut sent = 0;
        for (tx, job) in self.jobs.iter().zip(jobs) {
            // SAFETY: erasing 'a lets the job cross into a thread that outlives 'a; it is
            // sound because every job is done before this function returns, so nothing
            // borrowed for 'a is used after. A job sent is answered on `done` once it has
            // finished, panic or not (the thread catches it); the loop below takes as many
            // answers as jobs were sent, and nothing from here to its end can unwind (sends
            // and receives on these channels do not panic, and the caller's own job runs
            // inside `catch_unwind`). A job whose send fails comes back inside the error and
            // is dropped unrun. Should `done` disconnect, every thread has exited (each holds
            // a sender to it, `self` none), so none runs a job.
            let job = unsafe { std::mem::transmute::<Job<'a>, Job<'static>>(job) };
            if tx.send(job).is_ok() {
                sent += 1;
            }
        }
        runs[0] = std::panic::catch_unwind(AssertUnwindSafe(own)).ok().flatten();
        for _ in 0..sent {
            let Ok((d, run)) = self.done.recv() else { break };
            runs[d] = run;
        }
        runs
    }
}

impl Drop for Devices {
    /// Closing the job channels ends the threads' loops; no run is under way (it would
    /// borrow the `Loaded`), so each is waiting for a job or about to.
    fn drop(&mut self) {
        self.jobs.clear();
        for t in self.threads.drain(..) {
            // A thread never panics: its jobs' panics are caught.
            let _ = t.join();
        }
    }
}

/// Decodes and checks the mask record before every masked weight of `p`: it must describe
/// the weight's matrices, and every matmul reading the weight must have their shape, since
/// kernels trust the record's runs.
fn masks_of(p: &Program, weights: &[u8]) -> Result<HashMap<usize, Mask>> {
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
            if let Exec::Library(Library::Matmul { b: shape, .. }) = &st.exec {
                if shape.len() < 2 || shape[shape.len() - 2..] != [info.rows, info.cols] {
                    bail!("node '{}': its weight's mask does not fit its shape {shape:?}", st.node);
                }
            }
        }
        out.insert(i, m);
    }
    Ok(out)
}

/// What runs take one at a time: the arenas and the device threads.
struct State {
    /// One per device, allocated once: repeated runs (`--bench`) reuse their pages.
    arenas: Vec<AlignedBuf>,
    /// Started by the first multi-device run.
    devices: Option<Devices>,
}

/// A program ready to run: the runner's whole view of a compiled graph.
pub struct Loaded {
    pub meta: Meta,
    /// One per device of `meta.mesh`, in device order.
    pub programs: Vec<Program>,
    code: Code,
    weights: Weights,
    /// std's lock, not `sync`'s: its poisoning is the signal that a run panicked while it
    /// held the arenas, which are then refused to the next run.
    state: std::sync::Mutex<State>,
    fabric: Fabric,
    /// Per device, the decoded mask record of each masked weight buffer (the library GEMM
    /// path iterates over its runs; the generated kernels read the record themselves).
    masks: Vec<HashMap<usize, Mask>>,
    exchange: Exchange,
    /// Per device and step: whether a collective may leave its result in the fabric's shared
    /// buffer (no other step writes its result buffer, so the device may read it there).
    share: Vec<Vec<bool>>,
    /// Per device, its streams.
    lanes: Vec<Lanes>,
    /// `--fail-device`: this device stops answering at its collective number .1 (from 0).
    fail: Option<(usize, usize)>,
    /// What `degrade` added to the artifact's degradation, and whether strictly.
    degraded: (crate::format::degradation::Degradation, bool),
    /// The cores the steps of a run with one stream in all may use: its kernels split into
    /// parts and its library calls fork up to this many (`set_threads`). A run with more
    /// streams already keeps the cores busy with its stream threads, one core each.
    threads: usize,
    /// Set when this process runs one host's devices (`set_transport`).
    hosts: Option<Arc<Hosts>>,
    /// `host_copies`.
    host_copies: AtomicU64,
}

/// Runs `kernel` on `args` (the step's buffers, which are the ones it was generated for) as
/// `parts` parts at once, on this thread and the pool's (`crate::kernels::pool`). Returns the first
/// non-zero status of a part, or 0.
fn call_kernel(kernel: KernelFn, args: &[*mut u8], parts: usize) -> u32 {
    // SAFETY (both calls): the buffers are the kernel's, and parts of one call write disjoint
    // elements and read only what no other part writes.
    if parts == 1 {
        return unsafe { kernel(args.as_ptr(), 0, 1) };
    }
    let args = args.as_ptr() as usize;
    let status: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
    pool::split(parts, &|p| status[p].store(unsafe { kernel(args as *const *mut u8, p, parts) }, Ordering::Relaxed));
    status.iter().map(|s| s.load(Ordering::Relaxed)).find(|&s| s != 0).unwrap_or(0)
}

impl Loaded {
    /// Kernels and weights an in-memory compile produced (no artifact file): the kernels
    /// where the compiler put them, the weights copied into an aligned block.
    pub fn in_memory(meta: Meta, programs: Vec<Program>, code: Box<dyn KernelTable>, weights: &[u8]) -> Result<Loaded> {
        Loaded::new(meta, programs, Code::InProcess(code), Weights::Owned(AlignedBuf::from_bytes(weights)?))
    }

    /// Checks that this CPU has every feature the code was compiled for and that the
    /// programs are sound (buffers inside their storage, indices in range, collectives that
    /// fit together), then wraps the pieces. `code` must hold the kernels the programs
    /// refer to.
    pub fn new(meta: Meta, programs: Vec<Program>, code: Code, weights: Weights) -> Result<Loaded> {
        let bytes = weights.bytes();
        let devices = meta.mesh.devices();
        if programs.len() != devices {
            bail!("{} programs for a mesh of {devices} devices", programs.len());
        }
        let host = abi::host_features();
        let missing: Vec<&str> = meta.features.iter().filter(|f| !host.contains(f)).map(String::as_str).collect();
        if !missing.is_empty() {
            bail!(
                "this CPU lacks {} needed by code compiled for target '{}'; recompile with --target x86-64-v2 or native",
                missing.join(", "),
                meta.target
            );
        }
        let code_len = match &code {
            Code::Mapped(m) => m.len(),
            Code::InProcess(t) => t.section_len(),
        };
        if let Some(a) = meta.model_axes.iter().find(|&&a| a >= meta.mesh.shape.len()) {
            bail!("model axis {a} is not an axis of the {:?} mesh", meta.mesh.shape);
        }
        // The devices the artifact names degraded run nothing: their programs are empty.
        let topo = (!meta.degraded.is_empty())
            .then(|| crate::comm::degraded::Topo::new(&meta.mesh, &meta.degraded, false))
            .transpose()?;
        let absent: Vec<bool> = (0..devices).map(|d| topo.as_ref().is_some_and(|t| !t.healthy(d))).collect();
        for (d, program) in programs.iter().enumerate().filter(|&(d, _)| !absent[d]) {
            let check = || -> Result<()> {
                if program.device != d {
                    bail!("program {d} is for device {}", program.device);
                }
                if let Some(k) = program.kernels.iter().find(|k| k.parts == 0) {
                    bail!("kernel {} splits into 0 parts", k.name);
                }
                let fits = |b: &Buffer| match b.storage {
                    Storage::Arena { offset } => {
                        offset.checked_add(b.bytes).is_some_and(|end| end <= program.arena_bytes)
                    }
                    Storage::Weights { offset } => offset.checked_add(b.bytes).is_some_and(|end| end <= bytes.len()),
                };
                if let Some(b) = program.buffers.iter().find(|b| !fits(b)) {
                    bail!("buffer '{}' lies outside its storage", b.name);
                }
                check_indices(&meta, program)?;
                check_steps(program)?;
                lanes(program)?;
                check_arena(program)
            };
            if devices == 1 {
                check()?;
            } else {
                check().with_context(|| meta.mesh.device_label(d))?;
            }
        }
        check_kernels(&programs, code_len)?;
        if let Code::InProcess(t) = &code {
            if let Some(k) = programs.iter().flat_map(|p| &p.kernels).find(|k| t.get(k.offset).is_none()) {
                bail!("kernel {} at offset {} is not a function of the compiled code", k.name, k.offset);
            }
        }
        check_collectives(&meta.mesh, &programs, &absent)?;
        check_transfers(&meta.mesh, &programs)?;
        let masks = programs.iter().map(|p| masks_of(p, bytes)).collect::<Result<_>>()?;
        let share = programs
            .iter()
            .map(|p| {
                let written = |i: usize, b: usize| {
                    p.inputs.contains(&b)
                        || p.steps.iter().enumerate().any(|(j, s)| j != i && s.buffers.first() == Some(&b))
                };
                p.steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| matches!(s.exec, Exec::Collective(_)) && !written(i, s.buffers[0]))
                    .collect()
            })
            .collect();
        let arenas = programs.iter().map(|p| AlignedBuf::zeroed(p.arena_bytes)).collect::<Result<_>>()?;
        let mut fabric = Fabric::new(&meta.mesh);
        if let Some(topo) = topo {
            fabric.degrade(topo)?;
        }
        let state = std::sync::Mutex::new(State { arenas, devices: None });
        let exchange = Exchange::default();
        let (fail, degraded) = (None, Default::default());
        let lanes = programs.iter().map(lanes).collect::<Result<_>>()?;
        // Not rayon::current_num_threads(): that starts the pool's threads, which a run
        // that never splits a kernel does not need (and load time would pay for). Asked
        // once: the answer comes from cgroup files (~20 µs).
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let threads = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        Ok(Loaded {
            meta,
            programs,
            code,
            weights,
            state,
            fabric,
            share,
            fail,
            degraded,
            masks,
            exchange,
            lanes,
            threads,
            hosts: None,
            host_copies: AtomicU64::new(0),
        })
    }

    /// Runs only this host's devices (`meta.hosts`, the transport's rank), joining the
    /// other hosts over `transport`. Before the first run.
    pub fn set_transport(&mut self, transport: Arc<dyn Transport>) -> Result<()> {
        let hosts = Arc::new(Hosts::new(&self.meta, &self.programs, transport)?);
        self.fabric.set_hosts(hosts.clone());
        self.exchange.set_hosts(hosts.clone());
        self.hosts = Some(hosts);
        Ok(())
    }

    /// Under hosts: the bytes this host sent each other host in the last run, one line per
    /// host (`--link-stats`).
    pub fn host_stats(&self) -> Option<String> {
        self.hosts.as_ref().map(|h| h.report())
    }

    /// This process's host: 0 unless `set_transport` made it another. Only host 0's runs
    /// return the outputs.
    pub fn host(&self) -> usize {
        self.hosts.as_ref().map_or(0, |h| h.me())
    }

    /// Under hosts: the device whose copy of `d`'s block of output `spec` host 0 reads: `d`
    /// when it is healthy and on host 0, else the first healthy device with the same block
    /// on host 0, else the first healthy one anywhere (its host sends that copy).
    fn source(&self, hosts: &Hosts, spec: &IoSpec, d: usize, healthy: impl Fn(usize) -> bool) -> Option<usize> {
        let mesh = &self.meta.mesh;
        let region = |x: usize| spec.block(mesh, x).map(|(r, _)| r);
        let mine = region(d);
        let same: Vec<usize> = (0..mesh.devices()).filter(|&h| healthy(h) && region(h) == mine).collect();
        same.iter().copied().find(|&h| hosts.host_of(h) == 0).or(same.first().copied())
    }

    /// Under hosts, the blocks host 0 reads (`source`) that other hosts hold go to host 0,
    /// one copy per block; host 0 gets them back by (output, device), the others nothing.
    fn gather_outputs(
        &self,
        hosts: &Hosts,
        runs: &[DeviceRun],
        healthy: impl Fn(usize) -> bool,
    ) -> Result<HashMap<(usize, usize), Vec<u8>>> {
        let mesh = &self.meta.mesh;
        let me = hosts.me();
        let mut sends = Vec::new();
        let mut blocks = Vec::new();
        for (i, spec) in self.meta.outputs.iter().enumerate() {
            let ty: TensorType = spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
            let len = spec.mesh(mesh).local_shape(&spec.shape, &spec.layout).iter().product::<usize>()
                * ty.dtype.size_bytes();
            let sources: BTreeSet<usize> = (0..mesh.devices())
                .filter(|&d| spec.block(mesh, d).is_some_and(|(_, w)| w))
                .filter_map(|d| self.source(hosts, spec, d, &healthy))
                .collect();
            for d in sources {
                let (host, tag) = (hosts.host_of(d), hosts.output_tag(i, d));
                if me != 0 && host == me {
                    // SAFETY: the buffer holds the device's block of the output; its job is done.
                    let bytes = unsafe { std::slice::from_raw_parts(runs[d].outputs[i].0, len) };
                    sends.push(Outgoing { to: 0, tag, bytes });
                } else if me == 0 && host != 0 {
                    blocks.push(((i, d), host, tag, vec![0u8; len]));
                }
            }
        }
        let mut recvs: Vec<Incoming> =
            blocks.iter_mut().map(|(_, from, tag, b)| Incoming { from: *from, tag: *tag, bytes: b }).collect();
        let timeout = self.exchange.timeout();
        match hosts.exchange(&sends, &mut recvs, timeout, &|| false) {
            Ok(()) => Ok(blocks.into_iter().map(|(at, _, _, b)| (at, b)).collect()),
            Err(Stall::Timeout(pending)) => {
                bail!("gathering the outputs on host 0: {}", hosts.stalled(pending, &sends, &recvs, timeout))
            }
            Err(Stall::Stopped) => bail!("gathering the outputs on host 0: stopped"),
            Err(Stall::Failed(m)) => bail!("gathering the outputs on host 0: {m}"),
        }
    }

    /// Section `kind` of the artifact the program was loaded from (none for a program
    /// compiled in memory).
    pub fn section(&self, kind: SectionKind) -> Option<&[u8]> {
        match &self.weights {
            Weights::Artifact(a) => a.section(kind),
            Weights::Owned(_) => None,
        }
    }

    /// The decoded mask of weight buffer `b` of `device`, if it has one.
    pub fn mask(&self, device: usize, b: usize) -> Option<&Mask> {
        self.masks[device].get(&b)
    }

    fn kernel(&self, device: usize, k: usize) -> KernelFn {
        let offset = self.programs[device].kernels[k].offset;
        match &self.code {
            // SAFETY: `new` checked the kernel lies inside the code, which was compiled for a
            // target whose features this CPU has.
            Code::Mapped(m) => unsafe { std::mem::transmute::<*const u8, KernelFn>(m.as_ptr().add(offset)) },
            Code::InProcess(t) => t.get(offset).expect("checked by `new`"),
        }
    }

    /// Checks the inputs against the metadata: each once, with its dtype and shape.
    pub fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<()> {
        self.check_given(inputs, &vec![true; self.meta.inputs.len()])
    }

    /// `check_inputs` for the inputs `wanted` marks (the others are resident state).
    fn check_given(&self, inputs: &HashMap<String, Tensor>, wanted: &[bool]) -> Result<()> {
        for spec in self.meta.inputs.iter().zip(wanted).filter(|(_, w)| **w).map(|(s, _)| s) {
            let want = spec.ty().ok_or_else(|| anyhow!("input '{}' has unknown dtype {}", spec.name, spec.dtype))?;
            match inputs.get(&spec.name) {
                None => bail!("missing input '{}' ({want})", spec.name),
                Some(t) if t.ty() != want => bail!("input '{}' is {}, the graph expects {want}", spec.name, t.ty()),
                Some(_) => {}
            }
        }
        let known = |k: &String| self.meta.inputs.iter().zip(wanted).any(|(s, w)| *w && &s.name == k);
        if let Some(extra) = inputs.keys().find(|k| !known(k)) {
            bail!("the graph has no input '{extra}'");
        }
        Ok(())
    }

    /// Re-plans the collectives around degraded devices and links (`meshc run --degrade`),
    /// those the artifact names plus `deg`; with `strict`, partially degraded devices count
    /// as failed. Degraded devices run nothing; see `crate::comm::fabric` for the collectives.
    pub fn degrade(&mut self, deg: &crate::format::degradation::Degradation, strict: bool) -> Result<()> {
        let extra = self.degraded.0.merged(deg);
        let strict = strict || self.degraded.1;
        let topo = crate::comm::degraded::Topo::new(&self.meta.mesh, &self.meta.degraded.merged(&extra), strict)?;
        let mesh = &self.meta.mesh;
        let lost = (0..mesh.devices()).find(|&d| !topo.healthy(d));
        let any_left = (0..mesh.devices()).any(|d| topo.healthy(d));
        let staged =
            self.programs.iter().flat_map(|p| &p.steps).any(|s| matches!(s.exec, Exec::Send(_) | Exec::Recv(_)));
        if let (Some(d), true, true) = (lost, staged, any_left) {
            bail!(
                "device {} would break the pipeline: a graph placed in stages (send/recv between devices) cannot lose a device",
                mesh.coords_string(d)
            );
        }
        if let (Some(d), Some(&a), true) = (lost, self.meta.model_axes.first(), any_left) {
            bail!(
                "device {} would take its shard of the model (params are split over mesh axis '{}') with it: only data-parallel layouts can lose a device",
                mesh.coords_string(d),
                mesh.axes[a]
            );
        }
        self.fabric.degrade(topo)?;
        self.degraded = (extra, strict);
        Ok(())
    }

    /// How long a device waits for a collective's member that shows no sign of life before
    /// the run ends naming it (`crate::comm::fabric::TIMEOUT` unless set).
    pub fn set_collective_timeout(&mut self, timeout: Duration) {
        self.fabric.set_timeout(timeout);
    }

    /// Makes `device` stop answering (it neither runs on nor shows signs of life) when it
    /// reaches its collective number `step`, from 0: how tests make a device fail mid-run.
    pub fn fail_device(&mut self, device: usize, step: usize) -> Result<()> {
        if self.fabric.degraded().is_some_and(|t| !t.healthy(device)) {
            bail!("{} is degraded: it runs nothing", self.meta.mesh.device_label(device));
        }
        let runs = self.programs[device].steps.iter().filter(|s| matches!(s.exec, Exec::Collective(_))).count();
        if step >= runs {
            bail!("{} runs {runs} collective(s), none numbered {step}", self.meta.mesh.device_label(device));
        }
        self.fail = Some((device, step));
        Ok(())
    }

    /// The most cores a run with a single stream may use (`--threads`; all of them unless
    /// set). Results do not depend on it.
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// How long a recv waits for its send (and a send for its recv) before the run fails.
    pub fn set_timeout(&self, t: Duration) {
        self.exchange.set_timeout(t);
    }

    /// The bytes every link of the mesh carried in the last run (`--link-stats`).
    pub fn link_stats(&self) -> LinkStats {
        self.fabric.link_stats()
    }

    /// Runs the programs once.
    pub fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        Ok(self.run_inner(inputs, None, false)?.0)
    }

    /// Runs the programs once with the state in `resident` (`Loaded::upload`) on the
    /// devices: `inputs` holds only the other inputs, the state's outputs stay on the
    /// devices as the next run's state, and the other outputs are returned.
    pub fn run_resident(
        &self,
        inputs: &HashMap<String, Tensor>,
        resident: &mut Resident,
    ) -> Result<BTreeMap<String, Tensor>> {
        Ok(self.run_inner(inputs, Some(resident), false)?.0)
    }

    /// Runs the programs once, then reports every step's time to `timed`, device by device
    /// in step order (the per-step profile behind traces and the kernel benchmarks).
    pub fn run_timed(
        &self,
        inputs: &HashMap<String, Tensor>,
        timed: &mut dyn FnMut(&StepTime),
    ) -> Result<BTreeMap<String, Tensor>> {
        let (results, times) = self.run_inner(inputs, None, true)?;
        times.iter().for_each(timed);
        Ok(results)
    }

    /// How many blocks of tensors have been copied between the host and the devices'
    /// buffers (an input's block into a device, or a device's block of an output out of
    /// it) since the program was loaded: what resident state saves shows here.
    pub fn host_copies(&self) -> u64 {
        self.host_copies.load(Ordering::Relaxed)
    }

    /// Whether `device` runs (it is not degraded).
    fn healthy(&self, device: usize) -> bool {
        self.fabric.degraded().is_none_or(|t| t.healthy(device))
    }

    /// Copies `device`'s block of input `i` (value `t`; `bytes`: its bytes, for an input
    /// split over the mesh) into `dst`, the device's buffer of it.
    fn cut_block(&self, i: usize, device: usize, t: &Tensor, dst: &mut [u8], bytes: Option<&[u8]>) {
        let spec = &self.meta.inputs[i];
        // A device outside the input's stage holds none of it.
        let Some((region, _)) = spec.block(&self.meta.mesh, device) else { return };
        self.host_copies.fetch_add(1, Ordering::Relaxed);
        match bytes {
            None => t.write_le_bytes(dst),
            Some(bytes) => {
                let e = t.dtype().size_bytes();
                let local: Vec<usize> = region.iter().map(|r| r.len()).collect();
                let at: Vec<usize> = region.iter().map(|r| r.start).collect();
                fabric::for_each_run(&spec.shape, &at, &local, &vec![0; local.len()], &local, |s, o, n| {
                    dst[o * e..(o + n) * e].copy_from_slice(&bytes[s * e..(s + n) * e])
                });
            }
        }
    }

    /// Output `spec` as a whole tensor from the devices' blocks (`block(d)`: device d's),
    /// each block read from a healthy device that holds it; under hosts, from the copy host 0
    /// reads (`source`).
    fn assemble<'b>(&self, spec: &IoSpec, block: &dyn Fn(usize) -> &'b [u8]) -> Result<Tensor> {
        let mesh = &self.meta.mesh;
        let healthy = |d: usize| self.healthy(d);
        let ty: TensorType = spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
        let local = spec.mesh(mesh).local_shape(&spec.shape, &spec.layout);
        let e = ty.dtype.size_bytes();
        let holders: Vec<(usize, Vec<std::ops::Range<usize>>)> = (0..mesh.devices())
            .filter_map(|d| spec.block(mesh, d).filter(|(_, writes)| *writes).map(|(r, _)| (d, r)))
            .collect();
        let region = |d: usize| spec.block(mesh, d).map(|(r, _)| r);
        // The block from a healthy device that holds it, if any (under hosts, the copy
        // host 0 reads).
        let holder = |d: usize| match (&self.hosts, healthy(d)) {
            (Some(hosts), _) => self.source(hosts, spec, d, healthy),
            (None, true) => Some(d),
            (None, false) => (0..mesh.devices()).filter(|&h| healthy(h)).find(|&h| region(h) == region(d)),
        };
        if local == spec.shape {
            let first = holders.first().map_or(0, |h| h.0);
            self.host_copies.fetch_add(1, Ordering::Relaxed);
            return Ok(Tensor::from_le_bytes(
                &ty,
                block(holder(first).ok_or_else(|| anyhow!("every device is degraded"))?),
            ));
        }
        // Blocks that only degraded devices held (their data-parallel shards were
        // dropped) read as NaN, or zero for other dtypes.
        let mut bytes = match ty.dtype {
            DType::F32 => f32::NAN.to_le_bytes().repeat(ty.size_bytes() / 4),
            _ => vec![0u8; ty.size_bytes()],
        };
        for (d, r) in &holders {
            let Some(h) = holder(*d) else { continue };
            self.host_copies.fetch_add(1, Ordering::Relaxed);
            let at: Vec<usize> = r.iter().map(|r| r.start).collect();
            let src = block(h);
            fabric::for_each_run(&local, &vec![0; local.len()], &spec.shape, &at, &local, |s, o, n| {
                bytes[o * e..(o + n) * e].copy_from_slice(&src[s * e..(s + n) * e])
            });
        }
        Ok(Tensor::from_le_bytes(&ty, &bytes))
    }

    fn run_inner(
        &self,
        inputs: &HashMap<String, Tensor>,
        mut resident: Option<&mut Resident>,
        timed: bool,
    ) -> Result<(BTreeMap<String, Tensor>, Vec<StepTime>)> {
        let is_state = |i: usize| resident.as_ref().is_some_and(|r| r.holds_input(i));
        let from_host: Vec<bool> = (0..self.meta.inputs.len()).map(|i| !is_state(i)).collect();
        self.check_given(inputs, &from_host)?;
        let taken: Vec<bool> = from_host.iter().map(|h| !h).collect();
        let returned: Vec<bool> =
            (0..self.meta.outputs.len()).map(|o| resident.as_ref().is_none_or(|r| !r.holds_output(o))).collect();
        let mut state = self.state.lock().map_err(|_| anyhow!("a previous run panicked"))?;
        let State { arenas, devices } = &mut *state;
        self.fabric.reset();
        self.exchange.reset();
        if let Some(h) = &self.hosts {
            h.reset();
        }
        let epoch = Instant::now();
        let mesh = &self.meta.mesh;
        let shared: Vec<DeviceShared> = (self.programs.iter().zip(arenas.iter_mut()).zip(&self.lanes))
            .enumerate()
            .map(|(d, ((p, arena), lanes))| {
                let base = arena.as_mut_slice().as_mut_ptr();
                let mut ptrs: Vec<*mut u8> = (p.buffers.iter())
                    .map(|b| match b.storage {
                        // SAFETY (both): `new` checked every buffer lies inside its storage.
                        Storage::Arena { offset } => unsafe { base.add(offset) },
                        // Kernels never write their operands, so weights stay read-only.
                        Storage::Weights { offset } => unsafe { self.weights.bytes().as_ptr().add(offset) as *mut u8 },
                    })
                    .collect();
                // Resident state: the step reads S where it lives and writes next.S into
                // the slot's other buffer (an arena output only: a weight is never written).
                for (&(i, o), slot) in resident.iter_mut().flat_map(|r| r.pairs.iter().zip(r.slots[d].iter_mut())) {
                    let (cur, next) = slot.ptrs();
                    let (ib, ob) = (p.inputs[i], p.outputs[o]);
                    ptrs[ib] = cur;
                    if ob != ib && matches!(p.buffers[ob].storage, Storage::Arena { .. }) {
                        ptrs[ob] = next;
                    }
                }
                let ptrs = ptrs.into_iter().map(AtomicPtr::new).collect();
                let cursors = lanes.steps.iter().map(|_| Mutex::new(0)).collect();
                DeviceShared { ptrs, board: Board::new(lanes.inputs_event + 1), cursors }
            })
            .collect();
        // Once the devices are done: each resident block's new value is where the step
        // left next.S (`out(d, o)`).
        let mut settle = |out: &dyn Fn(usize, usize) -> Option<*const u8>| {
            for r in resident.iter_mut() {
                for (d, slots) in r.slots.iter_mut().enumerate() {
                    for (&(_, o), slot) in r.pairs.iter().zip(slots.iter_mut()) {
                        if let Some(at) = out(d, o) {
                            slot.settle(at);
                        }
                    }
                }
            }
        };
        let lanes: Vec<(usize, usize)> =
            (0..mesh.devices()).flat_map(|d| self.lanes[d].active().map(move |k| (d, k))).collect();
        if lanes.len() == 1 {
            let ctx = RunCtx { inputs, split: &[], resident: &taken, epoch, timed, devices: &shared };
            let run = self.device_run(0, 0, ctx, &Cell::new(0), self.threads)?;
            settle(&|_, o| Some(run.outputs[o].0));
            let results = (self.meta.outputs.iter().zip(&run.outputs).zip(&returned)).filter(|(_, r)| **r).map(
                |((spec, &p), _)| {
                    let ty: TensorType =
                        spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
                    // SAFETY: the buffer holds exactly the output's bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(p.0, ty.size_bytes()) };
                    self.host_copies.fetch_add(1, Ordering::Relaxed);
                    Ok((spec.name.clone(), Tensor::from_le_bytes(&ty, bytes)))
                },
            );
            return Ok((results.collect::<Result<_>>()?, run.times));
        }
        // The bytes of every input split over the mesh, for the devices to take their
        // blocks from; replicated inputs are written straight into each device's buffer.
        let split: Vec<Option<Vec<u8>>> = (self.meta.inputs.iter().zip(&from_host))
            .map(|(s, &h)| (h && s.layout.iter().any(Option::is_some)).then(|| inputs[&s.name].to_le_bytes()))
            .collect();
        let ctx = RunCtx { inputs, split: &split, resident: &taken, epoch, timed, devices: &shared };
        let devices = match devices {
            Some(d) => d,
            None => devices.insert(Devices::start(lanes.len())?),
        };
        // A degraded device runs nothing (the fabric leaves it out of every collective).
        let healthy = |d: usize| self.healthy(d);
        // Another host's devices run there.
        let here = |d: usize| self.hosts.as_ref().is_none_or(|h| h.is_local(d));
        let jobs = (lanes.iter())
            .map(|&(d, k)| match healthy(d) && here(d) {
                true => Box::new(move || self.device_thread(d, k, ctx)) as Job,
                false => Box::new(|| Some(DeviceRun { outputs: Vec::new(), times: Vec::new() })) as Job,
            })
            .collect();
        let lane_runs = devices.run(jobs);
        if let Some(reason) = self.fabric.poisoned() {
            return Err(reason.into());
        }
        let lane_runs: Vec<DeviceRun> =
            lane_runs.into_iter().collect::<Option<_>>().ok_or_else(|| anyhow!("a device failed"))?;
        // Per device: its main stream's run (the outputs), with every stream's step times.
        let mut runs: Vec<DeviceRun> = Vec::new();
        for (&(_, k), run) in lanes.iter().zip(lane_runs) {
            match runs.last_mut() {
                Some(last) if k != 0 => last.times.extend(run.times),
                _ => runs.push(run),
            }
        }
        settle(&|d, o| runs[d].outputs.get(o).map(|p| p.0));
        // In step order, whichever thread ran them.
        runs.iter_mut().for_each(|r| r.times.sort_by_key(|t| t.step));
        let remote = match &self.hosts {
            Some(hosts) => self.gather_outputs(hosts, &runs, healthy)?,
            None => HashMap::new(),
        };
        let times = || runs.iter().flat_map(|r| r.times.clone()).collect();
        if self.host() != 0 {
            return Ok((BTreeMap::new(), times()));
        }
        let mut results = BTreeMap::new();
        for (i, spec) in self.meta.outputs.iter().enumerate().filter(|&(i, _)| returned[i]) {
            let ty: TensorType = spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
            let len = spec.mesh(mesh).local_shape(&spec.shape, &spec.layout).iter().product::<usize>()
                * ty.dtype.size_bytes();
            let block = |d: usize| match remote.get(&(i, d)) {
                Some(b) => b.as_slice(),
                // SAFETY: the buffer holds the device's block of the output; its job is done.
                None => unsafe { std::slice::from_raw_parts(runs[d].outputs[i].0, len) },
            };
            results.insert(spec.name.clone(), self.assemble(spec, &block)?);
        }
        Ok((results, times()))
    }

    /// One stream's thread of a multi-device (or multi-stream) run: its error or panic
    /// poisons the fabric and every device's events (the reason names the device and node)
    /// and ends its run with `None`.
    fn device_thread(&self, device: usize, stream: usize, ctx: RunCtx) -> Option<DeviceRun> {
        let step = Cell::new(usize::MAX);
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.device_run(device, stream, ctx, &step, 1)));
        let label = self.meta.mesh.device_label(device);
        let cause = match run {
            Ok(Ok(run)) => return Some(run),
            Ok(Err(e)) => RunError::of(&e),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                RunError::Other(match self.programs[device].steps.get(step.get()) {
                    Some(s) => format!("node '{}': panicked: {msg}", s.node),
                    None => format!("panicked: {msg}"),
                })
            }
        };
        self.fabric.poison(RunError::OnDevice { device, label, cause: Box::new(cause) });
        ctx.devices.iter().for_each(|d| d.board.poison());
        self.exchange.poison();
        None
    }

    /// Runs stream `stream` of `device`'s program and, for the main stream (0), copies in
    /// the device's inputs first (its block of the split ones), then joins the other streams
    /// and returns where the outputs are. `step` tracks the running step (for a panic's
    /// message); `threads`: the cores its steps may use.
    fn device_run(
        &self,
        device: usize,
        stream: usize,
        ctx: RunCtx,
        step: &Cell<usize>,
        threads: usize,
    ) -> Result<DeviceRun> {
        let RunCtx { inputs, split, devices, .. } = ctx;
        let p = &self.programs[device];
        let lanes = &self.lanes[device];
        let DeviceShared { ptrs, board, cursors } = &devices[device];
        let ptr = |b: usize| ptrs[b].load(Ordering::Relaxed);
        let abandoned = || {
            let reason = self.fabric.poisoned().map(|r| r.to_string()).unwrap_or_default();
            anyhow!("abandoned: {reason}")
        };
        if stream != 0 && !board.wait(lanes.inputs_event) {
            return Err(abandoned());
        }
        for (i, (spec, &b)) in self.meta.inputs.iter().zip(&p.inputs).enumerate().filter(|_| stream == 0) {
            // State already on the device: the buffer points at it (`run_inner`).
            if ctx.resident[i] {
                continue;
            }
            // SAFETY: the buffer has exactly the bytes of the device's block (check_indices).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr(b), p.buffers[b].bytes) };
            let bytes = split.get(i).and_then(Option::as_deref);
            self.cut_block(i, device, &inputs[&spec.name], dst, bytes);
        }
        if stream == 0 {
            board.record(lanes.inputs_event);
        }
        let mut run = StepRun { device, threads, ctx, step, times: Vec::new(), waits: Vec::new(), args: Vec::new() };
        let cursor = &cursors[stream];
        loop {
            let pos = *cursor.lock();
            let Some(&i) = lanes.steps[stream].get(pos) else { break };
            // Wait for the step's events without holding the stream, so that a stream
            // waiting for this one may take the step over (`drive`).
            for &e in &lanes.wait[i] {
                if !board.wait(e) {
                    return Err(abandoned()).with_context(|| format!("node '{}'", p.steps[i].node));
                }
            }
            let mut at = cursor.lock();
            if *at == pos {
                self.run_step(&mut run, stream, i)?;
                *at += 1;
            }
        }
        if stream != 0 {
            return Ok(DeviceRun { outputs: Vec::new(), times: run.times });
        }
        for &e in &lanes.join {
            self.await_event(&mut run, e)?;
        }
        let times = std::mem::take(&mut run.times);
        Ok(DeviceRun { outputs: p.outputs.iter().map(|&b| SendPtr(ptr(b))).collect(), times })
    }

    /// Waits for event `e` of `run`'s device; first runs the steps of its stream up to the
    /// one that records it, if no thread is running that stream (`drive`).
    fn await_event(&self, run: &mut StepRun, e: usize) -> Result<()> {
        let shared = &run.ctx.devices[run.device];
        if !shared.board.done[e].load(Ordering::Acquire) {
            let after = self.programs[run.device].streams.events[e].after;
            self.drive(run, after)?;
        }
        if !shared.board.wait(e) {
            let reason = self.fabric.poisoned().map(|r| r.to_string()).unwrap_or_default();
            bail!("abandoned: {reason}");
        }
        Ok(())
    }

    /// Runs the steps of step `s`'s stream, in order, up to `s`, if no other thread is
    /// running that stream: a stream waiting for another one does its work rather than
    /// wake its thread and sleep (a hand-off between host threads costs ~25 µs with 8
    /// devices on 2 cores, more than a small collective), while a stream that is already
    /// under way keeps running on its own thread, overlapping. Every step waits only for
    /// earlier steps, so the stream taken over never waits for the one that took it.
    fn drive(&self, run: &mut StepRun, s: usize) -> Result<()> {
        let lanes = &self.lanes[run.device];
        let stream = lanes.stream_of[s];
        let Some(mut at) = run.ctx.devices[run.device].cursors[stream].try_lock() else { return Ok(()) };
        while let Some(&j) = lanes.steps[stream].get(*at).filter(|&&j| j <= s) {
            self.run_step(run, stream, j)?;
            *at += 1;
        }
        Ok(())
    }

    /// Runs step `i` of stream `stream`: waits for its events, executes it, records its
    /// events.
    fn run_step(&self, run: &mut StepRun, stream: usize, i: usize) -> Result<()> {
        let device = run.device;
        let p = &self.programs[device];
        let lanes = &self.lanes[device];
        let RunCtx { epoch, timed, devices, .. } = run.ctx;
        let DeviceShared { ptrs, board, .. } = &devices[device];
        let st = &p.steps[i];
        for &e in &lanes.wait[i] {
            let start = Instant::now();
            self.await_event(run, e).with_context(|| format!("node '{}'", st.node))?;
            if timed {
                run.waits.push((start, Instant::now()));
            }
        }
        run.step.set(i);
        self.fabric.beat(device);
        if let Exec::Collective(c) = &st.exec {
            let number = p.steps[..i].iter().filter(|s| matches!(s.exec, Exec::Collective(_))).count();
            if self.fail == Some((device, number)) {
                // Silent until the others give up on it.
                while self.fabric.poisoned().is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                bail!("node '{}': collective #{}: stopped answering (--fail-device)", st.node, c.id);
            }
        }
        let start = Instant::now();
        let args = &mut run.args;
        args.clear();
        args.extend(st.buffers.iter().map(|&b| ptrs[b].load(Ordering::Relaxed)));
        match &st.exec {
            Exec::Kernel(k) => {
                let status = call_kernel(self.kernel(device, *k), args, p.kernels[*k].parts.min(run.threads));
                if status != 0 {
                    return Err(RunError::KernelStatus { node: st.node.clone(), status }.into());
                }
            }
            Exec::Library(Library::Matmul { a, b, out, panels: true, epilogue, .. }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let ep = bind_epilogue(epilogue, &args[3..], out);
                // SAFETY: the buffers hold f32 tensors of these shapes, `b` in panels
                // (checked by `check_program`), and the result does not alias the operands.
                let (o, x, y) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)),
                        std::slice::from_raw_parts(args[1] as *const f32, len(a)),
                        std::slice::from_raw_parts(
                            args[2] as *const f32,
                            crate::kernels::panels::packed_elems(b).unwrap_or(0),
                        ),
                    )
                };
                library::matmul_panels(x, y, o, a, b, out, Threads::UpTo(run.threads), &ep)
                    .with_context(|| format!("node '{}'", st.node))?;
            }
            Exec::Library(Library::Matmul { a, b, out, b_elem, epilogue, transposed, .. }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let ep = bind_epilogue(epilogue, &args[3..], out);
                // SAFETY: the buffers hold tensors of exactly these shapes (f32, b as
                // `b_elem`: checked by `check_program`), and the result does not alias the
                // operands.
                let (o, x) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)),
                        std::slice::from_raw_parts(args[1] as *const f32, len(a)),
                    )
                };
                let threads = Threads::UpTo(run.threads);
                match (b_elem, self.masks[device].get(&st.buffers[2])) {
                    (Elem::F32, mask) => {
                        // SAFETY: as above.
                        let y = unsafe { std::slice::from_raw_parts(args[2] as *const f32, len(b)) };
                        match mask {
                            Some(m) => library::matmul_masked(x, y, o, a, b, out, m, threads, &ep),
                            None if transposed.is_none() => library::matmul(x, y, o, a, b, out, threads, &ep),
                            None => library::matmul_transposed(x, y, o, a, b, out, *transposed, threads, &ep),
                        }
                    }
                    (half, _) => {
                        // SAFETY: as above.
                        let y = unsafe { std::slice::from_raw_parts(args[2] as *const u16, len(b)) };
                        library::matmul_half(x, (y, *half), o, a, b, out, threads, &ep)
                    }
                }
                .with_context(|| format!("node '{}'", st.node))?;
            }
            Exec::Library(Library::Attention { q, k, v, out, scale, mask }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let sh = crate::kernels::attention::Shapes::new(q, k, v, out, mask.as_deref())
                    .with_context(|| format!("node '{}'", st.node))?;
                let f32s = |i: usize, n: usize| {
                    // SAFETY: `check_program` checked that buffer `i` holds an aligned f32
                    // tensor of `n` elements; the result does not alias the operands.
                    unsafe { std::slice::from_raw_parts(args[i] as *const f32, n) }
                };
                let scale = scale.map(|how| (how, f32s(4, 1)[0]));
                let mask = mask.as_ref().map(|m| f32s(4 + usize::from(scale.is_some()), len(m)));
                // SAFETY: as above.
                let o = unsafe { std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)) };
                let threads = Threads::UpTo(run.threads).pick(sh.macs());
                crate::kernels::attention::attention(
                    &sh,
                    (f32s(1, len(q)), f32s(2, len(k)), f32s(3, len(v))),
                    scale,
                    mask,
                    o,
                    threads,
                );
            }
            Exec::Collective(c) => {
                // SAFETY: `new` checked the buffers' sizes against the collective and
                // that the result is apart from the operand; nothing else touches them
                // until the call returns.
                let delivery = unsafe {
                    self.fabric.collective_raw(
                        device,
                        c,
                        args[1] as *const f32,
                        args[0] as *mut f32,
                        self.share[device][i],
                        timed.then_some(&mut run.waits),
                    )
                }
                .with_context(|| format!("node '{}'", st.node))?;
                if let Delivery::Shared(at) = delivery {
                    // No step writes this buffer again (`share`): read the result there.
                    // The streams that read it wait for an event recorded after the step,
                    // which orders this store before their loads.
                    ptrs[st.buffers[0]].store(at as *mut u8, Ordering::Relaxed);
                }
            }
            Exec::Send(t) => {
                // SAFETY: `new` checked the buffer holds `t.bytes`; a `move` send's buffer
                // is live to the end of the program (`passes::buffers`), so it stays put.
                unsafe { self.exchange.send(device, t, args[0]) }.with_context(|| format!("node '{}'", st.node))?;
                if timed {
                    run.waits.push((start, Instant::now()));
                }
            }
            Exec::Recv(t) => {
                // SAFETY: `new` checked the buffer holds `t.bytes` in the arena.
                let at =
                    unsafe { self.exchange.recv(device, t, args[0]) }.with_context(|| format!("node '{}'", st.node))?;
                // `move`: the data stays in the sender's buffer; read it there (the readers
                // on other streams wait for an event recorded after this step).
                ptrs[st.buffers[0]].store(at as *mut u8, Ordering::Relaxed);
                if timed {
                    run.waits.push((start, Instant::now()));
                }
            }
        }
        for &e in &lanes.record[i] {
            board.record(e);
        }
        if timed {
            let since = |t: Instant| t.duration_since(epoch);
            let waits = run.waits.drain(..).map(|(a, b): (Instant, Instant)| (since(a), b.duration_since(a))).collect();
            run.times.push(StepTime { device, stream, step: i, start: since(start), dur: start.elapsed(), waits });
        }
        Ok(())
    }
}

/// Resident state (`crate::exec::resident`): onto the devices and back.
impl Loaded {
    /// Puts `state` (the inputs named `names`, each with an output `next_of(S)`) on the
    /// devices: each device's block of each tensor is cut once, here.
    pub fn upload(
        &self,
        state: &BTreeMap<String, Tensor>,
        names: &[String],
        next_of: impl Fn(&str) -> String,
    ) -> Result<Resident> {
        if self.host() != 0 || !self.meta.hosts.is_empty() {
            bail!("training runs over several hosts are not supported");
        }
        let mesh = &self.meta.mesh;
        let mut pairs = Vec::new();
        for n in names {
            let i = self.meta.inputs.iter().position(|s| &s.name == n).ok_or_else(|| anyhow!("no input '{n}'"))?;
            let next = next_of(n);
            let o =
                self.meta.outputs.iter().position(|s| s.name == next).ok_or_else(|| anyhow!("no output '{next}'"))?;
            let (si, so) = (&self.meta.inputs[i], &self.meta.outputs[o]);
            // The step must leave every device the block of next.S that it reads of S.
            let same = (0..mesh.devices()).all(|d| si.block(mesh, d).map(|b| b.0) == so.block(mesh, d).map(|b| b.0));
            if si.dtype != so.dtype || si.shape != so.shape || !same {
                bail!("state '{n}' leaves the step laid out unlike it enters it (a meshc bug)");
            }
            pairs.push((i, o));
        }
        let tensors = names
            .iter()
            .map(|n| state.get(n).map(|t| (t, t.to_le_bytes())).ok_or_else(|| anyhow!("the state has no tensor '{n}'")))
            .collect::<Result<Vec<_>>>()?;
        let mut slots = Vec::new();
        for (d, p) in self.programs.iter().enumerate() {
            let mut mine = Vec::new();
            for (&(i, _), (t, bytes)) in pairs.iter().zip(&tensors) {
                let len = p.buffers[p.inputs[i]].bytes;
                let mut cur = AlignedBuf::zeroed(len)?;
                self.cut_block(i, d, t, cur.as_mut_slice(), Some(bytes));
                mine.push(Slot { bufs: [cur, AlignedBuf::zeroed(len)?], cur: 0 });
            }
            slots.push(mine);
        }
        Ok(Resident { pairs, slots })
    }

    /// The state tensors as whole tensors (by input name), gathered from the devices'
    /// blocks: what a checkpoint writes.
    pub fn download(&self, resident: &Resident) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for (k, &(i, o)) in resident.pairs.iter().enumerate() {
            let spec = &self.meta.outputs[o];
            let t = self.assemble(spec, &|d| resident.slots[d][k].current())?;
            out.insert(self.meta.inputs[i].name.clone(), t);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use meshc_ir::{DType, Data};

    use super::*;
    use crate::comm::transport::{Pending, Threads};
    use crate::format::mesh::Topology;
    use crate::format::program::ALIGN;
    use crate::format::program::{CollectiveOp, Event, Reduce, Step, Stream, StreamKind, StreamPlan, Wait};

    fn io(name: &str, dtype: DType, shape: &[usize], layout: &[Option<usize>]) -> IoSpec {
        IoSpec::with_layout(name, &TensorType::new(dtype, shape.to_vec()), layout.to_vec())
    }

    /// A program over arena buffers of these sizes, one after the other.
    fn program(device: usize, sizes: &[usize], steps: Vec<Step>, inputs: Vec<usize>, outputs: Vec<usize>) -> Program {
        let mut at = 0;
        let buffers = sizes
            .iter()
            .enumerate()
            .map(|(i, &bytes)| {
                let b = Buffer { name: format!("b{i}"), bytes, storage: Storage::Arena { offset: at }, mask: None };
                at += bytes.div_ceil(ALIGN) * ALIGN;
                b
            })
            .collect();
        Program {
            device,
            arena_bytes: at,
            buffers,
            kernels: vec![],
            steps,
            inputs,
            outputs,
            streams: Default::default(),
        }
    }

    fn load(m: &Mesh, inputs: Vec<IoSpec>, outputs: Vec<IoSpec>, programs: Vec<Program>) -> Result<Loaded> {
        let meta = Meta {
            graph: "t".into(),
            target: "test".into(),
            features: vec![],
            mesh: m.clone(),
            flops: 0,
            inputs,
            outputs,
            degraded: Default::default(),
            model_axes: Vec::new(),
            hosts: Vec::new(),
        };
        Loaded::in_memory(meta, programs, Box::new(()), &[])
    }

    fn collective(id: usize, op: CollectiveOp, groups: Vec<Vec<usize>>, shape: &[usize]) -> Exec {
        Exec::Collective(Collective { op, id, groups, dtype: "f32".into(), shape: shape.to_vec() })
    }

    /// A library matmul of row-major f32 operands (no panels, epilogue or transposes).
    pub(super) fn f32_matmul(a: &[usize], b: &[usize], out: &[usize]) -> Exec {
        Exec::Library(Library::Matmul {
            a: a.to_vec(),
            b: b.to_vec(),
            out: out.to_vec(),
            b_elem: Elem::F32,
            panels: false,
            epilogue: Vec::new(),
            transposed: Default::default(),
        })
    }

    fn step(node: &str, exec: Exec, buffers: &[usize]) -> Step {
        Step { node: node.into(), exec, buffers: buffers.to_vec(), why: None }
    }

    fn iota(shape: &[usize]) -> Tensor {
        Tensor::f32(shape.to_vec(), (0..shape.iter().product::<usize>()).map(|i| i as f32).collect())
    }

    #[test]
    fn inputs_scatter_and_outputs_gather_by_layout() {
        let m = Mesh::numbered(&[2, 3], Topology::Torus);
        // Each device's output is its input buffer: gathering must undo the scatter.
        for layout in [vec![Some(0), Some(1)], vec![Some(1), None], vec![None, Some(0)], vec![None, None]] {
            let local = m.local_shape(&[6, 6], &layout);
            let bytes = local.iter().product::<usize>() * 4;
            let programs = (0..6).map(|d| program(d, &[bytes, bytes], vec![], vec![0, 1], vec![1, 0])).collect();
            let l = load(
                &m,
                vec![io("x", DType::F32, &[6, 6], &layout), io("i", DType::I32, &[6, 6], &layout)],
                vec![io("y", DType::I32, &[6, 6], &layout), io("z", DType::F32, &[6, 6], &layout)],
                programs,
            )
            .unwrap();
            let x = iota(&[6, 6]);
            let i = Tensor::new(vec![6, 6], Data::I32((0..36).map(|v| 100 - v).collect()));
            let out = l.run(&HashMap::from([("x".to_string(), x.clone()), ("i".to_string(), i.clone())])).unwrap();
            assert_eq!((&out["z"], &out["y"]), (&x, &i), "layout {layout:?}");
        }
    }

    #[test]
    fn collectives_run_between_scatter_and_gather() {
        let m = Mesh::numbered(&[2, 2], Topology::Torus);
        let rows = m.groups(&[1]);
        let gather = collective(0, CollectiveOp::AllGather { axis: 1 }, rows.clone(), &[2, 3]);
        let sum = collective(1, CollectiveOp::AllReduce { reduce: Reduce::Sum }, m.groups(&[0, 1]), &[2, 6]);
        // x [4,6] split [a0, a1]; an all_gather along each row of the mesh leaves device
        // (r, c) with rows 2r..2r+2, and an all_reduce over all four devices sums both row
        // blocks, each held twice.
        let programs = (0..4)
            .map(|d| {
                let steps = vec![step("g", gather.clone(), &[1, 0]), step("s", sum.clone(), &[2, 1])];
                program(d, &[24, 48, 48], steps, vec![0], vec![1, 2])
            })
            .collect();
        let l = load(
            &m,
            vec![io("x", DType::F32, &[4, 6], &[Some(0), Some(1)])],
            vec![io("g", DType::F32, &[4, 6], &[Some(0), None]), io("s", DType::F32, &[2, 6], &[None, None])],
            programs,
        )
        .unwrap();
        let x = iota(&[4, 6]);
        let out = l.run(&HashMap::from([("x".to_string(), x.clone())])).unwrap();
        assert_eq!(out["g"], x);
        let v = x.as_f32().unwrap();
        let want: Vec<f32> = (0..12).map(|i| 2.0 * (v[i] + v[i + 12])).collect();
        assert_eq!(out["s"], Tensor::f32(vec![2, 6], want));
        assert!(l.link_stats().max > 0);
        let mut times = Vec::new();
        l.run_timed(&HashMap::from([("x".to_string(), x)]), &mut |t| times.push(t.clone())).unwrap();
        let steps: Vec<(usize, usize)> = times.iter().map(|t| (t.device, t.step)).collect();
        assert_eq!(steps, (0..4).flat_map(|d| [(d, 0), (d, 1)]).collect::<Vec<_>>());
        let trace = crate::tools::trace::chrome_trace(&l.meta, &l.programs, &times);
        let v: serde_json::Value = serde_json::from_str(&trace).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        assert!(events.iter().any(|e| e["args"]["name"] == "device 3 (1,1)"));
        assert_eq!(events.iter().filter(|e| e["cat"] == "collective").count(), 8);
    }

    #[test]
    fn large_results_are_read_from_the_shared_buffer() {
        let m = Mesh::numbered(&[4], Topology::Torus);
        let n = 1 << 16;
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Mean }, vec![(0..4).collect()], &[n]);
        let programs = (0..4)
            .map(|d| program(d, &[4 * n, 4 * n], vec![step("s", sum.clone(), &[1, 0])], vec![0], vec![1]))
            .collect();
        let l = load(&m, vec![io("x", DType::F32, &[n], &[None])], vec![io("s", DType::F32, &[n], &[None])], programs)
            .unwrap();
        assert!(l.share.iter().all(|s| s == &[true]));
        let x = iota(&[n]);
        for _ in 0..2 {
            assert_eq!(l.run(&HashMap::from([("x".to_string(), x.clone())])).unwrap()["s"], x);
        }
    }

    #[test]
    fn device_threads_serve_a_moved_loaded_and_any_thread() {
        fn shareable<T: Send + Sync>(_: &T) {}
        let m = Mesh::numbered(&[2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![vec![0, 1]], &[3]);
        let programs = (0..2).map(|d| program(d, &[12, 12], vec![step("s", sum.clone(), &[1, 0])], vec![0], vec![1]));
        let x = [io("x", DType::F32, &[3], &[None])];
        let l = load(&m, x.to_vec(), vec![io("s", DType::F32, &[3], &[None])], programs.collect()).unwrap();
        shareable(&l);
        let inputs = HashMap::from([("x".to_string(), iota(&[3]))]);
        let want = Tensor::f32(vec![3], vec![0.0, 2.0, 4.0]);
        assert_eq!(l.run(&inputs).unwrap()["s"], want);
        // The threads started by the first run take the `Loaded` from each job, not from
        // where it was when they started.
        let l = Box::new(l);
        assert_eq!(l.run(&inputs).unwrap()["s"], want);
        let l = std::thread::spawn(move || {
            assert_eq!(l.run(&inputs).unwrap()["s"], want);
            l
        })
        .join()
        .unwrap();
        assert!(l.state.lock().unwrap().devices.as_ref().is_some_and(|d| d.threads.len() == 1));
    }

    /// Streams for a program of three steps: 0 on the communication stream, 1 and 2 on the
    /// main stream, 2 after 0 (event 0).
    fn two_streams() -> StreamPlan {
        StreamPlan {
            streams: vec![
                Stream { kind: StreamKind::Compute, steps: vec![1, 2] },
                Stream { kind: StreamKind::Comm, steps: vec![0] },
            ],
            events: vec![Event { after: 0 }],
            waits: vec![Wait { event: 0, before: 2 }],
            join: vec![],
        }
    }

    #[test]
    fn streams_run_apart_joined_by_events_and_traced_per_stream() {
        let m = Mesh::numbered(&[2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![vec![0, 1]], &[2, 2]);
        let mm = f32_matmul(&[2, 2], &[2, 2], &[2, 2]);
        // b1 = all_reduce(b0) on the comm stream while b2 = b0·b0 runs; then b3 = b1·b2.
        let programs = (0..2)
            .map(|d| {
                let steps = vec![
                    step("s", sum.clone(), &[1, 0]),
                    step("p", mm.clone(), &[2, 0, 0]),
                    step("y", mm.clone(), &[3, 1, 2]),
                ];
                Program { streams: two_streams(), ..program(d, &[16; 4], steps, vec![0], vec![3]) }
            })
            .collect();
        let x = || vec![io("x", DType::F32, &[2, 2], &[None, None])];
        let l = load(&m, x(), vec![io("y", DType::F32, &[2, 2], &[None, None])], programs).unwrap();
        let inputs = HashMap::from([("x".to_string(), iota(&[2, 2]))]);
        // x = [[0,1],[2,3]]: b1 = 2x, b2 = x·x = [[2,3],[6,11]], y = 2x·x·x.
        let want = Tensor::f32(vec![2, 2], vec![12.0, 22.0, 44.0, 78.0]);
        let mut times = Vec::new();
        for _ in 0..3 {
            assert_eq!(l.run(&inputs).unwrap()["y"], want);
        }
        l.run_timed(&inputs, &mut |t| times.push(t.clone())).unwrap();
        let streams: Vec<(usize, usize, usize)> = times.iter().map(|t| (t.device, t.stream, t.step)).collect();
        assert_eq!(streams, [(0, 1, 0), (0, 0, 1), (0, 0, 2), (1, 1, 0), (1, 0, 1), (1, 0, 2)]);
        let trace = crate::tools::trace::chrome_trace(&l.meta, &l.programs, &times);
        let v: serde_json::Value = serde_json::from_str(&trace).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let track = |name: &str| events.iter().find(|e| e["args"]["name"] == name).map(|e| e["tid"].clone());
        assert_eq!(track("device 1 (1) s1 comm"), Some(serde_json::json!(3)));
        assert!(events.iter().any(|e| e["name"] == "s" && e["tid"] == 3));
    }

    #[test]
    fn unsound_stream_plans_are_refused() {
        let m = Mesh::numbered(&[1], Topology::Torus);
        let mm = f32_matmul(&[2, 2], &[2, 2], &[2, 2]);
        let refuse = |plan: StreamPlan| {
            let steps = vec![
                step("a", mm.clone(), &[1, 0, 0]),
                step("b", mm.clone(), &[2, 1, 1]),
                step("c", mm.clone(), &[3, 2, 2]),
            ];
            let p = Program { streams: plan, ..program(0, &[16; 4], steps, vec![0], vec![3]) };
            let x = || vec![io("x", DType::F32, &[2, 2], &[None, None])];
            match load(&m, x(), vec![io("y", DType::F32, &[2, 2], &[None, None])], vec![p]) {
                Ok(_) => String::new(),
                Err(e) => format!("{e:#}"),
            }
        };
        assert_eq!(refuse(two_streams()), "");
        let mut p = two_streams();
        p.streams[0].steps = vec![2, 1];
        assert_eq!(refuse(p), "stream 0 lists step 1 out of order, twice or beyond the 3 steps");
        let mut p = two_streams();
        p.streams[0].steps = vec![2];
        assert_eq!(refuse(p), "step 'b' is on no stream");
        let mut p = two_streams();
        p.waits = vec![Wait { event: 0, before: 0 }];
        assert_eq!(refuse(p), "a wait for event 0 before step 0 does not follow an earlier step");
        let mut p = two_streams();
        p.join = vec![1];
        assert_eq!(refuse(p), "the main stream joins event 1, but there are 1");
        let p = StreamPlan { events: vec![Event { after: 0 }], ..StreamPlan::default() };
        assert_eq!(refuse(p), "events without streams");
    }

    #[test]
    fn a_failing_stream_stops_the_streams_waiting_for_it() {
        let m = Mesh::numbered(&[2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![vec![0, 1]], &[2, 2]);
        let bad = f32_matmul(&[2, 3], &[2, 3], &[2, 2]);
        let mm = f32_matmul(&[2, 2], &[2, 2], &[2, 2]);
        // Device 1's comm stream fails before its all_reduce; device 0's main stream waits
        // for its own all_reduce's event, which never comes.
        let programs = (0..2)
            .map(|d| {
                let first = mm.clone();
                let steps = vec![
                    step("f", first, &[1, 0, 0]),
                    step("p", mm.clone(), &[2, 0, 0]),
                    step("s", sum.clone(), &[3, 1]),
                ];
                let plan = StreamPlan {
                    streams: vec![
                        Stream { kind: StreamKind::Compute, steps: vec![1] },
                        Stream { kind: StreamKind::Comm, steps: vec![0, 2] },
                    ],
                    events: vec![Event { after: 2 }],
                    waits: vec![],
                    join: vec![0],
                };
                Program { streams: plan, ..program(d, &[16; 4], steps, vec![0], vec![3]) }
            })
            .collect();
        let x = || vec![io("x", DType::F32, &[2, 2], &[None, None])];
        let mut l = load(&m, x(), vec![io("y", DType::F32, &[2, 2], &[None, None])], programs).unwrap();
        // Shapes that do not fit pass no load check: the step is broken after loading.
        l.programs[1].steps[0].exec = bad;
        let inputs = HashMap::from([("x".to_string(), iota(&[2, 2]))]);
        for _ in 0..2 {
            let e = l.run(&inputs).unwrap_err().to_string();
            assert!(e.starts_with("device 1 (1): node 'f': matmul"), "{e}");
        }
    }

    #[test]
    fn a_library_operand_off_its_element_alignment_is_refused() {
        let m = Mesh::numbered(&[1], Topology::Torus);
        let matmul = f32_matmul(&[2, 3], &[3, 2], &[2, 2]);
        let mut p = program(0, &[16, 24, 24], vec![step("y", matmul, &[0, 1, 2])], vec![], vec![]);
        load(&m, vec![], vec![], vec![p.clone()]).unwrap();
        // What the mutation fuzzer found: an operand moved off alignment but still in bounds.
        p.buffers[1].storage = Storage::Arena { offset: 66 };
        let e = format!("{:#}", load(&m, vec![], vec![], vec![p]).err().expect("refused"));
        assert!(e.contains("step 'y': buffer 1 at offset 66 is not aligned for F32"), "{e}");
    }

    #[test]
    fn a_failing_device_stops_the_others() {
        let m = Mesh::numbered(&[2, 2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, m.groups(&[0, 1]), &[6]);
        // One device first runs a matmul whose shapes do not fit: the others wait for it in
        // the all_reduce until its error poisons the fabric. Device 0 runs on the calling
        // thread, device 3 on one of the runner's.
        let bad = f32_matmul(&[2, 3], &[2, 3], &[2, 3]);
        let good = f32_matmul(&[2, 3], &[3, 2], &[2, 2]);
        for (failing, label) in [(3, "device 3 (1,1)"), (0, "device 0 (0,0)")] {
            let programs = (0..4)
                .map(|d| {
                    let mut steps = vec![step("s", sum.clone(), &[1, 0])];
                    if d == failing {
                        steps.insert(0, step("h", good.clone(), &[2, 0, 0]));
                    }
                    program(d, &[24, 24, 24], steps, vec![0], vec![1])
                })
                .collect();
            let x = || vec![io("x", DType::F32, &[6], &[None])];
            let mut l = load(&m, x(), vec![io("s", DType::F32, &[6], &[None])], programs).unwrap();
            // Shapes that do not fit pass no load check: the step is broken after loading.
            l.programs[failing].steps[0].exec = bad.clone();
            let x = HashMap::from([("x".to_string(), iota(&[6]))]);
            for _ in 0..2 {
                let e = l.run(&x).unwrap_err().to_string();
                assert!(e.starts_with(&format!("{label}: node 'h': matmul")), "{e}");
            }
        }
    }

    #[test]
    fn collectives_that_cannot_meet_are_refused() {
        let m = Mesh::numbered(&[2], Topology::Torus);
        let all = vec![vec![0, 1]];
        let a = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, all.clone(), &[2]);
        let b = collective(1, CollectiveOp::AllReduce { reduce: Reduce::Max }, all.clone(), &[2]);
        let refuse = |steps: [Vec<Step>; 2]| {
            let programs =
                steps.into_iter().enumerate().map(|(d, s)| program(d, &[8, 8, 8], s, vec![0], vec![1])).collect();
            let x = || vec![io("x", DType::F32, &[2], &[None])];
            match load(&m, x(), x(), programs) {
                Ok(_) => String::new(),
                Err(e) => format!("{e:#}"),
            }
        };
        let (sa, sb) = (step("a", a.clone(), &[1, 0]), step("b", b.clone(), &[2, 1]));
        assert_eq!(refuse([vec![sa.clone(), sb.clone()], vec![sa.clone(), sb.clone()]]), "");
        assert_eq!(
            refuse([vec![sa.clone(), sb.clone()], vec![step("b", b, &[2, 0]), step("a", a.clone(), &[1, 2])]]),
            "the collectives cannot all complete in program order: device 0 (0) waits in #0 ('a'), device 1 (1) waits in #1 ('b')"
        );
        assert_eq!(refuse([vec![sa.clone()], vec![]]), "device 1 (1) never runs collective #0 (node 'a') of its group");
        let other = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, all, &[1]);
        assert_eq!(
            refuse([vec![sa.clone()], vec![step("a", other, &[1, 0])]]),
            "device 1 (1): node 'a' (collective #0): buffers of 8 and 8 bytes for an f32 operand [1] and result [1]"
        );
        assert_eq!(
            refuse([vec![sa.clone()], vec![step("a", a, &[0, 0])]]),
            "device 1 (1): node 'a' (collective #0): its result buffer 'b0' overlaps its operand 'b0'"
        );
        assert_eq!(
            refuse([vec![sa.clone(), sa.clone()], vec![sa.clone(), sa]]),
            "device 0 (0): node 'a' runs collective #0 a second time"
        );
    }

    #[test]
    fn degraded_devices_have_empty_programs_and_run_nothing() {
        let m = Mesh::numbered(&[2, 2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Mean }, m.groups(&[0, 1]), &[6]);
        let x = || vec![io("x", DType::F32, &[2, 6], &[Some(0), None])];
        let out = || vec![io("s", DType::F32, &[6], &[None])];
        let programs = |failed: usize| -> Vec<Program> {
            (0..4)
                .map(|d| match d == failed {
                    true => Program { device: d, ..Default::default() },
                    false => program(d, &[24, 24], vec![step("s", sum.clone(), &[1, 0])], vec![0], vec![1]),
                })
                .collect()
        };
        let meta = |degraded: crate::format::degradation::Degradation, model_axes: Vec<usize>| Meta {
            graph: "t".into(),
            target: "test".into(),
            features: vec![],
            mesh: m.clone(),
            flops: 0,
            inputs: x(),
            outputs: out(),
            degraded,
            model_axes,
            hosts: Vec::new(),
        };
        let failed = |d: usize| crate::format::degradation::Degradation { nodes: vec![d], ..Default::default() };
        // x is [2, 6] split over axis 0 (row 0 on devices 0 and 1, row 1 on 2 and 3): the
        // mean is over the three healthy devices' rows.
        for gone in [0, 2] {
            let l = Loaded::in_memory(meta(failed(gone), vec![]), programs(gone), Box::new(()), &[]).unwrap();
            let xs = iota(&[2, 6]);
            let got = l.run(&HashMap::from([("x".to_string(), xs.clone())])).unwrap();
            let rows = xs.as_f32().unwrap();
            let block = |d: usize| &rows[6 * (d / 2)..6 * (d / 2) + 6];
            let want: Vec<f32> =
                (0..6).map(|i| (0..4).filter(|&d| d != gone).map(|d| block(d)[i]).sum::<f32>() / 3.0).collect();
            assert_eq!(got["s"].as_f32().unwrap(), &want[..], "device {gone} failed");
        }
        // A corrupt degradation or model axis is refused, not a panic.
        let e = |meta: Meta| Loaded::in_memory(meta, programs(2), Box::new(()), &[]).err().map(|e| e.to_string());
        assert_eq!(e(meta(failed(9), vec![])).unwrap(), "degraded device 9 is not in the [2, 2] mesh");
        assert_eq!(e(meta(failed(2), vec![5])).unwrap(), "model axis 5 is not an axis of the [2, 2] mesh");
        // Without the degradation, the empty program is refused.
        assert!(e(meta(Default::default(), vec![])).unwrap().contains("device 2 (1,0)"));
    }

    /// Host `.0` of two, the other one stopped: an exchange waits out its timeout with its
    /// first receive pending, else its first send, as over MPI (`Threads` buffers sends, so
    /// with it a send never waits for its receiver).
    struct Alone(usize);

    impl Transport for Alone {
        fn rank(&self) -> usize {
            self.0
        }

        fn size(&self) -> usize {
            2
        }

        fn exchange(
            &self,
            sends: &[Outgoing],
            recvs: &mut [Incoming],
            timeout: Duration,
            _: &dyn Fn() -> bool,
        ) -> std::result::Result<(), Stall> {
            let pending = match (recvs.is_empty(), sends.is_empty()) {
                (false, _) => Pending::Recv(0),
                (true, false) => Pending::Send(0),
                (true, true) => return Ok(()),
            };
            std::thread::sleep(timeout);
            Err(Stall::Timeout(pending))
        }
    }

    #[test]
    fn a_gather_that_times_out_names_the_host_it_waited_for() {
        // One device per host, each returning its block of x as y: host 1 sends its block
        // to host 0, which waits for it.
        let m = Mesh { shape: vec![2], axes: vec!["a".into()], topology: Topology::Mesh };
        let gather = |transport: Arc<dyn Transport>| {
            let split = |n: &str| io(n, DType::F32, &[4], &[Some(0)]);
            let programs = (0..2).map(|d| program(d, &[8], vec![], vec![0], vec![0])).collect();
            let mut l = load(&m, vec![split("x")], vec![split("y")], programs).unwrap();
            l.meta.hosts = vec![vec![0], vec![1]];
            l.set_transport(transport).unwrap();
            l.set_timeout(Duration::from_millis(50));
            format!("{:#}", l.run(&HashMap::from([("x".to_string(), iota(&[4]))])).unwrap_err())
        };
        // Host 0 stopped before it took host 1's block.
        assert_eq!(
            gather(Arc::new(Alone(1))),
            "gathering the outputs on host 0: on host 1 (device 1), nothing was taken by host 0 (device 0) within 50ms"
        );
        // Host 1 never sent it (it never ran).
        assert_eq!(
            gather(Threads::joined(2).swap_remove(0)),
            "gathering the outputs on host 0: on host 0 (device 0), nothing came from host 1 (device 1) within 50ms"
        );
    }
}

#[cfg(test)]
mod transfer_tests {
    use meshc_ir::DType;

    use super::tests::f32_matmul;
    use super::*;
    use crate::format::mesh::Topology;
    use crate::format::program::{Protocol, Step, Transfer};

    fn two() -> Mesh {
        Mesh { shape: vec![2], axes: vec!["a".into()], topology: Topology::Mesh }
    }

    fn program(device: usize, steps: Vec<Step>) -> Program {
        // b0: the input, b1: what is received, b2: the output.
        let buffers = (0..3)
            .map(|i| Buffer {
                name: format!("b{i}"),
                bytes: 16,
                storage: Storage::Arena { offset: 64 * i },
                mask: None,
            })
            .collect();
        Program {
            device,
            arena_bytes: 192,
            buffers,
            kernels: vec![],
            steps,
            inputs: vec![0],
            outputs: vec![1],
            streams: Default::default(),
        }
    }

    fn send(key: &str, to: usize, protocol: Protocol, b: usize) -> Step {
        let t = Transfer { key: key.into(), peer: to, bytes: 16, protocol };
        Step { node: format!("send {key}"), exec: Exec::Send(t), buffers: vec![b], why: None }
    }

    fn recv(key: &str, from: usize, protocol: Protocol) -> Step {
        let t = Transfer { key: key.into(), peer: from, bytes: 16, protocol };
        Step { node: format!("recv {key}"), exec: Exec::Recv(t), buffers: vec![1], why: None }
    }

    fn load(programs: Vec<Program>) -> Result<Loaded> {
        let io = |n: &str| IoSpec::new(n, &TensorType::new(DType::F32, vec![4]));
        let meta = Meta {
            graph: "t".into(),
            target: "test".into(),
            features: vec![],
            mesh: two(),
            flops: 0,
            inputs: vec![io("x")],
            outputs: vec![io("y")],
            degraded: Default::default(),
            model_axes: Vec::new(),
            hosts: Vec::new(),
        };
        Loaded::in_memory(meta, programs, Box::new(()), &[])
    }

    fn x() -> HashMap<String, Tensor> {
        HashMap::from([("x".to_string(), Tensor::f32(vec![4], vec![1.0, 2.0, 3.0, 4.0]))])
    }

    #[test]
    fn each_protocol_delivers_the_data() {
        for protocol in [Protocol::Move, Protocol::Copy] {
            // Device 0 sends its input to device 1, which sends it back: y is x on both.
            let l = load(vec![
                program(0, vec![send("there", 1, protocol, 0), recv("back", 1, protocol)]),
                program(1, vec![recv("there", 0, protocol), send("back", 0, protocol, 1)]),
            ])
            .unwrap();
            for _ in 0..2 {
                assert_eq!(l.run(&x()).unwrap()["y"], x()["x"], "{protocol:?}");
            }
        }
    }

    #[test]
    fn a_recv_whose_send_never_comes_times_out_naming_key_and_devices() {
        // Both devices receive first: each waits for a send the other reaches only after.
        let l = load(vec![
            program(0, vec![recv("b", 1, Protocol::Copy), send("a", 1, Protocol::Copy, 0)]),
            program(1, vec![recv("a", 0, Protocol::Copy), send("b", 0, Protocol::Copy, 0)]),
        ])
        .unwrap();
        l.set_timeout(Duration::from_millis(200));
        let start = Instant::now();
        let e = l.run(&x()).unwrap_err().to_string();
        assert!(start.elapsed() < Duration::from_secs(5), "the other device must stop at once");
        let a = "device 1 (1): node 'recv a': recv 'a' on device 1 from device 0: no send came within 200ms";
        let b = "device 0 (0): node 'recv b': recv 'b' on device 0 from device 1: no send came within 200ms";
        assert!(e == a || e == b, "{e}");
        // The next run starts afresh (and fails the same way).
        assert!(l.run(&x()).unwrap_err().to_string().contains("no send came within 200ms"));
    }

    #[test]
    fn a_failing_sender_stops_its_receiver() {
        let bad = f32_matmul(&[2, 3], &[2, 3], &[2, 3]);
        let good = f32_matmul(&[2, 2], &[2, 2], &[2, 2]);
        let mut l = load(vec![
            program(
                0,
                vec![
                    Step { node: "h".into(), exec: good, buffers: vec![2, 0, 0], why: None },
                    send("a", 1, Protocol::Copy, 2),
                ],
            ),
            program(1, vec![recv("a", 0, Protocol::Copy)]),
        ])
        .unwrap();
        // Shapes that do not fit pass no load check: the step is broken after loading.
        l.programs[0].steps[0].exec = bad;
        let start = Instant::now();
        let e = l.run(&x()).unwrap_err().to_string();
        assert!(e.starts_with("device 0 (0): node 'h': matmul"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn transfers_that_do_not_pair_up_are_refused() {
        let refuse = |p0: Vec<Step>, p1: Vec<Step>| match load(vec![program(0, p0), program(1, p1)]) {
            Ok(_) => String::new(),
            Err(e) => format!("{e:#}"),
        };
        let ok = || (vec![send("a", 1, Protocol::Move, 0)], vec![recv("a", 0, Protocol::Move)]);
        assert_eq!(refuse(ok().0, ok().1), "");
        assert_eq!(refuse(ok().0, vec![]), "device 0 (0): node 'send a' sends 'a', which no device receives");
        assert_eq!(refuse(vec![], ok().1), "device 1 (1): node 'recv a' receives 'a', which no device sends");
        assert_eq!(
            refuse(ok().0, vec![recv("a", 0, Protocol::Copy)]),
            "device 0 (0): node 'send a' sends 'a' unlike device 1 (1) receives it"
        );
        assert_eq!(
            refuse(vec![send("a", 0, Protocol::Move, 0)], ok().1),
            "device 0 (0): node 'send a': transfer 'a' with device 0"
        );
        let twice = [send("a", 1, Protocol::Move, 0), send("a", 1, Protocol::Move, 0)].to_vec();
        assert!(refuse(twice, ok().1).contains("sends 'a' as node 'send a' on device 0 (0) does"));
    }
}
