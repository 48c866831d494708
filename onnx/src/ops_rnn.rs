//! ONNX's recurrent layers LSTM, GRU and RNN (docs/onnx.md), unrolled at import over their
//! sequence, whose length the import knows: the input projection of every time step is one
//! matmul (`[seq·batch, input] · Wᵀ`, plus the biases), then each step is a small matmul of
//! the hidden state with Rᵀ and the gates as slices, activations, `mul` and `add`. Nothing
//! new reaches the IR, so the interpreter, the passes and codegen run them as they are.
//! Every attribute is implemented as onnxruntime computes it: the directions (reverse runs
//! from the last step to the first, bidirectional concatenates both), the activations with
//! their alpha/beta (consumed in order by the activations that take them), `clip` on every
//! gate's input, `input_forget` (f = 1 − i), peepholes, `linear_before_reset`, `layout` 1
//! (batch first), and `sequence_lens`: a batch row past its length keeps its state and
//! gives zeros in Y, so a reverse direction starts at the row's own last step; a row of
//! length 0 gives zero final states (not its initial ones).

use meshc_ir::{Attr, DType, Op};

use super::builder::{Builder, Value};
use super::control::MAX_TRIPS;
use super::ops::{reshape, scalar, table, Converter, Ctx};
use super::ops_math::{
    elu_of, float_only, hard_sigmoid_of, leaky_relu_of, softplus, softsign, thresholded_relu_of, Steps,
};

type R<T> = std::result::Result<T, String>;

/// This module's converters (docs/onnx.md). Opset 7's versions mean what 14's do, which
/// only adds `layout` (default 0).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(7, "LSTM", |b, c| recurrent(b, c, Cell::Lstm)),
    Converter::since(7, "GRU", |b, c| recurrent(b, c, Cell::Gru)),
    Converter::since(7, "RNN", |b, c| recurrent(b, c, Cell::Rnn)),
];

#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    /// How many gates W and R stack (ONNX's order: LSTM i, o, f, c; GRU z, r, h).
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// The default activations of one direction (f, g, h for LSTM).
    fn activations(self) -> &'static [&'static str] {
        match self {
            Cell::Lstm => &["sigmoid", "tanh", "tanh"],
            Cell::Gru => &["sigmoid", "tanh"],
            Cell::Rnn => &["tanh"],
        }
    }
}

/// One activation function with its alpha and beta.
#[derive(Clone)]
struct Act {
    name: String,
    alpha: f64,
    beta: f64,
}

/// Which of alpha and beta each activation takes, and their defaults (ONNX's operators').
const ACTIVATIONS: &[(&str, Option<f64>, Option<f64>)] = &[
    ("sigmoid", None, None),
    ("tanh", None, None),
    ("relu", None, None),
    ("affine", Some(1.0), Some(0.0)),
    ("leakyrelu", Some(0.01), None),
    ("thresholdedrelu", Some(1.0), None),
    ("scaledtanh", Some(1.0), Some(1.0)),
    ("hardsigmoid", Some(0.2), Some(0.5)),
    ("elu", Some(1.0), None),
    ("softsign", None, None),
    ("softplus", None, None),
];

/// The activations of each direction: `activations` (case-insensitive, as onnxruntime reads
/// them; one direction's list serves both), alpha and beta taken in order by those that use them.
fn activations(c: &Ctx, cell: Cell, dirs: usize) -> R<Vec<Vec<Act>>> {
    let per = cell.activations().len();
    let names: Vec<String> = match c.attr("activations") {
        Some(a) if !a.strings.is_empty() => {
            a.strings.iter().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect()
        }
        _ => cell.activations().iter().map(|s| s.to_string()).collect(),
    };
    // (RNN's own default is ['Tanh', 'Tanh'] whatever the direction: onnxruntime takes the
    // first of a list of two directions' worth on a single direction, and so does meshc.)
    let names = if per == 1 && dirs == 1 && names.len() == 2 { names[..1].to_vec() } else { names };
    if names.len() != per && names.len() != per * dirs {
        return Err(format!(
            "attribute activations: {} names, expected {per} per direction ({} in all)",
            names.len(),
            per * dirs
        ));
    }
    let floats = |n: &str| c.attr(n).map(|a| a.floats.clone()).unwrap_or_default();
    let (alphas, betas) = (floats("activation_alpha"), floats("activation_beta"));
    let (mut alphas, mut betas) = (alphas.iter(), betas.iter());
    let mut all = Vec::new();
    for name in names {
        let Some(&(_, alpha, beta)) = ACTIVATIONS.iter().find(|a| a.0 == name) else {
            return Err(format!("attribute activations: '{name}' is not one of ONNX's recurrent activations"));
        };
        let take = |default: Option<f64>, given: &mut std::slice::Iter<f32>| {
            default.map(|d| given.next().map_or(d, |&v| v.into())).unwrap_or(0.0)
        };
        let alpha = take(alpha, &mut alphas);
        let beta = take(beta, &mut betas);
        all.push(Act { name, alpha, beta });
    }
    let all = if all.len() == per { (0..dirs).flat_map(|_| all.clone()).collect() } else { all };
    Ok(all.chunks(per).map(<[Act]>::to_vec).collect())
}

/// The shapes of one layer: sequence, batch, input and hidden sizes, directions.
struct Dims {
    seq: usize,
    batch: usize,
    hidden: usize,
    dirs: usize,
}

/// Input `i`'s shape, which must be `want` (`name` in the message).
fn expect_shape(b: &Builder, c: &Ctx, i: usize, name: &str, want: &[usize]) -> R<()> {
    match c.opt(i).map(|v| b.ty(v).shape) {
        Some(have) if have != want => Err(format!(
            "input {name} has shape {}, expected {}",
            meshc_ir::dtype::ShapeDisplay(&have),
            meshc_ir::dtype::ShapeDisplay(want)
        )),
        _ => Ok(()),
    }
}

fn recurrent(b: &mut Builder, c: &Ctx, cell: Cell) -> R<Vec<Value>> {
    let op_type = c.node.op_type.as_deref().unwrap_or("");
    let x = c.arg(0)?;
    float_only(b, x, op_type)?;
    let layout = c.int("layout", 0);
    if !(0..=1).contains(&layout) {
        return Err(format!("attribute layout {layout} is not 0 or 1"));
    }
    let reverse: &[bool] = match c.string("direction", "forward").as_str() {
        "forward" => &[false],
        "reverse" => &[true],
        "bidirectional" => &[false, true],
        other => return Err(format!("attribute direction '{other}' is not forward, reverse or bidirectional")),
    };
    let xs = b.ty(x).shape;
    let r_shape = b.ty(c.arg(2)?).shape;
    let [a, bb, input] = xs[..] else {
        return Err(format!("input X has rank {}, expected 3", xs.len()));
    };
    let (seq, batch) = if layout == 0 { (a, bb) } else { (bb, a) };
    let hidden = *r_shape.last().unwrap_or(&0);
    let d = Dims { seq, batch, hidden, dirs: reverse.len() };
    let given = c.int("hidden_size", hidden as i64);
    if given != hidden as i64 {
        return Err(format!("attribute hidden_size {given} differs from R's last dim {hidden}"));
    }
    let gh = cell.gates() * hidden;
    expect_shape(b, c, 1, "W", &[d.dirs, gh, input])?;
    expect_shape(b, c, 2, "R", &[d.dirs, gh, hidden])?;
    expect_shape(b, c, 3, "B", &[d.dirs, 2 * gh])?;
    expect_shape(b, c, 4, "sequence_lens", &[batch])?;
    let state = if layout == 0 { [d.dirs, batch, hidden] } else { [batch, d.dirs, hidden] };
    expect_shape(b, c, 5, "initial_h", &state)?;
    if cell == Cell::Lstm {
        expect_shape(b, c, 6, "initial_c", &state)?;
        expect_shape(b, c, 7, "P", &[d.dirs, 3 * hidden])?;
    }
    if seq == 0 || batch == 0 || hidden == 0 {
        return Err("an empty sequence, batch or hidden size is not supported".into());
    }
    // Each step is a few dozen nodes: a sequence as long as the most iterations a Loop
    // unrolls is the most a node may unroll too.
    if seq as i64 > MAX_TRIPS {
        return Err(format!("its sequence of {seq} steps is longer than {MAX_TRIPS}, the most meshc unrolls"));
    }
    let acts = activations(c, cell, d.dirs)?;
    let clip = c.attr("clip").and_then(|a| a.f).map(f64::from);
    if let Some(v) = clip.filter(|v| v.is_nan() || *v <= 0.0) {
        return Err(format!("attribute clip is {v}; it must be positive"));
    }
    let lens = sequence_lens(b, c, &d)?;
    let s = &mut Steps { b, c };
    let x = if layout == 1 { transpose(s, x, &[1, 0, 2], "x_seq_first")? } else { x.clone() };
    let x2 = reshape(s.b, &x, &[(seq * batch) as i64, input as i64], &c.part("x_rows"))?;
    let wants: Vec<bool> = (0..3).map(|k| c.node.output.get(k).is_some_and(|o| !o.is_empty())).collect();
    let mut outs: [Vec<Value>; 3] = Default::default();
    for (dir, &rev) in reverse.iter().enumerate() {
        let layer =
            Layer { cell, d: &d, dir, rev, acts: &acts[dir], clip, lens: lens.as_ref(), layout, want_y: wants[0] };
        let [y, h, cc] = layer.run(s, &x2)?;
        for (k, v) in [y, h, cc].into_iter().enumerate() {
            outs[k].extend(v);
        }
    }
    // Y is [seq, dirs, batch, hidden], Y_h and Y_c [dirs, batch, hidden] (batch first in layout 1).
    let mut results = Vec::new();
    for (k, (parts, name)) in outs.iter().zip(["Y", "Y_h", "Y_c"]).enumerate() {
        if !wants[k] {
            // An output the node does not name is never read: any value stands in for it.
            results.push(x.clone());
            continue;
        }
        if parts.is_empty() {
            return Err(format!("output {name} of {op_type} does not exist"));
        }
        let (batch, hidden) = (batch as i64, hidden as i64);
        let mut stacked = Vec::new();
        for (dir, part) in parts.iter().enumerate() {
            stacked.push(match k {
                0 => part.clone(),
                _ => reshape(s.b, part, &[1, batch, hidden], &c.part(&format!("d{dir}.{name}")))?,
            });
        }
        let axis = if k == 0 { 1 } else { 0 };
        let all = concat(s, &stacked, axis, name)?;
        let perm: &[i64] = if k == 0 { &[2, 0, 1, 3] } else { &[1, 0, 2] };
        results.push(if layout == 1 { transpose(s, &all, perm, &format!("{name}_batch_first"))? } else { all });
    }
    Ok(results)
}

/// The sequence lengths as a `[batch, 1]` column, or `None` when every row runs the whole
/// sequence (no input, or a constant of all `seq`). A constant length outside 0..=seq is
/// refused, as onnxruntime refuses it.
fn sequence_lens(b: &mut Builder, c: &Ctx, d: &Dims) -> R<Option<Value>> {
    let Some(lens) = c.opt(4) else { return Ok(None) };
    if let Some(t) = lens.as_const() {
        let v: Vec<f64> = t.data.iter_f64().collect();
        if let Some(bad) = v.iter().find(|&&l| l < 0.0 || l > d.seq as f64) {
            return Err(format!("input sequence_lens holds {bad}, outside 0..={}", d.seq));
        }
        if v.iter().all(|&l| l == d.seq as f64) {
            return Ok(None);
        }
    }
    reshape(b, lens, &[d.batch as i64, 1], &c.part("lens_column")).map(Some)
}

fn transpose(s: &mut Steps, x: &Value, perm: &[i64], step: &str) -> R<Value> {
    s.op(step, Op::Transpose, &[x], &[("perm", Attr::ints(perm))])
}

fn concat(s: &mut Steps, parts: &[Value], axis: i64, step: &str) -> R<Value> {
    match parts {
        [one] => Ok(one.clone()),
        _ => s.op(step, Op::Concat, &parts.iter().collect::<Vec<_>>(), &[("axis", Attr::Int(axis))]),
    }
}

/// `x[start..end]` along `axis`.
fn slice(s: &mut Steps, x: &Value, axis: i64, start: usize, end: usize, step: &str) -> R<Value> {
    let attrs =
        [("starts", Attr::ints(&[start as i64])), ("ends", Attr::ints(&[end as i64])), ("axes", Attr::ints(&[axis]))];
    s.op(step, Op::Slice, &[x], &attrs)
}

/// One direction of a layer.
struct Layer<'a> {
    cell: Cell,
    d: &'a Dims,
    dir: usize,
    rev: bool,
    acts: &'a [Act],
    clip: Option<f64>,
    lens: Option<&'a Value>,
    layout: i64,
    want_y: bool,
}

impl Layer<'_> {
    fn name(&self, what: &str) -> String {
        format!("d{}.{what}", self.dir)
    }

    /// Row block `rows` of this direction's slice of the stacked weight input `i`
    /// (`[dirs, gates·hidden, n]`), transposed to `[n, rows]`.
    fn weight_t(&self, s: &mut Steps, i: usize, rows: (usize, usize), what: &str) -> R<Value> {
        let w = s.c.arg(i)?.clone();
        let n = s.b.ty(&w).shape[2] as i64;
        let mine = slice(s, &w, 0, self.dir, self.dir + 1, &self.name(&format!("{what}_dir")))?;
        let block = slice(s, &mine, 1, rows.0, rows.1, &self.name(&format!("{what}_rows")))?;
        let m = reshape(s.b, &block, &[(rows.1 - rows.0) as i64, n], &s.c.part(&self.name(&format!("{what}_2d"))))?;
        transpose(s, &m, &[1, 0], &self.name(&format!("{what}_t")))
    }

    /// `B[dir, start..end]` (the input biases Wb are B's first gates·hidden, Rb the rest).
    fn bias(&self, s: &mut Steps, start: usize, end: usize, what: &str) -> R<Option<Value>> {
        let Some(b) = s.c.opt(3).cloned() else { return Ok(None) };
        let mine = slice(s, &b, 0, self.dir, self.dir + 1, &self.name(&format!("{what}_dir")))?;
        let part = slice(s, &mine, 1, start, end, &self.name(what))?;
        reshape(s.b, &part, &[(end - start) as i64], &s.c.part(&self.name(&format!("{what}_1d")))).map(Some)
    }

    /// Initial state input `i` of this direction as `[batch, hidden]`, or zeros.
    fn initial(&self, s: &mut Steps, i: usize, what: &str) -> R<Value> {
        let (batch, hidden) = (self.d.batch as i64, self.d.hidden as i64);
        let Some(v) = s.c.opt(i).cloned() else {
            return table("the zero initial state", DType::F32, vec![self.d.batch, self.d.hidden], |_| 0.0);
        };
        let axis = if self.layout == 0 { 0 } else { 1 };
        let mine = slice(s, &v, axis, self.dir, self.dir + 1, &self.name(what))?;
        reshape(s.b, &mine, &[batch, hidden], &s.c.part(&self.name(&format!("{what}_2d"))))
    }

    /// The input projection of every step plus the biases that add to it (all of them but
    /// GRU's Rb of the h gate under `linear_before_reset`), as `[seq, batch, gates·hidden]`.
    fn projection(&self, s: &mut Steps, x2: &Value) -> R<Value> {
        let (h, gh) = (self.d.hidden, self.cell.gates() * self.d.hidden);
        let wt = self.weight_t(s, 1, (0, gh), "w")?;
        let mut xw = s.op(&self.name("xw"), Op::MatMul, &[x2, &wt], &[])?;
        let lbr = self.cell == Cell::Gru && s.c.int("linear_before_reset", 0) != 0;
        // Under linear_before_reset, the h gate's input bias is Wb's alone.
        let summed = if lbr { 2 * h } else { gh };
        if let Some(wb) = self.bias(s, 0, summed, "wb")? {
            let rb = self.bias(s, gh, gh + summed, "rb")?.expect("B is given");
            let mut bias = s.op0(&self.name("bias"), Op::Add, &[&wb, &rb])?;
            if lbr {
                let wb_h = self.bias(s, summed, gh, "wb_h")?.expect("B is given");
                bias = concat(s, &[bias, wb_h], 0, &self.name("bias_all"))?;
            }
            xw = s.op0(&self.name("xw_bias"), Op::Add, &[&xw, &bias])?;
        }
        let shape = [self.d.seq as i64, self.d.batch as i64, gh as i64];
        reshape(s.b, &xw, &shape, &s.c.part(&self.name("xw_steps")))
    }

    /// Activation `k` of gate input `x`, clipped first when `clip` is given.
    fn act(&self, s: &mut Steps, k: usize, x: &Value, step: &str) -> R<Value> {
        let x = match self.clip {
            Some(clip) => {
                let lo = s.op0(&format!("{step}_clip_lo"), Op::Maximum, &[x, &scalar(DType::F32, -clip)])?;
                s.op0(&format!("{step}_clip"), Op::Minimum, &[&lo, &scalar(DType::F32, clip)])?
            }
            None => x.clone(),
        };
        activate(s, &self.acts[k], &x, step)
    }

    /// Runs the direction: Y's steps stacked to `[seq, 1, batch, hidden]` (when asked for),
    /// the last hidden state and (LSTM) cell state as `[batch, hidden]`.
    fn run(&self, s: &mut Steps, x2: &Value) -> R<[Option<Value>; 3]> {
        let (h, gh) = (self.d.hidden, self.cell.gates() * self.d.hidden);
        let xw = self.projection(s, x2)?;
        let lbr = s.c.int("linear_before_reset", 0) != 0;
        let (rt, rh_t) = match self.cell {
            Cell::Gru if !lbr => (self.weight_t(s, 2, (0, 2 * h), "r")?, Some(self.weight_t(s, 2, (2 * h, gh), "rh")?)),
            _ => (self.weight_t(s, 2, (0, gh), "r")?, None),
        };
        let rb_h = match self.cell == Cell::Gru && lbr {
            true => self.bias(s, gh + 2 * h, 2 * gh, "rb_h")?,
            false => None,
        };
        let peep: Option<Vec<Value>> = match (self.cell, s.c.opt(7).cloned()) {
            (Cell::Lstm, Some(p)) => {
                let mine = slice(s, &p, 0, self.dir, self.dir + 1, &self.name("p_dir"))?;
                let mut parts = Vec::new();
                for (k, what) in ["p_i", "p_o", "p_f"].iter().enumerate() {
                    let part = slice(s, &mine, 1, k * h, (k + 1) * h, &self.name(what))?;
                    parts.push(reshape(s.b, &part, &[h as i64], &s.c.part(&self.name(&format!("{what}_1d"))))?);
                }
                Some(parts)
            }
            _ => None,
        };
        let mut hs = self.initial(s, 5, "h0")?;
        let mut cs = match self.cell {
            Cell::Lstm => Some(self.initial(s, 6, "c0")?),
            _ => None,
        };
        let mut ys: Vec<Option<Value>> = vec![None; self.d.seq];
        let order: Vec<usize> = if self.rev { (0..self.d.seq).rev().collect() } else { (0..self.d.seq).collect() };
        for t in order {
            let n = |what: &str| self.name(&format!("t{t}.{what}"));
            let xt = slice(s, &xw, 0, t, t + 1, &n("x"))?;
            let xt = reshape(s.b, &xt, &[self.d.batch as i64, gh as i64], &s.c.part(&n("x_2d")))?;
            let hr = s.op0(&n("hr"), Op::MatMul, &[&hs, &rt])?;
            let (new_h, new_c) = match self.cell {
                Cell::Rnn => {
                    let pre = s.op0(&n("pre"), Op::Add, &[&xt, &hr])?;
                    (self.act(s, 0, &pre, &n("h"))?, None)
                }
                Cell::Gru => {
                    let gate =
                        |s: &mut Steps, v: &Value, k: usize, what: &str| slice(s, v, 1, k * h, (k + 1) * h, &n(what));
                    let mut zr = Vec::new();
                    for (k, what) in ["z", "r"].iter().enumerate() {
                        let xg = gate(s, &xt, k, &format!("x{what}"))?;
                        let hg = gate(s, &hr, k, &format!("h{what}"))?;
                        let pre = s.op0(&n(&format!("{what}_pre")), Op::Add, &[&xg, &hg])?;
                        zr.push(self.act(s, 0, &pre, &n(what))?);
                    }
                    let (z, r) = (&zr[0], &zr[1]);
                    let xh = gate(s, &xt, 2, "xh")?;
                    let rec = match &rh_t {
                        // (r ⊙ H) · Rhᵀ, Rbh already in the projection.
                        Some(rh_t) => {
                            let rh = s.op0(&n("r_h"), Op::Mul, &[r, &hs])?;
                            s.op0(&n("rec"), Op::MatMul, &[&rh, rh_t])?
                        }
                        // r ⊙ (H · Rhᵀ + Rbh).
                        None => {
                            let hh = gate(s, &hr, 2, "hh")?;
                            let hh = match &rb_h {
                                Some(rb) => s.op0(&n("hh_bias"), Op::Add, &[&hh, rb])?,
                                None => hh,
                            };
                            s.op0(&n("rec"), Op::Mul, &[r, &hh])?
                        }
                    };
                    let pre = s.op0(&n("h_pre"), Op::Add, &[&xh, &rec])?;
                    let cand = self.act(s, 1, &pre, &n("cand"))?;
                    // (1 − z) ⊙ ĥ + z ⊙ H
                    let one_minus = s.op0(&n("one_minus_z"), Op::Sub, &[&scalar(DType::F32, 1.0), z])?;
                    let a = s.op0(&n("keep_new"), Op::Mul, &[&one_minus, &cand])?;
                    let bz = s.op0(&n("keep_old"), Op::Mul, &[z, &hs])?;
                    (s.op0(&n("h"), Op::Add, &[&a, &bz])?, None)
                }
                Cell::Lstm => {
                    let c_prev = cs.clone().expect("an LSTM has a cell state");
                    let pre = s.op0(&n("gates"), Op::Add, &[&xt, &hr])?;
                    let mut g = Vec::new();
                    for (k, what) in ["i", "o", "f", "c"].iter().enumerate() {
                        g.push(slice(s, &pre, 1, k * h, (k + 1) * h, &n(&format!("{what}_pre")))?);
                    }
                    let with_peep = |s: &mut Steps, v: &Value, p: usize, c: &Value, what: &str| -> R<Value> {
                        match &peep {
                            Some(ps) => {
                                let pc = s.op0(&n(&format!("{what}_peep")), Op::Mul, &[&ps[p], c])?;
                                s.op0(&n(&format!("{what}_pre_peep")), Op::Add, &[v, &pc])
                            }
                            None => Ok(v.clone()),
                        }
                    };
                    let gi = with_peep(s, &g[0], 0, &c_prev, "i")?;
                    let i = self.act(s, 0, &gi, &n("i"))?;
                    let f = match s.c.int("input_forget", 0) != 0 {
                        true => s.op0(&n("f"), Op::Sub, &[&scalar(DType::F32, 1.0), &i])?,
                        false => {
                            let gf = with_peep(s, &g[2], 2, &c_prev, "f")?;
                            self.act(s, 0, &gf, &n("f"))?
                        }
                    };
                    let cand = self.act(s, 1, &g[3], &n("cand"))?;
                    let fc = s.op0(&n("f_c"), Op::Mul, &[&f, &c_prev])?;
                    let ic = s.op0(&n("i_cand"), Op::Mul, &[&i, &cand])?;
                    let c_new = s.op0(&n("c"), Op::Add, &[&fc, &ic])?;
                    let go = with_peep(s, &g[1], 1, &c_new, "o")?;
                    let o = self.act(s, 0, &go, &n("o"))?;
                    // The cell state is no gate's input: `clip` leaves it as it is.
                    let hc = activate(s, &self.acts[2], &c_new, &n("h_of_c"))?;
                    (s.op0(&n("h"), Op::Mul, &[&o, &hc])?, Some(c_new))
                }
            };
            // Rows past their length keep their state and give zeros.
            let mask = match self.lens {
                Some(lens) => {
                    let dtype = s.b.ty(lens).dtype;
                    Some(s.op0(&n("running"), Op::Less, &[&scalar(dtype, t as f64), lens])?)
                }
                None => None,
            };
            let keep = |s: &mut Steps, new: Value, old: &Value, what: &str| match &mask {
                Some(m) => s.op0(&n(what), Op::Where, &[m, &new, old]),
                None => Ok(new),
            };
            if self.want_y {
                let zero = scalar(DType::F32, 0.0);
                let y = keep(s, new_h.clone(), &zero, "y")?;
                let shape = [1, 1, self.d.batch as i64, h as i64];
                ys[t] = Some(reshape(s.b, &y, &shape, &s.c.part(&n("y_4d")))?);
            }
            hs = keep(s, new_h, &hs, "h_kept")?;
            if let (Some(c_new), Some(c_prev)) = (new_c, &cs) {
                cs = Some(keep(s, c_new, c_prev, "c_kept")?);
            }
        }
        let y = match self.want_y {
            true => Some(concat(s, &ys.into_iter().flatten().collect::<Vec<_>>(), 0, &self.name("y"))?),
            false => None,
        };
        // A row of length 0 ends with zero states, as onnxruntime gives them, not with the
        // initial state it kept.
        let (hs, cs) = match self.lens {
            Some(lens) => {
                let dtype = s.b.ty(lens).dtype;
                let ran = s.op0(&self.name("ran"), Op::Less, &[&scalar(dtype, 0.0), lens])?;
                let zero = scalar(DType::F32, 0.0);
                let h = s.op0(&self.name("h_final"), Op::Where, &[&ran, &hs, &zero])?;
                let c = cs.map(|c| s.op0(&self.name("c_final"), Op::Where, &[&ran, &c, &zero])).transpose()?;
                (h, c)
            }
            None => (hs, cs),
        };
        Ok([y, Some(hs), cs])
    }
}

/// Activation `a` of `x`, named `step` (ONNX's formulas, as ops_math writes the operators
/// of the same name).
fn activate(s: &mut Steps, a: &Act, x: &Value, step: &str) -> R<Value> {
    let k = |v: f64| scalar(DType::F32, v);
    let part = |what: &str| format!("{step}.{what}");
    match a.name.as_str() {
        "sigmoid" => s.op0(step, Op::Sigmoid, &[x]),
        "tanh" => s.op0(step, Op::Tanh, &[x]),
        "relu" => s.op0(step, Op::Relu, &[x]),
        "affine" => {
            let ax = s.op0(&part("ax"), Op::Mul, &[&k(a.alpha), x])?;
            s.op0(step, Op::Add, &[&ax, &k(a.beta)])
        }
        "leakyrelu" => leaky_relu_of(s, x, &k(a.alpha), step),
        "thresholdedrelu" => thresholded_relu_of(s, x, &k(a.alpha), step),
        "scaledtanh" => {
            let bx = s.op0(&part("bx"), Op::Mul, &[&k(a.beta), x])?;
            let t = s.op0(&part("tanh"), Op::Tanh, &[&bx])?;
            s.op0(step, Op::Mul, &[&k(a.alpha), &t])
        }
        "hardsigmoid" => hard_sigmoid_of(s, x, a.alpha, a.beta, step, step),
        "elu" => elu_of(s, x, &k(a.alpha), step),
        "softsign" => softsign(s, x, step),
        _ => softplus(s, x, step),
    }
}

#[cfg(test)]
mod tests {
    use meshc_ir::{Data, Tensor};

    use crate::dispatch::tests::{attr_i, eval, f32s};
    use crate::proto::AttributeProto;

    fn attr_s(name: &str, v: &str) -> AttributeProto {
        AttributeProto { name: Some(name.into()), s: Some(v.into()), ..Default::default() }
    }

    fn attr_strings(name: &str, v: &[&str]) -> AttributeProto {
        let strings = v.iter().map(|s| s.as_bytes().to_vec()).collect();
        AttributeProto { name: Some(name.into()), strings, ..Default::default() }
    }

    /// An RNN of hidden size 1 whose activation is the identity (Affine 1, 0): h_t = x_t + h_(t−1)/2,
    /// over x = [1, 2, 3] in both rows of a batch of 2, the second row 2 steps long.
    fn identity_rnn(direction: &str, lens: Vec<i32>, extra: Vec<AttributeProto>) -> Result<Vec<f32>, String> {
        let dirs = if direction == "bidirectional" { 2 } else { 1 };
        let x = Tensor::f32(vec![3, 2, 1], vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        let w = Tensor::f32(vec![dirs, 1, 1], vec![1.0; dirs]);
        let r = Tensor::f32(vec![dirs, 1, 1], vec![0.5; dirs]);
        let b = Tensor::f32(vec![dirs, 2], vec![0.0; 2 * dirs]);
        let lens = Tensor::new(vec![2], Data::I32(lens));
        // The first of two attributes of one name is the one read: `extra`'s.
        let mut attrs = extra;
        attrs.extend([attr_s("direction", direction), attr_strings("activations", &vec!["Affine"; dirs])]);
        eval("RNN", 14, vec![x, w, r, b, lens], attrs).map(|t| f32s(&t))
    }

    #[test]
    fn a_reverse_direction_starts_at_each_rows_own_last_step() {
        // Forward: 1, 2.5, 4.25 (the short row stops after 2.5 and gives 0 past its end).
        // Reverse: from the last step, 3, 3.5, 2.75; the short row from its step 2: 2, 2.
        let y = identity_rnn("bidirectional", vec![3, 2], vec![]).unwrap();
        let want = [1.0, 1.0, 2.75, 2.0, 2.5, 2.5, 3.5, 2.0, 4.25, 0.0, 3.0, 0.0];
        assert_eq!(y, want);
        // Alpha and beta go, in order, to the activations that take them: h = 2·(x + h/2) + 1.
        let scaled = vec![
            AttributeProto { name: Some("activation_alpha".into()), floats: vec![2.0], ..Default::default() },
            AttributeProto { name: Some("activation_beta".into()), floats: vec![1.0], ..Default::default() },
        ];
        let y = identity_rnn("forward", vec![3, 3], scaled).unwrap();
        assert_eq!(y, [3.0, 3.0, 8.0, 8.0, 15.0, 15.0]);
    }

    #[test]
    fn what_cannot_be_unrolled_is_refused_naming_the_attribute_or_input() {
        let refused = |direction: &str, lens: Vec<i32>, extra: Vec<AttributeProto>, want: &str| {
            let err = identity_rnn(direction, lens, extra).unwrap_err();
            assert!(err.contains(want), "{err}");
        };
        refused("sideways", vec![3, 3], vec![], "attribute direction 'sideways'");
        refused("forward", vec![4, 3], vec![], "sequence_lens holds 4, outside 0..=3");
        refused("forward", vec![3, 3], vec![attr_i("layout", 2)], "attribute layout 2");
        refused("forward", vec![3, 3], vec![attr_i("hidden_size", 2)], "hidden_size 2 differs from R's last dim 1");
        let swish = attr_strings("activations", &["Swish"]);
        refused("forward", vec![3, 3], vec![swish], "'swish' is not one of ONNX's recurrent activations");
        let three = attr_strings("activations", &["Tanh", "Tanh", "Tanh"]);
        refused("bidirectional", vec![3, 3], vec![three], "3 names, expected 1 per direction (2 in all)");
        // onnxruntime refuses a clip that is not positive: it would clamp every gate to 0.
        for clip in [0.0, -1.0, f32::NAN] {
            let attr = AttributeProto { name: Some("clip".into()), f: Some(clip), ..Default::default() };
            refused("forward", vec![3, 3], vec![attr], "must be positive");
        }
    }

    /// A row of length 0 runs no step: zeros in Y, and zero final states where its initial
    /// state would have been kept (onnxruntime's result), for every cell kind.
    #[test]
    fn a_row_of_length_zero_ends_with_zero_states() {
        use crate::dispatch::tests::eval_outputs;
        for (op, gates, outputs) in [("RNN", 1, 2), ("GRU", 3, 2), ("LSTM", 4, 3)] {
            let x = Tensor::f32(vec![2, 2, 1], vec![1.0, 1.0, 2.0, 2.0]);
            let w = Tensor::f32(vec![1, gates, 1], vec![0.5; gates]);
            let r = Tensor::f32(vec![1, gates, 1], vec![0.5; gates]);
            let b = Tensor::f32(vec![1, 2 * gates], vec![0.0; 2 * gates]);
            let lens = Tensor::new(vec![2], Data::I32(vec![0, 2]));
            let h0 = Tensor::f32(vec![1, 2, 1], vec![0.75, 0.75]);
            let mut inputs = vec![x, w, r, b, lens, h0.clone()];
            if op == "LSTM" {
                inputs.push(h0);
            }
            let out = eval_outputs(op, 14, inputs, vec![attr_i("hidden_size", 1)], outputs).unwrap();
            let y = f32s(&out[0]);
            assert_eq!((y[0], y[2]), (0.0, 0.0), "{op}: Y of the empty row");
            for state in &out[1..] {
                let v = f32s(state);
                assert_eq!(v[0], 0.0, "{op}: a final state of the empty row");
                assert!(v[1] != 0.0 && v[1] != 0.75, "{op}: the other row ran: {v:?}");
            }
        }
    }

    #[test]
    fn a_single_direction_rnn_takes_the_first_of_two_activations() {
        // RNN's schema default is ['Tanh', 'Tanh']; onnxruntime reads the first on one direction.
        let two = attr_strings("activations", &["Affine", "Relu"]);
        assert_eq!(
            identity_rnn("forward", vec![3, 3], vec![two]).unwrap(),
            identity_rnn("forward", vec![3, 3], vec![]).unwrap()
        );
    }
}
