//! The runner: executes the programs of a compiled graph, one per device of its mesh, over
//! their buffers. It knows nothing of the passes, only what the artifact (or an in-memory
//! compile) provides: metadata, the programs, their kernels in executable memory, and the
//! weights.
//!
//! `Loaded` is a program ready to run. Its parts: `crate::exec::validate` checks what it is
//! handed (`Loaded::new`); a run (`crate::exec::streams`) runs each device's streams on the
//! device threads (`crate::exec::threads`), each step executed by `crate::exec::step`, the
//! inputs and outputs crossing by `crate::exec::io`.
//!
//! A single-device program runs on the calling thread (its library matmuls on all cores).
//! A multi-device one runs one thread per device and stream (`Devices`: started by the
//! first run, kept parked between runs, joined when the `Loaded` drops), each device over
//! its own arena: inputs are scattered (each device's main stream copies its block of every
//! input), each stream runs its steps in order (`Program::streams`; without a plan one
//! stream runs them all), waiting for the events of other streams with blocking waits,
//! collectives meet in the fabric (`crate::comm::fabric`), and the devices that hold the
//! write-back copy of an output block gather it into the result. A
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
//! returns the outputs (the others' return none). Resident state stays where it is used:
//! each host keeps its own devices' blocks, and only `Loaded::download` gathers them on
//! host 0.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::comm::exchange::Exchange;
use crate::comm::fabric::{Fabric, LinkStats};
pub use crate::comm::memory::AlignedBuf;
use crate::comm::transport::Hosts;
/// What joins the processes of the hosts (`set_transport`), for the layers above this one.
pub use crate::comm::transport::Transport;
use crate::exec::blocks::Blocks;
use crate::exec::shared::Scratch;
use crate::exec::threads::Devices;
use crate::exec::validate::{
    check_collectives, check_kernels, check_program, check_transfers, lanes, masks_of, Lanes, Plans,
};
use crate::format::abi::{self, KernelFn, KernelTable};
use crate::format::artifact::{Artifact, SectionKind};
use crate::format::mask::Mask;
use crate::format::program::{CollectiveOp, Exec, Meta, Program};

/// Where the kernels are: an artifact's code section mapped executable, or executable
/// memory an in-memory compile owns (the `Loaded` keeps it alive).
pub enum Code {
    Mapped(memmap2::Mmap),
    InProcess(Box<dyn KernelTable>),
}

/// The weights a loaded program reads: the artifact's weights section, in the memory the
/// artifact was read into (the `Loaded` keeps it alive; several `Loaded` of one artifact
/// share it), or an aligned copy from an in-memory compile.
pub enum Weights {
    Artifact(Arc<Artifact>),
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

/// What runs take one at a time: the arenas, the device threads and the bookkeeping of a
/// run, all kept from one run to the next.
pub(super) struct State {
    /// One per device, allocated once: repeated runs (`--bench`) reuse their pages.
    pub(super) arenas: Vec<AlignedBuf>,
    /// Started by the first multi-device run.
    pub(super) devices: Option<Devices>,
    /// Built with the `Loaded`, so that a run on one device allocates nothing.
    pub(super) scratch: Scratch,
}

/// A program ready to run: the runner's whole view of a compiled graph.
pub struct Loaded {
    pub meta: Meta,
    /// One per device of `meta.mesh`, in device order.
    pub programs: Vec<Program>,
    pub(super) code: Code,
    pub(super) weights: Weights,
    /// std's lock, not `sync`'s: its poisoning is the signal that a run panicked while it
    /// held the arenas, which are then refused to the next run.
    pub(super) state: std::sync::Mutex<State>,
    pub(super) fabric: Fabric,
    /// Per device, the decoded mask record of each masked weight buffer (the library GEMM
    /// path iterates over its runs; the generated kernels read the record themselves).
    pub(super) masks: Vec<HashMap<usize, Mask>>,
    pub(super) exchange: Exchange,
    /// Per device and step: whether a collective may leave its result in the fabric's shared
    /// buffer (no other step writes its result buffer, so the device may read it there).
    pub(super) share: Vec<Vec<bool>>,
    /// Per device, its streams.
    pub(super) lanes: Vec<Lanes>,
    /// Per device and step, its library call as planned when the programs were checked.
    pub(super) plans: Vec<Plans>,
    /// With symbolic dims: the library calls planned again for a call's shapes, and the
    /// symbols' values at the upper bounds (at which the programs are planned).
    pub(super) replans: super::sizes::Replans,
    pub(super) upper: Vec<i64>,
    /// The devices' blocks of each input and each output.
    pub(super) inputs: Vec<Blocks>,
    pub(super) outputs: Vec<Blocks>,
    /// `--fail-device`: this device stops answering at its collective number .1 (from 0).
    pub(super) fail: Option<(usize, usize)>,
    /// What `degrade` added to the artifact's degradation, and whether strictly.
    pub(super) degraded: (crate::format::degradation::Degradation, bool),
    /// The cores the steps of a run with one stream in all may use: its kernels split into
    /// parts and its library calls fork up to this many (`set_threads`). A run with more
    /// streams already keeps the cores busy with its stream threads, one core each.
    pub(super) threads: usize,
    /// Set when this process runs one host's devices (`set_transport`).
    pub(super) hosts: Option<Arc<Hosts>>,
    /// `host_copies`.
    pub(super) host_copies: AtomicU64,
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
        // (Nothing would check the inputs' and outputs' layouts, which only programs that
        // run are checked against.)
        if absent.iter().all(|&a| a) {
            bail!("the artifact names every device of the mesh degraded: none is left to run");
        }
        let mut plans = Vec::with_capacity(devices);
        for (d, program) in programs.iter().enumerate() {
            let check = || check_program(&meta, d, program, bytes.len());
            plans.push(match (absent[d], devices) {
                (true, _) => Vec::new(),
                (false, 1) => check()?,
                (false, _) => check().with_context(|| meta.mesh.device_label(d))?,
            });
        }
        check_kernels(&programs, code_len)?;
        super::sizes::check(&meta, &programs)?;
        let upper = meta.symbolic.as_ref().map_or(Vec::new(), |s| s.upper());
        if let Code::InProcess(t) = &code {
            if let Some(k) = programs.iter().flat_map(|p| &p.kernels).find(|k| t.get(k.offset).is_none()) {
                bail!("kernel {} at offset {} is not a function of the compiled code", k.name, k.offset);
            }
        }
        check_collectives(&meta.mesh, &programs, &absent)?;
        check_transfers(&meta.mesh, &programs)?;
        if let (Code::Mapped(m), Some("1")) = (&code, std::env::var(super::perf_map::VAR).ok().as_deref()) {
            super::perf_map::write(&programs, m.as_ptr());
        }
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
        let lanes: Vec<Lanes> = programs.iter().map(lanes).collect::<Result<_>>()?;
        let (inputs, outputs) = Blocks::of_io(&meta);
        let state =
            std::sync::Mutex::new(State { arenas, devices: None, scratch: Scratch::new(&meta, &programs, &lanes) });
        let exchange = Exchange::default();
        let (fail, degraded) = (None, Default::default());
        let threads = crate::exec::gate::cores();
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
            plans,
            replans: Default::default(),
            upper,
            inputs,
            outputs,
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

    /// A digest of what this program computes: the artifact's section table (each
    /// section's kind, size and checksum) where it was loaded from one, else its metadata,
    /// programs and weights.
    pub fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        match &self.weights {
            Weights::Artifact(a) => a.sections().iter().for_each(|s| {
                h.update((s.kind as u32).to_le_bytes());
                h.update(s.size.to_le_bytes());
                h.update(s.checksum.to_le_bytes());
            }),
            Weights::Owned(w) => {
                h.update(serde_json::to_vec(&(&self.meta, &self.programs)).unwrap_or_default());
                h.update(crc32fast::hash(w.as_slice()).to_le_bytes());
            }
        }
        h.finalize().into()
    }

    /// Under hosts (`set_transport`): checks that every host runs what this one does,
    /// comparing digests of `parts`, computed only here (`Hosts::agree`); else nothing.
    pub fn agree(&self, parts: impl FnOnce() -> Vec<(&'static str, [u8; 32])>, timeout: Duration) -> Result<()> {
        match &self.hosts {
            Some(hosts) => hosts.agree(&parts(), timeout),
            None => Ok(()),
        }
    }

    /// Whether this process runs one host of several (`set_transport`).
    pub fn spans_hosts(&self) -> bool {
        self.hosts.is_some()
    }

    /// Under hosts (`set_transport`): host 0's `bytes` given to every host
    /// (`Hosts::broadcast`; each host's `bytes` as long), within the run's timeout; else
    /// nothing.
    pub fn broadcast(&self, bytes: &mut [u8]) -> Result<()> {
        match &self.hosts {
            Some(hosts) => hosts.broadcast(bytes, self.exchange.timeout()),
            None => Ok(()),
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

    pub(super) fn kernel(&self, device: usize, k: usize) -> KernelFn {
        let offset = self.programs[device].kernels[k].offset;
        match &self.code {
            // SAFETY: `new` checked the kernel lies inside the code, which was compiled for a
            // target whose features this CPU has.
            Code::Mapped(m) => unsafe { std::mem::transmute::<*const u8, KernelFn>(m.as_ptr().add(offset)) },
            Code::InProcess(t) => t.get(offset).expect("checked by `new`"),
        }
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
            // Under --zero the optimizer state is split though every param is replicated:
            // the line names both, not "params" alone.
            bail!(
                "device {} cannot be left out: it holds a shard of a param or of optimizer state (split over mesh axis '{}': model parallel, or --zero) that the others cannot do without; only layouts that replicate both can lose a device",
                mesh.coords_string(d),
                mesh.axes[a]
            );
        }
        // Reductions leave a lost member's operand out; a gather or an exchange of blocks
        // cannot do without its block.
        if let (Some(d), true) = (lost, any_left) {
            let blocks = self.programs.iter().flat_map(|p| &p.steps).find_map(|st| {
                let Exec::Collective(c) = &st.exec else { return None };
                let op = match c.op {
                    CollectiveOp::AllGather { .. } => "all_gather",
                    CollectiveOp::AllToAll { .. } => "all_to_all",
                    _ => return None,
                };
                c.groups.iter().any(|g| g.contains(&d)).then(|| (st.node.clone(), op))
            });
            if let Some((node, op)) = blocks {
                bail!(
                    "device {} cannot be left out: node '{}' ({op}) needs its block; only reductions can leave a device's operand out",
                    mesh.coords_string(d),
                    meshc_ir::error::shorten(&node)
                );
            }
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

    /// How many blocks of tensors have been copied between the host and the devices'
    /// buffers (an input's block into a device, or a device's block of an output out of
    /// it) since the program was loaded: what resident state saves shows here.
    pub fn host_copies(&self) -> u64 {
        self.host_copies.load(Ordering::Relaxed)
    }

    /// What runs at other sizes than the upper bounds keep beside the arenas: how many sets
    /// of the symbols' values have their library calls kept planned (at most
    /// `sizes::KEPT_SIZES`), and the bytes of weights kept copied out of their panels (at
    /// most one copy per step, whatever the sizes).
    pub fn kept_for_sizes(&self) -> (usize, usize) {
        let copies = self.plans.iter().flatten().flatten().map(|p| p.kept.bytes()).sum();
        (self.replans.sizes_kept(), copies)
    }

    /// Whether `device` runs (it is not degraded).
    pub(super) fn healthy(&self, device: usize) -> bool {
        self.fabric.degraded().is_none_or(|t| t.healthy(device))
    }
}

#[cfg(test)]
mod tests {
    use meshc_ir::{DType, Data, Tensor, TensorType};

    use super::*;
    use crate::comm::transport::{Incoming, Outgoing, Pending, Stall, Threads};
    use crate::format::mesh::{Mesh, Topology};
    use crate::format::program::{Buffer, Collective, Elem, IoSpec, Library, Matmul, Storage, ALIGN};
    use crate::format::program::{Event, Reduce, Step, Stream, StreamKind, StreamPlan, Wait};
    use crate::kernels::call::Planned;

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
            symbolic: None,
        };
        Loaded::in_memory(meta, programs, Box::new(()), &[])
    }

    fn collective(id: usize, op: CollectiveOp, groups: Vec<Vec<usize>>, shape: &[usize]) -> Exec {
        Exec::Collective(Collective { op, id, groups, dtype: "f32".into(), shape: shape.to_vec() })
    }

    /// A library call that fails when it runs.
    struct Fails;

    impl Planned for Fails {
        unsafe fn call<'m>(&self, _: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, _: usize) -> Result<()> {
            bail!("matmul: planted to fail")
        }
    }

    /// Makes the library call at `step` of `device` fail when it runs: a step the load
    /// checks would refuse cannot be loaded, so the failure is planted after loading.
    pub(super) fn fails(l: &mut Loaded, device: usize, step: usize) {
        let Some(step) = l.plans[device][step].as_mut() else {
            panic!("step {step} of device {device} is a library call")
        };
        step.plan = Box::new(Fails);
    }

    /// A library matmul of row-major f32 operands (no panels, epilogue or transposes).
    pub(super) fn f32_matmul(a: &[usize], b: &[usize], out: &[usize]) -> Exec {
        Exec::Library(Library::Matmul(Matmul {
            a: a.to_vec(),
            b: b.to_vec(),
            out: out.to_vec(),
            b_elem: Elem::F32,
            panels: false,
            epilogue: Vec::new(),
            transposed: Default::default(),
        }))
    }

    fn step(node: &str, exec: Exec, buffers: &[usize]) -> Step {
        Step { node: node.into(), exec, buffers: buffers.to_vec(), why: None, scaling: None }
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
        fails(&mut l, 1, 0);
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
    fn dim_names_not_one_per_dimension_are_refused() {
        let m = Mesh::numbered(&[1], Topology::Torus);
        let x = io("x", DType::F32, &[2, 3], &[None, None]);
        let named =
            |dims: &[Option<&str>]| x.clone().with_dims(Some(&dims.iter().map(|d| d.map(String::from)).collect()));
        let p = program(0, &[24], vec![], vec![0], vec![0]);
        let y = io("y", DType::F32, &[2, 3], &[None, None]);
        load(&m, vec![named(&[Some("batch"), None])], vec![y.clone()], vec![p.clone()]).unwrap();
        let e = format!("{:#}", load(&m, vec![named(&[Some("batch")])], vec![y], vec![p]).err().expect("refused"));
        assert!(e.contains("input 'x' has 1 dim names for a rank-2 tensor"), "{e}");
    }

    #[test]
    fn a_failing_device_stops_the_others() {
        let m = Mesh::numbered(&[2, 2], Topology::Torus);
        let sum = collective(0, CollectiveOp::AllReduce { reduce: Reduce::Sum }, m.groups(&[0, 1]), &[6]);
        // One device first runs a matmul that fails: the others wait for it in
        // the all_reduce until its error poisons the fabric. Device 0 runs on the calling
        // thread, device 3 on one of the runner's.
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
            fails(&mut l, failing, 0);
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
            symbolic: None,
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
        // With every device degraded, nothing would check the layouts and nothing can run.
        let all = crate::format::degradation::Degradation { nodes: vec![0, 1, 2, 3], ..Default::default() };
        let empty = (0..4).map(|d| Program { device: d, ..Default::default() }).collect();
        let e = Loaded::in_memory(meta(all, vec![]), empty, Box::new(()), &[]).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("the artifact names every device of the mesh degraded: none is left to run"));
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
    use meshc_ir::{DType, Tensor, TensorType};

    use std::time::Instant;

    use super::tests::{f32_matmul, fails};
    use super::*;
    use crate::format::mesh::{Mesh, Topology};
    use crate::format::program::{Buffer, IoSpec, Protocol, Step, Storage, Transfer};

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
        Step { node: format!("send {key}"), exec: Exec::Send(t), buffers: vec![b], why: None, scaling: None }
    }

    fn recv(key: &str, from: usize, protocol: Protocol) -> Step {
        let t = Transfer { key: key.into(), peer: from, bytes: 16, protocol };
        Step { node: format!("recv {key}"), exec: Exec::Recv(t), buffers: vec![1], why: None, scaling: None }
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
            symbolic: None,
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
        let good = f32_matmul(&[2, 2], &[2, 2], &[2, 2]);
        let mut l = load(vec![
            program(
                0,
                vec![
                    Step { node: "h".into(), exec: good, buffers: vec![2, 0, 0], why: None, scaling: None },
                    send("a", 1, Protocol::Copy, 2),
                ],
            ),
            program(1, vec![recv("a", 0, Protocol::Copy)]),
        ])
        .unwrap();
        fails(&mut l, 0, 0);
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
