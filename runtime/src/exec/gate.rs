//! The cores a run's device threads compute on at once, when they outnumber the cores:
//! a long GEMM step of a device holds one of `cores` permits while it runs, so that with
//! 8 devices on 2 cores two GEMMs run to the end, one per core, instead of eight sharing
//! the cores in time slices (each slice refilling the caches the others evicted).
//!
//! Only such compute steps hold a permit, and a step that holds one waits for no other
//! device (it computes, then returns it); collectives, sends, receives and the waits for
//! events take none. A device that waits for a permit therefore waits only for steps that
//! finish by themselves: the gate adds no way to deadlock, and collectives and send/recv
//! keep their semantics. Short steps skip the gate: handing a permit to a sleeping thread
//! costs a wake-up (tens of µs in a VM), more than a short step gains.

use std::sync::OnceLock;
use std::time::Duration;

use crate::comm::sync::{Condvar, Mutex};
use crate::format::program::{Exec, Library, Step};

/// Multiply-adds of a GEMM step from which it takes a permit: about a millisecond on
/// one core, so the wake-up a hand-off may cost is small beside it.
const GATED_MACS: usize = 1 << 26;

/// How often a device waiting for a permit tells the fabric it is alive, so that a device
/// waiting at a collective for it does not take the wait for a failure.
const BEAT: Duration = Duration::from_millis(100);

pub(super) struct Gate {
    /// Permits not taken.
    free: Mutex<usize>,
    freed: Condvar,
}

/// The process's gate: one permit per core, shared by every run (runs of several `Loaded`
/// at once share the cores too).
pub(super) fn gate() -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(|| Gate::new(cores()))
}

/// The cores this process may use. Not rayon::current_num_threads(): that starts the pool's
/// threads, which a run that never splits a kernel does not need (and load time would pay
/// for). Asked once: the answer comes from cgroup files (~20 µs), and every run asks.
pub(super) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether step `st` computes long enough to take a permit.
pub(super) fn gated(st: &Step) -> bool {
    match &st.exec {
        Exec::Library(Library::Matmul(m)) => {
            m.out.iter().product::<usize>().saturating_mul(m.a.last().copied().unwrap_or(0)) >= GATED_MACS
        }
        _ => false,
    }
}

/// A permit, returned when dropped.
pub(super) struct Permit<'a>(&'a Gate);

impl Gate {
    fn new(permits: usize) -> Gate {
        Gate { free: Mutex::new(permits), freed: Condvar::new() }
    }

    /// Takes a permit, waiting for one if none is free; calls `beat` while it waits.
    pub(super) fn enter(&self, beat: impl Fn()) -> Permit<'_> {
        let mut free = self.free.lock();
        while *free == 0 {
            beat();
            self.freed.wait_for(&mut free, BEAT);
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock() += 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// However many threads want in, no more than the permits are inside at once, and
    /// every thread gets in.
    #[test]
    fn permits_bound_the_threads_inside() {
        let gate = Gate::new(2);
        let (inside, most, done) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let _permit = gate.enter(|| {});
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(done.into_inner(), 8 * 50);
        assert!(most.into_inner() <= 2);
        assert_eq!(*gate.free.lock(), 2);
    }
}
