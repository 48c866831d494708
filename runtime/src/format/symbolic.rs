//! What an artifact compiled with symbolic dims says about its sizes (docs/dynamic-shapes.md):
//! the symbols and their bounds, each input's and output's dims as expressions, the checks a
//! call must pass, the size table a call fills, and how a step scales (`Scaling`).
//!
//! Every buffer is laid out for the upper bounds, and every tensor of a call is stored
//! from the start of its buffer at its own shape: a generated kernel does the first `r` of
//! the `hi` rows it was compiled for, a library call is planned for the call's shapes.

use meshc_ir::sym::{Check, Expr, Symbol};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Symbolic {
    pub symbols: Vec<Symbol>,
    /// Each input's dims, in `Meta::inputs` order: a constant or a symbol.
    pub inputs: Vec<Vec<Expr>>,
    /// Each output's dims, in `Meta::outputs` order.
    pub outputs: Vec<Vec<Expr>>,
    /// What a call's sizes must meet beyond the bounds.
    pub checks: Vec<Check>,
    /// The size table: each entry evaluated once per call. Kernels read it through a
    /// `Storage::Sizes` buffer (one i64 per entry), library calls through `Rows::size`.
    pub sizes: Vec<Expr>,
}

/// How a step scales with a call's sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scaling {
    /// A generated kernel, compiled for `hi` rows (the leading dims the symbols size, of
    /// every buffer it touches that has them, flattened into one): it runs `sizes[size]`
    /// of them, read from the size table it is passed.
    Rows {
        size: usize,
        hi: usize,
        /// Per kernel buffer (the result first, which repeats nothing), how an operand
        /// broadcast along some of the result's leading dims repeats over the rows; empty
        /// when none does. The kernel divides by these entries, so loading checks them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        repeats: Vec<Option<RepeatSlots>>,
    },
    /// A library call: each buffer's shape over the symbols (result, then operands), which
    /// each call evaluates and plans for.
    Shapes(Vec<Vec<Expr>>),
}

/// The size-table entries of an operand that repeats over a scaled kernel's rows: result
/// row `r` reads the operand's row `(r / stride) mod period` (`stride` `None` when it is 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepeatSlots {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stride: Option<usize>,
    pub period: usize,
}

impl Symbolic {
    /// The index of symbol `name`.
    pub fn symbol(&self, name: &str) -> Option<usize> {
        self.symbols.iter().position(|s| s.name == name)
    }

    /// The symbols' values from the inputs' shapes (`shape(i)`: input i's) into `values`
    /// (one per symbol), checked against the bounds, each other and the checks, and the
    /// size table at them into `table`. The first violation is one line naming the input,
    /// the symbol and the bound. Allocates only for that line.
    pub fn bind<'a, 'n>(
        &self,
        names: &dyn Fn(usize) -> &'n str,
        shape: &dyn Fn(usize) -> &'a [usize],
        values: &mut [i64],
        table: &mut [i64],
    ) -> Result<(), String> {
        values.iter_mut().for_each(|v| *v = -1);
        for (i, dims) in self.inputs.iter().enumerate() {
            let (name, actual) = (names(i), shape(i));
            if actual.len() != dims.len() {
                let want = meshc_ir::sym::infer::show(dims);
                return Err(format!(
                    "input {name}: rank {} given, the graph's {want} is rank {}",
                    actual.len(),
                    dims.len()
                ));
            }
            for (k, (e, &v)) in dims.iter().zip(actual).enumerate() {
                let v = i64::try_from(v).map_err(|_| format!("input {name}: dim {k} is too large"))?;
                let Some(s) = e.as_sym().and_then(|s| self.symbol(s)) else {
                    if e.as_const() != Some(v) {
                        return Err(format!("input {name}: dim {k} is {v}, the graph's is {e}"));
                    }
                    continue;
                };
                let sym = &self.symbols[s];
                if let Some(why) = sym.refuse(v) {
                    return Err(format!("input {name}: dim {k} ({}) is {v}, {why}", sym.name));
                }
                if values[s] >= 0 && values[s] != v {
                    let other = self.bound_by(names, s, shape);
                    return Err(format!(
                        "input {name}: dim {k} ({}) is {v}, but input {other} has {} = {}",
                        sym.name, sym.name, values[s]
                    ));
                }
                values[s] = v;
            }
        }
        let values: &[i64] = values;
        let value = |n: &str| self.symbol(n).map(|s| values[s]).filter(|&v| v >= 0);
        for c in &self.checks {
            if c.kind.holds_with(&value) != Some(true) {
                let vals: Vec<String> =
                    self.symbols.iter().zip(values).map(|(s, v)| format!("{} = {v}", s.name)).collect();
                return Err(format!("input sizes {} fail the check {c}", vals.join(", ")));
            }
        }
        for (t, e) in table.iter_mut().zip(&self.sizes) {
            *t = e.eval_with(&value).ok_or_else(|| format!("the size {e} has no value at these sizes"))?;
        }
        Ok(())
    }

    /// The first input that binds symbol `s`.
    fn bound_by<'a, 'n>(
        &self,
        name: &dyn Fn(usize) -> &'n str,
        s: usize,
        shape: &dyn Fn(usize) -> &'a [usize],
    ) -> &'n str {
        let sym = self.symbols[s].name.as_str();
        let binds = |i: usize| self.inputs[i].iter().zip(shape(i)).any(|(e, _)| e.as_sym() == Some(sym));
        (0..self.inputs.len()).find(|&i| binds(i)).map_or("?", name)
    }

    /// Dim `e` at the symbols' `values`. Loading checked that every dim an artifact states
    /// lies within 0 and its size at the bounds, so the fallback 0 is never taken.
    fn dim(&self, e: &Expr, values: &[i64]) -> usize {
        let value = |n: &str| self.symbol(n).map(|s| values[s]);
        e.eval_with(&value).and_then(|v| usize::try_from(v).ok()).unwrap_or(0)
    }

    /// Output `o`'s dims at the symbols' `values` into `shape` (as long as its rank).
    pub fn output_shape(&self, o: usize, values: &[i64], shape: &mut [usize]) {
        for (d, e) in shape.iter_mut().zip(&self.outputs[o]) {
            *d = self.dim(e, values);
        }
    }

    /// Each buffer's shape of a `Scaling::Shapes` step at the symbols' `values`.
    pub fn shapes_at(&self, shapes: &[Vec<Expr>], values: &[i64]) -> Vec<Vec<usize>> {
        shapes.iter().map(|s| s.iter().map(|e| self.dim(e, values)).collect()).collect()
    }

    /// Every symbol at its upper bound (rounded down to its divisor).
    pub fn upper(&self) -> Vec<i64> {
        self.symbols.iter().map(|s| s.hi / s.multiple_of * s.multiple_of).collect()
    }
}
