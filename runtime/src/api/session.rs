//! A model ready to run, called many times. Its arenas (one per device) are allocated once
//! and its device threads started by the first call of a multi-device model, then reused
//! by every call; the weights stay where the artifact was read.
//!
//! A `Session` is `Send + Sync`: any number of threads may call it at once, and every call
//! is correct. Calls on one session are queued (each holds the session's arenas while it
//! runs, as the runner's lock orders them): a single-device run already spreads its large
//! kernels and library matmuls over every core, and a mesh run keeps one thread per device
//! and stream busy, so running two calls over the same cores at once would only make each
//! slower. Calls that should run side by side (small models on many cores) take a session
//! each: sessions of one `Model` share its weights and code mapping but not arenas.

use std::collections::BTreeMap;
use std::sync::Mutex;

use meshc_ir::{DType, Tensor, TensorType};

use crate::api::error::Error;
use crate::api::model::Model;
use crate::api::view::{TensorView, TensorViewMut};
use crate::exec::mismatch::Mismatch;
use crate::exec::resident::Resident;
use crate::exec::runner::Loaded;
use crate::format::program::IoSpec;

/// How many inputs a call keeps track of on the stack; a graph with more takes one
/// allocation per call for them.
const STACK_INPUTS: usize = 16;

/// A model's runner, shared by the threads that call it.
pub struct Session {
    loaded: Loaded,
    /// The state on the devices (`set_state`), read and written by `step`.
    state: Mutex<Option<Held>>,
}

/// State on the devices, and what a generation knows of it.
struct Held {
    resident: Resident,
    /// Set by a generation (`set_state_with`): along each state tensor's `ctx` dim, the
    /// positions from this one on still hold the zeros it started with, since its steps
    /// write only the positions they are fed. `None` after `set_state` or a step by hand,
    /// which may have written anything.
    zero_from: Option<usize>,
}

impl Session {
    /// A session on `model`: its runner, arenas allocated (threads start with the first call).
    pub fn new(model: &Model) -> Result<Session, Error> {
        Ok(Session { loaded: model.load()?, state: Mutex::new(None) })
    }

    /// Runs only this host's devices of a model compiled with hosts, joining the other
    /// hosts' processes over `transport` (`Loaded::set_transport`): every host then makes
    /// the same calls in the same order, and only host 0's return outputs. Before the
    /// first call.
    pub fn set_transport(
        &mut self,
        transport: std::sync::Arc<dyn crate::exec::runner::Transport>,
    ) -> Result<(), Error> {
        // State kept from before holds blocks for the devices that were local then.
        *self.state.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        self.loaded.set_transport(transport).map_err(|e| Error::from_run(e, Error::State))
    }

    /// The runner itself, for what the embedding API does not cover (traces, link
    /// statistics, degraded meshes): `crate::exec::runner::Loaded`.
    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    /// Runs the model once on `inputs` (every input by name, once), returning every output
    /// as an owned tensor.
    pub fn run(&self, inputs: &[(&str, TensorView)]) -> Result<BTreeMap<String, Tensor>, Error> {
        self.call(inputs, None, &mut Outputs::Owned(BTreeMap::new()))
    }

    /// Runs the model once on `inputs`, writing the outputs named in `outputs` into the
    /// caller's buffers (others are not copied out). Inputs are read where they are, outputs
    /// copied once, from the device buffers into the caller's. On one device, a call after
    /// the first allocates nothing on the heap (runtime/tests/no_alloc.rs counts): the
    /// runner's bookkeeping of a call is kept in the session, under the lock that queues
    /// calls.
    pub fn run_into(&self, inputs: &[(&str, TensorView)], outputs: &mut [(&str, TensorViewMut)]) -> Result<(), Error> {
        self.check_outputs(outputs)?;
        self.call(inputs, None, &mut Outputs::Into(outputs)).map(drop)
    }

    /// Puts a training artifact's state on the devices (every tensor of
    /// `Model::state_names`, by name): the next `step` reads it there. The artifact's
    /// initial state is `crate::tools::steps::State::initial`; a checkpoint's is
    /// `State::read`.
    pub fn set_state(&self, state: &BTreeMap<String, Tensor>) -> Result<(), Error> {
        let names = self.state_names();
        if names.is_empty() {
            return Err(Error::State("the model has no state (compile it with --loss NAME --optimizer SPEC)".into()));
        }
        let types = self.loaded.meta.inputs.iter().filter(|s| names.contains(&s.name));
        for spec in types {
            let given = state.get(&spec.name).map(Tensor::ty);
            self.loaded.check_input(spec, given).map_err(|e| Error::State(format!("state: {e:#}")))?;
        }
        let resident = self.loaded.upload(state, &names, meshc_ir::optim::next_name);
        let resident = resident.map_err(|e| Error::from_run(e, Error::State))?;
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some(Held { resident, zero_from: None });
        Ok(())
    }

    /// Replaces the state on the devices with zeros but for what `fill(k, i, d, dst)`
    /// writes into device `d`'s block of the `k`th state tensor (in `state_names` order;
    /// input `i`): a decoder's caches start so, without building whole tensors of zeros
    /// on the host (`Loaded::upload_with`). `fill` writes the first `written` positions
    /// along each `ctx` dim whole, and nothing else; the steps to come (`generation_step`)
    /// write only positions below `reach`.
    pub(crate) fn set_state_with(
        &self,
        (written, reach): (usize, usize),
        fill: impl Fn(usize, usize, usize, &mut [u8]),
    ) -> Result<(), Error> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // A generation's state is rewritten where it is. Fresh blocks would be zero pages
        // mapped in as they are first touched, and a cache whose keys are kept transposed
        // is touched on every page by the prefill: 13-16 ms for GPT-2 small's 1024
        // positions. Here only the positions the last generation wrote past `written` are
        // zeroed, in pages mapped already.
        if let Some(Held { resident, zero_from: Some(from) }) = guard.as_mut() {
            let axes: Vec<Option<usize>> = self.state_specs().map(ctx_axis).collect();
            let stale = (written, *from);
            self.loaded.rewrite(resident, |k, i, d, dst| {
                match axes[k] {
                    Some(axis) => self.loaded.zero_positions(i, d, axis, stale, dst),
                    None => dst.fill(0),
                }
                fill(k, i, d, dst);
            });
            *from = written.max(reach);
            return Ok(());
        }
        // The old state goes first, so that its memory serves the new one.
        *guard = None;
        let resident = self.loaded.upload_with(&self.state_names(), meshc_ir::optim::next_name, fill);
        let resident = resident.map_err(|e| Error::from_run(e, Error::State))?;
        *guard = Some(Held { resident, zero_from: Some(written.max(reach)) });
        Ok(())
    }

    /// The state on the devices, gathered into whole tensors (what a checkpoint holds).
    /// Under hosts (`set_transport`) every host calls it at the same point; host 0 gets
    /// the tensors, the others an empty map (`Loaded::download`).
    pub fn state(&self) -> Result<BTreeMap<String, Tensor>, Error> {
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let held = guard.as_ref().ok_or_else(no_state)?;
        self.loaded.download(&held.resident).map_err(|e| Error::from_run(e, Error::State))
    }

    /// `state`, each tensor named in `outputs` copied into the caller's buffer, which must
    /// have its dtype and shape. Under hosts only host 0's buffers are written (every host
    /// calls it, as `state`).
    pub fn state_into(&self, outputs: &mut [(&str, TensorViewMut)]) -> Result<(), Error> {
        let state = self.state()?;
        if self.loaded.host() != 0 {
            return Ok(());
        }
        for (name, view) in outputs.iter_mut() {
            let Some(t) = state.get(*name) else {
                return Err(Error::State(format!(
                    "no state tensor '{name}' (the state: {})",
                    self.state_names().join(", ")
                )));
            };
            if t.ty() != view.ty() {
                return Err(Error::State(format!("state tensor '{name}' is {}, the buffer {}", t.ty(), view.ty())));
            }
            view.bytes.copy_from_slice(crate::exec::io::le_bytes(t));
        }
        Ok(())
    }

    /// One training step: `inputs` are the batch (every input that is not state), the
    /// state on the devices is read and replaced by the step's `next.S`, and the other
    /// outputs (the loss) are returned.
    pub fn step(&self, inputs: &[(&str, TensorView)]) -> Result<BTreeMap<String, Tensor>, Error> {
        self.step_on(inputs, &mut Outputs::Owned(BTreeMap::new()), true)
    }

    /// `step`, the outputs named in `outputs` written into the caller's buffers as
    /// `run_into` writes them.
    pub fn step_into(&self, inputs: &[(&str, TensorView)], outputs: &mut [(&str, TensorViewMut)]) -> Result<(), Error> {
        self.check_outputs(outputs)?;
        self.step_on(inputs, &mut Outputs::Into(outputs), true).map(drop)
    }

    /// `step_into` of a generation, which writes only below the `reach` it gave
    /// `set_state_with`.
    pub(crate) fn generation_step(
        &self,
        inputs: &[(&str, TensorView)],
        outputs: &mut [(&str, TensorViewMut)],
    ) -> Result<(), Error> {
        self.check_outputs(outputs)?;
        self.step_on(inputs, &mut Outputs::Into(outputs), false).map(drop)
    }

    /// A step on the state on the devices. Where the buffer plan writes some next.S over
    /// S itself (`Loaded::writes_state_in_place`: a decoder's caches), a run that fails
    /// may have written part of it: that state is dropped, so the next step asks for
    /// `set_state` instead of running on it.
    fn step_on(
        &self,
        inputs: &[(&str, TensorView)],
        out: &mut Outputs,
        by_hand: bool,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let held = guard.as_mut().ok_or_else(no_state)?;
        if by_hand {
            held.zero_from = None;
        }
        let resident = &mut held.resident;
        let in_place = self.loaded.writes_state_in_place(resident);
        let result = self.call(inputs, Some(resident), out);
        if in_place && matches!(result, Err(Error::Run(_))) {
            *guard = None;
        }
        result
    }

    pub(crate) fn state_names(&self) -> Vec<String> {
        self.state_specs().map(|i| i.name.clone()).collect()
    }

    /// The state inputs, in `state_names` order.
    fn state_specs(&self) -> impl Iterator<Item = &IoSpec> {
        let meta = &self.loaded.meta;
        let next = |n: &str| meta.outputs.iter().any(|o| o.name == meshc_ir::optim::next_name(n));
        meta.inputs.iter().filter(move |i| next(&i.name))
    }

    /// Every output buffer named once, for an output of the graph, of its type.
    fn check_outputs(&self, outputs: &[(&str, TensorViewMut)]) -> Result<(), Error> {
        let specs = &self.loaded.meta.outputs;
        for (k, (name, view)) in outputs.iter().enumerate() {
            let Some(spec) = specs.iter().find(|s| s.name == *name) else {
                return Err(Mismatch::unknown(name, specs.iter().map(|s| s.name.as_str()), true).into());
            };
            if outputs[..k].iter().any(|(n, _)| n == name) {
                return Err(Mismatch::DuplicateOutput { name: name.to_string() }.into());
            }
            if !self.fits(spec, view.dtype, view.shape) {
                let want = spec.ty().ok_or_else(|| Error::Run(format!("output '{name}' has unknown dtype")))?;
                return Err(Mismatch::WrongOutput { name: name.to_string(), got: view.ty(), want }.into());
            }
        }
        Ok(())
    }

    /// Whether a tensor of `dtype` and `shape` may stand for `spec`: its type, or with
    /// symbolic dims its dtype and rank (the call's sizes are checked when they bind).
    fn fits(&self, spec: &IoSpec, dtype: DType, shape: &[usize]) -> bool {
        let shaped = match self.loaded.meta.symbolic {
            Some(_) => spec.shape.len() == shape.len(),
            None => spec.shape == shape,
        };
        shaped && spec.elem() == Some(dtype)
    }

    /// A run: the inputs checked and put in the metadata's order (the state's left out),
    /// the outputs handed to `out`.
    fn call(
        &self,
        inputs: &[(&str, TensorView)],
        resident: Option<&mut Resident>,
        out: &mut Outputs,
    ) -> Result<BTreeMap<String, Tensor>, Error> {
        let specs = &self.loaded.meta.inputs;
        let state = |i: usize| resident.as_ref().is_some_and(|r| r.holds_input(i));
        let fed = |name: &str| specs.iter().enumerate().position(|(i, s)| s.name == name && !state(i));
        let (mut stack, mut heap) = ([&[][..]; STACK_INPUTS], Vec::new());
        let bytes: &mut [&[u8]] = slots(&mut stack, &mut heap, specs.len());
        let (mut stack, mut heap) = ([&[][..]; STACK_INPUTS], Vec::new());
        let shapes: &mut [&[usize]] = slots(&mut stack, &mut heap, specs.len());
        for (shape, spec) in shapes.iter_mut().zip(specs) {
            *shape = &spec.shape;
        }
        for (k, (name, view)) in inputs.iter().enumerate() {
            let Some(i) = fed(name) else {
                let names = specs.iter().enumerate().filter(|&(i, _)| !state(i)).map(|(_, s)| s.name.as_str());
                return Err(Mismatch::unknown(name, names, false).into());
            };
            if inputs[..k].iter().any(|(n, _)| n == name) {
                return Err(Mismatch::DuplicateInput { name: name.to_string() }.into());
            }
            let spec = &specs[i];
            if !self.fits(spec, view.dtype, view.shape) {
                self.loaded.check_input(spec, Some(view.ty())).map_err(|e| Error::from_run(e, Error::Run))?;
            }
            bytes[i] = view.bytes;
            shapes[i] = view.shape;
        }
        for (_, spec) in specs.iter().enumerate().filter(|&(i, _)| !state(i)) {
            if !inputs.iter().any(|(n, _)| *n == spec.name) {
                self.loaded.check_input(spec, None).map_err(|e| Error::from_run(e, Error::Run))?;
            }
        }
        let meta = &self.loaded.meta;
        let mut put = |o: usize, shape: &[usize], b: &[u8]| -> anyhow::Result<()> {
            let spec = &meta.outputs[o];
            let dtype = spec.elem().ok_or_else(|| anyhow::anyhow!("output '{}' has unknown dtype", spec.name))?;
            match out {
                Outputs::Owned(map) => {
                    map.insert(spec.name.clone(), Tensor::from_le_bytes(&TensorType::new(dtype, shape.to_vec()), b));
                }
                Outputs::Into(views) => {
                    if let Some((_, v)) = views.iter_mut().find(|(n, _)| *n == spec.name) {
                        // With symbolic dims, the call's sizes decide the output's.
                        if v.shape != shape {
                            let (got, want) = (v.ty(), TensorType::new(dtype, shape.to_vec()));
                            return Err(Mismatch::WrongOutput { name: spec.name.clone(), got, want }.into());
                        }
                        v.bytes.copy_from_slice(b);
                    }
                }
            }
            Ok(())
        };
        self.loaded.run_bytes(bytes, shapes, resident, false, &mut put).map_err(|e| Error::from_run(e, Error::Run))?;
        match out {
            Outputs::Owned(map) => Ok(std::mem::take(map)),
            Outputs::Into(_) => Ok(BTreeMap::new()),
        }
    }
}

/// `n` slots of `T`'s default: on the stack up to `STACK_INPUTS` of them, else in `heap`
/// (only a call with more inputs than that allocates).
fn slots<'s, T: Copy + Default>(stack: &'s mut [T; STACK_INPUTS], heap: &'s mut Vec<T>, n: usize) -> &'s mut [T] {
    if n <= STACK_INPUTS {
        &mut stack[..n]
    } else {
        heap.resize(n, T::default());
        heap
    }
}

/// Where a run's outputs go.
enum Outputs<'a, 'b, 'c> {
    Owned(BTreeMap<String, Tensor>),
    Into(&'a mut [(&'b str, TensorViewMut<'c>)]),
}

/// The axis of a state tensor that its dim names call `ctx`: a cache's positions.
pub(crate) fn ctx_axis(spec: &IoSpec) -> Option<usize> {
    spec.dim_names().iter().position(|n| n.as_deref() == Some("ctx"))
}

fn no_state() -> Error {
    Error::State("no state on the devices: call set_state first".into())
}
