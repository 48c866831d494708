//! One step of a device's program, by what executes it: a generated kernel (split into
//! parts over the cores), the library GEMM or fused attention, a collective in the fabric,
//! or a send/recv through the exchange.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::comm::error::RunError;
use crate::comm::fabric::{self, Delivery};
use crate::exec::runner::Loaded;
use crate::format::abi::KernelFn;
use crate::format::program::Exec;
use crate::format::symbolic::Scaling;
use crate::kernels::pool;

/// Runs `kernel` on `args` (the step's buffers, which are the ones it was generated for) as
/// `parts` parts at once, on this thread and the pool's (`crate::kernels::pool`). Returns the first
/// non-zero status of a part, or 0.
fn call_kernel(kernel: KernelFn, args: &[*mut u8], parts: usize) -> u32 {
    // SAFETY (both calls): the buffers are the kernel's, and parts of one call write disjoint
    // elements and read only what no other part writes.
    if parts == 1 {
        return unsafe { kernel(args.as_ptr(), 0, 1) };
    }
    let args = args.as_ptr() as usize;
    // The lowest failing part and its status, `part << 32 | status`: one word rather than a
    // status per part, so that a split step allocates nothing.
    let first = AtomicU64::new(u64::MAX);
    pool::split(parts, &|p| {
        let status = unsafe { kernel(args as *const *mut u8, p, parts) };
        if status != 0 {
            first.fetch_min((p as u64) << 32 | u64::from(status), Ordering::Relaxed);
        }
    });
    match first.into_inner() {
        u64::MAX => 0,
        f => f as u32,
    }
}

impl Loaded {
    /// Executes step `i` of `device`'s program on its buffers (`ptrs`: a collective's shared
    /// result or a `move` recv points its buffer elsewhere) with up to `threads` cores;
    /// `args` is the calling thread's scratch. With `waits`, the spans a collective or a
    /// transfer spent blocked for other devices go there, a transfer's from `start`.
    pub(super) fn exec_step(
        &self,
        (device, i): (usize, usize),
        ptrs: &[AtomicPtr<u8>],
        args: &mut Vec<*mut u8>,
        (threads, sizes): (usize, &super::sizes::Sizes),
        waits: Option<&mut Vec<fabric::Wait>>,
        start: Instant,
    ) -> Result<()> {
        let p = &self.programs[device];
        let st = &p.steps[i];
        args.clear();
        args.extend(st.buffers.iter().map(|&b| ptrs[b].load(Ordering::Relaxed)));
        match &st.exec {
            Exec::Kernel(k) => {
                // A kernel split for its rows at the bounds splits a call's fewer rows into
                // fewer parts, as one compiled for them would.
                let parts = match st.scaling {
                    Some(Scaling::Rows { size, hi, .. }) => {
                        let rows = sizes.table[size] as usize;
                        (p.kernels[*k].parts * rows).div_ceil(hi).max(1)
                    }
                    _ => p.kernels[*k].parts,
                };
                let status = call_kernel(self.kernel(device, *k), args, parts.min(threads));
                if status != 0 {
                    return Err(RunError::KernelStatus { node: st.node.clone(), status }.into());
                }
            }
            Exec::Library(_) => {
                let mask = |i: usize| self.masks[device].get(&st.buffers[i]);
                let Some(plan) = self.plans[device].get(i).and_then(Option::as_ref) else {
                    bail!("node '{}': a library call that was not planned", st.node)
                };
                // At other sizes than the upper bounds, the call planned for its shapes
                // (`sizes::check` kept them within the bounds').
                let replanned = match (&self.meta.symbolic, &st.scaling) {
                    (Some(sym), Some(Scaling::Shapes(_))) if sizes.values != self.upper => {
                        Some(self.replans.get(sym, (device, i), p, &plan.kept, &sizes.values)?)
                    }
                    _ => None,
                };
                let plan: &dyn crate::kernels::call::Planned = replanned.as_deref().unwrap_or(&*plan.plan);
                // SAFETY: `crate::exec::validate` had the call plan for the step's buffers,
                // the result apart from the operands (`Replans` the same for its rows);
                // only this step touches them now.
                unsafe { plan.call(args, &mask, threads) }.with_context(|| format!("node '{}'", st.node))?;
            }
            Exec::Collective(c) => {
                // SAFETY: `new` checked the buffers' sizes against the collective and
                // that the result is apart from the operand; nothing else touches them
                // until the call returns.
                let delivery = unsafe {
                    self.fabric.collective_raw(
                        device,
                        c,
                        args[1] as *const f32,
                        args[0] as *mut f32,
                        self.share[device][i],
                        waits,
                    )
                }
                .with_context(|| format!("node '{}'", st.node))?;
                if let Delivery::Shared(at) = delivery {
                    // No step writes this buffer again (`share`): read the result there.
                    // The streams that read it wait for an event recorded after the step,
                    // which orders this store before their loads.
                    ptrs[st.buffers[0]].store(at as *mut u8, Ordering::Relaxed);
                }
            }
            Exec::Send(t) => {
                // SAFETY: `new` checked the buffer holds `t.bytes`; a `move` send's buffer
                // is live to the end of the program (`passes::buffers`), so it stays put.
                unsafe { self.exchange.send(device, t, args[0]) }.with_context(|| format!("node '{}'", st.node))?;
                if let Some(w) = waits {
                    w.push((start, Instant::now()));
                }
            }
            Exec::Recv(t) => {
                // SAFETY: `new` checked the buffer holds `t.bytes` in the arena.
                let at =
                    unsafe { self.exchange.recv(device, t, args[0]) }.with_context(|| format!("node '{}'", st.node))?;
                // `move`: the data stays in the sender's buffer; read it there (the readers
                // on other streams wait for an event recorded after this step).
                ptrs[st.buffers[0]].store(at as *mut u8, Ordering::Relaxed);
                if let Some(w) = waits {
                    w.push((start, Instant::now()));
                }
            }
        }
        Ok(())
    }
}
