//! The MPI transport (cargo feature `mpi`): the hosts of a run are the ranks of
//! `MPI_COMM_WORLD`, one process per host started by `mpirun -n H`, over Open MPI (or any
//! MPI with `MPI_THREAD_MULTIPLE`: every device thread may cross hosts at once).
//!
//! Bound through `ferrompi`, which compiles a small C shim against the MPI found by
//! pkg-config: no libclang at build time, and its communicators are `Send + Sync`, so the
//! device threads share them.
//!
//! `exchange` is receiver-pull on the wire too: each receive is posted first and then
//! announced to its sender by a one-byte token on a second communicator; a send's data
//! leaves only once its token has come. So data never waits in a send for a receiver that
//! is not there, and on a timeout (or when the run is stopped) only receives are pending,
//! which MPI can cancel: the call returns, and the run ends with the error and an
//! `MPI_Abort` of the whole job (`Transport::abort`; Open MPI cannot go on without a
//! process).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferrompi::{Communicator, Mpi, Request, ThreadLevel};

use crate::comm::transport::{Incoming, Outgoing, Pending, Stall, Transport};

/// MPI as a `Transport`. The `Mpi` handle itself stays with the caller of `init` (on the
/// thread that finalizes MPI when it drops it, after the run).
pub struct MpiTransport {
    /// Data.
    world: Communicator,
    /// The tokens that announce posted receives.
    tokens: Communicator,
}

/// Initializes MPI with full thread support: the handle (finalize by dropping it once the
/// run is over) and the transport over `MPI_COMM_WORLD`.
pub fn init() -> Result<(Mpi, MpiTransport)> {
    let mpi = Mpi::init_thread(ThreadLevel::Multiple).context("MPI_Init_thread")?;
    if mpi.thread_level() < ThreadLevel::Multiple {
        bail!(
            "this MPI gives thread level {:?}, meshc needs MPI_THREAD_MULTIPLE (device threads cross hosts at once)",
            mpi.thread_level()
        );
    }
    let world = mpi.world();
    let tokens = world.duplicate().context("MPI_Comm_dup")?;
    Ok((mpi, MpiTransport { world, tokens }))
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn exchange(
        &self,
        sends: &[Outgoing],
        recvs: &mut [Incoming],
        timeout: Duration,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<(), Stall> {
        let failed = |e: ferrompi::Error| Stall::Failed(format!("MPI: {e}"));
        let mut tokens_in = vec![[0u8; 1]; sends.len()];
        let token = [1u8; 1];
        let peers: Vec<(i32, i32)> = recvs.iter().map(|r| (r.from as i32, r.tag as i32)).collect();
        let outcome = ferrompi::scope(|s| {
            // Each pending request, `None` once it completed.
            let mut data_in: Vec<Option<Request>> = Vec::new();
            for r in recvs.iter_mut() {
                data_in.push(Some(self.world.irecv(s, &mut *r.bytes, r.from as i32, r.tag as i32)?));
            }
            for &(from, tag) in &peers {
                // One byte: sent eagerly, complete without the peer.
                self.tokens.isend(s, &token, from, tag)?;
            }
            let mut ready: Vec<Option<Request>> = Vec::new();
            for (o, t) in sends.iter().zip(tokens_in.iter_mut()) {
                ready.push(Some(self.tokens.irecv(s, t, o.to as i32, o.tag as i32)?));
            }
            let mut data_out: Vec<Option<Request>> = sends.iter().map(|_| None).collect();
            let start = Instant::now();
            let mut idle = 0u32;
            loop {
                let mut progress = false;
                for (i, r) in ready.iter_mut().enumerate() {
                    if let Some(req) = r {
                        if req.test()?.is_some() {
                            *r = None;
                            progress = true;
                            let o = &sends[i];
                            data_out[i] = Some(self.world.isend(s, o.bytes, o.to as i32, o.tag as i32)?);
                        }
                    }
                }
                for r in data_in.iter_mut().chain(data_out.iter_mut()) {
                    if let Some(req) = r {
                        if req.test()?.is_some() {
                            *r = None;
                            progress = true;
                        }
                    }
                }
                let first = |v: &[Option<Request>]| v.iter().position(Option::is_some);
                // A send waits for its token, then for its data to leave.
                let waiting = (first(&data_in).map(Pending::Recv))
                    .or_else(|| first(&ready).or_else(|| first(&data_out)).map(Pending::Send));
                let Some(waiting) = waiting else { return Ok(Ok(())) };
                let stalled = if stop() {
                    Some(Stall::Stopped)
                } else if start.elapsed() >= timeout {
                    Some(Stall::Timeout(waiting))
                } else {
                    None
                };
                if let Some(stall) = stalled {
                    // Only receives can be pending (module doc): cancel them, so that the
                    // scope can complete them and end.
                    for req in data_in.iter_mut().chain(ready.iter_mut()).flatten() {
                        req.cancel()?;
                    }
                    return Ok(Err(stall));
                }
                // Poll hot while messages flow, then back off to a sleep: a waiting leader
                // must not take the core from the device threads still computing.
                idle = if progress { 0 } else { idle + 1 };
                if idle > 64 {
                    std::thread::sleep(Duration::from_micros(if idle > 1024 { 200 } else { 20 }));
                } else {
                    std::thread::yield_now();
                }
            }
        });
        outcome.map_err(failed)?
    }

    fn abort(&self) {
        self.world.abort(1)
    }
}
