//! The runner's fork/join: `split(parts, f)` runs `f(0..parts)` on the calling thread and
//! on persistent worker threads, returning once every part has run. A step of a run is
//! split this way (a generated kernel's parts, the small-M GEMM's strips), tens of times per
//! millisecond on a small model, so the fork/join itself must cost far less than a step:
//! the workers spin for `SPIN` after their last part before they sleep on a condition
//! variable, and the caller spins for its workers instead of sleeping, so a split between
//! two steps close together costs no system call at all (a rayon scope entered from a
//! thread outside its pool sleeps on a latch and is woken: two futex round trips a step).
//!
//! Parts are claimed from a shared counter, so the caller takes on any part a worker has not
//! started (a worker that the OS has descheduled delays nobody). One split runs at a time:
//! a split asked for while another is under way (another run on another thread, or a part
//! that splits again) runs its parts on its own thread.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps: longer than the gap between two split
/// steps of a run (an unsplit kernel or two), short enough not to hold a core between runs.
const SPIN: Duration = Duration::from_micros(300);

/// How long a spin stays busy before it yields between polls.
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// Parts per thread a step splits into where its work divides finely (the GEMMs): a part a
/// worker has claimed and then been descheduled from (a machine busy with other jobs) holds
/// up the whole step, and smaller parts bound that wait; the others are claimed by whoever
/// is running.
pub const PARTS_PER_THREAD: usize = 4;

/// The work of one split, on the caller's stack while the split lasts.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    parts: usize,
    /// The next unclaimed part.
    next: AtomicUsize,
}

impl Job<'_> {
    /// Claims and runs parts until none is left.
    fn work(&self) {
        loop {
            let p = self.next.fetch_add(1, Ordering::Relaxed);
            if p >= self.parts {
                return;
            }
            (self.f)(p);
        }
    }
}

/// A job's address with its lifetime erased: it crosses into the workers, which take it only
/// while it is `Slot::job` and use it only while they hold a count in `Pool::active` (see
/// `Finish`).
#[derive(Clone, Copy)]
struct JobRef(*const Job<'static>);
// SAFETY: a `Job` is Sync (atomics and a Sync closure); see `JobRef` for its lifetime.
unsafe impl Send for JobRef {}

/// What the workers watch.
struct Slot {
    /// Bumped for each new job.
    epoch: u64,
    job: Option<JobRef>,
    /// Workers asleep on `Pool::wake`.
    sleeping: usize,
}

struct Pool {
    slot: Mutex<Slot>,
    wake: Condvar,
    /// The epoch, readable without the lock (what spinning workers poll).
    epoch: AtomicUsize,
    /// Workers holding a job's address: raised with `slot` locked, lowered when done.
    active: AtomicUsize,
    /// Taken by the split under way.
    busy: AtomicBool,
    /// Workers started.
    workers: AtomicUsize,
}

/// The pool: one worker per core but the caller's, started on first use.
fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            slot: Mutex::new(Slot { epoch: 0, job: None, sleeping: 0 }),
            wake: Condvar::new(),
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            workers: AtomicUsize::new(0),
        }));
        for i in 1..cores {
            let spawned = std::thread::Builder::new().name(format!("meshc worker {i}")).spawn(move || worker(pool));
            // Fewer workers only means fewer parts at once; a split never waits for one.
            pool.workers.fetch_add(usize::from(spawned.is_ok()), Ordering::Relaxed);
        }
        pool
    })
}

/// One round of a spin that began at `start`: busy at first, then yielding the core, so
/// that on a machine with more runnable threads than cores the spinner lets the thread it
/// waits for (or another job) run instead of burning its time slice.
fn pause(start: Instant) {
    if start.elapsed() < YIELD_AFTER {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
    } else {
        std::thread::yield_now();
    }
}

fn worker(pool: &'static Pool) {
    let mut seen = 0u64;
    loop {
        // Spin for a new epoch, then sleep for one.
        let start = Instant::now();
        while pool.epoch.load(Ordering::Acquire) as u64 == seen && start.elapsed() < SPIN {
            pause(start);
        }
        let mut slot = pool.slot.lock().unwrap_or_else(|e| e.into_inner());
        while slot.epoch == seen {
            slot.sleeping += 1;
            slot = pool.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
            slot.sleeping -= 1;
        }
        seen = slot.epoch;
        let Some(job) = slot.job else { continue };
        pool.active.fetch_add(1, Ordering::Relaxed);
        drop(slot);
        // SAFETY: the job lives until its caller sees `active` back at 0 (`Finish`).
        unsafe { (*job.0).work() };
        pool.active.fetch_sub(1, Ordering::Release);
    }
}

/// Runs `f(p)` for every `p` in `0..parts`, spread over the calling thread and the pool's
/// workers; returns when all have run. A part's panic is not caught: `f` must not panic
/// (the runner's kernels return a status instead).
pub fn split(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    if parts <= 1 {
        (0..parts).for_each(f);
        return;
    }
    let pool = pool();
    if pool.workers.load(Ordering::Relaxed) == 0 || pool.busy.swap(true, Ordering::Acquire) {
        (0..parts).for_each(f);
        return;
    }
    let job = Job { f, parts, next: AtomicUsize::new(0) };
    let _finish = Finish(pool);
    {
        let mut slot = pool.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.epoch += 1;
        // SAFETY (of the erased lifetime): `_finish`, dropped before `job` (declared after
        // it), unpublishes the job and waits until no worker holds it.
        slot.job = Some(JobRef(std::ptr::from_ref(&job).cast::<Job<'static>>()));
        pool.epoch.store(slot.epoch as usize, Ordering::Release);
        if slot.sleeping > 0 {
            pool.wake.notify_all();
        }
    }
    job.work();
}

/// The end of a split, also when a part of the caller's panics: no worker may take the job
/// any more, and the workers that took it have finished every part they claimed (all parts
/// are claimed: the caller claims until none is left, and so does each worker).
struct Finish(&'static Pool);

impl Drop for Finish {
    fn drop(&mut self) {
        let pool = self.0;
        pool.slot.lock().unwrap_or_else(|e| e.into_inner()).job = None;
        let start = Instant::now();
        while pool.active.load(Ordering::Acquire) > 0 {
            pause(start);
        }
        pool.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part runs exactly once, whatever the number of parts, also when splits come
    /// from several threads at once (one runs on the pool, the others inline).
    #[test]
    fn every_part_runs_once() {
        std::thread::scope(|s| {
            for t in 0..3 {
                s.spawn(move || {
                    for parts in [0, 1, 2, 3, 7, 64] {
                        for _ in 0..200 {
                            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                            split(parts, &|p| {
                                hits[p].fetch_add(1, Ordering::Relaxed);
                            });
                            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "thread {t}, {parts} parts");
                        }
                    }
                });
            }
        });
    }

    /// A part may split again: the inner split runs inline.
    #[test]
    fn nested_splits_run_inline() {
        let total = AtomicUsize::new(0);
        split(4, &|_| {
            split(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }
}
