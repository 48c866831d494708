//! Kernels of a graph compiled with symbolic dims (docs/dynamic-shapes.md): a step whose
//! tensors' symbolic dims are all leading dims is generated at the upper bounds, for `hi`
//! rows, and runs the call's row count, which it reads from the size table (the kernel's
//! last buffer). The step's generator runs inside `scaled`; the one loop that walks the
//! rows, the outermost loop `nest::for_parts` cuts into parts, reads the count there
//! (`outer`). A generator that never reaches that loop, or reaches it with a count that is
//! not whole rows, makes `scaled` fail: nothing else in a kernel may depend on the rows.

use std::cell::RefCell;

use anyhow::{bail, Result};
use cranelift_codegen::ir::{types, InstBuilder, Value};

use meshc_runtime::format::symbolic::RepeatSlots;

use super::emit::{mem, KernelBuilder};

/// Where a scaled kernel finds its row count.
#[derive(Clone, Debug)]
pub struct RowsArg {
    /// The kernel buffer that is the size table.
    pub buf: usize,
    /// The table entry holding the rows.
    pub slot: usize,
    /// The rows the kernel is generated for.
    pub hi: usize,
    /// Per kernel buffer, the table entries of how it repeats over the rows, for an
    /// operand broadcast along some of the result's leading dims (`sizes::Repeat`).
    pub repeats: Vec<Option<RepeatSlots>>,
}

/// A repeating operand's stride and period this call, in rows, and the iterations of the
/// outer loop a row takes.
pub(crate) struct Repeat {
    stride: Option<Value>,
    period: Value,
    per_row: i64,
}

impl Repeat {
    /// The outer-loop iteration of the operand that iteration `i` of the result reads: it
    /// is laid out as if it had the result's rows, each of its own rows once (row `r`
    /// reads its row `(r / stride) mod period`), the iterations within a row as the
    /// result's.
    pub fn at(&self, kb: &mut KernelBuilder, i: Value) -> Value {
        let Some(stride) = self.stride else {
            let period = kb.b.ins().imul_imm_s(self.period, self.per_row);
            return kb.b.ins().urem(i, period);
        };
        if self.per_row == 1 {
            let row = kb.b.ins().udiv(i, stride);
            return kb.b.ins().urem(row, self.period);
        }
        let r = kb.b.ins().udiv_imm_u(i, self.per_row);
        let within = kb.b.ins().urem_imm_u(i, self.per_row);
        let row = kb.b.ins().udiv(r, stride);
        let row = kb.b.ins().urem(row, self.period);
        let start = kb.b.ins().imul_imm_s(row, self.per_row);
        kb.b.ins().iadd(start, within)
    }
}

struct Scaled {
    arg: RowsArg,
    uses: usize,
    bad: Option<String>,
}

thread_local! {
    static SCALED: RefCell<Option<Scaled>> = const { RefCell::new(None) };
}

/// Runs the generator `f` of a kernel that scales with the rows `arg` describes; fails if
/// the kernel it generates does not read them exactly where its rows are walked.
pub fn scaled<T>(arg: RowsArg, f: impl FnOnce() -> Result<T>) -> Result<T> {
    /// Clears the setting however `f` ends (a panic included), so that no later kernel
    /// of this thread scales by mistake.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            SCALED.with(|s| s.borrow_mut().take());
        }
    }
    SCALED.with(|s| *s.borrow_mut() = Some(Scaled { arg, uses: 0, bad: None }));
    let clear = Clear;
    let out = f();
    let Some(s) = SCALED.with(|s| s.borrow_mut().take()) else { bail!("the row count was taken twice") };
    drop(clear);
    let out = out?;
    if let Some(why) = s.bad {
        bail!("{why}")
    }
    if s.uses == 0 {
        bail!("its kernel does not walk its rows in one outer loop, so it cannot take a run-time row count yet")
    }
    Ok(out)
}

/// The rows of the kernel being generated, if it scales.
pub(crate) fn scaling() -> Option<usize> {
    SCALED.with(|s| s.borrow().as_ref().map(|s| s.arg.hi))
}

/// The trip count of the outermost loop of a kernel, `n` at the upper bounds: the call's
/// rows times `n / hi` when the kernel scales (`None`: it does not, `n` is the count).
pub(crate) fn outer(kb: &mut KernelBuilder, n: usize) -> Option<Value> {
    let arg = SCALED.with(|s| {
        let mut s = s.borrow_mut();
        let s = s.as_mut()?;
        s.uses += 1;
        if !n.is_multiple_of(s.arg.hi) {
            s.bad = Some(format!("its outer loop of {n} is not whole rows of {}", s.arg.hi));
        }
        Some((s.arg.buf, s.arg.slot, s.arg.hi))
    })?;
    let (buf, slot, hi) = arg;
    let table = kb.buf(buf);
    let rows = kb.b.ins().load(types::I64, mem(), table, (slot * 8) as i32);
    Some(kb.b.ins().imul_imm_s(rows, (n / hi) as i64))
}

/// Per kernel buffer (`pointers` of them), how it repeats over the rows, for an operand
/// broadcast along some of the result's leading dims (the outer loop being `n` iterations
/// at the bounds). Such an operand is laid out as if it had the result's rows, so its
/// pointer steps as the result's does, but from the row it repeats (`Repeat::at`).
pub(crate) fn repeats(kb: &mut KernelBuilder, pointers: usize, n: usize) -> Vec<Option<Repeat>> {
    let Some((buf, repeats, hi)) =
        SCALED.with(|s| s.borrow().as_ref().map(|s| (s.arg.buf, s.arg.repeats.clone(), s.arg.hi)))
    else {
        return (0..pointers).map(|_| None).collect();
    };
    let load = |kb: &mut KernelBuilder, slot: usize| {
        let table = kb.buf(buf);
        kb.b.ins().load(types::I64, mem(), table, (slot * 8) as i32)
    };
    (0..pointers)
        .map(|b| {
            let slots = repeats.get(b).copied().flatten()?;
            let stride = slots.stride.map(|s| load(kb, s));
            Some(Repeat { stride, period: load(kb, slots.period), per_row: (n / hi) as i64 })
        })
        .collect()
}

/// Whether kernel buffer `b` repeats over the rows (`repeats`).
pub(crate) fn is_periodic(b: usize) -> bool {
    SCALED.with(|s| s.borrow().as_ref().is_some_and(|s| s.arg.repeats.get(b).copied().flatten().is_some()))
}
