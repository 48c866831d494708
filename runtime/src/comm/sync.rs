//! How the runtime's threads (devices, streams, the fabric's members) lock and wait: one
//! kind of lock and condition variable, and one spin before blocking.
//!
//! The locks are parking_lot's: they do not poison. Every piece of state they guard stays
//! consistent across a panic of a holder (a panicking step ends the run, and the fabric is
//! poisoned explicitly, with the reason), so std's poisoning only added an
//! `unwrap_or_else(|e| e.into_inner())` to every lock.

use std::time::{Duration, Instant};

pub use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

/// How long a waiter keeps checking before it blocks (`spin_until`). It yields the core
/// meanwhile, so device threads sharing the core still run; not blocking at once saves the
/// wake-up of a sleeping thread (futex and, in a VM, an interrupt to an idle core), which
/// dominates a small collective: the median latency of a 4-byte all_reduce over 8 devices
/// on 2 cores went from ~50 µs to ~12 µs. For stream events the testdata transformer on
/// mp-8 with every collective on the communication stream took ~2.4x the one-stream time
/// with 20 µs and ~2.1x with 100 µs (medians of 1000 runs, within noise).
pub const SPIN: Duration = Duration::from_micros(50);

/// How long a device waits for a peer (a recv for its send, a collective for a silent
/// member) before the run fails instead of hanging, unless set otherwise (`--timeout`).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Checks `ready` while yielding the core, for up to `SPIN`; whether it became true. The
/// caller then blocks on its condition variable, re-checking under its lock.
pub fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= SPIN {
            return false;
        }
        std::thread::yield_now();
    }
}
