//! The collective fabric: the simulated physical network of the device mesh (`meta.mesh`)
//! with a byte counter per directed link, and the collectives the device threads meet in
//! (all_reduce, all_gather, reduce_scatter, all_to_all over any group of devices). The
//! counters record the traffic of the schedules `crate::comm::traffic` models.
//!
//! # What is executed
//! Device threads share memory, so data moves directly between the members' buffers:
//! - small operands (below `SMALL_BYTES`): one rendezvous. The last member to arrive does
//!   all the work (below), straight from all operands into the results, then wakes the
//!   others.
//! - large operands: a first rendezvous publishes every member's buffers; then the members
//!   claim the parts of the work one at a time, in parallel (all_reduce: a chunk of the
//!   result, reduced from that chunk of every operand; all_gather: placing one member's
//!   operand; reduce_scatter and all_to_all: one member's result), and a second rendezvous
//!   waits until all parts are done. Claiming rather than assigning parts lets the members
//!   the OS runs first (8 device threads share 2 cores) do the work of those it runs late.
//!
//! The results of all_reduce and all_gather are equal on every member, so members that allow
//! it (`share`) read one result buffer held by the fabric instead of receiving a copy each:
//! the result is written once, not once per member.
//!
//! Every reduction combines the operands in rank order (((o0 ∘ o1) ∘ o2) ∘ ...) elementwise
//! (`crate::comm::reduce`), on both paths, so every member gets bit-identical results whatever the thread timing or
//! the operand size; a mean divides that sum by the number of members.
//!
//! # Degraded devices and links (`Fabric::degrade`, docs/design.md §6.2)
//! Degraded devices run nothing (the runner starts no job for them), so they never arrive.
//! An all_reduce or reduce_scatter whose group holds one, or whose plain schedule would
//! cross a degraded link, combines the operands of its healthy members only (a mean divides
//! by their number; a degraded member's block of a reduce_scatter goes to no one), and its
//! link counters record the fault-tolerant schedule of `crate::comm::degraded::plan_group`
//! (forwarding and critical groups, any operand size; for reduce_scatter the reduce half
//! and only the broadcast edges leading to what each member keeps). all_gather and
//! all_to_all cannot leave a member out: one that involves a degraded device or would send
//! over a degraded link fails, naming the collective. The counters of the plain schedules
//! are kept too, for the fault-free comparison of `LinkStats`.
//!
//! # Across hosts (`Fabric::set_hosts`, `crate::comm::transport`)
//! When the devices are spread over hosts (one process each), a collective whose group
//! lies inside this host runs as above and never touches the transport. One whose group
//! spans hosts runs hierarchically: the members on this host meet in one rendezvous (as for
//! small operands); the last of them to arrive is the host's leader and, with every local
//! member's buffers published, does the host's part of the cross-host exchange with the
//! other leaders, then writes every local member's result:
//! - all_reduce and reduce_scatter: the contributing ranks, in rank order, are cut into runs
//!   of consecutive ranks on one host. The host of the first run folds its operands, sends
//!   the partial result to the host of the next run, which folds its own onto it, and so on:
//!   the combination order is the rank order of the in-process fabric, so results are bit
//!   for bit the same. Along a chain of three hosts or more, each one link of it, it moves
//!   pieces of `CHAIN_PIECE` elements, each passed on while the next arrives, so the chain
//!   costs about one hop, not one per host. The last host (dividing a mean) sends the result to the other hosts;
//!   each writes its members' results (a reduce_scatter member its block).
//! - all_gather and all_to_all: each leader sends its members' operands to every other
//!   leader; each host then places the blocks for its members.
//!
//! Only leaders cross hosts, one message per host and phase. A host that does not answer
//! within the timeout ends the run with an error naming both hosts.
//!
//! # Failure detection
//! A member waiting at the first rendezvous wakes every quarter of the timeout
//! (`set_timeout`, `TIMEOUT` by default), beats its own heartbeat and looks at the members
//! that have not arrived: one whose heartbeat (the runner beats once per step, waiters
//! while they wait) stood still for a whole timeout is declared failed, and the fabric is
//! poisoned with its coordinates, ending the run. A member blocked in another collective
//! keeps beating, so the blame lands on the silent device, not on those waiting for it. A
//! single step that computes for longer than the timeout would be blamed wrongly: the
//! timeout must exceed the longest step.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use crate::comm::degraded::{self, Topo};
use crate::comm::error::RunError;
use crate::comm::memory::AlignedBuf;
use crate::comm::reduce::{combine, reduce_range, store_fence};
pub use crate::comm::sync::TIMEOUT;
use crate::comm::sync::{spin_until, Condvar, Mutex, MutexGuard, RwLock};
use crate::comm::traffic::{group_of, result_shape, small, Links, Model};
use crate::comm::transport::{Hosts, Incoming, Outgoing, Stall};
use crate::format::mesh::Mesh;
use crate::format::program::{Collective, CollectiveOp, Reduce};

/// Elements of an all_reduce result per part: parts are claimed by whichever member is
/// free, so members that the OS runs late (8 device threads on 2 cores) leave their share of
/// the work to the others. Small enough that an operand just above `SMALL_BYTES` makes a
/// part per core; a multiple of 16, so parts start on cache lines.
const PART: usize = 1 << 12;

/// Results at least this large are written with non-temporal stores: they would not stay
/// in the cache anyway, and the stores skip reading every result line before writing it
/// (measured while choosing the design: summing 8 operands of 16 MiB on 2 threads took
/// 8.2–9.4 ms with plain stores, 6.8 ms with these).
const STREAM_BYTES: usize = 1 << 20;

/// Elements per piece of the cross-host reduction chain (module doc): 1 MiB, enough that
/// a message's fixed cost (tens of µs over TCP) is small beside its bytes, small enough
/// that a chain of several hosts overlaps.
const CHAIN_PIECE: usize = 1 << 18;

/// A time span a member spent blocked in a rendezvous.
pub type Wait = (Instant, Instant);

/// Tensors of up to this rank are copied in runs without allocating.
const STACK_RANK: usize = 8;

/// Calls `f(src_offset, dst_offset, len)` (in elements) for every contiguous run of
/// copying the box `extent` at `src_start` of a row-major tensor of shape `src` to
/// `dst_start` of one of shape `dst`. Trailing dimensions copied whole merge into one run.
pub fn for_each_run(
    src: &[usize],
    src_start: &[usize],
    dst: &[usize],
    dst_start: &[usize],
    extent: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    if extent.contains(&0) {
        return;
    }
    let rank = extent.len();
    if rank == 0 {
        return f(0, 0, 1);
    }
    // Strides of both tensors and the odometer, on the stack up to `STACK_RANK` dims: runs
    // copy blocks on every call, which must not allocate.
    let mut stack = [0usize; 3 * STACK_RANK];
    let mut heap = Vec::new();
    let space = match rank <= STACK_RANK {
        true => &mut stack[..3 * rank],
        false => {
            heap.resize(3 * rank, 0);
            &mut heap[..]
        }
    };
    let (ss, rest) = space.split_at_mut(rank);
    let (ds, idx) = rest.split_at_mut(rank);
    for (s, shape) in [(&mut *ss, src), (&mut *ds, dst)] {
        s[rank - 1] = 1;
        for i in (0..rank - 1).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
    }
    let (ss, ds): (&[usize], &[usize]) = (ss, ds);
    let mut k = rank - 1;
    let mut run = extent[k];
    while k > 0 && extent[k] == src[k] && extent[k] == dst[k] {
        k -= 1;
        run *= extent[k];
    }
    let base = |start: &[usize], st: &[usize]| start.iter().zip(st).map(|(a, b)| a * b).sum::<usize>();
    let (mut so, mut d_o) = (base(src_start, ss), base(dst_start, ds));
    // An odometer over the dimensions before k.
    loop {
        f(so, d_o, run);
        let mut i = k;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            idx[i] += 1;
            so += ss[i];
            d_o += ds[i];
            if idx[i] < extent[i] {
                break;
            }
            so -= ss[i] * extent[i];
            d_o -= ds[i] * extent[i];
            idx[i] = 0;
        }
    }
}

/// One entry per member of a collective, on the stack for groups of up to 32.
type Members<T> = smallvec::SmallVec<[T; 32]>;

/// One entry per dim of a tensor, on the stack up to `STACK_RANK` dims.
type Dims = smallvec::SmallVec<[usize; STACK_RANK]>;

/// A member's buffers, published for the others between the rendezvous of one execution.
#[derive(Clone, Copy)]
struct Member {
    operand: *const f32,
    result: *mut f32,
    share: bool,
}

// SAFETY: the pointers are only dereferenced under the rendezvous protocol (module doc):
// while their owner is blocked in the collective that published them.
unsafe impl Send for Member {}

/// Bytes per link (by index into `Links::list`) of one execution of a collective.
type Traffic = Vec<(usize, u64)>;

/// What a collective computes, fixed per slot.
struct Plan {
    op: CollectiveOp,
    shape: Vec<usize>,
    result_shape: Vec<usize>,
    n: usize,
    numel: usize,
    result_numel: usize,
    traffic: Traffic,
    /// The traffic of the plain schedule, as if nothing were degraded (`LinkStats::fault_free_max`).
    plain: Traffic,
    /// The ranks whose operands a reduction combines and who take part: every member,
    /// except the degraded ones of a fault-tolerant all_reduce or reduce_scatter (they run
    /// nothing, so they never arrive).
    contributors: Vec<usize>,
}

impl Plan {
    fn shareable(&self) -> bool {
        matches!(self.op, CollectiveOp::AllReduce { .. } | CollectiveOp::AllGather { .. })
    }

    /// The number of parts of the work: all_reduce chunks of `PART` elements, else one per
    /// member (the member's block or result).
    fn parts(&self) -> usize {
        match self.op {
            CollectiveOp::AllReduce { .. } => self.numel.div_ceil(PART).max(1),
            _ => self.n,
        }
    }

    /// Part `r` of the work (module doc), writing results into `shared` (if any) and the
    /// result buffers of the members that do not share it.
    ///
    /// # Safety
    /// Every member's operand and result must be valid for this plan's sizes, and no one
    /// else may access the elements this part writes while it runs.
    unsafe fn part(&self, r: usize, members: &[Member], shared: Option<*mut f32>) {
        let ops: Members<*const f32> = members.iter().map(|m| m.operand).collect();
        let contributing: Members<*const f32> = self.contributors.iter().map(|&r| ops[r]).collect();
        let stream = self.result_numel * 4 >= STREAM_BYTES;
        // A result every member gets goes to the shared buffer and to each member that does
        // not read it there.
        let everyone = || -> Members<*mut f32> {
            shared
                .into_iter()
                .chain(members.iter().filter(|m| shared.is_none() || !m.share).map(|m| m.result))
                .filter(|p| !p.is_null())
                .collect()
        };
        let n = self.n;
        let shape = &self.shape;
        match self.op {
            CollectiveOp::AllReduce { reduce } => {
                let lo = r * PART;
                unsafe { reduce_range(&contributing, lo, &everyone(), lo, PART.min(self.numel - lo), reduce, stream) };
            }
            CollectiveOp::AllGather { axis } => {
                let mut start = Dims::from_elem(0, shape.len());
                start[axis] = r * shape[axis];
                let zero = Dims::from_elem(0, shape.len());
                for d in everyone() {
                    for_each_run(shape, &zero, &self.result_shape, &start, shape, |s, o, len| unsafe {
                        std::ptr::copy_nonoverlapping(ops[r].add(s), d.add(o), len)
                    });
                }
            }
            CollectiveOp::ReduceScatter { axis, reduce } => {
                // A degraded member (it never arrived) keeps nothing.
                if members[r].result.is_null() {
                    return;
                }
                let mine = [members[r].result];
                let mut start = Dims::from_elem(0, shape.len());
                start[axis] = r * self.result_shape[axis];
                for_each_run(
                    shape,
                    &start,
                    &self.result_shape,
                    &Dims::from_elem(0, shape.len()),
                    &self.result_shape,
                    |s, o, len| unsafe { reduce_range(&contributing, s, &mine, o, len, reduce, stream) },
                );
            }
            CollectiveOp::AllToAll { split_axis, concat_axis } => {
                let mut block = Dims::from_slice(shape);
                block[split_axis] /= n;
                for (s, &op) in ops.iter().enumerate() {
                    let mut from = Dims::from_elem(0, shape.len());
                    from[split_axis] = r * block[split_axis];
                    let mut to = Dims::from_elem(0, shape.len());
                    to[concat_axis] = s * block[concat_axis];
                    for_each_run(shape, &from, &self.result_shape, &to, &block, |a, b, len| unsafe {
                        std::ptr::copy_nonoverlapping(op.add(a), members[r].result.add(b), len)
                    });
                }
            }
        }
        if stream {
            store_fence();
        }
    }
}

/// The rendezvous state of one collective over one group, reused by every execution.
struct SlotState {
    members: Vec<Member>,
    /// Members at the first rendezvous of this execution.
    arrived: usize,
    /// Members at the second rendezvous (large operands): their parts are done.
    finished: usize,
    /// Per rank: at the first rendezvous of this execution.
    here: Vec<bool>,
    /// The result of all_reduce and all_gather that sharing members read.
    shared: Option<AlignedBuf>,
}

struct Slot {
    /// The description every member must agree on.
    desc: Collective,
    /// The members' devices, by rank.
    group: Vec<usize>,
    plan: Plan,
    /// The ranks that meet in this process: the contributors on this host.
    waited: Vec<usize>,
    /// Set when the group spans hosts (module doc).
    span: Option<Span>,
    state: Mutex<SlotState>,
    cv: Condvar,
    /// Executions that passed the first and the second rendezvous. Changed only under the
    /// `state` lock; atomic so that waiters can watch them without it.
    gen: AtomicU64,
    fin_gen: AtomicU64,
    /// The next unclaimed part of the current execution (large operands).
    next: AtomicUsize,
}

/// A collective whose group spans hosts: who takes part where, and how results are written.
struct Span {
    /// The contributing ranks in rank order, cut into runs of consecutive ranks on one host:
    /// (host, ranks).
    runs: Vec<(usize, Vec<usize>)>,
    /// The hosts holding a contributor, ascending.
    hosts: Vec<usize>,
    /// all_reduce and reduce_scatter: the plan that writes every local member's result from
    /// the fully reduced operand, as the one contributor.
    write: Plan,
}

/// Bytes a directed link carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkBytes {
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub bytes: u64,
}

/// Per-link traffic: every link of the mesh, sorted by (from, to), and the busiest's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkStats {
    pub links: Vec<LinkBytes>,
    pub max: u64,
    /// With degraded devices or links: the busiest link's bytes had the same collectives run
    /// on the healthy network (the plain schedules), to compare `max` with.
    pub fault_free_max: Option<u64>,
}

impl LinkStats {
    /// One line per link that carried anything, then the maximum (`meshc run --link-stats`).
    pub fn report(&self) -> String {
        let c = |v: &[usize]| format!("({})", v.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
        let mut s = String::new();
        for l in self.links.iter().filter(|l| l.bytes > 0) {
            s.push_str(&format!("link {} -> {} {} bytes\n", c(&l.from), c(&l.to), l.bytes));
        }
        s.push_str(&format!("max link bytes {}\n", self.max));
        if let Some(f) = self.fault_free_max {
            s.push_str(&format!(
                "fault-free max link bytes {f} (degraded/fault-free {:.2})\n",
                self.max as f64 / f as f64
            ));
        }
        s
    }
}

/// Where a member finds its result after a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// In its result buffer.
    Written,
    /// In a buffer of the fabric (same length as the result), valid until the group runs
    /// this collective again, or the fabric is dropped.
    Shared(*const f32),
}

/// The slot's shared result buffer, if the collective's results are shared and it has one.
fn shared_ptr(plan: &Plan, s: &mut SlotState) -> Option<*mut f32> {
    let buf = s.shared.as_mut().filter(|_| plan.shareable())?;
    Some(buf.as_mut_slice().as_mut_ptr() as *mut f32)
}

/// The network of one mesh and the collectives over it.
pub struct Fabric {
    links: Links,
    bytes: Vec<AtomicU64>,
    slots: RwLock<HashMap<(usize, usize), Arc<Slot>>>,
    poisoned: AtomicBool,
    reason: Mutex<Option<RunError>>,
    /// The mesh's degraded devices and links, if any.
    degraded: Option<Topo>,
    /// Per link: the bytes of the plain schedules (`LinkStats::fault_free_max`).
    free_bytes: Vec<AtomicU64>,
    /// Per device: signs of life (`beat`).
    heartbeats: Vec<AtomicU64>,
    timeout: Duration,
    /// Set when the devices are spread over hosts (module doc).
    hosts: Option<Arc<Hosts>>,
}

impl Fabric {
    pub fn new(mesh: &Mesh) -> Fabric {
        let links = Links::new(mesh);
        let bytes = links.list.iter().map(|_| AtomicU64::new(0)).collect();
        let free_bytes = links.list.iter().map(|_| AtomicU64::new(0)).collect();
        Fabric {
            links,
            bytes,
            free_bytes,
            slots: RwLock::new(HashMap::new()),
            poisoned: AtomicBool::new(false),
            reason: Mutex::new(None),
            degraded: None,
            heartbeats: (0..mesh.devices()).map(|_| AtomicU64::new(0)).collect(),
            timeout: TIMEOUT,
            hosts: None,
        }
    }

    /// Runs the collectives whose groups span hosts over `hosts`' transport (module doc).
    /// Before any collective runs.
    pub fn set_hosts(&mut self, hosts: Arc<Hosts>) {
        self.slots.get_mut().clear();
        self.hosts = Some(hosts);
    }

    /// Runs the collectives around the degraded devices and links of `topo` (module doc).
    /// Before any collective runs.
    pub fn degrade(&mut self, topo: Topo) -> Result<()> {
        if topo.mesh != self.links.mesh {
            bail!("the degradation describes a {:?} mesh, the fabric is {:?}", topo.mesh.shape, self.links.mesh.shape);
        }
        topo.require_healthy()?;
        self.slots.get_mut().clear();
        self.degraded = Some(topo);
        Ok(())
    }

    /// The degraded devices and links the collectives run around, if any.
    pub fn degraded(&self) -> Option<&Topo> {
        self.degraded.as_ref()
    }

    /// The traffic and contributing ranks of an all_reduce or reduce_scatter whose group
    /// holds a degraded device or whose plain schedule (`plain`) crosses a degraded link
    /// (module doc), and of an all_gather or all_to_all of healthy members whose plain
    /// schedule crosses one; `None` for every other collective, or without a degradation.
    fn fault_tolerant(
        &self,
        c: &Collective,
        group: &[usize],
        plain: &Traffic,
        result_shape: &[usize],
    ) -> Result<Option<(Traffic, Vec<usize>)>> {
        let Some(topo) = &self.degraded else { return Ok(None) };
        // For the sub-mesh groups lowering makes, the second test implies the first.
        let touched = degraded::touches(topo, group)
            || plain.iter().any(|&(l, _)| !topo.link_ok(self.links.list[l].0, self.links.list[l].1));
        if !touched {
            return Ok(None);
        }
        let numel = c.shape.iter().product();
        let bytes = match c.op {
            CollectiveOp::AllReduce { .. } => degraded::plan_group(topo, group, numel)
                .map_err(|e| anyhow!("collective #{}: {e}", c.id))?
                .link_bytes(4),
            CollectiveOp::ReduceScatter { axis, .. } => {
                let schedule =
                    degraded::plan_group(topo, group, numel).map_err(|e| anyhow!("collective #{}: {e}", c.id))?;
                // The elements each healthy member keeps: its block along `axis`.
                let zero = vec![0; c.shape.len()];
                let keeps = (0..group.len())
                    .filter(|&r| topo.healthy(group[r]))
                    .map(|r| {
                        let mut start = zero.clone();
                        start[axis] = r * result_shape[axis];
                        let mut ranges = Vec::new();
                        for_each_run(&c.shape, &start, result_shape, &zero, result_shape, |s, _, n| {
                            ranges.push(s..s + n)
                        });
                        (group[r], ranges)
                    })
                    .collect();
                schedule.scatter_link_bytes(4, &keeps)
            }
            // Blocks go member to member: each routed around the failed links (a degraded
            // member cannot be left out of these: `check_healthy` refuses it).
            CollectiveOp::AllGather { .. } | CollectiveOp::AllToAll { .. }
                if group.iter().all(|&d| topo.healthy(d)) =>
            {
                let block = if matches!(c.op, CollectiveOp::AllGather { .. }) { numel } else { numel / group.len() };
                let pairs: Vec<(usize, usize, usize)> = (group.iter())
                    .flat_map(|&u| group.iter().filter(move |&&v| v != u).map(move |&v| (u, v, 4 * block)))
                    .collect();
                degraded::route_transfers(topo, &pairs).map_err(|e| anyhow!("collective #{}: {e}", c.id))?
            }
            _ => return Ok(None),
        };
        let traffic = bytes.into_iter().map(|((u, v), b)| (self.links.index[&(u, v)], b)).collect();
        Ok(Some((traffic, (0..group.len()).filter(|&r| topo.healthy(group[r])).collect())))
    }

    /// Fails if a collective of the plain plan involves a degraded device or link.
    fn check_healthy(&self, c: &Collective, group: &[usize], traffic: &[(usize, u64)]) -> Result<()> {
        let Some(topo) = &self.degraded else { return Ok(()) };
        let mesh = &self.links.mesh;
        if let Some(&d) = group.iter().find(|&&d| !topo.healthy(d)) {
            bail!("collective #{}: device {} of its group is degraded", c.id, mesh.coords_string(d));
        }
        if let Some(&(u, v)) = traffic.iter().map(|&(l, _)| &self.links.list[l]).find(|&&(u, v)| !topo.link_ok(u, v)) {
            let (u, v) = (mesh.coords_string(u), mesh.coords_string(v));
            bail!("collective #{}: its route uses the degraded link {u}-{v}", c.id);
        }
        Ok(())
    }

    pub fn mesh(&self) -> &Mesh {
        &self.links.mesh
    }

    /// The bytes every link carried since the fabric was made or reset.
    pub fn link_stats(&self) -> LinkStats {
        let links: Vec<LinkBytes> = self
            .links
            .list
            .iter()
            .zip(&self.bytes)
            .map(|(&(f, t), b)| LinkBytes {
                from: self.links.mesh.coords(f),
                to: self.links.mesh.coords(t),
                bytes: b.load(Ordering::Relaxed),
            })
            .collect();
        let max = links.iter().map(|l| l.bytes).max().unwrap_or(0);
        let fault_free_max = self
            .degraded
            .as_ref()
            .map(|_| self.free_bytes.iter().map(|b| b.load(Ordering::Relaxed)).max().unwrap_or(0));
        LinkStats { links, max, fault_free_max }
    }

    /// Clears the counters, the poison and any half-met rendezvous. Only while no thread is
    /// inside a collective (between runs).
    pub fn reset(&self) {
        self.bytes.iter().chain(&self.free_bytes).for_each(|b| b.store(0, Ordering::Relaxed));
        for slot in self.slots.read().values() {
            let mut s = slot.state.lock();
            s.arrived = 0;
            s.finished = 0;
            s.here.iter_mut().for_each(|h| *h = false);
        }
        *self.reason.lock() = None;
        self.poisoned.store(false, Ordering::SeqCst);
    }

    /// Makes every member waiting for others (now or later) return an error naming
    /// `reason`; the first reason is kept.
    pub fn poison(&self, reason: RunError) {
        self.reason.lock().get_or_insert(reason);
        self.poisoned.store(true, Ordering::SeqCst);
        for slot in self.slots.read().values() {
            // Under the slot lock: a waiter checks the flag under it before sleeping.
            let _s = slot.state.lock();
            slot.cv.notify_all();
        }
    }

    /// The first poison reason, if any.
    pub fn poisoned(&self) -> Option<RunError> {
        self.reason.lock().clone()
    }

    fn abandoned(&self, c: &Collective) -> anyhow::Error {
        let reason = self.poisoned().map(|r| r.to_string()).unwrap_or_default();
        anyhow!("collective #{} abandoned: {reason}", c.id)
    }

    fn slot(&self, device: usize, c: &Collective) -> Result<(Arc<Slot>, usize)> {
        let group = group_of(c, device)?;
        let rank = group.iter().position(|&d| d == device).expect("group holds the device");
        let key = (c.id, group[0]);
        let found = self.slots.read().get(&key).cloned();
        let slot = match found {
            Some(slot) => slot,
            None => {
                let mut slots = self.slots.write();
                match slots.get(&key) {
                    Some(slot) => slot.clone(),
                    None => {
                        let slot = Arc::new(self.new_slot(device, c, group)?);
                        slots.insert(key, slot.clone());
                        slot
                    }
                }
            }
        };
        if slot.desc != *c {
            bail!("collective #{}: device {device} describes it differently from the other members", c.id);
        }
        Ok((slot, rank))
    }

    fn new_slot(&self, device: usize, c: &Collective, group: &[usize]) -> Result<Slot> {
        let result_shape = result_shape(&self.links.mesh, device, c)?;
        let (numel, result_numel) = (c.shape.iter().product(), result_shape.iter().product());
        let plain = Model::schedule(&self.links, &c.op, group, numel, result_numel);
        let (traffic, contributors) = match self.fault_tolerant(c, group, &plain, &result_shape)? {
            Some(p) => p,
            None => {
                self.check_healthy(c, group, &plain)?;
                (plain.clone(), (0..group.len()).collect())
            }
        };
        let plan = Plan {
            op: c.op.clone(),
            shape: c.shape.clone(),
            traffic,
            plain,
            contributors,
            result_shape,
            n: group.len(),
            numel,
            result_numel,
        };
        let local = |r: &usize| self.hosts.as_ref().is_none_or(|h| h.is_local(group[*r]));
        let waited: Vec<usize> = plan.contributors.iter().copied().filter(local).collect();
        let span =
            self.hosts.as_ref().filter(|h| group.iter().any(|&d| h.host_of(d) != h.host_of(group[0]))).map(|h| {
                let mut runs: Vec<(usize, Vec<usize>)> = Vec::new();
                for &r in &plan.contributors {
                    match runs.last_mut() {
                        Some((host, ranks)) if *host == h.host_of(group[r]) => ranks.push(r),
                        _ => runs.push((h.host_of(group[r]), vec![r])),
                    }
                }
                let hosts: BTreeSet<usize> = runs.iter().map(|r| r.0).collect();
                let write = Plan {
                    op: plan.op.clone(),
                    shape: plan.shape.clone(),
                    result_shape: plan.result_shape.clone(),
                    n: plan.n,
                    numel: plan.numel,
                    result_numel: plan.result_numel,
                    traffic: Vec::new(),
                    plain: Vec::new(),
                    contributors: vec![0],
                };
                Span { runs, hosts: hosts.into_iter().collect(), write }
            });
        let none = Member { operand: std::ptr::null(), result: std::ptr::null_mut(), share: false };
        Ok(Slot {
            desc: c.clone(),
            waited,
            span,
            state: Mutex::new(SlotState {
                members: vec![none; plan.n],
                arrived: 0,
                finished: 0,
                here: vec![false; plan.n],
                shared: None,
            }),
            group: group.to_vec(),
            plan,
            cv: Condvar::new(),
            gen: AtomicU64::new(0),
            fin_gen: AtomicU64::new(0),
            next: AtomicUsize::new(0),
        })
    }

    /// Runs `device`'s side of collective `c` on `operand` (the operand shape's elements)
    /// into `result` (the result shape's), blocking until the group's other members run it
    /// too. With `share`, the member accepts `Delivery::Shared` for all_reduce and
    /// all_gather. Time spent blocked is appended to `waits`.
    ///
    /// # Safety
    /// `operand` and `result` must be valid for their shapes' lengths (f32), must not
    /// overlap, and must not be accessed by anyone else until this returns: the other
    /// members read the operand and write the result meanwhile. The operand must not be a
    /// shared result of this same collective, which this execution overwrites.
    pub unsafe fn collective_raw(
        &self,
        device: usize,
        c: &Collective,
        operand: *const f32,
        result: *mut f32,
        share: bool,
        mut waits: Option<&mut Vec<Wait>>,
    ) -> Result<Delivery> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(self.abandoned(c));
        }
        let (slot, rank) = self.slot(device, c)?;
        let plan = &slot.plan;
        if !plan.contributors.contains(&rank) {
            bail!(
                "collective #{}: device {} is degraded and takes no part",
                c.id,
                self.links.mesh.coords_string(device)
            );
        }
        let mut s = slot.state.lock();
        s.members[rank] = Member { operand, result, share };
        s.here[rank] = true;
        s.arrived += 1;
        let gen = slot.gen.load(Ordering::Relaxed);
        if s.arrived == slot.waited.len() {
            s.arrived = 0;
            s.here.iter_mut().for_each(|h| *h = false);
            for &(l, b) in &plan.traffic {
                self.bytes[l].fetch_add(b, Ordering::Relaxed);
            }
            for &(l, b) in &plan.plain {
                self.free_bytes[l].fetch_add(b, Ordering::Relaxed);
            }
            slot.next.store(0, Ordering::Relaxed);
            if plan.shareable() && s.members.iter().any(|m| m.share) && s.shared.is_none() {
                // Without the memory, every member simply gets its own copy.
                s.shared = AlignedBuf::zeroed(plan.result_numel * 4).ok();
            }
            if slot.span.is_some() {
                let shared = shared_ptr(plan, &mut s);
                // SAFETY: as below.
                if let Err(e) = unsafe { self.cross_hosts(&slot, &s.members, shared) } {
                    // The other local members wake to the poison; none touches a buffer.
                    drop(s);
                    self.poison(RunError::of(&e));
                    return Err(e);
                }
            } else if small(plan.numel) {
                let shared = shared_ptr(plan, &mut s);
                for r in 0..plan.parts() {
                    // SAFETY: every member is blocked in this rendezvous (the caller's
                    // contract for their buffers), and parts write disjoint elements.
                    unsafe { plan.part(r, &s.members, shared) };
                }
            }
            slot.gen.store(gen + 1, Ordering::Release);
            slot.cv.notify_all();
        } else {
            let start = Instant::now();
            s = match self.await_change(&slot, s, &slot.gen, gen, Some(device)) {
                Ok(s) => s,
                Err(mut s) => {
                    // Withdraw: without this member the rendezvous can never complete, so
                    // no one touches its buffers.
                    s.arrived -= 1;
                    s.here[rank] = false;
                    return Err(self.abandoned(c));
                }
            };
            if let Some(w) = waits.as_deref_mut() {
                w.push((start, Instant::now()));
            }
        }
        let shared = shared_ptr(plan, &mut s);
        let delivery = match shared {
            Some(p) if share => Delivery::Shared(p),
            _ => Delivery::Written,
        };
        if small(plan.numel) || slot.span.is_some() {
            return Ok(delivery);
        }
        let members = s.members.clone();
        drop(s);
        loop {
            let r = slot.next.fetch_add(1, Ordering::Relaxed);
            if r >= plan.parts() {
                break;
            }
            // SAFETY: as above; each part is claimed once and writes only its own elements.
            unsafe { plan.part(r, &members, shared) };
        }
        // The second rendezvous ignores poison: every member past the first one finishes
        // its part, and none may return while others still use its buffers.
        let mut s = slot.state.lock();
        s.finished += 1;
        let fin_gen = slot.fin_gen.load(Ordering::Relaxed);
        if s.finished == slot.waited.len() {
            s.finished = 0;
            slot.fin_gen.store(fin_gen + 1, Ordering::Release);
            slot.cv.notify_all();
        } else {
            let start = Instant::now();
            drop(self.await_change(&slot, s, &slot.fin_gen, fin_gen, None));
            if let Some(w) = waits {
                w.push((start, Instant::now()));
            }
        }
        Ok(delivery)
    }

    /// Waits until `counter` (one of `slot`'s generations) moves past `seen`: first
    /// checking it while yielding the core, for up to `SPIN`, then blocking. With
    /// `watcher` (the waiting device, at the first rendezvous), a poisoned fabric ends the
    /// wait with `Err`, still under the lock and with `counter` unchanged; and the wait is
    /// also a watch: the waiter beats its own heartbeat, and a missing member whose
    /// heartbeat stood still for the whole timeout is declared failed (the fabric is
    /// poisoned with its coordinates).
    fn await_change<'a>(
        &self,
        slot: &'a Slot,
        s: MutexGuard<'a, SlotState>,
        counter: &AtomicU64,
        seen: u64,
        watcher: Option<usize>,
    ) -> std::result::Result<MutexGuard<'a, SlotState>, MutexGuard<'a, SlotState>> {
        let poisoned = || watcher.is_some() && self.poisoned.load(Ordering::SeqCst);
        drop(s);
        spin_until(|| counter.load(Ordering::Acquire) != seen || poisoned());
        let mut s = slot.state.lock();
        let missing = |s: &SlotState| -> Members<(usize, u64)> {
            let ranks = slot.waited.iter().filter(|&&r| !s.here[r]);
            ranks.map(|&r| (slot.group[r], self.heartbeats[slot.group[r]].load(Ordering::SeqCst))).collect()
        };
        let mut window = (Instant::now(), missing(&s));
        while counter.load(Ordering::Relaxed) == seen {
            if poisoned() {
                return Err(s);
            }
            let Some(me) = watcher else {
                slot.cv.wait(&mut s);
                continue;
            };
            self.beat(me);
            let tick = (self.timeout / 4).max(Duration::from_millis(1));
            slot.cv.wait_for(&mut s, tick);
            if counter.load(Ordering::Relaxed) != seen || window.0.elapsed() < self.timeout {
                continue;
            }
            let now = missing(&s);
            let dead: Vec<usize> = now.iter().filter(|m| window.1.contains(m)).map(|&(d, _)| d).collect();
            if !dead.is_empty() {
                drop(s);
                let names = dead.iter().map(|&d| self.links.mesh.coords_string(d)).collect();
                self.poison(RunError::DeviceFailed {
                    devices: dead,
                    names,
                    ms: self.timeout.as_millis(),
                    waiter: self.links.mesh.coords_string(me),
                    collective: slot.desc.id,
                });
                return Err(slot.state.lock());
            }
            window = (Instant::now(), now);
        }
        Ok(s)
    }

    /// The host's part of a collective whose group spans hosts (module doc), done by the
    /// last local member to arrive.
    ///
    /// # Safety
    /// Every local member is blocked in the rendezvous with its buffers in `members`, valid
    /// for the plan's sizes; `shared` (if any) holds the result's length.
    unsafe fn cross_hosts(&self, slot: &Slot, members: &[Member], shared: Option<*mut f32>) -> Result<()> {
        let (Some(hosts), Some(span)) = (&self.hosts, &slot.span) else { bail!("no hosts to cross") };
        let plan = &slot.plan;
        let me = hosts.me();
        let tag = |phase| hosts.collective_tag(slot.desc.id, slot.group[0], phase);
        // SAFETY: the caller's contract: every local member's operand holds `numel` elements.
        let operand = |r: usize| unsafe { std::slice::from_raw_parts(members[r].operand, plan.numel) };
        match plan.op {
            CollectiveOp::AllReduce { reduce } | CollectiveOp::ReduceScatter { reduce, .. } => {
                let mut acc = vec![0f32; plan.numel];
                let last = span.runs.last().map_or(me, |r| r.0);
                // Pieces only along a chain of three hosts or more (two have nothing to
                // overlap) in which each host is one link: a host at two links (hosts
                // interleaved in rank order) would wait to receive at its second while the
                // one after its first waits for it to take a piece.
                let hosts_once = span.runs.iter().map(|r| r.0).collect::<BTreeSet<_>>().len() == span.runs.len();
                let step = if hosts_once && span.runs.len() > 2 { CHAIN_PIECE } else { plan.numel.max(1) };
                let bounds: Vec<usize> = (0..plan.numel).step_by(step).chain([plan.numel]).collect();
                let piece = |i: usize| bounds[i]..bounds[i + 1];
                let pieces = bounds.len() - 1;
                for (j, (_, ranks)) in span.runs.iter().enumerate().filter(|(_, r)| r.0 == me) {
                    let srcs: Vec<&[f32]> = ranks.iter().map(|&r| operand(r)).collect();
                    let prev = j.checked_sub(1).map(|p| span.runs[p].0);
                    let next = span.runs.get(j + 1).map(|n| n.0);
                    if let (Some(prev), true) = (prev, pieces > 0) {
                        self.swap(slot, &[], &mut [(prev, tag(0)?, &mut acc[piece(0)])])?;
                    }
                    // Piece by piece, each piece passed on while the next one arrives: along
                    // a chain of several hosts they all fold at once, each on its own piece.
                    for i in 0..pieces {
                        let r = piece(i);
                        combine(&mut acc[r.clone()], &srcs, r.start, reduce, j == 0);
                        let (done, rest) = acc.split_at_mut(r.end);
                        let sends: Vec<(usize, u32, &[f32])> =
                            next.map(|n| Ok((n, tag(0)?, &done[r.start..]))).into_iter().collect::<Result<_>>()?;
                        let mut recvs: Vec<(usize, u32, &mut [f32])> = match prev {
                            Some(p) if i + 1 < pieces => vec![(p, tag(0)?, &mut rest[..piece(i + 1).len()])],
                            _ => Vec::new(),
                        };
                        if !sends.is_empty() || !recvs.is_empty() {
                            self.swap(slot, &sends, &mut recvs)?;
                        }
                    }
                }
                if me == last {
                    if reduce == Reduce::Mean {
                        let n = plan.contributors.len() as f32;
                        acc.iter_mut().for_each(|x| *x /= n);
                    }
                    let sends: Vec<(usize, u32, &[f32])> = span
                        .hosts
                        .iter()
                        .filter(|&&h| h != me)
                        .map(|&h| Ok((h, tag(1)?, &acc[..])))
                        .collect::<Result<_>>()?;
                    self.swap(slot, &sends, &mut [])?;
                } else {
                    self.swap(slot, &[], &mut [(last, tag(1)?, &mut acc)])?;
                }
                let members: Vec<Member> = members.iter().map(|m| Member { operand: acc.as_ptr(), ..*m }).collect();
                for r in 0..span.write.parts() {
                    // SAFETY: `acc` holds the reduced operand; the results are the members'.
                    unsafe { span.write.part(r, &members, shared) };
                }
            }
            CollectiveOp::AllGather { .. } | CollectiveOp::AllToAll { .. } => {
                let on = |h: usize| (0..plan.n).filter(move |&r| hosts.host_of(slot.group[r]) == h);
                let mine: Vec<f32> = on(me).flat_map(operand).copied().collect();
                let others: Vec<usize> = span.hosts.iter().copied().filter(|&h| h != me).collect();
                let mut theirs: Vec<Vec<f32>> =
                    others.iter().map(|&h| vec![0f32; on(h).count() * plan.numel]).collect();
                let sends: Vec<(usize, u32, &[f32])> =
                    others.iter().map(|&h| Ok((h, tag(0)?, &mine[..]))).collect::<Result<_>>()?;
                let mut recvs: Vec<(usize, u32, &mut [f32])> = (others.iter().zip(&mut theirs))
                    .map(|(&h, buf)| Ok((h, tag(0)?, &mut buf[..])))
                    .collect::<Result<_>>()?;
                self.swap(slot, &sends, &mut recvs)?;
                let mut all = members.to_vec();
                for (&h, buf) in others.iter().zip(&theirs) {
                    for (k, r) in on(h).enumerate() {
                        all[r].operand = buf[k * plan.numel..].as_ptr();
                    }
                }
                let to_all_local = matches!(plan.op, CollectiveOp::AllToAll { .. });
                for r in (0..plan.n).filter(|&r| !to_all_local || hosts.is_local(slot.group[r])) {
                    // SAFETY: every operand is a local member's or a received copy; results
                    // are the local members' (a remote member's is null, never written).
                    unsafe { plan.part(r, &all, shared) };
                }
            }
        }
        Ok(())
    }

    /// One exchange of f32 buffers with other hosts (`Transport::exchange`), bounded by the
    /// timeout and ended by the poison.
    fn swap(&self, slot: &Slot, sends: &[(usize, u32, &[f32])], recvs: &mut [(usize, u32, &mut [f32])]) -> Result<()> {
        let Some(hosts) = &self.hosts else { bail!("no hosts to cross") };
        // SAFETY (both): reinterpreting f32s as their bytes, within the same borrow.
        let out: Vec<Outgoing> = (sends.iter())
            .map(|&(to, tag, s)| Outgoing {
                to,
                tag,
                bytes: unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len() * 4) },
            })
            .collect();
        let mut inc: Vec<Incoming> = (recvs.iter_mut())
            .map(|(from, tag, s)| Incoming {
                from: *from,
                tag: *tag,
                bytes: unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len() * 4) },
            })
            .collect();
        let id = slot.desc.id;
        match hosts.exchange(&out, &mut inc, self.timeout, &|| self.poisoned.load(Ordering::SeqCst)) {
            Ok(()) => Ok(()),
            Err(Stall::Stopped) => Err(self.abandoned(&slot.desc)),
            Err(Stall::Timeout(pending)) => Err(RunError::Timeout(format!(
                "collective #{id} across hosts: {}",
                hosts.stalled(pending, &out, &inc, self.timeout)
            ))
            .into()),
            Err(Stall::Failed(m)) => bail!("collective #{id} across hosts: {m}"),
        }
    }

    /// A sign of life from `device` (the runner gives one per step).
    pub fn beat(&self, device: usize) {
        self.heartbeats[device].fetch_add(1, Ordering::SeqCst);
    }

    /// How long a member may show no sign of life before the others declare it failed.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// `collective_raw` on slices (lengths checked), always delivering into `result`.
    pub fn collective(
        &self,
        device: usize,
        c: &Collective,
        operand: &[f32],
        result: &mut [f32],
        waits: Option<&mut Vec<Wait>>,
    ) -> Result<()> {
        let shape = result_shape(&self.links.mesh, device, c)?;
        let (numel, result_numel) = (c.shape.iter().product::<usize>(), shape.iter().product::<usize>());
        if operand.len() != numel || result.len() != result_numel {
            bail!(
                "collective #{}: buffers of {} and {} elements for an operand of {numel} and a result of {result_numel}",
                c.id,
                operand.len(),
                result.len()
            );
        }
        // SAFETY: the borrows hold both buffers for the whole call, and they cannot overlap.
        unsafe { self.collective_raw(device, c, operand.as_ptr(), result.as_mut_ptr(), false, waits) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::comm::traffic::SMALL_BYTES;
    use crate::format::mesh::Topology;

    fn coll(op: CollectiveOp, groups: Vec<Vec<usize>>, shape: &[usize]) -> Collective {
        Collective { op, id: 7, groups, dtype: "f32".into(), shape: shape.to_vec() }
    }

    /// Values of very different magnitudes: the order of summation shows in the rounding.
    fn data(device: usize, n: usize) -> Vec<f32> {
        let scale = [1e-3, 1.0, 1e4, 0.3];
        (0..n).map(|i| (((device * 7919 + i * 104_729) % 1999) as f32 - 999.0) * scale[(i + device) % 4]).collect()
    }

    /// Calls `f` with every index of `shape`, in row-major order.
    fn each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
        if shape.contains(&0) {
            return;
        }
        let mut idx = vec![0; shape.len()];
        loop {
            f(&idx);
            let Some(d) = (0..shape.len()).rev().find(|&d| idx[d] + 1 < shape[d]) else { return };
            idx[d] += 1;
            idx[d + 1..].iter_mut().for_each(|x| *x = 0);
        }
    }

    /// The row-major offset in `shape` of `idx` with dimension `d` moved by `at(idx[d])`.
    fn ravel(idx: &[usize], shape: &[usize], d: usize, at: impl Fn(usize) -> usize) -> usize {
        (0..shape.len()).fold(0, |i, k| i * shape[k] + if k == d { at(idx[k]) } else { idx[k] })
    }

    fn reduced(reduce: Reduce, operands: &[&Vec<f32>]) -> Vec<f32> {
        (0..operands[0].len())
            .map(|i| {
                let mut v = operands[0][i];
                for o in &operands[1..] {
                    v = match reduce {
                        Reduce::Sum | Reduce::Mean => v + o[i],
                        Reduce::Max if v.is_nan() || o[i].is_nan() => f32::NAN,
                        Reduce::Max => v.max(o[i]),
                    };
                }
                if reduce == Reduce::Mean {
                    v / operands.len() as f32
                } else {
                    v
                }
            })
            .collect()
    }

    /// What member `rank` of a group with these operands (rank order) must get, the plain way.
    fn expected(op: &CollectiveOp, shape: &[usize], result: &[usize], operands: &[&Vec<f32>], rank: usize) -> Vec<f32> {
        let n = operands.len();
        let mut out = Vec::new();
        match *op {
            CollectiveOp::AllReduce { reduce } => out = reduced(reduce, operands),
            // numpy's concatenate and split: runs of the dims from `axis` on, for each index
            // of the dims before it.
            CollectiveOp::AllGather { axis } => {
                let inner: usize = shape[axis..].iter().product();
                for o in 0..shape[..axis].iter().product() {
                    for op in operands {
                        out.extend_from_slice(&op[o * inner..(o + 1) * inner]);
                    }
                }
            }
            CollectiveOp::ReduceScatter { axis, reduce } => {
                let all = reduced(reduce, operands);
                let (inner, block) =
                    (shape[axis..].iter().product::<usize>(), result[axis..].iter().product::<usize>());
                for o in 0..shape[..axis].iter().product() {
                    out.extend_from_slice(&all[o * inner + rank * block..][..block]);
                }
            }
            CollectiveOp::AllToAll { split_axis, concat_axis } => {
                // The source block along the concat axis, then the offset of this rank's
                // block along the split axis (the same axis when they are equal).
                let (bs, bc) =
                    (shape[split_axis] / n, shape[concat_axis] / if split_axis == concat_axis { n } else { 1 });
                each_index(result, |idx| {
                    let s = idx[concat_axis] / bc;
                    let mut local = idx.to_vec();
                    local[concat_axis] %= bc;
                    out.push(operands[s][ravel(&local, shape, split_axis, |x| x + rank * bs)]);
                });
            }
        }
        out
    }

    /// Every device of the collective's groups runs it on its own thread; returns the
    /// results by device (empty for devices outside the groups), and whether each was shared.
    fn run(f: &Fabric, c: &Collective, operands: &[Vec<f32>], share: bool) -> Vec<(Vec<f32>, bool)> {
        let mut out: Vec<(Vec<f32>, bool)> = vec![(Vec::new(), false); operands.len()];
        std::thread::scope(|s| {
            for (d, slot) in out.iter_mut().enumerate() {
                let degraded = f.degraded.as_ref().is_some_and(|t| !t.healthy(d));
                if degraded || !c.groups.iter().flatten().any(|&x| x == d) {
                    continue;
                }
                let op = &operands[d];
                s.spawn(move || {
                    let n = result_shape(f.mesh(), d, c).unwrap().iter().product();
                    let mut result = vec![f32::NAN; n];
                    // SAFETY: both vectors live, unaliased, through the call.
                    let delivery =
                        unsafe { f.collective_raw(d, c, op.as_ptr(), result.as_mut_ptr(), share, None) }.unwrap();
                    if let Delivery::Shared(p) = delivery {
                        // SAFETY: valid until the group runs the collective again.
                        result.copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
                    }
                    *slot = (result, delivery != Delivery::Written);
                });
            }
        });
        out
    }

    fn check(m: &Mesh, c: &Collective, share: bool) {
        let f = Fabric::new(m);
        let numel = c.shape.iter().product();
        let operands: Vec<Vec<f32>> = (0..m.devices()).map(|d| data(d, numel)).collect();
        let got = run(&f, c, &operands, share);
        for g in &c.groups {
            let ops: Vec<&Vec<f32>> = g.iter().map(|&d| &operands[d]).collect();
            for (rank, &d) in g.iter().enumerate() {
                let result = result_shape(m, d, c).unwrap();
                let want = expected(&c.op, &c.shape, &result, &ops, rank);
                let what =
                    format!("{:?} over {g:?} on {:?} {:?}, {:?}, device {d}", c.op, m.topology, m.shape, c.shape);
                assert!(got[d].0.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
                let shared = share && matches!(c.op, CollectiveOp::AllReduce { .. } | CollectiveOp::AllGather { .. });
                assert_eq!(got[d].1, shared, "{what}");
            }
        }
    }

    fn ops() -> Vec<CollectiveOp> {
        use CollectiveOp::*;
        vec![
            AllReduce { reduce: Reduce::Sum },
            AllReduce { reduce: Reduce::Max },
            AllReduce { reduce: Reduce::Mean },
            AllGather { axis: 0 },
            AllGather { axis: 1 },
            ReduceScatter { axis: 0, reduce: Reduce::Sum },
            ReduceScatter { axis: 1, reduce: Reduce::Mean },
            AllToAll { split_axis: 0, concat_axis: 1 },
            AllToAll { split_axis: 1, concat_axis: 0 },
            AllToAll { split_axis: 1, concat_axis: 1 },
        ]
    }

    #[test]
    fn every_collective_matches_the_sequential_computation() {
        let mut cases: Vec<(Vec<usize>, Vec<Vec<usize>>)> = Vec::new();
        for n in [2, 4, 8] {
            cases.push((vec![n], vec![(0..n).collect()]));
        }
        let m24 = Mesh::numbered(&[2, 4], Topology::Mesh);
        for axes in [&[0][..], &[1], &[0, 1], &[1, 0]] {
            cases.push((vec![2, 4], m24.groups(axes)));
        }
        let m222 = Mesh::numbered(&[2, 2, 2], Topology::Mesh);
        for axes in [&[0][..], &[1], &[2], &[0, 2], &[0, 1, 2]] {
            cases.push((vec![2, 2, 2], m222.groups(axes)));
        }
        // A group that is no sub-mesh, in a scrambled rank order, beside devices left out.
        cases.push((vec![2, 4], vec![vec![6, 1, 3], vec![0, 5, 4]]));
        for (shape, groups) in &cases {
            for topology in [Topology::Mesh, Topology::Torus] {
                let m = Mesh::numbered(shape, topology);
                for op in ops() {
                    // 24 divides over every group size; `large` rows make a large operand.
                    // (The topology changes the traffic model only: one suffices here.)
                    let large = (SMALL_BYTES / 4 / 24).div_ceil(24) * 24;
                    let sizes: &[(usize, bool)] = if topology == Topology::Mesh {
                        &[(24, false)]
                    } else {
                        &[(24, false), (large, false), (large, true)]
                    };
                    for &(rows, share) in sizes {
                        if share && matches!(op, CollectiveOp::ReduceScatter { .. } | CollectiveOp::AllToAll { .. }) {
                            continue; // their results differ per member: nothing to share
                        }
                        check(&m, &coll(op.clone(), groups.clone(), &[rows, 24]), share);
                    }
                }
            }
        }
        let m = Mesh::numbered(&[4], Topology::Torus);
        let all = vec![(0..4).collect()];
        check(&m, &coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, all.clone(), &[]), false);
        check(&m, &coll(CollectiveOp::AllGather { axis: 2 }, all.clone(), &[3, 5, 1]), false);
        check(&m, &coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, all, &[3, 100_003]), true);
    }

    #[test]
    fn max_propagates_nan_like_numpy() {
        let m = Mesh::numbered(&[4], Topology::Mesh);
        for numel in [8, SMALL_BYTES] {
            let mut operands: Vec<Vec<f32>> = (0..4).map(|d| data(d, numel)).collect();
            operands[2][1] = f32::NAN;
            operands[0][5] = f32::NAN;
            let c = coll(CollectiveOp::AllReduce { reduce: Reduce::Max }, vec![(0..4).collect()], &[numel]);
            for (r, _) in run(&Fabric::new(&m), &c, &operands, false) {
                assert!(r[1].is_nan() && r[5].is_nan() && !r[0].is_nan());
            }
        }
    }

    #[test]
    fn members_that_do_not_share_get_their_own_copy() {
        let m = Mesh::numbered(&[4], Topology::Torus);
        let c = coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![(0..4).collect()], &[1 << 16]);
        let f = Fabric::new(&m);
        let operands: Vec<Vec<f32>> = (0..4).map(|d| data(d, 1 << 16)).collect();
        let mut got: Vec<Vec<f32>> = vec![vec![0.0; 1 << 16]; 4];
        std::thread::scope(|s| {
            for (d, r) in got.iter_mut().enumerate() {
                let (f, c, op) = (&f, &c, &operands[d]);
                s.spawn(move || {
                    // SAFETY: both live through the call; a shared result is read at once.
                    match unsafe { f.collective_raw(d, c, op.as_ptr(), r.as_mut_ptr(), d % 2 == 0, None) }.unwrap() {
                        Delivery::Shared(p) => {
                            assert_eq!(d % 2, 0);
                            r.copy_from_slice(unsafe { std::slice::from_raw_parts(p, 1 << 16) });
                        }
                        Delivery::Written => assert_eq!(d % 2, 1),
                    }
                });
            }
        });
        let want = reduced(Reduce::Sum, &operands.iter().collect::<Vec<_>>());
        assert!(got.iter().all(|r| *r == want));
    }

    #[test]
    fn repeated_runs_of_one_collective_keep_their_generations_apart() {
        for numel in [64, 1 << 16] {
            let m = Mesh::numbered(&[2, 4], Topology::Torus);
            let c = coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, m.groups(&[1]), &[numel]);
            let f = Fabric::new(&m);
            std::thread::scope(|s| {
                for d in 0..8 {
                    let (f, c) = (&f, &c);
                    s.spawn(move || {
                        for iter in 0..20 {
                            let mut out = vec![0.0; numel];
                            // Uneven pacing: some members race ahead into the next run.
                            if (d + iter) % 3 == 0 {
                                std::thread::sleep(std::time::Duration::from_micros(200));
                            }
                            f.collective(d, c, &vec![(d + iter) as f32; numel], &mut out, None).unwrap();
                            let row = 4 * (d / 4);
                            let want = (row..row + 4).map(|x| (x + iter) as f32).sum::<f32>();
                            assert!(out.iter().all(|&x| x == want), "device {d} run {iter}");
                        }
                    });
                }
            });
        }
    }

    /// Bytes per (from device, to device) link.
    fn traffic(f: &Fabric) -> BTreeMap<(usize, usize), u64> {
        let m = f.mesh();
        f.link_stats().links.iter().map(|l| ((m.device(&l.from), m.device(&l.to)), l.bytes)).collect()
    }

    fn run_once(m: &Mesh, c: &Collective) -> Fabric {
        let f = Fabric::new(m);
        let numel = c.shape.iter().product();
        run(&f, c, &(0..m.devices()).map(|d| data(d, numel)).collect::<Vec<_>>(), true);
        f
    }

    #[test]
    fn links_join_neighbours_only() {
        let t = Fabric::new(&Mesh::numbered(&[2, 3], Topology::Torus));
        let links: Vec<(usize, usize)> = traffic(&t).into_keys().collect();
        // Axis 0 (size 2): one link pair per column; axis 1 (size 3): a ring per row.
        let want = vec![(0, 1), (0, 2), (0, 3), (1, 0), (1, 2), (1, 4), (2, 0), (2, 1), (2, 5), (3, 0), (3, 4), (3, 5)];
        assert_eq!(links[..12], want[..]);
        assert_eq!(links.len(), 18);
        let m = Fabric::new(&Mesh::numbered(&[2, 3], Topology::Mesh));
        assert_eq!(traffic(&m).len(), 14);
        assert_eq!(
            Fabric::new(&Mesh::single()).link_stats(),
            LinkStats { links: vec![], max: 0, fault_free_max: None }
        );
    }

    #[test]
    fn ring_all_reduce_puts_2_n_minus_1_over_n_bytes_on_each_ring_link() {
        let numel = 1 << 16;
        let bytes = 4 * numel as u64;
        for n in [2, 4, 8] {
            for topology in [Topology::Torus, Topology::Mesh] {
                let m = Mesh::numbered(&[n], topology);
                let f = run_once(
                    &m,
                    &coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![(0..n).collect()], &[numel]),
                );
                let per = 2 * (n as u64 - 1) * bytes / n as u64;
                let t = traffic(&f);
                for (&(a, b), &got) in &t {
                    // Torus: one direction round the ring; mesh: the embedded ring uses every
                    // link once (and a torus of 2 has one link pair).
                    let on_ring = topology == Topology::Mesh || n == 2 || b == (a + 1) % n;
                    assert_eq!(got, if on_ring { per } else { 0 }, "{topology:?} {n}: link {a}->{b}");
                }
            }
        }
    }

    #[test]
    fn multi_axis_all_reduce_goes_dimension_by_dimension() {
        let numel = 1 << 16;
        let b = 4 * numel as u64;
        let m = Mesh::numbered(&[2, 4], Topology::Torus);
        let f = run_once(&m, &coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, m.groups(&[0, 1]), &[numel]));
        for (&(x, y), &got) in &traffic(&f) {
            let (cx, cy) = (m.coords(x), m.coords(y));
            let want = if cx[0] != cy[0] {
                // Axis 0 first: the whole operand, halved, each way (reduce-scatter + all-gather).
                b
            } else if cy[1] == (cx[1] + 1) % 4 {
                // Then axis 1 on the half each member keeps: 2·3/4 of it, one way round.
                2 * 3 * (b / 2) / 4
            } else {
                0
            };
            assert_eq!(got, want, "link {x}->{y}");
        }
    }

    #[test]
    fn small_collectives_use_the_tree_to_rank_0() {
        let numel = 16;
        let b = 4 * numel as u64;
        let ar = CollectiveOp::AllReduce { reduce: Reduce::Sum };
        let f = run_once(&Mesh::numbered(&[4], Topology::Mesh), &coll(ar.clone(), vec![(0..4).collect()], &[numel]));
        let want: BTreeMap<(usize, usize), u64> =
            [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2)].map(|l| (l, b)).into();
        assert_eq!(traffic(&f), want);
        // On a torus of 8, members 4..7 reach 0 the other way round (4 ties: forward).
        let f = run_once(&Mesh::numbered(&[8], Topology::Torus), &coll(ar, vec![(0..8).collect()], &[numel]));
        let t = traffic(&f);
        for (x, y) in [(1, 0), (2, 1), (3, 2), (4, 5), (5, 6), (6, 7), (7, 0)] {
            assert_eq!((t[&(x, y)], t[&(y, x)]), (b, b), "{x}<->{y}");
        }
        assert_eq!(t.values().sum::<u64>(), 14 * b);
        // all_gather: the subtree's blocks up, the whole result down.
        let f = run_once(
            &Mesh::numbered(&[4], Topology::Mesh),
            &coll(CollectiveOp::AllGather { axis: 0 }, vec![(0..4).collect()], &[numel]),
        );
        let t = traffic(&f);
        assert_eq!([t[&(3, 2)], t[&(2, 1)], t[&(1, 0)]], [b, 2 * b, 3 * b]);
        assert_eq!([t[&(0, 1)], t[&(1, 2)], t[&(2, 3)]], [4 * b, 4 * b, 4 * b]);
    }

    #[test]
    fn large_gather_scatter_and_all_to_all_traffic() {
        let numel = 1 << 16;
        let b = 4 * numel as u64;
        let m = Mesh::numbered(&[4], Topology::Torus);
        let all = vec![(0..4).collect::<Vec<_>>()];
        let t = traffic(&run_once(&m, &coll(CollectiveOp::AllGather { axis: 0 }, all.clone(), &[numel])));
        assert!((0..4).all(|d| t[&(d, (d + 1) % 4)] == 3 * b && t[&((d + 1) % 4, d)] == 0));
        let rs = CollectiveOp::ReduceScatter { axis: 0, reduce: Reduce::Sum };
        let t = traffic(&run_once(&m, &coll(rs, all, &[numel])));
        assert!((0..4).all(|d| t[&(d, (d + 1) % 4)] == 3 * b / 4));
        // all_to_all is direct: on a line of 4 the middle link carries four blocks.
        let a2a = CollectiveOp::AllToAll { split_axis: 0, concat_axis: 0 };
        let t = traffic(&run_once(&Mesh::numbered(&[4], Topology::Mesh), &coll(a2a, vec![(0..4).collect()], &[numel])));
        assert_eq!([t[&(0, 1)], t[&(1, 2)], t[&(2, 3)]], [3 * b / 4, b, 3 * b / 4]);
        assert_eq!([t[&(1, 0)], t[&(2, 1)], t[&(3, 2)]], [3 * b / 4, b, 3 * b / 4]);
    }

    #[test]
    fn link_report_lists_busy_links_and_the_maximum() {
        let m = Mesh::numbered(&[1, 3], Topology::Mesh);
        let f = run_once(&m, &coll(CollectiveOp::AllGather { axis: 0 }, vec![vec![0, 1]], &[2]));
        assert_eq!(
            f.link_stats().report(),
            "link (0,0) -> (0,1) 16 bytes\nlink (0,1) -> (0,0) 8 bytes\nmax link bytes 16\n"
        );
        f.reset();
        assert_eq!(f.link_stats().report(), "max link bytes 0\n");
    }

    #[test]
    fn a_failed_member_ends_the_others_waits() {
        let m = Mesh::numbered(&[4], Topology::Torus);
        for numel in [4, 1 << 16] {
            let c = coll(CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![(0..4).collect()], &[numel]);
            let f = Fabric::new(&m);
            let errors: Vec<String> = std::thread::scope(|s| {
                let waiting: Vec<_> = (0..3)
                    .map(|d| {
                        let (f, c) = (&f, &c);
                        s.spawn(move || {
                            let mut out = vec![0.0; numel];
                            f.collective(d, c, &vec![1.0; numel], &mut out, None).unwrap_err().to_string()
                        })
                    })
                    .collect();
                // Device 3 fails instead of arriving (whether or not the others wait yet).
                std::thread::sleep(std::time::Duration::from_millis(20));
                f.poison(RunError::Other("device 3 (3): node 'h': broke".into()));
                waiting.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for e in errors {
                assert_eq!(e, "collective #7 abandoned: device 3 (3): node 'h': broke");
            }
            // Later arrivals fail at once; after a reset the fabric works again.
            let mut out = vec![0.0; numel];
            assert!(f.collective(3, &c, &vec![1.0; numel], &mut out, None).is_err());
            f.reset();
            let got = run(&f, &c, &vec![vec![1.0; numel]; 4], false);
            assert!(got.iter().all(|(r, _)| r.iter().all(|&x| x == 4.0)));
        }
    }

    #[test]
    fn buffers_are_checked_against_the_description() {
        let m = Mesh::numbered(&[2, 2], Topology::Mesh);
        let f = Fabric::new(&m);
        let e = f.collective(
            0,
            &coll(CollectiveOp::AllGather { axis: 0 }, vec![vec![0, 1]], &[4]),
            &[0.0; 4],
            &mut [0.0; 4],
            None,
        );
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("buffers of 4 and 4 elements for an operand of 4 and a result of 8"));
    }

    #[test]
    fn runs_cover_a_box_in_order() {
        let mut runs = Vec::new();
        for_each_run(&[4, 6, 8], &[1, 2, 0], &[2, 2, 8], &[0, 0, 0], &[2, 2, 8], |s, d, n| runs.push((s, d, n)));
        assert_eq!(runs, vec![(64, 0, 16), (112, 16, 16)]);
        runs.clear();
        for_each_run(&[2, 3], &[0, 0], &[4, 3], &[2, 0], &[2, 3], |s, d, n| runs.push((s, d, n)));
        assert_eq!(runs, vec![(0, 6, 6)]);
        runs.clear();
        for_each_run(&[3, 4], &[0, 1], &[3, 2], &[0, 0], &[3, 2], |s, d, n| runs.push((s, d, n)));
        assert_eq!(runs, vec![(1, 0, 2), (5, 2, 2), (9, 4, 2)]);
    }

    /// Up to `STACK_RANK` dims and past it (where the strides go to the heap), a box copied
    /// run by run lands where copying it element by element puts it.
    #[test]
    fn runs_copy_boxes_of_any_rank() {
        for rank in [1, 3, STACK_RANK, STACK_RANK + 1, STACK_RANK + 3] {
            let src: Vec<usize> = (0..rank).map(|d| 2 + d % 2).collect();
            let extent: Vec<usize> = src.iter().map(|&n| n - 1).collect();
            let at: Vec<usize> = (0..rank).map(|d| d % 2).collect();
            let dst = extent.clone();
            let numel = |s: &[usize]| s.iter().product::<usize>();
            let values: Vec<usize> = (0..numel(&src)).collect();
            let mut got = vec![usize::MAX; numel(&dst)];
            for_each_run(&src, &at, &dst, &vec![0; rank], &extent, |s, d, n| {
                got[d..d + n].copy_from_slice(&values[s..s + n])
            });
            let mut want = Vec::new();
            for i in 0..numel(&dst) {
                // Element i of the box: its index per dim, shifted by `at`, in `src`.
                let (mut rest, mut offset) = (i, 0);
                let mut stride = 1;
                for d in (0..rank).rev() {
                    let idx = rest % dst[d] + at[d];
                    rest /= dst[d];
                    offset += idx * stride;
                    stride *= src[d];
                }
                want.push(values[offset]);
            }
            assert_eq!(got, want, "rank {rank}");
        }
    }

    #[test]
    fn degraded_all_reduce_combines_the_healthy_operands_over_the_seed_schedule() {
        use crate::comm::degraded::plan;
        use crate::format::degradation::Degradation;
        let m = Mesh::numbered(&[4, 4], Topology::Torus);
        // The seed's figure 7 (a1, a2, b1, b2 failed) plus the link c3-c4.
        let deg = Degradation { nodes: vec![0, 1, 4, 5], links: vec![(10, 11)], along: vec![] };
        let topo = Topo::new(&m, &deg, false).unwrap();
        let healthy: Vec<usize> = (0..16).filter(|&d| topo.healthy(d)).collect();
        assert_eq!(healthy.len(), 12);
        // Both paths: one rendezvous, and parts claimed in parallel.
        for (numel, reduce) in [(1000, Reduce::Sum), (20_000, Reduce::Mean)] {
            let mut f = Fabric::new(&m);
            f.degrade(topo.clone()).unwrap();
            let c = coll(CollectiveOp::AllReduce { reduce }, vec![(0..16).collect()], &[numel]);
            let operands: Vec<Vec<f32>> = (0..16).map(|d| data(d, numel)).collect();
            let want = reduced(reduce, &healthy.iter().map(|&d| &operands[d]).collect::<Vec<_>>());
            let got = run(&f, &c, &operands, false);
            for &d in &healthy {
                assert!(got[d].0.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "device {d}, {numel}");
            }
            let stats = f.link_stats();
            let schedule = plan(&topo, numel).unwrap().link_bytes(4);
            for l in &stats.links {
                let (u, v) = (m.device(&l.from), m.device(&l.to));
                assert_eq!(l.bytes, schedule.get(&(u, v)).copied().unwrap_or(0), "{u}->{v}");
                assert!(l.bytes == 0 || topo.link_ok(u, v), "{u}->{v} carried {} bytes", l.bytes);
            }
        }
        // all_gather cannot leave a member's block out.
        let mut f = Fabric::new(&m);
        f.degrade(topo).unwrap();
        let c = coll(CollectiveOp::AllGather { axis: 0 }, vec![vec![0, 1, 2, 3]], &[4]);
        let e = f.collective(2, &c, &[0.0; 4], &mut [0.0; 16], None).unwrap_err();
        assert_eq!(e.to_string(), "collective #7: device (0,0) of its group is degraded");
    }

    #[test]
    fn degraded_sub_group_reductions_route_around_and_leave_degraded_members_out() {
        let m = Mesh::numbered(&[4, 4], Topology::Mesh);
        // b2 failed, the link c3-c4 failed: c4 is degraded along the rows, c3 along the rows.
        let deg = crate::format::degradation::Degradation { nodes: vec![5], links: vec![(10, 11)], along: vec![] };
        let topo = Topo::new(&m, &deg, false).unwrap();
        for axis in [0, 1] {
            for (numel, reduce) in [(64, Reduce::Sum), (40_000, Reduce::Mean)] {
                for op in [CollectiveOp::AllReduce { reduce }, CollectiveOp::ReduceScatter { axis: 0, reduce }] {
                    let mut f = Fabric::new(&m);
                    f.degrade(topo.clone()).unwrap();
                    let c = coll(op.clone(), m.groups(&[axis]), &[numel]);
                    let operands: Vec<Vec<f32>> = (0..16).map(|d| data(d, numel)).collect();
                    let got = run(&f, &c, &operands, false);
                    for g in &c.groups {
                        let healthy: Vec<&Vec<f32>> =
                            g.iter().filter(|&&d| topo.healthy(d)).map(|&d| &operands[d]).collect();
                        let want = reduced(reduce, &healthy);
                        for (r, &d) in g.iter().enumerate().filter(|&(_, &d)| topo.healthy(d)) {
                            let want = match op {
                                CollectiveOp::AllReduce { .. } => &want[..],
                                _ => &want[r * numel / 4..(r + 1) * numel / 4],
                            };
                            assert!(
                                got[d].0.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{op:?} along {axis}, device {d}"
                            );
                        }
                    }
                    for l in f.link_stats().links.iter().filter(|l| l.bytes > 0) {
                        let (u, v) = (m.device(&l.from), m.device(&l.to));
                        assert!(topo.link_ok(u, v), "{op:?} along {axis}: {u}->{v} carried {}", l.bytes);
                    }
                }
            }
        }
        // A reduce-scatter's broadcast carries only what members keep: less than all_reduce.
        let bytes = |op: CollectiveOp| {
            let mut f = Fabric::new(&m);
            f.degrade(topo.clone()).unwrap();
            let c = coll(op, vec![vec![1, 5, 9, 13]], &[40_000]);
            run(&f, &c, &(0..16).map(|d| data(d, 40_000)).collect::<Vec<_>>(), false);
            f.link_stats().links.iter().map(|l| l.bytes).sum::<u64>()
        };
        let ar = bytes(CollectiveOp::AllReduce { reduce: Reduce::Sum });
        let rs = bytes(CollectiveOp::ReduceScatter { axis: 0, reduce: Reduce::Sum });
        assert!(rs < ar && rs > ar / 3, "reduce_scatter {rs}, all_reduce {ar}");
    }
}
