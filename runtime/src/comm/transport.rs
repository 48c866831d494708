//! The seam between hosts: how the processes that run one artifact, each the devices of one
//! host (`Meta::hosts`) as threads, exchange bytes. The in-process fabric and exchange stay
//! the transport inside a host (and the only one without `hosts`); what crosses hosts goes
//! through a `Transport`: MPI (`crate::comm::mpi`, cargo feature `mpi`) between processes, or
//! `Threads` between hosts that are threads of one process (tests of everything above the
//! seam without MPI).
//!
//! The one primitive is `Transport::exchange`: post every receive, then every send, and wait
//! for all of them, never longer than a timeout and never after `stop` says the run is over.
//! Posting the receives first keeps the runtime's receiver-pull discipline and lets two
//! hosts swap large buffers without either blocking in a send.
//!
//! `Hosts` is what the fabric and the exchange need to know: which host each device is on,
//! which host this process is, and a message tag for every transfer key and collective of
//! the programs (all processes map the same artifact, so they number them alike).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::comm::sync::{Condvar, Mutex};
use crate::format::program::{Exec, Meta, Program};

/// A message to send: its bytes to host `to` under `tag`.
pub struct Outgoing<'a> {
    pub to: usize,
    pub tag: u32,
    pub bytes: &'a [u8],
}

/// A message to receive: exactly `bytes.len()` bytes from host `from` under `tag`.
pub struct Incoming<'a> {
    pub from: usize,
    pub tag: u32,
    pub bytes: &'a mut [u8],
}

/// Why an exchange did not complete.
#[derive(Debug)]
pub enum Stall {
    /// The timeout passed with this message still pending.
    Timeout(Pending),
    /// `stop` said the run is over.
    Stopped,
    /// The transport itself failed (its message).
    Failed(String),
}

/// The message a timed-out exchange was still waiting for: a receive nothing came for, else
/// a send its receiver never took (each an index into the exchange's receives or sends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    Recv(usize),
    Send(usize),
}

/// Moves bytes between the processes of one run, one per host (rank h runs host h).
pub trait Transport: Send + Sync {
    /// This process's host.
    fn rank(&self) -> usize;
    /// The number of hosts.
    fn size(&self) -> usize;
    /// Posts every receive, then every send, and waits until all are done; at most
    /// `timeout`, and no longer than `stop()` stays false. Messages between two hosts under
    /// one tag arrive in the order they were sent. Receiver-pull: a send's data may wait
    /// until its receiver has posted the receive, never the other way round.
    fn exchange(
        &self,
        sends: &[Outgoing],
        recvs: &mut [Incoming],
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Stall>;

    /// Ends every process of the run after an error here (the error already reported): a
    /// process that returned alone would leave the others waiting for it.
    fn abort(&self) {}
}

/// The hosts of a run as the fabric and the exchange see them.
pub struct Hosts {
    pub transport: Arc<dyn Transport>,
    /// Per device: its host.
    host_of: Vec<usize>,
    /// Per host: its devices, ascending.
    devices: Vec<Vec<usize>>,
    /// Message tags: one per transfer key, then one per collective (id, first device of the
    /// group), then one per output block (`output_tag`); below `AGREE_TAG`.
    keys: HashMap<String, u32>,
    collectives: HashMap<(usize, usize), u32>,
    outputs_base: u32,
    /// Per host: the bytes this host sent it since `reset` (`--link-stats`).
    sent: Vec<AtomicU64>,
}

/// Tags are a tag base times this, plus the message's phase (a reduction's partial results,
/// then its result).
pub const PHASES: u32 = 4;

/// The tag of `Hosts::agree`'s messages: fixed, above every other (which are numbered from
/// the artifact, and so may differ between hosts that do not run the same one), and within
/// the tags MPI allows (Open MPI: up to `i32::MAX`).
const AGREE_TAG: u32 = i32::MAX as u32 - 1;

/// The tag of `Hosts::broadcast`'s messages: fixed like `AGREE_TAG`, just below it.
const BROADCAST_TAG: u32 = AGREE_TAG - 1;

impl Hosts {
    /// Checks `meta.hosts` against the mesh and the transport (one process per host) and
    /// numbers the programs' transfer keys and collectives.
    pub fn new(meta: &Meta, programs: &[Program], transport: Arc<dyn Transport>) -> Result<Hosts> {
        let devices = meta.mesh.devices();
        if meta.hosts.is_empty() {
            bail!("the artifact names no hosts: compile it with a layout spec that has \"hosts\" (docs/layout.md)");
        }
        if transport.size() != meta.hosts.len() {
            bail!(
                "the artifact spreads its devices over {} hosts, the run has {} processes (mpirun -n {})",
                meta.hosts.len(),
                transport.size(),
                meta.hosts.len()
            );
        }
        let mut host_of = vec![usize::MAX; devices];
        for (h, group) in meta.hosts.iter().enumerate() {
            for &d in group {
                match host_of.get_mut(d) {
                    Some(slot) if *slot == usize::MAX => *slot = h,
                    Some(_) => bail!("hosts: device {d} is on two hosts"),
                    None => bail!("hosts: device {d} is not in the mesh of {devices} devices"),
                }
            }
        }
        if let Some(d) = host_of.iter().position(|&h| h == usize::MAX) {
            bail!("hosts: device {d} is on no host");
        }
        let mut keys = BTreeSet::new();
        let mut collectives = BTreeSet::new();
        for s in programs.iter().flat_map(|p| &p.steps) {
            match &s.exec {
                Exec::Send(t) | Exec::Recv(t) => {
                    keys.insert(t.key.clone());
                }
                Exec::Collective(c) => {
                    collectives.extend(c.groups.iter().filter_map(|g| g.first()).map(|&g0| (c.id, g0)));
                }
                _ => {}
            }
        }
        let count = keys.len() + collectives.len() + meta.outputs.len() * devices;
        if count as u64 * PHASES as u64 >= BROADCAST_TAG as u64 {
            bail!("{count} transfers, collectives and output blocks are more than MPI tags can number");
        }
        let outputs_base = (keys.len() + collectives.len()) as u32;
        let keys: HashMap<String, u32> = keys.into_iter().enumerate().map(|(i, k)| (k, i as u32)).collect();
        let base = keys.len();
        let collectives = collectives.into_iter().enumerate().map(|(i, c)| (c, (base + i) as u32)).collect();
        let sent = meta.hosts.iter().map(|_| AtomicU64::new(0)).collect();
        Ok(Hosts { transport, host_of, devices: meta.hosts.clone(), keys, collectives, outputs_base, sent })
    }

    /// Checks, before the first run, that every host runs what this one does: each sends
    /// every other its digest of each of `parts` (described as said of a host: "runs
    /// another artifact") and compares them with host 0's, so that every host names the same
    /// one. A host that differed would compute silently wrong outputs, or wait for messages
    /// that never come until the timeout blamed another.
    pub fn agree(&self, parts: &[(&str, [u8; 32])], timeout: Duration) -> Result<()> {
        let me = self.me();
        let mine: Vec<u8> = parts.iter().flat_map(|p| p.1).collect();
        let others: Vec<usize> = (0..self.devices.len()).filter(|&h| h != me).collect();
        let mut theirs = vec![vec![0u8; mine.len()]; others.len()];
        let tag = AGREE_TAG;
        let sends: Vec<Outgoing> = others.iter().map(|&to| Outgoing { to, tag, bytes: &mine }).collect();
        let mut recvs: Vec<Incoming> =
            others.iter().zip(&mut theirs).map(|(&from, bytes)| Incoming { from, tag, bytes }).collect();
        match self.transport.exchange(&sends, &mut recvs, timeout, &|| false) {
            Ok(()) => {}
            Err(Stall::Timeout(p)) => bail!("before the first run, {}", self.stalled(p, &sends, &recvs, timeout)),
            Err(Stall::Failed(m)) => bail!("before the first run, comparing the hosts: {m}"),
            Err(Stall::Stopped) => bail!("before the first run, comparing the hosts: stopped"),
        }
        drop(recvs);
        let record =
            |h: usize| if h == me { &mine } else { &theirs[others.iter().position(|&o| o == h).expect("a host")] };
        for h in 1..self.devices.len() {
            let (a, b) = (record(0).chunks(32), record(h).chunks(32));
            if let Some(((what, _), _)) = parts.iter().zip(a.zip(b)).find(|(_, (a, b))| a != b) {
                bail!("{} {what} than {}", self.label(h), self.label(0));
            }
        }
        Ok(())
    }

    /// Host 0's `bytes` on every host: host 0 sends them to each other host, which receives
    /// them into its `bytes` (as long as host 0's). What host 0 alone decides from outputs
    /// only it gets (a generation's next tokens) must reach the others before they run
    /// again, or they would run on something else, or wait for a run that never comes.
    pub fn broadcast(&self, bytes: &mut [u8], timeout: Duration) -> Result<()> {
        let tag = BROADCAST_TAG;
        let failed = |stall: Stall, stalled: &dyn Fn(Pending) -> String| match stall {
            Stall::Timeout(p) => bail!("broadcast from host 0: {}", stalled(p)),
            Stall::Stopped => bail!("broadcast from host 0: stopped"),
            Stall::Failed(m) => bail!("broadcast from host 0: {m}"),
        };
        if self.me() == 0 {
            let sends: Vec<Outgoing> = (1..self.devices.len()).map(|to| Outgoing { to, tag, bytes: &*bytes }).collect();
            match self.exchange(&sends, &mut [], timeout, &|| false) {
                Ok(()) => Ok(()),
                Err(e) => failed(e, &|p| self.stalled(p, &sends, &[], timeout)),
            }
        } else {
            let mut recvs = [Incoming { from: 0, tag, bytes }];
            match self.exchange(&[], &mut recvs, timeout, &|| false) {
                Ok(()) => Ok(()),
                Err(e) => failed(e, &|p| self.stalled(p, &[], &recvs, timeout)),
            }
        }
    }

    /// `Transport::exchange`, counting the bytes sent per host.
    pub fn exchange(
        &self,
        sends: &[Outgoing],
        recvs: &mut [Incoming],
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Stall> {
        for s in sends {
            self.sent[s.to].fetch_add(s.bytes.len() as u64, Ordering::Relaxed);
        }
        self.transport.exchange(sends, recvs, timeout, stop)
    }

    /// Clears the byte counts (between runs).
    pub fn reset(&self) {
        self.sent.iter().for_each(|b| b.store(0, Ordering::Relaxed));
    }

    /// "host 0 -> host 1 N bytes": one line per host this one sent anything since `reset`.
    pub fn report(&self) -> String {
        let me = self.me();
        (self.sent.iter().enumerate())
            .map(|(h, b)| (h, b.load(Ordering::Relaxed)))
            .filter(|&(_, b)| b > 0)
            .map(|(h, b)| format!("host {me} -> host {h} {b} bytes\n"))
            .collect()
    }

    /// This process's host.
    pub fn me(&self) -> usize {
        self.transport.rank()
    }

    pub fn host_of(&self, device: usize) -> usize {
        self.host_of[device]
    }

    pub fn is_local(&self, device: usize) -> bool {
        self.host_of[device] == self.me()
    }

    /// "host 1 (devices 4-7)": how errors name a host.
    pub fn label(&self, host: usize) -> String {
        let d = &self.devices[host];
        let contiguous = d.windows(2).all(|w| w[1] == w[0] + 1);
        match (d.len(), contiguous) {
            (1, _) => format!("host {host} (device {})", d[0]),
            (_, true) => format!("host {host} (devices {}-{})", d[0], d[d.len() - 1]),
            _ => format!("host {host} (devices {})", d.iter().map(usize::to_string).collect::<Vec<_>>().join(",")),
        }
    }

    /// Why an exchange of this host with `sends` and `recvs` timed out, naming the host
    /// it waited for: "on host 1 (device 1), nothing came from host 0 (device 0) within
    /// 2s" for a receive, "..., nothing was taken by host 0 (device 0) ..." for a send.
    pub fn stalled(&self, pending: Pending, sends: &[Outgoing], recvs: &[Incoming], timeout: Duration) -> String {
        let (what, peer) = match pending {
            Pending::Recv(i) => ("nothing came from", recvs[i].from),
            Pending::Send(i) => ("nothing was taken by", sends[i].to),
        };
        format!("on {}, {what} {} within {timeout:?}", self.label(self.me()), self.label(peer))
    }

    /// The tag of phase `phase` of transfer `key`.
    pub fn key_tag(&self, key: &str, phase: u32) -> Result<u32> {
        match self.keys.get(key) {
            Some(&i) => Ok(i * PHASES + phase),
            None => bail!("transfer '{key}' is in no program"),
        }
    }

    /// The tag of phase `phase` of collective `id` over the group that starts at `first`.
    pub fn collective_tag(&self, id: usize, first: usize, phase: u32) -> Result<u32> {
        match self.collectives.get(&(id, first)) {
            Some(&i) => Ok(i * PHASES + phase),
            None => bail!("collective #{id} is in no program"),
        }
    }

    /// The tag of the block of output `i` that `device` holds, sent to host 0.
    pub fn output_tag(&self, i: usize, device: usize) -> u32 {
        (self.outputs_base + (i * self.host_of.len() + device) as u32) * PHASES
    }
}

/// Hosts that are threads of one process, joined by mailboxes: `Threads::joined(n)` gives the
/// transport of each of the n hosts. Sends are buffered (a copy: the receiver pulls it from
/// the mailbox), receives wait.
pub struct Threads {
    rank: usize,
    size: usize,
    mail: Arc<Mailboxes>,
}

/// Messages by (from, to, tag), in the order sent.
type Boxes = BTreeMap<(usize, usize, u32), VecDeque<Vec<u8>>>;

#[derive(Default)]
struct Mailboxes {
    boxes: Mutex<Boxes>,
    arrived: Condvar,
}

impl Threads {
    pub fn joined(hosts: usize) -> Vec<Arc<dyn Transport>> {
        let mail = Arc::new(Mailboxes::default());
        (0..hosts)
            .map(|rank| Arc::new(Threads { rank, size: hosts, mail: mail.clone() }) as Arc<dyn Transport>)
            .collect()
    }
}

impl Transport for Threads {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(
        &self,
        sends: &[Outgoing],
        recvs: &mut [Incoming],
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Stall> {
        let mut boxes = self.mail.boxes.lock();
        for s in sends {
            boxes.entry((self.rank, s.to, s.tag)).or_default().push_back(s.bytes.to_vec());
        }
        self.mail.arrived.notify_all();
        let start = Instant::now();
        for (i, r) in recvs.iter_mut().enumerate() {
            loop {
                if let Some(m) = boxes.get_mut(&(r.from, self.rank, r.tag)).and_then(VecDeque::pop_front) {
                    if m.len() != r.bytes.len() {
                        return Err(Stall::Failed(format!(
                            "a message of {} bytes from host {} where {} were expected",
                            m.len(),
                            r.from,
                            r.bytes.len()
                        )));
                    }
                    r.bytes.copy_from_slice(&m);
                    break;
                }
                if stop() {
                    return Err(Stall::Stopped);
                }
                let left = timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(Stall::Timeout(Pending::Recv(i)));
                }
                // Wake now and then to look at `stop`, which no message announces.
                self.mail.arrived.wait_for(&mut boxes, left.min(Duration::from_millis(20)));
            }
        }
        Ok(())
    }
}
