//! Helpers shared by the bench binaries (each includes this file as `mod common`): medians,
//! the process's CPU time, and timing a collective on device threads that meet in the
//! fabric exactly as the runner's do.

#![allow(dead_code)] // each bench uses its own subset

use std::time::Instant;

use meshc::fabric::{Delivery, Fabric};
use meshc::program::Collective;
use meshc::runner::AlignedBuf;

pub fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// CPU time of the whole process so far: the sum over its threads of the nanoseconds each
/// spent on a CPU (`/proc/self/task/*/schedstat`, first field). Device threads persist
/// across runs, so differences of this sum measure a run; 0 where /proc is missing.
pub fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// Each of `devices` runs the f32 collective `c` over `f` `warmup + iters` times back to
/// back, element i of its operand being `i % 1000 + device`; `check(device, x)` sees the last
/// element of every result. Returns the first device's wall time of each of the last
/// `iters` calls.
pub fn time_collective(
    f: &Fabric,
    c: &Collective,
    devices: &[usize],
    share: bool,
    (warmup, iters): (usize, usize),
    check: impl Fn(usize, f32) + Sync,
) -> Vec<f64> {
    let numel: usize = c.shape.iter().product();
    let check = &check;
    std::thread::scope(|s| {
        let threads: Vec<_> = devices
            .iter()
            .map(|&d| {
                s.spawn(move || {
                    let mut operand = AlignedBuf::zeroed(numel * 4).unwrap();
                    for (i, x) in operand.as_mut_slice().chunks_exact_mut(4).enumerate() {
                        x.copy_from_slice(&((i % 1000 + d) as f32).to_le_bytes());
                    }
                    let mut result = AlignedBuf::zeroed(numel * 4).unwrap();
                    let mut times = Vec::new();
                    for i in 0..warmup + iters {
                        let t = Instant::now();
                        // SAFETY: both buffers live, apart, through the call.
                        let delivery = unsafe {
                            f.collective_raw(
                                d,
                                c,
                                operand.as_slice().as_ptr() as *const f32,
                                result.as_mut_slice().as_mut_ptr() as *mut f32,
                                share,
                                None,
                            )
                        }
                        .unwrap();
                        if i >= warmup {
                            times.push(t.elapsed().as_secs_f64());
                        }
                        let last = match delivery {
                            // SAFETY: valid until the next call.
                            Delivery::Shared(p) => unsafe { *p.add(numel - 1) },
                            Delivery::Written => {
                                f32::from_le_bytes(result.as_slice()[numel * 4 - 4..].try_into().unwrap())
                            }
                        };
                        check(d, last);
                    }
                    times
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).next().unwrap_or_default()
    })
}
