//! What the threads of a run share: each device's events (`Board`), where its buffers are
//! and where each of its streams is (`DeviceShared`).

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::comm::sync::{spin_until, Condvar, Mutex, MutexGuard};

/// The events of one device in a run, plus one more: the inputs are in (`inputs_event`).
/// Streams block on a condition variable (after a short spin), never spin for long.
pub(super) struct Board {
    pub(super) done: Vec<AtomicBool>,
    lock: Mutex<()>,
    cv: Condvar,
    poisoned: AtomicBool,
}

impl Board {
    pub(super) fn new(events: usize) -> Board {
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

    pub(super) fn record(&self, e: usize) {
        self.done[e].store(true, Ordering::Release);
        // Under the lock: a waiter checks the flag under it before sleeping.
        let _g = self.guard();
        self.cv.notify_all();
    }

    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
        let _g = self.guard();
        self.cv.notify_all();
    }

    /// Waits until event `e` is recorded; false if the run was abandoned meanwhile.
    pub(super) fn wait(&self, e: usize) -> bool {
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
pub(super) struct DeviceShared {
    pub(super) ptrs: Vec<AtomicPtr<u8>>,
    pub(super) board: Board,
    pub(super) cursors: Vec<Mutex<usize>>,
}
