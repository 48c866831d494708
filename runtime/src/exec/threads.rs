//! The device threads of a multi-device run: one per device (and stream) but the first,
//! started once, parked between runs, each running its part of the job a run hands them.
//! They know nothing of programs; what a job does is `crate::exec::streams`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use crate::comm::sync::{Condvar, Mutex};

/// A run's job: called once per lane with the lane's number, on that lane's thread. It
/// keeps what each lane answers itself.
pub(super) type Job<'a> = dyn Fn(usize) + Sync + 'a;

/// The device threads of a multi-device `Loaded`: one per lane but the first, whose part
/// the calling thread runs (saving a wake-up), each parked between runs.
/// Starting a thread per device and run cost more than small graphs take to run: the
/// transformer block on 2x4 devices ran in ~0.5 ms that way, ~0.19 ms on these threads
/// (one device: ~0.03 ms). Handing out a job allocates nothing: it is a pointer and a run
/// number, published under one lock.
///
/// A job borrows the run: the `Loaded`, the device's arena and the inputs, for a lifetime
/// the threads outlive. `run` is what makes that sound: it returns only once every thread
/// has finished its part (see the SAFETY comment there), and between runs the threads hold
/// no pointer to a job.
pub(super) struct Devices {
    board: Arc<Board>,
    pub(super) threads: Vec<JoinHandle<()>>,
}

/// What the caller and the threads share.
struct Board {
    state: Mutex<State>,
    /// The threads wait here for a run; the caller, for the threads to finish.
    posted: Condvar,
    finished: Condvar,
}

struct State {
    /// The current run's job, its lifetime erased (`run`); `None` between runs.
    job: Option<JobPtr>,
    /// Counts the runs handed out, so a thread takes each one once.
    run: u64,
    /// The threads still working on the current run.
    busy: usize,
    /// Set when the `Devices` is dropped: the threads exit.
    quit: bool,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job<'static>);

// SAFETY: the job is `Sync`; the pointer is only followed during the run that posted it
// (`Devices::run`).
unsafe impl Send for JobPtr {}

impl Devices {
    /// Starts the threads of lanes 1..lanes.
    pub(super) fn start(lanes: usize) -> Result<Devices> {
        let board = Arc::new(Board {
            state: Mutex::new(State { job: None, run: 0, busy: 0, quit: false }),
            posted: Condvar::new(),
            finished: Condvar::new(),
        });
        // Built up in place, so that if a spawn fails `Drop` joins the threads started.
        let mut pool = Devices { board, threads: Vec::new() };
        for lane in 1..lanes {
            let board = pool.board.clone();
            let thread = std::thread::Builder::new().name(format!("meshc device {lane}")).spawn(move || {
                let mut seen = 0;
                loop {
                    let job = {
                        let mut s = board.state.lock();
                        while !s.quit && s.run == seen {
                            board.posted.wait(&mut s);
                        }
                        if s.quit {
                            return;
                        }
                        seen = s.run;
                        s.job
                    };
                    if let Some(JobPtr(job)) = job {
                        // SAFETY: `run` keeps the job alive until this thread reports it
                        // is done, below.
                        let job = unsafe { &*job };
                        // `device_thread` catches the device's own panics; catching here
                        // too keeps the promise `run` relies on: every thread reports back,
                        // after its part has finished (unwinding included).
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(lane)));
                    }
                    let mut s = board.state.lock();
                    s.busy -= 1;
                    if s.busy == 0 {
                        board.finished.notify_one();
                    }
                }
            });
            pool.threads.push(thread.context("cannot start the device threads")?);
        }
        Ok(pool)
    }

    /// Runs `job` for every lane: lane 0 on the calling thread, each other lane on its
    /// thread; returns once all are done.
    pub(super) fn run(&self, job: &Job<'_>) {
        // SAFETY: erasing the job's lifetime lets the threads, which outlive it, reach it;
        // it is sound because this function returns only once every thread has finished
        // with it: each thread that takes the run decrements `busy` after its part, and the
        // loop below waits for `busy` to reach 0. Nothing between the post and that wait
        // can unwind (the caller's own part runs inside `catch_unwind`; the locks do not
        // panic). The pointer is cleared before this function returns; a thread follows only
        // the job of a run number it has not seen.
        let erased = unsafe { std::mem::transmute::<&Job<'_>, &Job<'static>>(job) };
        {
            let mut s = self.board.state.lock();
            s.job = Some(JobPtr(erased));
            s.run += 1;
            s.busy = self.threads.len();
        }
        self.board.posted.notify_all();
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut s = self.board.state.lock();
        while s.busy > 0 {
            self.board.finished.wait(&mut s);
        }
        s.job = None;
    }
}

impl Drop for Devices {
    /// `quit` ends the threads' loops; no run is under way (it would borrow the `Loaded`),
    /// so each is waiting for a run or about to.
    fn drop(&mut self) {
        self.board.state.lock().quit = true;
        self.board.posted.notify_all();
        for t in self.threads.drain(..) {
            // A thread never panics: its jobs' panics are caught.
            let _ = t.join();
        }
    }
}
