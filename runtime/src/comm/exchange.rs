//! Point-to-point transfers between device threads: the receiver-pull rendezvous (docs/design.md §4.1),
//! one slot per key (`program::Transfer`), for the protocol the compiler chose:
//! - `copy`: the recv announces its buffer; the send waits for it, copies its bytes straight
//!   into it and marks the slot done; the recv waits for that. The sender's buffer is free
//!   again as soon as the send returns.
//! - `move`: the send hands its buffer's address over and goes on (its memory is never
//!   reused within the run: the compiler kept it live); the recv waits for the address and
//!   reads the data there, in place, for the rest of the run.
//!
//! Between devices of different hosts (`set_hosts`) a transfer is one message over the
//! transport (`crate::comm::transport`), receiver-pull as well: the data leaves once the recv has
//! posted its buffer, where it lands under either protocol. The tag comes from the key.
//!
//! Nothing waits for ever: a wait ends with an error naming the key and both devices after
//! the timeout, or as soon as another device failed (`poison`). A waiter first checks for
//! `sync::SPIN` while yielding the core, then blocks, as the fabric's rendezvous do (a
//! sleeping thread's wake-up dominates a small transfer).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::comm::error::RunError;
use crate::comm::sync::{spin_until, Condvar, Mutex, MutexGuard};
use crate::comm::transport::{Hosts, Incoming, Outgoing, Stall};
use crate::format::program::{Protocol, Transfer};

/// How long a send or recv waits for its peer by default (`meshc run --timeout`).
pub const DEFAULT_TIMEOUT: Duration = crate::comm::sync::TIMEOUT;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Nothing yet this run.
    Empty,
    /// The receiver is ready; for `copy`, at this address.
    Ready(usize),
    /// `move`: the sender's data is at this address.
    Handed(usize),
    /// `copy`: the sender is copying.
    Copying,
    /// `copy`: the data is in the receiver's buffer.
    Done,
}

pub struct Exchange {
    slots: Mutex<HashMap<String, Slot>>,
    changed: Condvar,
    /// Counts the changes of `slots` (made under its lock), for the waiters that spin.
    generation: AtomicU64,
    poisoned: AtomicBool,
    timeout: Mutex<Duration>,
    /// Set when the devices are spread over hosts.
    hosts: Option<Arc<Hosts>>,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange {
            slots: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            generation: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            timeout: Mutex::new(DEFAULT_TIMEOUT),
            hosts: None,
        }
    }
}

/// Sets the slot of `key`, adding it only the first time a run uses the key.
fn set(slots: &mut HashMap<String, Slot>, key: &str, to: Slot) {
    match slots.get_mut(key) {
        Some(s) => *s = to,
        None => {
            slots.insert(key.to_string(), to);
        }
    }
}

/// "device 3": how the errors name a peer (the runner adds the failing device's label).
fn dev(d: usize) -> String {
    format!("device {d}")
}

/// "device 5 (host 1 (devices 4-7))": a device in an error about a transfer between hosts.
fn on(hosts: &Hosts, d: usize) -> String {
    format!("{} on {}", dev(d), hosts.label(hosts.host_of(d)))
}

impl Exchange {
    pub fn set_timeout(&self, t: Duration) {
        *self.timeout.lock() = t;
    }

    pub fn timeout(&self) -> Duration {
        *self.timeout.lock()
    }

    /// Sends the transfers between devices of different hosts over `hosts`' transport.
    pub fn set_hosts(&mut self, hosts: Arc<Hosts>) {
        self.hosts = Some(hosts);
    }

    /// The hosts, if `me` and `peer` are on different ones.
    fn across(&self, me: usize, peer: usize) -> Option<&Hosts> {
        self.hosts.as_deref().filter(|h| h.host_of(me) != h.host_of(peer))
    }

    /// One exchange with another host for transfer `key`; `what` describes the wait for a
    /// timeout's error.
    fn cross(
        &self,
        hosts: &Hosts,
        key: &str,
        sends: &[Outgoing],
        recvs: &mut [Incoming],
        what: impl Fn(Duration) -> String,
    ) -> Result<()> {
        let timeout = self.timeout();
        match hosts.exchange(sends, recvs, timeout, &|| self.poisoned.load(Ordering::SeqCst)) {
            Ok(()) => Ok(()),
            Err(Stall::Stopped) => bail!("stopped: another device failed"),
            Err(Stall::Timeout(_)) => Err(RunError::Timeout(what(timeout)).into()),
            Err(Stall::Failed(m)) => bail!("'{key}': {m}"),
        }
    }

    /// Forgets the last run's slots. Their keys stay, so that the next run's transfers
    /// find them without allocating.
    pub fn reset(&self) {
        self.lock().values_mut().for_each(|s| *s = Slot::Empty);
        self.poisoned.store(false, Ordering::SeqCst);
    }

    /// Wakes every waiter: another device failed, the run is over.
    pub fn poison(&self) {
        let _guard = self.lock();
        self.poisoned.store(true, Ordering::SeqCst);
        self.notify();
    }

    /// Wakes the waiters after a change of the slots (called under their lock).
    fn notify(&self) {
        self.generation.fetch_add(1, Ordering::Release);
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock()
    }

    /// Waits until `done` holds for the slots; `what` describes the wait for the error.
    fn wait<'a>(
        &'a self,
        mut slots: MutexGuard<'a, HashMap<String, Slot>>,
        mut done: impl FnMut(&mut HashMap<String, Slot>) -> bool,
        what: impl Fn(Duration) -> String,
    ) -> Result<MutexGuard<'a, HashMap<String, Slot>>> {
        let timeout = *self.timeout.lock();
        let start = Instant::now();
        loop {
            if done(&mut slots) {
                return Ok(slots);
            }
            if self.poisoned.load(Ordering::SeqCst) {
                bail!("stopped: another device failed");
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(RunError::Timeout(what(timeout)).into());
            }
            // Changes happen under the lock and bump the generation: unchanged after the
            // spin, nothing was missed, and blocking is safe.
            let seen = self.generation.load(Ordering::Acquire);
            drop(slots);
            spin_until(|| self.generation.load(Ordering::Acquire) != seen);
            slots = self.lock();
            if self.generation.load(Ordering::Acquire) == seen {
                self.changed.wait_for(&mut slots, left);
            }
        }
    }

    /// Device `me` sends `t.bytes` bytes at `src` to `t.peer`.
    ///
    /// # Safety
    /// `src` holds `t.bytes` readable bytes; for `move`, they stay valid and unchanged until
    /// the run ends.
    pub unsafe fn send(&self, me: usize, t: &Transfer, src: *const u8) -> Result<()> {
        if let Some(hosts) = self.across(me, t.peer) {
            let peer = hosts.host_of(t.peer);
            let what = |after| {
                format!(
                    "send '{}' from {} to {}: the recv was not ready after {after:?}",
                    t.key,
                    on(hosts, me),
                    on(hosts, t.peer)
                )
            };
            // SAFETY: the caller's contract: `src` holds `t.bytes` readable bytes.
            let bytes = unsafe { std::slice::from_raw_parts(src, t.bytes) };
            let data = Outgoing { to: peer, tag: hosts.key_tag(&t.key, 0)?, bytes };
            return self.cross(hosts, &t.key, &[data], &mut [], what);
        }
        let slots = self.lock();
        match t.protocol {
            Protocol::Move => {
                let mut slots = slots;
                set(&mut slots, &t.key, Slot::Handed(src as usize));
                self.notify();
                Ok(())
            }
            Protocol::Copy => {
                let mut dst = 0;
                let mut slots = self.wait(
                    slots,
                    |s| match s.get(&t.key) {
                        Some(Slot::Ready(at)) => {
                            dst = *at;
                            set(s, &t.key, Slot::Copying);
                            true
                        }
                        _ => false,
                    },
                    |after| {
                        format!(
                            "send '{}' from {} to {}: the recv was not ready after {after:?}",
                            t.key,
                            dev(me),
                            dev(t.peer)
                        )
                    },
                )?;
                drop(slots);
                // SAFETY: the receiver announced a buffer of `t.bytes` (both ends were
                // checked to agree at load) and waits, not touching it, until Done.
                unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, t.bytes) };
                slots = self.lock();
                set(&mut slots, &t.key, Slot::Done);
                self.notify();
                Ok(())
            }
            Protocol::Remote => bail!("send '{}': the remote protocol needs a transport between processes", t.key),
        }
    }

    /// Device `me` receives into `dst` (for `copy`); returns where the data is (`dst`, or
    /// the sender's buffer for `move`).
    ///
    /// # Safety
    /// `dst` has `t.bytes` writable bytes nothing else touches during the call.
    pub unsafe fn recv(&self, me: usize, t: &Transfer, dst: *mut u8) -> Result<*const u8> {
        if let Some(hosts) = self.across(me, t.peer) {
            let peer = hosts.host_of(t.peer);
            // SAFETY: the caller's contract: `dst` has `t.bytes` writable bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst, t.bytes) };
            let data = Incoming { from: peer, tag: hosts.key_tag(&t.key, 0)?, bytes };
            let what = |after| {
                format!(
                    "recv '{}' on {} from {}: no send came within {after:?}",
                    t.key,
                    on(hosts, me),
                    on(hosts, t.peer)
                )
            };
            self.cross(hosts, &t.key, &[], &mut [data], what)?;
            return Ok(dst);
        }
        let mut slots = self.lock();
        let missing = |after: Duration| {
            format!("recv '{}' on {} from {}: no send came within {after:?}", t.key, dev(me), dev(t.peer))
        };
        match t.protocol {
            Protocol::Move => {
                if matches!(slots.get(&t.key), None | Some(Slot::Empty)) {
                    set(&mut slots, &t.key, Slot::Ready(0));
                }
                self.notify();
                let mut at = 0;
                let mut slots = self.wait(
                    slots,
                    |s| match s.get(&t.key) {
                        Some(Slot::Handed(p)) => {
                            at = *p;
                            true
                        }
                        _ => false,
                    },
                    missing,
                )?;
                set(&mut slots, &t.key, Slot::Empty);
                Ok(at as *const u8)
            }
            Protocol::Copy => {
                set(&mut slots, &t.key, Slot::Ready(dst as usize));
                self.notify();
                let mut slots = self.wait(slots, |s| s.get(&t.key) == Some(&Slot::Done), missing)?;
                set(&mut slots, &t.key, Slot::Empty);
                Ok(dst)
            }
            Protocol::Remote => bail!("recv '{}': the remote protocol needs a transport between processes", t.key),
        }
    }
}
