//! What the threads of a run share: each device's events (`Board`), where its buffers are
//! and where each of its streams is (`DeviceShared`); with the run's other bookkeeping
//! (`Scratch`), built once per `Loaded` and reset by every run under the lock that orders
//! runs (`crate::exec::runner::State`), so that a run allocates none of it.

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::time::Duration;

use crate::comm::sync::{spin_until, Condvar, Mutex, MutexGuard};
use crate::exec::validate::Lanes;
use crate::format::program::{Meta, Program};

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

    /// No event recorded, not poisoned: as `new` left it.
    fn reset(&mut self) {
        self.done.iter_mut().for_each(|d| *d.get_mut() = false);
        *self.poisoned.get_mut() = false;
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

impl DeviceShared {
    fn new(p: &Program, lanes: &Lanes) -> DeviceShared {
        DeviceShared {
            ptrs: p.buffers.iter().map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            board: Board::new(lanes.inputs_event + 1),
            cursors: lanes.steps.iter().map(|_| Mutex::new(0)).collect(),
        }
    }

    /// Ready for a run: no event recorded, every stream at its first step. The run then
    /// sets every pointer.
    pub(super) fn reset(&mut self) {
        self.board.reset();
        self.cursors.iter_mut().for_each(|c| *c.get_mut() = 0);
    }
}

/// A run's bookkeeping, kept between runs (each run overwrites all of it before use).
pub(super) struct Scratch {
    /// Per input: whether it is resident state, already on the device.
    pub(super) resident: Vec<bool>,
    /// Per output: whether the run hands it to the caller (resident state's stays).
    pub(super) returned: Vec<bool>,
    /// Per device.
    pub(super) devices: Vec<DeviceShared>,
    /// The kernel arguments of a run's only stream, on the calling thread.
    pub(super) args: Args,
    /// Per output: where a run puts together an output the devices hold in blocks.
    pub(super) assembled: Vec<Vec<u8>>,
    /// Of a run on the device threads, per lane (a stream of a device).
    pub(super) lanes: Vec<Lane>,
    /// The call's sizes.
    pub(super) sizes: super::sizes::Sizes,
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

/// A lane of a run on the device threads: one stream of one device.
pub(super) struct Lane {
    pub(super) device: usize,
    pub(super) stream: usize,
    /// Its thread's kernel arguments.
    pub(super) args: Mutex<Args>,
    /// What its run left: its step times, or `None` if it failed.
    pub(super) times: Mutex<Option<Vec<StepTime>>>,
}

impl Scratch {
    pub(super) fn new(meta: &Meta, programs: &[Program], lanes: &[Lanes]) -> Scratch {
        Scratch {
            sizes: super::sizes::Sizes::new(meta, programs),
            resident: Vec::new(),
            returned: Vec::new(),
            devices: programs.iter().zip(lanes).map(|(p, l)| DeviceShared::new(p, l)).collect(),
            args: Args(Vec::new()),
            assembled: Vec::new(),
            lanes: (lanes.iter().enumerate())
                .flat_map(|(device, l)| l.active().map(move |stream| (device, stream)))
                .map(|(device, stream)| Lane {
                    device,
                    stream,
                    args: Mutex::new(Args(Vec::new())),
                    times: Mutex::new(None),
                })
                .collect(),
        }
    }
}

/// A step's buffer addresses, as its kernel takes them.
pub(super) struct Args(pub(super) Vec<*mut u8>);

// SAFETY: only the run holding the runner's lock uses it, on its own thread, and each step
// overwrites it before the kernel reads it: between runs it holds addresses never followed.
unsafe impl Send for Args {}
