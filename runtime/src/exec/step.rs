//! One step of a device's program, by what executes it: a generated kernel (split into
//! parts over the cores), the library GEMM or fused attention, a collective in the fabric,
//! or a send/recv through the exchange.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::comm::error::RunError;
use crate::comm::fabric::{self, Delivery};
use crate::exec::runner::Loaded;
use crate::format::abi::KernelFn;
use crate::format::epilogue::Step;
use crate::format::program::{Elem, Exec, Library};
use crate::kernels::epilogue::Bound;
use crate::kernels::library::{self, Threads};
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
    let status: Vec<AtomicU32> = (0..parts).map(|_| AtomicU32::new(0)).collect();
    pool::split(parts, &|p| status[p].store(unsafe { kernel(args as *const *mut u8, p, parts) }, Ordering::Relaxed));
    status.iter().map(|s| s.load(Ordering::Relaxed)).find(|&s| s != 0).unwrap_or(0)
}

/// A library matmul's epilogue bound to its operands' buffers (the step's after `b`).
fn bind_epilogue<'s>(steps: &'s [Step], operands: &[*mut u8], out: &[usize]) -> Bound<'s> {
    let operands: Vec<*const f32> = operands.iter().map(|&p| p as *const f32).collect();
    // SAFETY: `check_program` checked each operand's buffer against its shape and that
    // shape against the result; the buffers outlive the step.
    unsafe { Bound::new(steps, &operands, out) }
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
        threads: usize,
        waits: Option<&mut Vec<fabric::Wait>>,
        start: Instant,
    ) -> Result<()> {
        let p = &self.programs[device];
        let st = &p.steps[i];
        args.clear();
        args.extend(st.buffers.iter().map(|&b| ptrs[b].load(Ordering::Relaxed)));
        match &st.exec {
            Exec::Kernel(k) => {
                let status = call_kernel(self.kernel(device, *k), args, p.kernels[*k].parts.min(threads));
                if status != 0 {
                    return Err(RunError::KernelStatus { node: st.node.clone(), status }.into());
                }
            }
            Exec::Library(Library::Matmul { a, b, out, panels: true, epilogue, .. }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let ep = bind_epilogue(epilogue, &args[3..], out);
                // SAFETY: the buffers hold f32 tensors of these shapes, `b` in panels
                // (checked by `check_program`), and the result does not alias the operands.
                let (o, x, y) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)),
                        std::slice::from_raw_parts(args[1] as *const f32, len(a)),
                        std::slice::from_raw_parts(
                            args[2] as *const f32,
                            crate::kernels::panels::packed_elems(b).unwrap_or(0),
                        ),
                    )
                };
                library::matmul_panels(x, y, o, a, b, out, Threads::UpTo(threads), &ep)
                    .with_context(|| format!("node '{}'", st.node))?;
            }
            Exec::Library(Library::Matmul { a, b, out, b_elem, epilogue, transposed, .. }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let ep = bind_epilogue(epilogue, &args[3..], out);
                // SAFETY: the buffers hold tensors of exactly these shapes (f32, b as
                // `b_elem`: checked by `check_program`), and the result does not alias the
                // operands.
                let (o, x) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)),
                        std::slice::from_raw_parts(args[1] as *const f32, len(a)),
                    )
                };
                let threads = Threads::UpTo(threads);
                match (b_elem, self.masks[device].get(&st.buffers[2])) {
                    (Elem::F32, mask) => {
                        // SAFETY: as above.
                        let y = unsafe { std::slice::from_raw_parts(args[2] as *const f32, len(b)) };
                        match mask {
                            Some(m) => library::matmul_masked(x, y, o, a, b, out, m, threads, &ep),
                            None if transposed.is_none() => library::matmul(x, y, o, a, b, out, threads, &ep),
                            None => library::matmul_transposed(x, y, o, a, b, out, *transposed, threads, &ep),
                        }
                    }
                    (half, _) => {
                        // SAFETY: as above.
                        let y = unsafe { std::slice::from_raw_parts(args[2] as *const u16, len(b)) };
                        library::matmul_half(x, (y, *half), o, a, b, out, threads, &ep)
                    }
                }
                .with_context(|| format!("node '{}'", st.node))?;
            }
            Exec::Library(Library::Attention { q, k, v, out, scale, mask }) => {
                let len = |s: &[usize]| s.iter().product::<usize>();
                let sh = crate::kernels::attention::Shapes::new(q, k, v, out, mask.as_deref())
                    .with_context(|| format!("node '{}'", st.node))?;
                let f32s = |i: usize, n: usize| {
                    // SAFETY: `check_program` checked that buffer `i` holds an aligned f32
                    // tensor of `n` elements; the result does not alias the operands.
                    unsafe { std::slice::from_raw_parts(args[i] as *const f32, n) }
                };
                let scale = scale.map(|how| (how, f32s(4, 1)[0]));
                let mask = mask.as_ref().map(|m| f32s(4 + usize::from(scale.is_some()), len(m)));
                // SAFETY: as above.
                let o = unsafe { std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)) };
                let threads = Threads::UpTo(threads).pick(sh.macs());
                crate::kernels::attention::attention(
                    &sh,
                    (f32s(1, len(q)), f32s(2, len(k)), f32s(3, len(v))),
                    scale,
                    mask,
                    o,
                    threads,
                );
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
