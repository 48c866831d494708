//! A run of an artifact compiled with symbolic dims: what `Loaded::new` checks of its
//! sizes (`check`), the sizes each call binds (`Sizes`, kept in the session's scratch so
//! that a call allocates nothing), and the library calls planned again for a call's shapes
//! (`Replans`, one plan per step and set of sizes, the sizes used last kept).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Result};
use parking_lot::Mutex;

use crate::format::program::{Buffer, Exec, Meta, Program, Storage};
use crate::format::symbolic::{Scaling, Symbolic};
use crate::kernels::call::Planned;
use crate::kernels::library_call;

/// One call's sizes: each symbol's value, the size table (which kernels read through the
/// `Storage::Sizes` buffer) and each output's shape.
pub(super) struct Sizes {
    pub(super) values: Vec<i64>,
    pub(super) table: Vec<i64>,
    pub(super) outputs: Vec<Vec<usize>>,
    divisors: Vec<Divisor>,
}

/// A size-table entry that a scaled kernel divides by (a repeating operand's stride or
/// period, `Scaling::Rows`), with the entry of the kernel's rows: whenever it runs a row,
/// the divisor must be at least 1. The compiler's entries always are (they are factors of
/// the rows); a call checks, so that an artifact whose entries are not stops with a line
/// instead of a division by zero in its code.
struct Divisor {
    node: String,
    rows: usize,
    slot: usize,
}

impl Sizes {
    /// The sizes of calls of `programs` (which `check` has accepted).
    pub(super) fn new(meta: &Meta, programs: &[Program]) -> Sizes {
        let (symbols, table) = meta.symbolic.as_ref().map_or((0, 0), |s| (s.symbols.len(), s.sizes.len()));
        let mut divisors: Vec<Divisor> = Vec::new();
        for st in programs.iter().flat_map(|p| &p.steps) {
            let Some(Scaling::Rows { size, repeats, .. }) = &st.scaling else { continue };
            for r in repeats.iter().flatten() {
                for slot in r.stride.into_iter().chain([r.period]) {
                    if !divisors.iter().any(|d| (d.rows, d.slot) == (*size, slot)) {
                        divisors.push(Divisor { node: st.node.clone(), rows: *size, slot });
                    }
                }
            }
        }
        Sizes {
            values: vec![0; symbols],
            table: vec![0; table],
            outputs: meta.outputs.iter().map(|o| o.shape.clone()).collect(),
            divisors,
        }
    }

    /// Binds the symbols from the inputs' shapes (`shape(i)`), fills the table and the
    /// outputs' shapes; static artifacts take exactly their inputs' shapes.
    pub(super) fn bind<'a>(&mut self, meta: &Meta, shape: impl Fn(usize) -> &'a [usize]) -> Result<()> {
        let Some(sym) = &meta.symbolic else {
            if let Some(i) = (0..meta.inputs.len()).find(|&i| shape(i) != meta.inputs[i].shape.as_slice()) {
                bail!(
                    "input '{}': shape {:?}, the graph's is {:?}",
                    meta.inputs[i].name,
                    shape(i),
                    meta.inputs[i].shape
                );
            }
            return Ok(());
        };
        let name = |i: usize| meta.inputs[i].name.as_str();
        sym.bind(&name, &shape, &mut self.values, &mut self.table).map_err(anyhow::Error::msg)?;
        if let Some(d) = self.divisors.iter().find(|d| self.table[d.rows] > 0 && self.table[d.slot] < 1) {
            bail!(
                "node '{}': these sizes make its operand repeat every {} of its rows (size {} of the table): the artifact is malformed",
                d.node,
                self.table[d.slot],
                sym.sizes[d.slot]
            );
        }
        for (o, s) in self.outputs.iter_mut().enumerate() {
            sym.output_shape(o, &self.values, s);
        }
        Ok(())
    }

    /// Output `o`'s bytes at the call's sizes.
    pub(super) fn output_bytes(&self, meta: &Meta, o: usize) -> Result<usize> {
        let spec = &meta.outputs[o];
        let dtype = spec.elem().ok_or_else(|| anyhow::anyhow!("output '{}' has unknown dtype", spec.name))?;
        Ok(dtype.size_bytes() * self.outputs[o].iter().product::<usize>())
    }
}

/// The most symbols an artifact may have: a call's values key its library plans without
/// allocating.
pub const MAX_SYMBOLS: usize = 8;

/// Library calls planned for a call's shapes, by the symbols' values and then (device,
/// step): planning allocates, so each is planned once and kept, for the `KEPT_SIZES` sets of
/// values used last. A session may see every size within the bounds (8192 for `batch=1..32,
/// seq=1..256`); what a plan keeps for its step alone is shared (`Kept`), but the plans of
/// every set of values, kept, would still grow without bound.
#[derive(Default)]
pub(super) struct Replans(Mutex<Kept>);

/// The plans of one set of the symbols' values, by (device, step), and when they were last
/// used (a count of look-ups).
#[derive(Default)]
struct AtValues {
    used: u64,
    steps: HashMap<(usize, usize), Arc<dyn Planned>>,
}

/// How many sets of the symbols' values `Replans` keeps the plans of.
pub(super) const KEPT_SIZES: usize = 64;

/// The plans kept, by the symbols' values, and the look-ups so far.
#[derive(Default)]
struct Kept {
    calls: u64,
    plans: HashMap<[i64; MAX_SYMBOLS], AtValues>,
}

impl Replans {
    /// Step `i` of `p` (on `device`) planned for the shapes its buffers have at `values`,
    /// sharing what the step's plans keep (`kept`).
    pub(super) fn get(
        &self,
        sym: &Symbolic,
        (device, i): (usize, usize),
        p: &Program,
        kept: &Arc<crate::kernels::call::Kept>,
        values: &[i64],
    ) -> Result<Arc<dyn Planned>> {
        let mut key = [0i64; MAX_SYMBOLS];
        key[..values.len()].copy_from_slice(values);
        {
            let mut all = self.0.lock();
            all.calls += 1;
            let now = all.calls;
            if let Some(at) = all.plans.get_mut(&key) {
                at.used = now;
                if let Some(plan) = at.steps.get(&(device, i)) {
                    return Ok(plan.clone());
                }
            }
        }
        let st = &p.steps[i];
        let (Exec::Library(lib), Some(Scaling::Shapes(shapes))) = (&st.exec, &st.scaling) else {
            bail!("node '{}': not a library call over symbolic shapes", st.node)
        };
        let buffers: Vec<&Buffer> = st.buffers.iter().map(|&b| &p.buffers[b]).collect();
        let at = lib.at_shapes(&sym.shapes_at(shapes, values));
        let plan: Arc<dyn Planned> = Arc::from(library_call(&at).plan(&buffers, kept).map_err(anyhow::Error::msg)?);
        let mut all = self.0.lock();
        if !all.plans.contains_key(&key) && all.plans.len() >= KEPT_SIZES {
            let oldest = all.plans.iter().min_by_key(|(_, at)| at.used).map(|(k, _)| *k);
            all.plans.remove(&oldest.expect("KEPT_SIZES is not 0"));
        }
        let now = all.calls;
        let at = all.plans.entry(key).or_default();
        at.used = now;
        at.steps.insert((device, i), plan.clone());
        Ok(plan)
    }

    /// How many sets of values have plans kept.
    pub(super) fn sizes_kept(&self) -> usize {
        self.0.lock().plans.len()
    }
}

/// What a symbolic artifact must be, beyond what any artifact must: one device (the mesh
/// and collectives take static sizes for now), symbols with valid bounds, dims for every
/// input and output that are the metadata's shapes at the upper bounds and never above
/// them within the bounds, a size table that one `Storage::Sizes` buffer per program
/// holds, and steps whose rows name an entry of it that never exceeds their `hi` (nor do
/// the entries their repeating operands' rows are read by).
pub(super) fn check(meta: &Meta, programs: &[Program]) -> Result<()> {
    let Some(sym) = &meta.symbolic else {
        if let Some(st) = programs.iter().flat_map(|p| &p.steps).find(|s| s.scaling.is_some()) {
            bail!("step '{}' scales with sizes the artifact does not have", st.node);
        }
        return Ok(());
    };
    if sym.symbols.len() > MAX_SYMBOLS {
        bail!("{} symbols: at most {MAX_SYMBOLS}", sym.symbols.len());
    }
    if meta.mesh.devices() != 1 {
        bail!("symbolic dims on a mesh of {} devices: only one device takes them for now", meta.mesh.devices());
    }
    for (i, s) in sym.symbols.iter().enumerate() {
        let again = meshc_ir::sym::Symbol::new(&s.name, s.lo, s.hi, s.multiple_of)
            .map_err(|e| anyhow::anyhow!("symbol '{}': {e}", s.name))?;
        if again != *s || sym.symbols[..i].iter().any(|t| t.name == s.name) {
            bail!("symbol '{}' is given twice or malformed", s.name);
        }
    }
    let bounds = |n: &str| sym.symbol(n).map_or((i64::MAX, i64::MIN), |s| (sym.symbols[s].lo, sym.symbols[s].hi));
    let hi = sym.upper();
    let at_hi = |n: &str| sym.symbol(n).map(|s| hi[s]);
    let io = [("input", &meta.inputs, &sym.inputs), ("output", &meta.outputs, &sym.outputs)];
    for (what, specs, dims) in io {
        if specs.len() != dims.len() {
            bail!("{} {what} shapes for {} {what}s", dims.len(), specs.len());
        }
        for (spec, dims) in specs.iter().zip(dims) {
            if dims.len() != spec.shape.len() {
                bail!("{what} '{}': {} symbolic dims for rank {}", spec.name, dims.len(), spec.shape.len());
            }
            for (e, &n) in dims.iter().zip(&spec.shape) {
                let (lo, top) = e.range(&bounds);
                if e.eval_with(&at_hi) != Some(n as i64) || lo < 0 || top > n as i128 {
                    bail!("{what} '{}': dim {e} is not its size {n} at the upper bounds", spec.name);
                }
                if what == "input" && !e.is_const() && e.as_sym().is_none() {
                    bail!("input '{}': dim {e} is neither a size nor a symbol", spec.name);
                }
            }
        }
    }
    for p in programs {
        let tables = p.buffers.iter().filter(|b| b.storage == Storage::Sizes).count();
        if tables > 1 {
            bail!("program {} has {tables} size tables", p.device);
        }
        for st in &p.steps {
            match (&st.scaling, &st.exec) {
                (None, _) => {}
                (Some(Scaling::Rows { size, hi, repeats }), Exec::Kernel(_)) if tables == 1 => {
                    let entry = |slot: usize| {
                        sym.sizes.get(slot).ok_or_else(|| {
                            anyhow::anyhow!("node '{}': size {slot} of a table of {}", st.node, sym.sizes.len())
                        })
                    };
                    let e = entry(*size)?;
                    let (lo, top) = e.range(&bounds);
                    if e.eval_with(&at_hi) != Some(*hi as i64) || lo < 0 || top > *hi as i128 || *hi == 0 {
                        bail!("node '{}': its rows {e} are not {hi} at the upper bounds, or exceed it", st.node);
                    }
                    // The result (buffer 0) is written row by row; only operands repeat.
                    if repeats.len() > st.buffers.len() || repeats.first().is_some_and(Option::is_some) {
                        bail!(
                            "node '{}': {} repeats for {} buffers, or its result repeats",
                            st.node,
                            repeats.len(),
                            st.buffers.len()
                        );
                    }
                    // A repeating operand is read at a row below its period, never past
                    // the kernel's rows at the bounds.
                    for r in repeats.iter().flatten() {
                        for slot in r.stride.into_iter().chain([r.period]) {
                            let e = entry(slot)?;
                            let (lo, top) = e.range(&bounds);
                            if lo < 0 || top > *hi as i128 {
                                bail!(
                                    "node '{}': its operand repeats every {e} rows, which may exceed its {hi} rows",
                                    st.node
                                );
                            }
                        }
                    }
                }
                (Some(Scaling::Shapes(shapes)), Exec::Library(lib)) => {
                    // At the bounds, the call as the step states it; never above it.
                    let upper = sym.shapes_at(shapes, &hi);
                    if shapes.len() != st.buffers.len() || lib.at_shapes(&upper) != *lib {
                        bail!("node '{}': its symbolic shapes are not its shapes at the upper bounds", st.node);
                    }
                    for (s, u) in shapes.iter().zip(&upper) {
                        for (e, &n) in s.iter().zip(u) {
                            let (lo, top) = e.range(&bounds);
                            if lo < 0 || top > n as i128 {
                                bail!("node '{}': its dim {e} may exceed its size {n} at the upper bounds", st.node);
                            }
                        }
                    }
                }
                _ => bail!("node '{}': a {} cannot scale so", st.node, st.exec.kind()),
            }
        }
    }
    Ok(())
}

/// How `Symbolic` reads in messages: `batch=1..64, seq=1..512`.
pub fn describe(sym: &Symbolic) -> String {
    let s: Vec<String> = sym.symbols.iter().map(|s| s.to_string()).collect();
    s.join(", ")
}
