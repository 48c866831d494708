//! A run: every device's streams on the device threads (`crate::exec::threads`), or the
//! calling thread for a single stream. The main stream of each device copies its blocks of
//! the inputs in; each stream runs its steps in order, waiting for the events of other
//! streams; a stream that waits for another one whose thread has not started yet runs that
//! stream's steps itself (`drive`); the main stream joins the others and hands back where
//! the outputs are. A failing or panicking stream poisons the fabric and every device's
//! events, so that the others stop.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::{Tensor, TensorType};

use crate::comm::error::RunError;
use crate::comm::fabric;
use crate::exec::gate::{self, Gate};
use crate::exec::io::le_bytes;
use crate::exec::resident::Resident;
use crate::exec::runner::{Loaded, State};
use crate::exec::shared::{DeviceShared, Lane, Scratch, StepTime};
use crate::exec::threads::Devices;
use crate::format::program::{Exec, Storage};

/// What the devices of one run share: the inputs' bytes (by input; those of resident state
/// unused), which are resident state, when the run started, whether to time the steps, and
/// every device's shared state (so a failing stream can wake all waiters).
#[derive(Clone, Copy)]
struct RunCtx<'a> {
    inputs: &'a [&'a [u8]],
    /// Per input: whether it is resident state, already on the device.
    resident: &'a [bool],
    epoch: Instant,
    timed: bool,
    devices: &'a [DeviceShared],
    /// The sizes this call binds (none without symbolic dims).
    sizes: &'a super::sizes::Sizes,
    /// Where long compute steps take a core, when the run has more threads than there are
    /// cores (`crate::exec::gate`).
    gate: Option<&'static Gate>,
}

/// Where a run hands each output: its index in the metadata, its shape at the call's sizes
/// and its bytes.
pub type OutputSink<'a> = dyn FnMut(usize, &[usize], &[u8]) -> Result<()> + 'a;

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
    args: &'a mut Vec<*mut u8>,
}

impl Loaded {
    /// Runs the programs once.
    pub fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        self.run_tensors(inputs, None, None)
    }

    /// Runs the programs once with the state in `resident` (`Loaded::upload`) on the
    /// devices: `inputs` holds only the other inputs, the state's outputs stay on the
    /// devices as the next run's state, and the other outputs are returned.
    pub fn run_resident(
        &self,
        inputs: &HashMap<String, Tensor>,
        resident: &mut Resident,
    ) -> Result<BTreeMap<String, Tensor>> {
        self.run_tensors(inputs, Some(resident), None)
    }

    /// Runs the programs once, then reports every step's time to `timed`, device by device
    /// in step order (the per-step profile behind traces and the kernel benchmarks).
    pub fn run_timed(
        &self,
        inputs: &HashMap<String, Tensor>,
        timed: &mut dyn FnMut(&StepTime),
    ) -> Result<BTreeMap<String, Tensor>> {
        self.run_tensors(inputs, None, Some(timed))
    }

    /// `run`, `run_resident` and `run_timed`: the inputs checked, the outputs as tensors.
    fn run_tensors(
        &self,
        inputs: &HashMap<String, Tensor>,
        resident: Option<&mut Resident>,
        timed: Option<&mut dyn FnMut(&StepTime)>,
    ) -> Result<BTreeMap<String, Tensor>> {
        let is_state = |i: usize| resident.as_ref().is_some_and(|r| r.holds_input(i));
        let from_host: Vec<bool> = (0..self.meta.inputs.len()).map(|i| !is_state(i)).collect();
        self.check_given(inputs, &from_host)?;
        let bytes: Vec<&[u8]> = (self.meta.inputs.iter().zip(&from_host))
            .map(|(s, &h)| if h { le_bytes(&inputs[&s.name]) } else { &[] })
            .collect();
        let shapes: Vec<&[usize]> = (self.meta.inputs.iter().zip(&from_host))
            .map(|(s, &h)| if h { inputs[&s.name].shape.as_slice() } else { s.shape.as_slice() })
            .collect();
        let mut results = BTreeMap::new();
        let mut put = |o: usize, shape: &[usize], b: &[u8]| -> Result<()> {
            let spec = &self.meta.outputs[o];
            let dtype = spec.elem().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
            results.insert(spec.name.clone(), Tensor::from_le_bytes(&TensorType::new(dtype, shape.to_vec()), b));
            Ok(())
        };
        let times = self.run_bytes(&bytes, &shapes, resident, timed.is_some(), &mut put)?;
        if let Some(timed) = timed {
            times.iter().for_each(timed);
        }
        Ok(results)
    }

    /// Runs the programs once on inputs given as their little-endian bytes, in the
    /// metadata's order (those of state in `resident` unused: it is on the devices), and
    /// hands each output the run returns to `out` (its index in the metadata, its bytes)
    /// where it lies, without copying it first: the one entry behind every other run.
    /// Each input must be exactly its type's bytes (`check_input` checks the types).
    pub fn run_bytes(
        &self,
        inputs: &[&[u8]],
        shapes: &[&[usize]],
        mut resident: Option<&mut Resident>,
        timed: bool,
        out: &mut OutputSink,
    ) -> Result<Vec<StepTime>> {
        let is_state = |i: usize| resident.as_ref().is_some_and(|r| r.holds_input(i));
        if inputs.len() != self.meta.inputs.len() || shapes.len() != inputs.len() {
            bail!("{} inputs ({} shapes) for a graph of {}", inputs.len(), shapes.len(), self.meta.inputs.len());
        }
        let mut state = self.state.lock().map_err(|_| anyhow!("a previous run panicked"))?;
        let State { arenas, devices, scratch } = &mut *state;
        let Scratch { resident: taken, returned, devices: shared, args, assembled, lanes: scratch_lanes, sizes } =
            scratch;
        // Resident state is on the devices at the shape it was uploaded with.
        sizes.bind(&self.meta, |i| if is_state(i) { self.meta.inputs[i].shape.as_slice() } else { shapes[i] })?;
        for (i, (spec, b)) in self.meta.inputs.iter().zip(inputs).enumerate().filter(|&(i, _)| !is_state(i)) {
            let dtype = spec.elem().ok_or_else(|| anyhow!("input '{}' has unknown dtype {}", spec.name, spec.dtype))?;
            // `bind` kept every shape within the one the buffers were laid out for.
            if b.len() != dtype.size_bytes() * shapes[i].iter().product::<usize>() {
                bail!("input '{}': {} bytes for {}", spec.name, b.len(), TensorType::new(dtype, shapes[i].to_vec()));
            }
        }
        taken.clear();
        taken.extend((0..self.meta.inputs.len()).map(is_state));
        returned.clear();
        returned.extend((0..self.meta.outputs.len()).map(|o| resident.as_ref().is_none_or(|r| !r.holds_output(o))));
        self.fabric.reset();
        self.exchange.reset();
        if let Some(h) = &self.hosts {
            h.reset();
        }
        let epoch = Instant::now();
        let mesh = &self.meta.mesh;
        for (d, ((p, arena), shared)) in self.programs.iter().zip(arenas.iter_mut()).zip(shared.iter_mut()).enumerate()
        {
            shared.reset();
            let ptrs = &mut shared.ptrs;
            let base = arena.as_mut_slice().as_mut_ptr();
            for (ptr, b) in ptrs.iter_mut().zip(&p.buffers) {
                *ptr.get_mut() = match b.storage {
                    // SAFETY (both): `new` checked every buffer lies inside its storage.
                    Storage::Arena { offset } => unsafe { base.add(offset) },
                    // Kernels never write their operands, so weights stay read-only.
                    Storage::Weights { offset } => unsafe { self.weights.bytes().as_ptr().add(offset) as *mut u8 },
                    // Kernels only read it: the run's table, filled by `bind` above.
                    Storage::Sizes => sizes.table.as_mut_ptr() as *mut u8,
                };
            }
            // Resident state: the step reads S where it lives and writes next.S into
            // the slot's other buffer (an arena output only: a weight is never written).
            // Where the buffer plan gave next.S the bytes of S (no step reads S after
            // next.S is written, or the step writing it reads S in place: a cache updated
            // at one position), next.S is written over S itself and nothing is swapped.
            for (&(i, o), slot) in resident.iter_mut().flat_map(|r| r.pairs.iter().zip(r.slots[d].iter_mut())) {
                let (cur, next) = slot.ptrs();
                let (ib, ob) = (p.inputs[i], p.outputs[o]);
                *ptrs[ib].get_mut() = cur;
                if ob != ib && matches!(p.buffers[ob].storage, Storage::Arena { .. }) {
                    let over = p.buffers[ob].storage == p.buffers[ib].storage;
                    *ptrs[ob].get_mut() = if over { cur } else { next };
                }
            }
        }
        let (taken, returned, shared): (&[bool], &[bool], &[DeviceShared]) = (taken, returned, shared);
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
        let sizes: &super::sizes::Sizes = sizes;
        // A degraded device runs nothing (the fabric leaves it out of every collective);
        // another host's devices run there.
        let healthy = |d: usize| self.healthy(d);
        let ran = |d: usize| healthy(d) && self.hosts.as_ref().is_none_or(|h| h.is_local(d));
        let threads = scratch_lanes.iter().filter(|l| ran(l.device)).count();
        let gate = (threads > gate::cores()).then(gate::gate);
        let ctx = RunCtx { inputs, resident: taken, epoch, timed, devices: shared, sizes, gate };
        if (0..mesh.devices()).map(|d| self.lanes[d].active().count()).sum::<usize>() == 1 {
            let times = self.device_run(0, 0, ctx, &Cell::new(0), self.threads, &mut args.0)?;
            let outputs = &self.programs[0].outputs;
            let at = |o: usize| shared[0].ptrs[outputs[o]].load(Ordering::Relaxed) as *const u8;
            settle(&|_, o| Some(at(o)));
            for o in (0..self.meta.outputs.len()).filter(|&o| returned[o]) {
                // SAFETY: the buffer holds the output's bytes at the upper bounds, of which
                // these sizes' are a prefix (`sizes::check`).
                let bytes = unsafe { std::slice::from_raw_parts(at(o), sizes.output_bytes(&self.meta, o)?) };
                self.host_copies.fetch_add(1, Ordering::Relaxed);
                out(o, &sizes.outputs[o], bytes)?;
            }
            return Ok(times);
        }
        let devices = match devices {
            Some(d) => d,
            None => devices.insert(Devices::start(scratch_lanes.len())?),
        };
        let lanes: &[Lane] = scratch_lanes;
        // A lane whose job never reports (its thread failed outside it) reads as failed.
        lanes.iter().for_each(|l| *l.times.lock() = None);
        devices.run(&|l: usize| {
            let lane = &lanes[l];
            let times = match ran(lane.device) {
                true => self.device_thread(lane, ctx),
                false => Some(Vec::new()),
            };
            *lane.times.lock() = times;
        });
        if let Some(reason) = self.fabric.poisoned() {
            return Err(reason.into());
        }
        if lanes.iter().any(|l| l.times.lock().is_none()) {
            bail!("a device failed");
        }
        // Where device d left output o: it ran (its main stream is done), or `None`.
        let left = |d: usize, o: usize| {
            ran(d).then(|| shared[d].ptrs[self.programs[d].outputs[o]].load(Ordering::Relaxed) as *const u8)
        };
        settle(&left);
        // Resident state stays on its hosts (`Loaded::download` gathers it when asked).
        let remote = match &self.hosts {
            Some(hosts) => self.gather_outputs(hosts, &|o| returned[o], &left, healthy)?,
            None => HashMap::new(),
        };
        // Device by device in step order, whichever thread ran them.
        let times = || -> Vec<StepTime> {
            if !timed {
                return Vec::new();
            }
            let mut all: Vec<StepTime> = lanes.iter().flat_map(|l| l.times.lock().take().unwrap_or_default()).collect();
            all.sort_by_key(|t| (t.device, t.step));
            all
        };
        if self.host() != 0 {
            return Ok(times());
        }
        assembled.resize_with(self.meta.outputs.len(), Vec::new);
        for (i, buf) in assembled.iter_mut().enumerate().filter(|&(i, _)| returned[i]) {
            let len = self.outputs[i].block_bytes;
            let block = |d: usize| match (remote.get(&(i, d)), left(d, i)) {
                (Some(b), _) => b.as_slice(),
                // SAFETY: the buffer holds the device's block of the output; its job is done.
                (None, Some(at)) => unsafe { std::slice::from_raw_parts(at, len) },
                (None, None) => &[],
            };
            // The call's sizes use a prefix of the output laid out at the upper bounds.
            let len = sizes.output_bytes(&self.meta, i)?;
            let whole = self.assemble(i, &block, buf)?;
            let bytes = whole
                .get(..len)
                .ok_or_else(|| anyhow!("output '{}' is short of its sizes", self.meta.outputs[i].name))?;
            out(i, &sizes.outputs[i], bytes)?;
        }
        Ok(times())
    }

    /// One lane's thread of a multi-device (or multi-stream) run: its step times, or its
    /// error or panic poisons the fabric and every device's events (the reason names the
    /// device and node) and ends its run with `None`.
    fn device_thread(&self, lane: &Lane, ctx: RunCtx) -> Option<Vec<StepTime>> {
        let (device, stream) = (lane.device, lane.stream);
        let step = Cell::new(usize::MAX);
        let mut args = lane.args.lock();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.device_run(device, stream, ctx, &step, 1, &mut args.0)
        }));
        let cause = match run {
            Ok(Ok(times)) => return Some(times),
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
        let label = self.meta.mesh.device_label(device);
        self.fabric.poison(RunError::OnDevice { device, label, cause: Box::new(cause) });
        ctx.devices.iter().for_each(|d| d.board.poison());
        self.exchange.poison();
        None
    }

    /// Runs stream `stream` of `device`'s program and, for the main stream (0), copies in
    /// the device's inputs first (its block of the split ones), then joins the other streams
    /// (the outputs are then where the device's pointers say); returns the step times.
    /// `step` tracks the running step (for a panic's message); `threads`: the cores its
    /// steps may use; `args`: this thread's scratch for kernel arguments.
    fn device_run(
        &self,
        device: usize,
        stream: usize,
        ctx: RunCtx,
        step: &Cell<usize>,
        threads: usize,
        args: &mut Vec<*mut u8>,
    ) -> Result<Vec<StepTime>> {
        let RunCtx { inputs, devices, .. } = ctx;
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
        for (i, &b) in p.inputs.iter().enumerate().filter(|_| stream == 0) {
            // State already on the device: the buffer points at it (`run_bytes`).
            if ctx.resident[i] {
                continue;
            }
            // SAFETY: the buffer has exactly the bytes of the device's block (check_indices).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr(b), p.buffers[b].bytes) };
            self.cut_block(i, device, inputs[i], dst);
        }
        if stream == 0 {
            board.record(lanes.inputs_event);
        }
        let mut run = StepRun { device, threads, ctx, step, times: Vec::new(), waits: Vec::new(), args };
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
            return Ok(run.times);
        }
        for &e in &lanes.join {
            self.await_event(&mut run, e)?;
        }
        Ok(run.times)
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
        let _permit = match run.ctx.gate {
            Some(g) if gate::gated(st) => Some(g.enter(|| self.fabric.beat(device))),
            _ => None,
        };
        let start = Instant::now();
        let waits = timed.then_some(&mut run.waits);
        self.exec_step((device, i), ptrs, run.args, (run.threads, run.ctx.sizes), waits, start)?;
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
