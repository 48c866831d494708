//! The device threads of a multi-device run: one per device (and stream) but the first,
//! started once, parked between runs, each running the job a run hands it. They know
//! nothing of programs; what a job does is `crate::exec::streams`.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};

/// One device's work in a run, answering `R` (`None` if it failed).
pub(super) type Job<'a, R> = Box<dyn FnOnce() -> Option<R> + Send + 'a>;

/// The device threads of a multi-device `Loaded`, each job answering `R`: one per device
/// but the first, whose jobs the calling thread runs (saving a wake-up), each blocked on
/// its channel between runs.
/// Starting a thread per device and run cost more than small graphs take to run: the
/// transformer block on 2x4 devices ran in ~0.5 ms that way, ~0.19 ms on these threads
/// (one device: ~0.03 ms).
///
/// A job borrows the run: the `Loaded`, the device's arena and the inputs, for a lifetime
/// the threads outlive. `run` is what makes that sound: it returns only once every job it
/// handed out has finished (see the SAFETY comment there), and between runs the threads
/// hold nothing but their channels.
pub(super) struct Devices<R> {
    jobs: Vec<mpsc::Sender<Job<'static, R>>>,
    /// (device, its job's answer): exactly one per job taken, panicking or not.
    done: mpsc::Receiver<(usize, Option<R>)>,
    pub(super) threads: Vec<JoinHandle<()>>,
}

impl<R: Send + 'static> Devices<R> {
    pub(super) fn start(devices: usize) -> Result<Devices<R>> {
        let (answer, done) = mpsc::channel();
        // Built up in place, so that if a spawn fails `Drop` joins the threads started.
        let mut pool = Devices { jobs: Vec::new(), done, threads: Vec::new() };
        for d in 1..devices {
            let (tx, rx) = mpsc::channel::<Job<'static, R>>();
            let answer = answer.clone();
            let thread = std::thread::Builder::new().name(format!("meshc device {d}")).spawn(move || {
                for job in rx {
                    // `device_thread` catches the device's own panics; catching here too
                    // keeps the promise `run` relies on: every job taken is answered, after
                    // it has finished (unwinding included).
                    let run = std::panic::catch_unwind(AssertUnwindSafe(job)).ok().flatten();
                    if answer.send((d, run)).is_err() {
                        break;
                    }
                }
            });
            pool.threads.push(thread.context("cannot start the device threads")?);
            pool.jobs.push(tx);
        }
        Ok(pool)
    }

    /// Hands job `d` to device `d`'s thread, runs job 0, and waits for all of them; `None`
    /// for a device whose job failed (it poisoned the fabric) or could not be handed out.
    pub(super) fn run<'a>(&self, jobs: Vec<Job<'a, R>>) -> Vec<Option<R>> {
        let mut runs: Vec<Option<R>> = jobs.iter().map(|_| None).collect();
        let mut jobs = jobs.into_iter();
        let Some(own) = jobs.next() else { return runs };
        let mut sent = 0;
        for (tx, job) in self.jobs.iter().zip(jobs) {
            // SAFETY: erasing 'a lets the job cross into a thread that outlives 'a; it is
            // sound because every job is done before this function returns, so nothing
            // borrowed for 'a is used after. A job sent is answered on `done` once it has
            // finished, panic or not (the thread catches it); the loop below takes as many
            // answers as jobs were sent, and nothing from here to its end can unwind (sends
            // and receives on these channels do not panic, and the caller's own job runs
            // inside `catch_unwind`). A job whose send fails comes back inside the error and
            // is dropped unrun. Should `done` disconnect, every thread has exited (each holds
            // a sender to it, `self` none), so none runs a job.
            let job = unsafe { std::mem::transmute::<Job<'a, R>, Job<'static, R>>(job) };
            if tx.send(job).is_ok() {
                sent += 1;
            }
        }
        runs[0] = std::panic::catch_unwind(AssertUnwindSafe(own)).ok().flatten();
        for _ in 0..sent {
            let Ok((d, run)) = self.done.recv() else { break };
            runs[d] = run;
        }
        runs
    }
}

impl<R> Drop for Devices<R> {
    /// Closing the job channels ends the threads' loops; no run is under way (it would
    /// borrow the `Loaded`), so each is waiting for a job or about to.
    fn drop(&mut self) {
        self.jobs.clear();
        for t in self.threads.drain(..) {
            // A thread never panics: its jobs' panics are caught.
            let _ = t.join();
        }
    }
}
