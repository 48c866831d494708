//! Fused elementwise kernels: a DAG of elementwise ops (docs/ops.md, with numpy
//! broadcasting) evaluated in one loop nest over the result, so intermediates never touch
//! memory.
//!
//! Loop shape: operands are broadcast against the *result's* shape (an intermediate with a
//! smaller broadcast shape is simply recomputed at every result index), size-1 dims are
//! dropped and adjacent dims that are contiguous for every operand are merged, so e.g. a
//! [64,1024] result with same-shape operands is one flat loop. The outer dims become
//! counted loops that advance each operand's pointer by its stride; the innermost dim is an
//! f32x4 loop followed by a scalar tail. An operand whose innermost stride is 0 is loaded
//! once per outer iteration and splatted, and so is every node that only depends on such
//! operands.
//!
//! Lanes: f32 values are `F32X4`, i32 values `I32X4` and bools lane masks (`I32X4`,
//! all-ones or zero; 1 byte 0/1 in memory) in the vector loop, and `F32`/`I32`/`I8` 0/1 in
//! the scalar tail. A group with an i64 value anywhere has no vector loop: it runs the
//! scalar body only. So every op, including `where` and every `cast` between f32, i32 and
//! bool, is vectorised; i64 arithmetic and casts to or from i64 are scalar.
//!
//! Aliasing: the result may share its buffer with an operand of the result's shape (the
//! arena reuses buffers in place): every element is read before the same element is
//! written, and nothing is written ahead of the reads.

use anyhow::{anyhow, bail, Context, Result};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, ConstantData, InstBuilder, Type, Value};
use cranelift_frontend::FunctionBuilder;
use meshc_ir::attrs::{self, GeluApprox};
use meshc_ir::infer::{infer, Operand};
use meshc_ir::{Attrs, DType, Node, Op, TensorType};

use super::emit::{build_kernel, load_widened, mem, narrow, store_first_lane, store_half, widen, KernelBuilder, LANES};
use super::math::Math;
use super::nest::{advance, for_parts, Dim};
use super::{parts_for, Generated, Target, STATUS_DIVISION_BY_ZERO};

/// Vectors per iteration of the innermost loop.
const UNROLL: i64 = 4;

/// A flat loop of at least two of these elements becomes chunks of this many (a multiple of
/// the unrolled step) plus a tail, so that its work splits into parts (`Plan::parts`).
const CHUNK: usize = 16384;

/// An operand of a fused node: one of the kernel's inputs or an earlier node of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Input(usize),
    Node(usize),
}

#[derive(Clone, Debug)]
pub struct FusedNode {
    pub op: Op,
    pub attrs: Attrs,
    pub args: Vec<Arg>,
    pub ty: TensorType,
}

/// A DAG of elementwise ops evaluated in one loop; the last node is the result.
/// Kernel buffers: bufs[0] = the result, bufs[1..] = `inputs` in order.
#[derive(Clone, Debug)]
pub struct Fused {
    pub inputs: Vec<TensorType>,
    pub nodes: Vec<FusedNode>,
}

/// Generates the kernel of a fused elementwise group.
pub fn fused(target: &Target, name: &str, f: &Fused) -> Result<Generated> {
    let plan = Plan::new(f).with_context(|| format!("fused elementwise kernel {name}"))?;
    let func = build_kernel(target, name, |k| {
        if plan.dims.iter().all(|&d| d > 0) {
            let ptrs: Vec<Value> = (0..=plan.strides.len()).map(|i| k.buf(i)).collect();
            let nest = plan.nest();
            let (outer, inner) = nest.split_at(nest.len() - 1);
            for_parts(k, outer, &ptrs, &mut |k, p| plan.inner(k, target, &At::of(p), inner[0].n));
            if plan.tail > 0 {
                // The elements after the last chunk of a chunked flat loop.
                let last = k.b.ins().iadd_imm_s(k.parts, -1);
                let is_last = k.b.ins().icmp(IntCC::Equal, k.part, last);
                k.when(is_last, |k| {
                    let chunks = k.iconst(nest[0].n as i64);
                    let p: Vec<Value> =
                        ptrs.iter().zip(&nest[0].strides).map(|(&p, &s)| advance(k, p, chunks, s)).collect();
                    plan.inner(k, target, &At::of(&p), plan.tail)
                });
            }
        }
    });
    Ok(Generated { func, scratch: 0, parts: plan.parts(f) })
}

/// Addresses of the result and of every input at the current loop position.
struct At {
    out: Value,
    ins: Vec<Value>,
}

impl At {
    /// From the kernel's buffer order: the result, then the inputs.
    fn of(ptrs: &[Value]) -> At {
        At { out: ptrs[0], ins: ptrs[1..].to_vec() }
    }
}

/// What a node computes, with its attributes resolved.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Plain(Op),
    Gelu {
        tanh: bool,
    },
    Cast {
        from: DType,
        to: DType,
    },
    /// A comparison of operands of dtype `of` (f32, or an integer or bool lane type).
    Compare {
        op: Op,
        of: DType,
    },
    /// Integer `mod`: scalar only, as there is no vector remainder.
    Mod {
        fmod: bool,
    },
    /// Integer `div`: scalar only, as there is no vector division.
    IntDiv,
}

/// A checked group, laid out as a loop nest. Values are numbered inputs first, then nodes.
struct Plan {
    dtypes: Vec<DType>,
    /// Per node: what it computes and the values it reads.
    nodes: Vec<(Kind, Vec<usize>)>,
    /// The collapsed loop nest, outermost first; never empty.
    dims: Vec<usize>,
    /// Per input: its element stride along each of `dims` (0 where broadcast).
    strides: Vec<Vec<usize>>,
    /// The result's element strides along `dims`.
    out_strides: Vec<usize>,
    /// Values that do not change along the innermost dim.
    invariant: Vec<bool>,
    /// Whether the innermost dim gets an f32x4 loop.
    vector: bool,
    /// Elements after a flat loop cut into `CHUNK`s (`dims` = [chunks, CHUNK]); the last
    /// part does them.
    tail: usize,
}

impl Plan {
    fn new(f: &Fused) -> Result<Plan> {
        let n_in = f.inputs.len();
        let last = f.nodes.last().ok_or_else(|| anyhow!("a fused group needs at least one node"))?;
        let shape = &last.ty.shape;
        let mut dtypes: Vec<DType> = f.inputs.iter().map(|t| t.dtype).collect();
        let mut types: Vec<&TensorType> = f.inputs.iter().collect();
        let mut nodes = Vec::new();
        for (i, node) in f.nodes.iter().enumerate() {
            let fail = |msg: String| anyhow!("node {i} ({}): {msg}", node.op);
            let args = node
                .args
                .iter()
                .map(|a| match *a {
                    Arg::Input(j) if j < n_in => Ok(j),
                    Arg::Node(j) if j < i => Ok(n_in + j),
                    _ => Err(fail(format!("operand {a:?} is not an input or an earlier node"))),
                })
                .collect::<Result<Vec<usize>>>()?;
            if !node.op.is_elementwise() {
                return Err(fail("not an elementwise op".into()));
            }
            if !node.op.arity().accepts(args.len()) {
                return Err(fail(format!("takes {}, got {}", node.op.arity(), args.len())));
            }
            // Inference owns the dtype and broadcasting rules; the declared type must agree.
            let operands: Vec<Operand> = args.iter().map(|&a| Operand { ty: types[a], dims: None }).collect();
            let mut ir_node = Node::new(format!("n{i}"), node.op, &[]);
            ir_node.attrs = node.attrs.clone();
            let inferred = infer(&ir_node, &operands).map_err(fail)?;
            if inferred.ty != node.ty {
                return Err(fail(format!("declared type {} but its operands give {}", node.ty, inferred.ty)));
            }
            if !broadcasts_to(&node.ty.shape, shape) {
                return Err(fail(format!("shape {} does not broadcast to the result {}", node.ty, last.ty)));
            }
            if node.ty.dtype.is_half() && node.op != Op::Cast {
                // Halves are storage: kernels widen them as they load them and compute in f32;
                // a cast rounds to one (`emit::narrow`), other ops would each need to.
                return Err(fail(format!(
                    "a {} result is not compiled yet (f16/bf16 are computed in f32; only a cast writes one)",
                    node.ty.dtype
                )));
            }
            let kind = match node.op {
                Op::Gelu => Kind::Gelu {
                    tanh: attrs::Gelu::from_attrs(&node.attrs).map_err(fail)?.approximate == GeluApprox::Tanh,
                },
                Op::Cast => Kind::Cast { from: dtypes[args[0]], to: node.ty.dtype },
                op if op.is_comparison() => Kind::Compare { op, of: dtypes[args[0]] },
                Op::Mod => Kind::Mod { fmod: attrs::Mod::from_attrs(&node.attrs).map_err(fail)?.fmod },
                Op::Div if node.ty.dtype.is_int() => Kind::IntDiv,
                op => Kind::Plain(op),
            };
            dtypes.push(node.ty.dtype);
            types.push(&node.ty);
            nodes.push((kind, args));
        }

        if let Some((i, t)) = f.inputs.iter().enumerate().find(|(_, t)| !broadcasts_to(&t.shape, shape)) {
            bail!("input {i} ({t}) does not broadcast to the result {}", last.ty);
        }
        // Element strides of every input and of the result along the result's dims. An
        // input that repeats over the result's rows (`rows::repeats`) steps through them as
        // the result does, its pointer starting each row at the row it repeats, and through
        // a row as its own inner dims broadcast.
        let mut all: Vec<Vec<usize>> = (f.inputs.iter().enumerate())
            .map(|(i, t)| match super::rows::is_periodic(i + 1) {
                true => broadcast_strides(&as_rows_of(&t.shape, shape), shape),
                false => broadcast_strides(&t.shape, shape),
            })
            .collect();
        all.push(broadcast_strides(shape, shape));
        let (mut dims, mut all) = collapse(shape, &all);
        let mut tail = 0;
        if let (Some(hi), &[n]) = (super::rows::scaling().filter(|&hi| dims.len() == 1 && dims[0] % hi == 0), &dims[..])
        {
            // Over symbolic rows the outer loop walks them (`rows::outer`), not chunks.
            let per_row = n / hi;
            (dims, all) = (vec![hi, per_row], all.iter().map(|s| vec![s[0] * per_row, s[0]]).collect());
        } else if let [n] = dims[..] {
            if n >= 2 * CHUNK {
                (dims, tail) = (vec![n / CHUNK, CHUNK], n % CHUNK);
                all = all.iter().map(|s| vec![s[0] * CHUNK, s[0]]).collect();
            }
        }
        let out_strides = all.pop().expect("the result's strides");
        let strides = all;

        let mut invariant: Vec<bool> = strides.iter().map(|s| s.last() == Some(&0)).collect();
        for (_, args) in &nodes {
            let inv = args.iter().all(|&a| invariant[a]);
            invariant.push(inv);
        }
        let inner = *dims.last().expect("at least one dim");
        let scalar_only = nodes.iter().any(|(k, _)| matches!(k, Kind::Mod { .. } | Kind::IntDiv));
        // i8/u8 are loaded one at a time, widened to i32 (a vector load of 4 bytes is not
        // written yet); held in i32 lanes, a byte computed inside the group (QuantizeLinear's
        // cast, stored four lanes to a word), or read once (a zero point), takes the vector
        // loop.
        let n_in = f.inputs.len();
        let bytes = (0..n_in).any(|v| dtypes[v].is_byte() && !invariant[v]);
        // The 16-bit ints, like the bytes, are loaded one at a time; u32 and u64 are held in
        // i64 lanes, which take the scalar loop as i64 does.
        let scalar_dtype = dtypes.iter().any(|d| d.wide() == DType::I64 || matches!(d, DType::I16 | DType::U16));
        let vector = inner >= LANES && !scalar_dtype && !scalar_only && !bytes;
        Ok(Plan { dtypes, nodes, dims, strides, out_strides, invariant, vector, tail })
    }

    /// Into how many parts the work may split: whole iterations of the outermost loop (a
    /// flat loop's parts are chunks).
    fn parts(&self, f: &Fused) -> usize {
        if self.dims.len() < 2 {
            return 1;
        }
        let result = f.nodes.last().map_or(0, |n| n.ty.size_bytes());
        parts_for(result + f.inputs.iter().map(TensorType::size_bytes).sum::<usize>(), self.dims[0])
    }

    /// The loop nest, outermost first, with the byte strides of the result and of each
    /// input (the kernel's buffer order) along each dim.
    fn nest(&self) -> Vec<Dim> {
        let bytes = |s: usize, dt: DType| (s * dt.size_bytes()) as i64;
        (0..self.dims.len())
            .map(|d| {
                let ins = self.strides.iter().zip(&self.dtypes).map(|(s, &dt)| bytes(s[d], dt));
                let strides: Vec<i64> =
                    std::iter::once(bytes(self.out_strides[d], self.out_dtype())).chain(ins).collect();
                Dim::new(self.dims[d], &strides)
            })
            .collect()
    }

    fn out_dtype(&self) -> DType {
        *self.dtypes.last().expect("a result")
    }

    /// `n` elements along the innermost dim: invariant values first, then the f32x4 loop and
    /// the scalar tail.
    fn inner(&self, k: &mut KernelBuilder, target: &Target, at: &At, n: usize) {
        let n = n as i64;
        let n_in = at.ins.len();
        let mut scalar_inv: Vec<Option<Value>> = vec![None; self.dtypes.len()];
        {
            let mut m = Math::new(&mut k.b, types::F32, target);
            for v in 0..self.dtypes.len() {
                if self.invariant[v] {
                    scalar_inv[v] =
                        Some(self.value(&mut m, v, n_in, &scalar_inv, |m, dt| load(m.b, dt, false, at.ins[v])));
                }
            }
        }
        let n_vec = if self.vector { n - n % LANES as i64 } else { 0 };
        if n_vec > 0 {
            let vec_inv: Vec<Option<Value>> =
                scalar_inv.iter().enumerate().map(|(v, s)| s.map(|s| splat(&mut k.b, self.dtypes[v], s))).collect();
            // Several independent vectors per iteration give the CPU work to overlap (loads
            // of one with the arithmetic of another) and amortise the loop overhead.
            let step = UNROLL * LANES as i64;
            let n_unrolled = n_vec - n_vec % step;
            k.for_const(0, n_unrolled, step, |k, i| {
                for u in 0..UNROLL {
                    let iu = if u == 0 { i } else { k.b.ins().iadd_imm_s(i, u * LANES as i64) };
                    self.body(k, target, (iu, true), at, &vec_inv);
                }
            });
            k.for_const(n_unrolled, n_vec, LANES as i64, |k, i| self.body(k, target, (i, true), at, &vec_inv));
        }
        if n_vec < n {
            k.for_const(n_vec, n, 1, |k, i| self.body(k, target, (i, false), at, &scalar_inv));
        }
    }

    /// One step of the innermost loop at index `i` (a vector of lanes or one element):
    /// loads, the nodes, the store. `inv` holds the invariant values in that form.
    fn body(&self, k: &mut KernelBuilder, target: &Target, (i, vector): (Value, bool), at: &At, inv: &[Option<Value>]) {
        let n_in = at.ins.len();
        let mut vals: Vec<Option<Value>> = inv.to_vec();
        let addrs: Vec<Value> =
            (0..n_in)
                .map(|j| {
                    if self.invariant[j] {
                        at.ins[j]
                    } else {
                        k.addr(at.ins[j], i, self.dtypes[j].size_bytes() as i64)
                    }
                })
                .collect();
        let out_dt = self.out_dtype();
        let out_addr = k.addr(at.out, i, out_dt.size_bytes() as i64);
        let mut m = Math::new(&mut k.b, if vector { types::F32X4 } else { types::F32 }, target);
        for v in 0..self.dtypes.len() {
            if vals[v].is_none() {
                vals[v] = Some(self.value(&mut m, v, n_in, &vals, |m, dt| load(m.b, dt, vector, addrs[v])));
            }
        }
        let result = vals.last().copied().flatten().expect("every value computed");
        store(m.b, out_dt, vector, result, out_addr);
    }

    /// Value `v`: an input (read by `load`) or a node over the values already in `vals`.
    fn value(
        &self,
        m: &mut Math,
        v: usize,
        n_in: usize,
        vals: &[Option<Value>],
        load: impl FnOnce(&mut Math, DType) -> Value,
    ) -> Value {
        if v < n_in {
            return load(m, self.dtypes[v]);
        }
        let (kind, args) = &self.nodes[v - n_in];
        let args: Vec<Value> = args.iter().map(|&a| vals[a].expect("operands come first")).collect();
        emit_node(m, *kind, self.dtypes[v], &args)
    }
}

fn broadcasts_to(shape: &[usize], to: &[usize]) -> bool {
    shape.len() <= to.len() && shape.iter().rev().zip(to.iter().rev()).all(|(&s, &t)| s == 1 || s == t)
}

/// The shape an operand of `shape` that repeats over the rows of a result of shape `to`
/// is walked at: the result's leading dims that make the kernel's rows (`rows::scaling`),
/// then its own inner dims.
fn as_rows_of(shape: &[usize], to: &[usize]) -> Vec<usize> {
    let hi = super::rows::scaling().expect("a repeating operand of a kernel that scales");
    let lead = (0..=to.len()).find(|&k| to[..k].iter().product::<usize>() == hi).unwrap_or(to.len());
    let off = to.len() - shape.len();
    (0..to.len())
        .map(|i| match i {
            _ if i < lead => to[i],
            _ if i < off => 1,
            _ => shape[i - off],
        })
        .collect()
}

/// Element strides of a dense `shape` read at the indices of `to` (which it broadcasts to).
fn broadcast_strides(shape: &[usize], to: &[usize]) -> Vec<usize> {
    let lead = to.len() - shape.len();
    let mut strides = vec![0; to.len()];
    let mut s = 1;
    for (j, &d) in shape.iter().enumerate().rev() {
        if d != 1 {
            strides[lead + j] = s;
        }
        s *= d;
    }
    strides
}

/// Drops size-1 dims and merges neighbours that are contiguous for every operand. Returns
/// the loop dims (at least one) and each operand's strides along them.
fn collapse(shape: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut dims: Vec<usize> = Vec::new();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merge = !dims.is_empty() && strides.iter().zip(&out).all(|(s, o)| o.last() == Some(&(s[d] * n)));
        if merge {
            *dims.last_mut().expect("checked non-empty") *= n;
            for (s, o) in strides.iter().zip(&mut out) {
                *o.last_mut().expect("same length as dims") = s[d];
            }
        } else {
            dims.push(n);
            for (s, o) in strides.iter().zip(&mut out) {
                o.push(s[d]);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        out.iter_mut().for_each(|o| o.push(0));
    }
    (dims, out)
}

/// The Cranelift type of one lane group of `dt`: scalar, or the vector-loop form. Halves
/// are held as the f32 values they are widened to on loading, the other integers in their
/// wide type (`DType::wide`: i32 or i64, in their type's range; a u64 as its bits).
fn lane_type(dt: DType, vector: bool) -> Type {
    match (dt, vector) {
        (DType::I16 | DType::U16, false) => types::I32,
        (DType::I16 | DType::U16, true) => unreachable!("16-bit ints take the scalar loop (Plan::new)"),
        (DType::U32 | DType::U64, _) => types::I64,
        (DType::I8 | DType::U8, false) => types::I32,
        (DType::I8 | DType::U8, true) => types::I32X4,
        (DType::F32 | DType::F16 | DType::BF16, false) => types::F32,
        (DType::F32 | DType::F16 | DType::BF16, true) => types::F32X4,
        (DType::I32, false) => types::I32,
        (DType::I32 | DType::Bool, true) => types::I32X4,
        (DType::I64, _) => types::I64,
        (DType::Bool, false) => types::I8,
    }
}

fn load(b: &mut FunctionBuilder, dt: DType, vector: bool, addr: Value) -> Value {
    if dt.is_half() {
        return load_widened(b, dt, vector, addr);
    }
    match dt {
        DType::I8 => return b.ins().sload8(types::I32, mem(), addr, 0),
        DType::U8 => return b.ins().uload8(types::I32, mem(), addr, 0),
        DType::I16 => return b.ins().sload16(types::I32, mem(), addr, 0),
        DType::U16 => return b.ins().uload16(types::I32, mem(), addr, 0),
        DType::U32 => return b.ins().uload32(mem(), addr, 0),
        _ => {}
    }
    if dt != DType::Bool || !vector {
        return b.ins().load(lane_type(dt, vector), mem(), addr, 0);
    }
    // Four bool bytes: lane i keeps byte i of the word, then nonzero → all-ones.
    let word = b.ins().load(types::I32, mem(), addr, 0);
    let spread = b.ins().splat(types::I32X4, word);
    let bytes: Vec<u8> = (0..4u32).flat_map(|i| (0xffu32 << (8 * i)).to_le_bytes()).collect();
    let c = b.func.dfg.constants.insert(ConstantData::from(bytes));
    let sel = b.ins().vconst(types::I32X4, c);
    let lanes = b.ins().band(spread, sel);
    let zero = b.ins().iconst(types::I32, 0);
    let zero = b.ins().splat(types::I32X4, zero);
    b.ins().icmp(IntCC::NotEqual, lanes, zero)
}

fn store(b: &mut FunctionBuilder, dt: DType, vector: bool, v: Value, addr: Value) {
    if dt.is_half() {
        let bits = narrow(b, dt, vector, v);
        store_half(b, vector, bits, addr);
    } else if dt.is_byte() && vector {
        // Each lane holds its byte's value, sign- or zero-extended (`cast`): the saturating
        // narrows keep it, to i16 and then to the byte, and the four bytes go out as a word.
        let halves = b.ins().snarrow(v, v);
        let bytes = if dt == DType::I8 { b.ins().snarrow(halves, halves) } else { b.ins().unarrow(halves, halves) };
        store_first_lane(b, types::I32X4, bytes, addr);
    } else if dt.is_byte() {
        b.ins().istore8(mem(), v, addr, 0);
    } else if matches!(dt, DType::I16 | DType::U16) {
        b.ins().istore16(mem(), v, addr, 0);
    } else if dt == DType::U32 {
        b.ins().istore32(mem(), v, addr, 0);
    } else if dt == DType::Bool && vector {
        // One bit per lane, then bit i moved to bit 0 of byte i (the shifted copies of the
        // 4-bit mask do not overlap, so the multiply is a plain sum of shifts).
        let bits = b.ins().vhigh_bits(types::I32, v);
        let spread = b.ins().imul_imm_s(bits, 0x0020_4081);
        let bytes = b.ins().band_imm_s(spread, 0x0101_0101);
        b.ins().store(mem(), bytes, addr, 0);
    } else {
        b.ins().store(mem(), v, addr, 0);
    }
}

/// A scalar value of `dt` (as the scalar tail holds it) in every lane of the vector form.
fn splat(b: &mut FunctionBuilder, dt: DType, s: Value) -> Value {
    let s = if dt == DType::Bool {
        let w = b.ins().uextend(types::I32, s);
        b.ins().ineg(w)
    } else {
        s
    };
    let t = lane_type(dt, true);
    b.ins().splat(t, s)
}

/// Zero of an integer lane type.
fn izero(m: &mut Math, t: Type) -> Value {
    let z = m.b.ins().iconst(t.lane_type(), 0);
    if t.is_vector() {
        m.b.ins().splat(t, z)
    } else {
        z
    }
}

/// Emits one node on lanes of `m`'s width; `dt` is the node's dtype.
fn emit_node(m: &mut Math, kind: Kind, dt: DType, args: &[Value]) -> Value {
    match kind {
        Kind::Gelu { tanh: true } => m.gelu_tanh(args[0]),
        Kind::Gelu { tanh: false } => m.gelu_erf(args[0]),
        Kind::Cast { from, to } => cast(m, from, to, args[0]),
        Kind::Plain(Op::Where) => m.select(args[0], args[1], args[2]),
        Kind::Compare { op, of } => compare(m, op, of, args),
        Kind::Mod { fmod } => modulo(m, fmod, args[0], args[1]),
        Kind::IntDiv => int_div(m, args[0], args[1]),
        // Bools are lane masks (all-ones/zero) on vectors and 0/1 on scalars: and, or, xor
        // keep either form; not flips every bit of a mask, bit 0 of a scalar. On integers
        // they are bitwise.
        Kind::Plain(Op::And) => m.b.ins().band(args[0], args[1]),
        Kind::Plain(Op::Or) => m.b.ins().bor(args[0], args[1]),
        Kind::Plain(Op::Xor) => m.b.ins().bxor(args[0], args[1]),
        Kind::Plain(Op::Not) if m.ty().is_vector() || dt != DType::Bool => m.b.ins().bnot(args[0]),
        Kind::Plain(Op::Not) => m.b.ins().bxor_imm_u(args[0], 1),
        Kind::Plain(op) if dt == DType::F32 => float_op(m, op, args),
        Kind::Plain(op) => int_op(m, op, args),
    }
}

pub(super) fn float_op(m: &mut Math, op: Op, a: &[Value]) -> Value {
    match op {
        Op::Add => m.b.ins().fadd(a[0], a[1]),
        Op::Sub => m.b.ins().fsub(a[0], a[1]),
        Op::Mul => m.b.ins().fmul(a[0], a[1]),
        Op::Div => m.b.ins().fdiv(a[0], a[1]),
        Op::Maximum => m.maximum(a[0], a[1]),
        Op::Minimum => m.minimum(a[0], a[1]),
        Op::Pow => m.pow(a[0], a[1]),
        Op::Neg => m.b.ins().fneg(a[0]),
        Op::Abs => m.b.ins().fabs(a[0]),
        Op::Relu => m.relu(a[0]),
        Op::Exp => m.exp(a[0]),
        Op::Log => m.log(a[0]),
        Op::Sqrt => m.sqrt(a[0]),
        Op::Rsqrt => m.rsqrt(a[0]),
        Op::Tanh => m.tanh(a[0]),
        Op::Erf => m.erf(a[0]),
        Op::Erfc => m.erfc(a[0]),
        Op::Sin => m.sin(a[0]),
        Op::Cos => m.cos(a[0]),
        Op::Sigmoid => m.sigmoid(a[0]),
        // roundss/roundps (SSE4.1, which every target meshc names has).
        Op::Floor => m.b.ins().floor(a[0]),
        Op::Ceil => m.b.ins().ceil(a[0]),
        Op::Round => m.b.ins().nearest(a[0]),
        other => unreachable!("{other} is not a float elementwise op (checked by Plan::new)"),
    }
}

/// Integer ops wrap, as in the interpreter.
fn int_op(m: &mut Math, op: Op, a: &[Value]) -> Value {
    match op {
        Op::Add => m.b.ins().iadd(a[0], a[1]),
        Op::Sub => m.b.ins().isub(a[0], a[1]),
        Op::Mul => m.b.ins().imul(a[0], a[1]),
        Op::Maximum => m.b.ins().smax(a[0], a[1]),
        Op::Minimum => m.b.ins().smin(a[0], a[1]),
        Op::Neg => m.b.ins().ineg(a[0]),
        Op::Abs => m.b.ins().iabs(a[0]),
        Op::Relu => {
            let t = m.b.func.dfg.value_type(a[0]);
            let z = izero(m, t);
            m.b.ins().smax(a[0], z)
        }
        other => unreachable!("{other} is not an integer elementwise op (checked by Plan::new)"),
    }
}

/// A comparison as a lane mask: `fcmp` on f32 (NaN is unordered: only `!=`-like tests hold,
/// and there are none here), `icmp` on integers and bools (a bool mask compares as 0/−1
/// and a scalar bool as 0/1, so only equal is meaningful, and only equal is allowed).
fn compare(m: &mut Math, op: Op, of: DType, a: &[Value]) -> Value {
    let (fc, ic) = match op {
        Op::Equal => (FloatCC::Equal, IntCC::Equal),
        Op::Less => (FloatCC::LessThan, IntCC::SignedLessThan),
        Op::LessEqual => (FloatCC::LessThanOrEqual, IntCC::SignedLessThanOrEqual),
        Op::Greater => (FloatCC::GreaterThan, IntCC::SignedGreaterThan),
        Op::GreaterEqual => (FloatCC::GreaterThanOrEqual, IntCC::SignedGreaterThanOrEqual),
        other => unreachable!("{other} is not a comparison"),
    };
    if of == DType::F32 || of.is_half() {
        m.cmp(fc, a[0], a[1])
    } else {
        m.b.ins().icmp(ic, a[0], a[1])
    }
}

/// Integer `div` on scalars, as the interpreter defines it: truncating, MIN / −1 wrapping to
/// MIN (sdiv would trap: the divisor −1 is replaced by 1 and the quotient negated), and a
/// zero divisor ending the kernel with `STATUS_DIVISION_BY_ZERO`, which the runner reports
/// naming the node, instead of the trap.
fn int_div(m: &mut Math, x: Value, y: Value) -> Value {
    let b = &mut *m.b;
    let t = b.func.dfg.value_type(x);
    let zero = b.ins().iconst(t, 0);
    let is_zero = b.ins().icmp(IntCC::Equal, y, zero);
    let fail = b.create_block();
    let cont = b.create_block();
    b.ins().brif(is_zero, fail, &[], cont, &[]);
    b.switch_to_block(fail);
    let status = b.ins().iconst(types::I32, STATUS_DIVISION_BY_ZERO as i64);
    b.ins().return_(&[status]);
    b.switch_to_block(cont);
    let minus_one = b.ins().iconst(t, -1);
    let is_minus_one = b.ins().icmp(IntCC::Equal, y, minus_one);
    let one = b.ins().iconst(t, 1);
    let safe = b.ins().select(is_minus_one, one, y);
    let q = b.ins().sdiv(x, safe);
    let negated = b.ins().ineg(x);
    b.ins().select(is_minus_one, negated, q)
}

/// Integer `mod` on scalars, as the interpreter defines it: a zero divisor is replaced by 1
/// (srem would trap) and its result by 0; without `fmod`, a nonzero remainder whose sign
/// differs from the divisor's gets the divisor added.
fn modulo(m: &mut Math, fmod: bool, x: Value, y: Value) -> Value {
    let b = &mut *m.b;
    let t = b.func.dfg.value_type(x);
    let zero = b.ins().iconst(t, 0);
    let one = b.ins().iconst(t, 1);
    let y_zero = b.ins().icmp(IntCC::Equal, y, zero);
    let safe = b.ins().select(y_zero, one, y);
    let mut r = b.ins().srem(x, safe);
    if !fmod {
        let nonzero = b.ins().icmp(IntCC::NotEqual, r, zero);
        let signs = b.ins().bxor(r, safe);
        let differ = b.ins().icmp(IntCC::SignedLessThan, signs, zero);
        let fix = b.ins().band(nonzero, differ);
        let moved = b.ins().iadd(r, safe);
        r = b.ins().select(fix, moved, r);
    }
    b.ins().select(y_zero, zero, r)
}

/// `cast`: float → int truncates and saturates (NaN → 0), nonzero (and NaN) → true,
/// bool → 0/1, i64 → i32 wraps, i64 → f32 rounds once; into a half, the value as f32
/// rounded to the half (`emit::narrow`, IEEE's rounding) and held widened, as halves are;
/// into a storage int, the value in its wide type wrapped to its bits, held widened; a u64
/// is unsigned into and out of a float (the interpreter's `cast`).
fn cast(m: &mut Math, from: DType, to: DType, x: Value) -> Value {
    use DType::*;
    let vector = m.ty().is_vector();
    if from == U64 && (to == F32 || to.is_half()) {
        let f = m.b.ins().fcvt_from_uint(types::F32, x);
        return cast(m, F32, to, f);
    }
    // A half was widened to f32 as it was loaded, a storage int to i32 or i64.
    let from = if from.is_half() { F32 } else { from.wide() };
    if (from, to) == (F32, U64) {
        return m.b.ins().fcvt_to_uint_sat(types::I64, x);
    }
    if to.is_stored_int() && !to.is_byte() {
        let w = cast(m, from, to.wide(), x);
        return match to {
            I16 => {
                let low = m.b.ins().ireduce(types::I16, w);
                m.b.ins().sextend(types::I32, low)
            }
            U16 => m.b.ins().band_imm_s(w, 0xffff),
            U32 => m.b.ins().band_imm_s(w, 0xffff_ffff),
            _ => w,
        };
    }
    if to.is_byte() {
        let w = cast(m, from, I32, x);
        return if vector {
            // The low byte, sign- or zero-extended, in every lane.
            let high = m.b.ins().ishl_imm_s(w, 24);
            if to == I8 {
                m.b.ins().sshr_imm_s(high, 24)
            } else {
                m.b.ins().ushr_imm_s(high, 24)
            }
        } else if to == I8 {
            let low = m.b.ins().ireduce(types::I8, w);
            m.b.ins().sextend(types::I32, low)
        } else {
            m.b.ins().band_imm_s(w, 0xff)
        };
    }
    let to_ty = lane_type(to, vector);
    if to.is_half() {
        // An integer reaches f32 exactly below 2^24, and from 65520 on the f16 is infinite
        // whatever f32 it became; a bf16 of an integer beyond 2^24 is rounded twice (the
        // interpreter does the same).
        let f = cast(m, from, F32, x);
        let bits = narrow(m.b, to, vector, f);
        return widen(m.b, to, vector, bits);
    }
    match (from, to) {
        (F32, I32 | I64) => m.b.ins().fcvt_to_sint_sat(to_ty, x),
        (I32 | I64, F32) => m.b.ins().fcvt_from_sint(to_ty, x),
        (F32, Bool) => {
            let zero = m.c(0.0);
            m.cmp(FloatCC::NotEqual, x, zero)
        }
        (I32 | I64, Bool) => {
            let t = m.b.func.dfg.value_type(x);
            let zero = izero(m, t);
            m.b.ins().icmp(IntCC::NotEqual, x, zero)
        }
        (Bool, F32) if vector => {
            let one = m.c(1.0);
            let mask = m.b.ins().bitcast(types::F32X4, cranelift_codegen::ir::MemFlagsData::new(), x);
            m.b.ins().band(mask, one)
        }
        (Bool, F32) => m.b.ins().fcvt_from_sint(types::F32, x),
        (Bool, I32) if vector => m.b.ins().ushr_imm_s(x, 31),
        (Bool, I32 | I64) => m.b.ins().uextend(to_ty, x),
        (I32, I64) => m.b.ins().sextend(types::I64, x),
        (I64, I32) => m.b.ins().ireduce(types::I32, x),
        (Bool, Bool) | (F32, F32) | (I32, I32) | (I64, I64) => x,
        (_, F16 | BF16) | (F16 | BF16, _) => unreachable!("narrowed above, widened on load"),
        _ => unreachable!("storage ints wrapped above, widened on load"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::emit::testing::{check_parts, native, run};
    use crate::codegen::math::tests::{runnable_targets, Rng};
    use crate::codegen::module::Kernels;
    use meshc_ir::interp::eval_node;
    use meshc_ir::Attr;
    use meshc_ir::{Data, Tensor};

    /// A node of a test group: op, string attributes, operands.
    type Spec<'a> = (Op, &'a [(&'a str, &'a str)], &'a [Arg]);

    /// A group from node specs, each node's type inferred as the graph's would be.
    fn group(inputs: &[TensorType], nodes: &[Spec]) -> Fused {
        let mut types: Vec<TensorType> = inputs.to_vec();
        let mut out = Vec::new();
        for &(op, attrs, args) in nodes {
            let attr = |v: &str| match v {
                "true" | "false" => Attr::Bool(v == "true"),
                _ => Attr::Str(v.to_string()),
            };
            let attrs: Attrs = attrs.iter().map(|(k, v)| (k.to_string(), attr(v))).collect();
            let ty_of = |a: &Arg| match *a {
                Arg::Input(i) => types[i].clone(),
                Arg::Node(i) => types[inputs.len() + i].clone(),
            };
            let arg_types: Vec<TensorType> = args.iter().map(ty_of).collect();
            let operands: Vec<Operand> = arg_types.iter().map(|t| Operand { ty: t, dims: None }).collect();
            let mut n = Node::new("n", op, &[]);
            n.attrs = attrs.clone();
            let ty = infer(&n, &operands).expect("well-typed test group").ty;
            types.push(ty.clone());
            out.push(FusedNode { op, attrs, args: args.to_vec(), ty });
        }
        Fused { inputs: inputs.to_vec(), nodes: out }
    }

    fn f32t(shape: &[usize]) -> TensorType {
        TensorType::new(DType::F32, shape.to_vec())
    }

    /// The interpreter, node by node.
    fn reference(f: &Fused, inputs: &[Tensor]) -> Tensor {
        let mut vals: Vec<Tensor> = inputs.to_vec();
        for n in &f.nodes {
            let args: Vec<&Tensor> = n
                .args
                .iter()
                .map(|a| match *a {
                    Arg::Input(i) => &vals[i],
                    Arg::Node(i) => &vals[inputs.len() + i],
                })
                .collect();
            let mut node = Node::new("n", n.op, &[]);
            node.attrs = n.attrs.clone();
            let r = eval_node(&node, &args, &n.ty).expect("interpreter");
            vals.push(r);
        }
        vals.pop().expect("a result")
    }

    fn run_fused(t: &Target, f: &Fused, inputs: &[Tensor]) -> Tensor {
        let g = fused(t, "test", f).expect("generates");
        assert_eq!(g.scratch, 0);
        let ty = &f.nodes.last().unwrap().ty;
        let mut out = vec![0xa5u8; ty.size_bytes()];
        let mut ins: Vec<Vec<u8>> = inputs.iter().map(Tensor::to_le_bytes).collect();
        let mut bufs: Vec<&mut [u8]> = vec![&mut out];
        bufs.extend(ins.iter_mut().map(|b| b.as_mut_slice()));
        assert_eq!(run(t, g.func, &mut bufs), 0);
        Tensor::from_le_bytes(ty, &out)
    }

    /// |got − want| <= 1e-5 + 1e-4·|want| for f32 (NaN matches NaN, infinities exactly);
    /// other dtypes exactly.
    fn assert_close(got: &Tensor, want: &Tensor, inputs: &[Tensor], what: &str) {
        assert_eq!(got.shape, want.shape, "{what}");
        let (g, w) = match (&got.data, &want.data) {
            (Data::F32(g), Data::F32(w)) => (g, w),
            _ => return assert_eq!(got.data, want.data, "{what}"),
        };
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            let ok = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 + 1e-4 * w.abs();
            if !ok {
                let args: Vec<String> = inputs.iter().map(|t| format!("{:?}", elem(t, i, &got.shape))).collect();
                panic!("{what}: element {i}: got {g:e}, want {w:e}; inputs there {}", args.join(", "));
            }
        }
    }

    /// Element of input `t` that output element `i` reads (for failure messages).
    fn elem(t: &Tensor, i: usize, out: &[usize]) -> String {
        let mut rem = i;
        let mut idx = vec![0; out.len()];
        for d in (0..out.len()).rev() {
            idx[d] = rem % out[d];
            rem /= out[d];
        }
        let lead = out.len() - t.shape.len();
        let mut flat = 0;
        for (j, &n) in t.shape.iter().enumerate() {
            flat = flat * n + if n == 1 { 0 } else { idx[lead + j] };
        }
        match &t.data {
            Data::F32(v) => format!("{:e}", v[flat]),
            Data::I32(v) => v[flat].to_string(),
            Data::I64(v) => v[flat].to_string(),
            Data::Bool(v) => v[flat].to_string(),
            Data::F16(v) => format!("{:e}", v[flat]),
            Data::BF16(v) => format!("{:e}", v[flat]),
            Data::I8(v) => v[flat].to_string(),
            Data::U8(v) => v[flat].to_string(),
            Data::I16(v) => v[flat].to_string(),
            Data::U16(v) => v[flat].to_string(),
            Data::U32(v) => v[flat].to_string(),
            Data::U64(v) => v[flat].to_string(),
        }
    }

    /// Every f16 and every bf16 (all 65536 bit patterns, and 3 more for the scalar tail),
    /// widened as kernels load them: exactly the interpreter's value (NaN for NaN), alone,
    /// into an f32 sum, and through a cast to i32.
    #[test]
    fn every_half_is_widened_exactly() {
        for dt in [DType::F16, DType::BF16] {
            let bits = (0..=u16::MAX).chain([0x3c00, 0x8001, 0x7c01]);
            let bytes: Vec<u8> = bits.flat_map(u16::to_le_bytes).collect();
            let n = bytes.len() / 2;
            let x = Tensor::from_le_bytes(&TensorType::new(dt, vec![n]), &bytes);
            let ht = TensorType::new(dt, vec![n]);
            let cast = |to: &'static str| -> Spec<'static> {
                (Op::Cast, if to == "f32" { &[("to", "f32")] } else { &[("to", "i32")] }, &[Arg::Input(0)])
            };
            for to in ["f32", "i32"] {
                check(
                    &group(std::slice::from_ref(&ht), &[cast(to)]),
                    std::slice::from_ref(&x),
                    &format!("{dt} -> {to}"),
                );
            }
            let y = Tensor::f32(vec![n], (0..n).map(|i| i as f32 * 0.25).collect());
            let f = group(&[ht, f32t(&[n])], &[cast("f32"), (Op::Add, &[], &[Arg::Node(0), Arg::Input(1)])]);
            check(&f, &[x, y], &format!("{dt} + f32"));
        }
    }

    #[test]
    fn a_half_result_other_than_a_casts_is_refused() {
        // Arithmetic takes no halves; a where of two halves gives one.
        let (c, h) = (TensorType::new(DType::Bool, vec![4]), TensorType::new(DType::F16, vec![4]));
        let f = group(&[c, h.clone(), h], &[(Op::Where, &[], &[Arg::Input(0), Arg::Input(1), Arg::Input(2)])]);
        let e = format!("{:#}", fused(&native(), "t", &f).err().expect("refused"));
        assert!(e.contains("a f16 result is not compiled yet"), "{e}");
    }

    /// f32 values on and around every rounding boundary of a half: each half, the midpoints
    /// between neighbours (ties) and one f32 ulp either side of them, the largest finite
    /// half and the overflow threshold (65504, 65520 for f16), subnormals, ±0, ±inf, NaN.
    fn half_edges(dt: DType) -> Vec<f32> {
        let mut v: Vec<f32> = SPECIAL.to_vec();
        v.extend([65504.0, 65520.0, 65519.996, 65536.0, 1e5, -65520.0, 6e-8, 2.98e-8, 5.96e-8, f32::MAX]);
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let all = Tensor::from_le_bytes(&TensorType::new(dt, vec![1 << 16]), &bytes).data.to_f64();
        for h in 0..=u16::MAX as usize {
            let (a, b) = (all[h] as f32, all[(h + 1) & 0xffff] as f32);
            if !a.is_finite() || !b.is_finite() || (a.to_bits() ^ b.to_bits()) >> 31 != 0 {
                v.push(a);
                continue;
            }
            let mid = (a as f64 + b as f64) / 2.0;
            let m = mid as f32;
            assert_eq!(m as f64, mid, "a midpoint of halves is an f32");
            v.extend([a, m, f32::from_bits(m.to_bits() - 1), f32::from_bits(m.to_bits() + 1)]);
        }
        v
    }

    /// A cast of f32 to f16 or bf16 (and back) gives the interpreter's bits, which are the
    /// `half` crate's IEEE rounding (NaN compared as NaN: payloads may differ).
    #[test]
    fn casts_to_halves_round_as_ieee() {
        for dt in [DType::F16, DType::BF16] {
            let v = half_edges(dt);
            // One more than a multiple of the vector width, so the scalar tail runs too.
            let n = (v.len() - 1) / 4 * 4 + 1;
            let x = Tensor::f32(vec![n], v[..n].to_vec());
            let to = [("to", dt.name())];
            let into = group(&[f32t(&[n])], &[(Op::Cast, &to, &[Arg::Input(0)])]);
            let back = group(
                &[f32t(&[n])],
                &[(Op::Cast, &to, &[Arg::Input(0)]), (Op::Cast, &[("to", "f32")], &[Arg::Node(0)])],
            );
            for t in runnable_targets() {
                for f in [&into, &back] {
                    let want = reference(f, std::slice::from_ref(&x)).data.to_f64();
                    let got = run_fused(&t, f, std::slice::from_ref(&x)).data.to_f64();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                        assert!(same, "{dt} on {}: {:e} gave {g:e}, want {w:e}", t.name, v[i]);
                    }
                }
            }
        }
    }

    /// Runs `f` on every runnable target and compares with the interpreter.
    fn check(f: &Fused, inputs: &[Tensor], what: &str) {
        let want = reference(f, inputs);
        for t in runnable_targets() {
            let got = run_fused(&t, f, inputs);
            assert_close(&got, &want, inputs, &format!("{what} on {}", t.name));
        }
    }

    const SPECIAL: [f32; 16] = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        2.0,
        3.0,
        -3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        3.0e38,
        -3.0e38,
        1.0e-40,
        -1.0e-40,
        1.0e-30,
    ];

    /// Random values of a dtype: for f32 a mix of specials, moderate values and magnitudes
    /// over the whole range; for ints, small values, full-range values and the extremes.
    fn random(rng: &mut Rng, ty: &TensorType) -> Tensor {
        let n = ty.numel();
        let data = match ty.dtype {
            DType::F32 => Data::F32(
                (0..n)
                    .map(|_| match rng.next() % 10 {
                        0 | 1 => SPECIAL[(rng.next() % SPECIAL.len() as u64) as usize],
                        2..=5 => rng.uniform(-8.0, 8.0),
                        6 | 7 => {
                            let m = (rng.uniform(-100.0, 100.0) as f64).exp() as f32;
                            if rng.next().is_multiple_of(2) {
                                m
                            } else {
                                -m
                            }
                        }
                        _ => rng.uniform(-100.0, 100.0).round(),
                    })
                    .collect(),
            ),
            DType::I32 => Data::I32((0..n).map(|_| int(rng) as i32).collect()),
            DType::I64 => Data::I64((0..n).map(|_| int(rng)).collect()),
            DType::Bool => Data::Bool((0..n).map(|_| rng.next().is_multiple_of(2)).collect()),
            // Any bit pattern: every value, subnormals, infinities and NaNs included (for
            // the storage ints, every value, a u64's from 2^63 on too).
            _ => {
                let bytes: Vec<u8> = (0..n * ty.dtype.size_bytes()).map(|_| rng.next() as u8).collect();
                return Tensor::from_le_bytes(ty, &bytes);
            }
        };
        Tensor::new(ty.shape.clone(), data)
    }

    fn int(rng: &mut Rng) -> i64 {
        match rng.next() % 4 {
            0 => [0, 1, -1, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN][(rng.next() % 7) as usize],
            1 => rng.next() as i64,
            _ => (rng.next() % 201) as i64 - 100,
        }
    }

    fn ty(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType::new(dtype, shape.to_vec())
    }

    fn check_random(f: &Fused, seed: u64, what: &str) {
        let mut rng = Rng(seed);
        let inputs: Vec<Tensor> = f.inputs.iter().map(|t| random(&mut rng, t)).collect();
        check(f, &inputs, what);
    }

    const IN0: Arg = Arg::Input(0);
    const IN1: Arg = Arg::Input(1);
    const IN2: Arg = Arg::Input(2);

    /// Shapes for single ops: vector loop + tail, tail only, and broadcasting.
    const UNARY_SHAPES: [&[usize]; 3] = [&[1023], &[3], &[5, 7]];
    const BINARY_SHAPES: [(&[usize], &[usize]); 4] =
        [(&[1023], &[1023]), (&[7], &[1]), (&[6, 9], &[9]), (&[4, 1], &[1, 5])];

    #[test]
    fn every_float_op() {
        let unary: [(Op, &[(&str, &str)]); 20] = [
            (Op::Floor, &[]),
            (Op::Ceil, &[]),
            (Op::Round, &[]),
            (Op::Neg, &[]),
            (Op::Abs, &[]),
            (Op::Relu, &[]),
            (Op::Exp, &[]),
            (Op::Log, &[]),
            (Op::Sqrt, &[]),
            (Op::Rsqrt, &[]),
            (Op::Tanh, &[]),
            (Op::Erf, &[]),
            (Op::Erfc, &[]),
            (Op::Sigmoid, &[]),
            (Op::Gelu, &[]),
            (Op::Gelu, &[("approximate", "none")]),
            (Op::Gelu, &[("approximate", "tanh")]),
            (Op::Cast, &[("to", "f32")]),
            (Op::Sin, &[]),
            (Op::Cos, &[]),
        ];
        for (k, (op, attrs)) in unary.iter().enumerate() {
            for (s, shape) in UNARY_SHAPES.iter().enumerate() {
                let f = group(&[f32t(shape)], &[(*op, attrs, &[IN0])]);
                let what = format!("{op}{attrs:?} {shape:?}");
                if !matches!(op, Op::Sin | Op::Cos) {
                    check_random(&f, (k * 10 + s) as u64, &what);
                    continue;
                }
                // Finite arguments folded into the range where sin and cos claim accuracy
                // (|x| < 2e5, math.rs): past 6.6e6 their range reduction gives up.
                let mut x = random(&mut Rng((k * 10 + s) as u64), &f.inputs[0]);
                if let Data::F32(v) = &mut x.data {
                    v.iter_mut().filter(|x| x.is_finite()).for_each(|x| *x %= 1e5);
                }
                check(&f, &[x], &what);
            }
        }
        for (k, op) in [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum, Op::Pow].into_iter().enumerate() {
            for (s, (a, b)) in BINARY_SHAPES.iter().enumerate() {
                let f = group(&[f32t(a), f32t(b)], &[(op, &[], &[IN0, IN1])]);
                check_random(&f, (100 + k * 10 + s) as u64, &format!("{op} {a:?} {b:?}"));
            }
        }
    }

    /// Every special value against every other, for the binary ops (NaN rules of
    /// maximum/minimum, pow's special cases).
    #[test]
    fn binary_specials() {
        let mut vals: Vec<f32> = SPECIAL.to_vec();
        vals.extend([-0.5, 4.0, -2.5, 1.0e10, -1.0e10, 7.0, -7.0]);
        let n = vals.len();
        let a = Tensor::f32(vec![n, 1], vals.clone());
        let b = Tensor::f32(vec![n], vals);
        for op in [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum, Op::Pow].into_iter().chain(COMPARISONS)
        {
            let f = group(&[f32t(&[n, 1]), f32t(&[n])], &[(op, &[], &[IN0, IN1])]);
            check(&f, &[a.clone(), b.clone()], &format!("{op} specials"));
        }
    }

    const COMPARISONS: [Op; 5] = [Op::Equal, Op::Less, Op::LessEqual, Op::Greater, Op::GreaterEqual];

    /// and, or, xor, not and equal on bools, alone and chained (a mask and its negation,
    /// both lane forms), and comparisons feeding logic.
    #[test]
    fn every_logic_op() {
        let b = |s: &[usize]| ty(DType::Bool, s);
        for (k, (x, y)) in BINARY_SHAPES.iter().enumerate() {
            for op in [Op::And, Op::Or, Op::Xor, Op::Equal] {
                let f = group(&[b(x), b(y)], &[(op, &[], &[IN0, IN1])]);
                check_random(&f, 400 + k as u64, &format!("{op} {x:?} {y:?}"));
            }
            let f = group(&[b(x), b(y)], &[(Op::Not, &[], &[IN0]), (Op::Xor, &[], &[Arg::Node(0), IN1])]);
            check_random(&f, 410 + k as u64, &format!("xor(not) {x:?} {y:?}"));
            let f = group(
                &[f32t(x), f32t(y)],
                &[
                    (Op::Less, &[], &[IN0, IN1]),
                    (Op::Equal, &[], &[IN0, IN0]),
                    (Op::Not, &[], &[Arg::Node(1)]),
                    (Op::Or, &[], &[Arg::Node(0), Arg::Node(2)]),
                ],
            );
            check_random(&f, 420 + k as u64, &format!("less or isnan {x:?} {y:?}"));
        }
    }

    #[test]
    fn every_int_op() {
        for (k, dt) in [DType::I32, DType::I64].into_iter().enumerate() {
            for op in [Op::Neg, Op::Abs, Op::Relu, Op::Not] {
                for shape in UNARY_SHAPES {
                    let f = group(&[ty(dt, shape)], &[(op, &[], &[IN0])]);
                    check_random(&f, 200 + k as u64, &format!("{op} {dt} {shape:?}"));
                }
            }
            let ops = [Op::Add, Op::Sub, Op::Mul, Op::Maximum, Op::Minimum, Op::Mod, Op::And, Op::Or, Op::Xor]
                .into_iter()
                .chain(COMPARISONS);
            for op in ops {
                for (a, b) in BINARY_SHAPES {
                    let f = group(&[ty(dt, a), ty(dt, b)], &[(op, &[], &[IN0, IN1])]);
                    check_random(&f, 300 + k as u64, &format!("{op} {dt} {a:?} {b:?}"));
                }
            }
            // fmod, and zero divisors, −1 divisors of the smallest integer, mixed signs.
            let (a, b) = (ty(dt, &[10, 1]), ty(dt, &[7]));
            let vals = [7, -7, 0, 1, -1, i32::MIN as i64, i32::MAX as i64, -3, 3, 5];
            let x = Tensor::new(vec![10, 1], Data::from_f64(dt, vals.iter().map(|&v| v as f64)));
            let y = Tensor::new(vec![7], Data::from_f64(dt, [3.0, -3.0, 0.0, -1.0, 1.0, 5.0, -5.0]));
            for fmod in ["true", "false"] {
                let f = group(&[a.clone(), b.clone()], &[(Op::Mod, &[("fmod", fmod)], &[IN0, IN1])]);
                check(&f, &[x.clone(), y.clone()], &format!("mod fmod={fmod} {dt}"));
            }
            // Integer div: exact and truncating (the interpreter's), MIN / −1 wrapping, and a
            // zero divisor anywhere ends the kernel with its status instead of trapping.
            let x = Tensor::new(vec![10, 1], Data::from_f64(dt, vals.iter().map(|&v| v as f64)));
            let nonzero = Tensor::new(vec![7], Data::from_f64(dt, [3.0, -3.0, 2.0, -1.0, 1.0, 5.0, -7.0]));
            let f = group(&[a.clone(), b.clone()], &[(Op::Div, &[], &[IN0, IN1])]);
            check(&f, &[x.clone(), nonzero], &format!("div {dt}"));
            let big = Tensor::new(vec![2], Data::from_f64(dt, [1_099_511_627_777.0, -7.0]));
            let three = Tensor::new(vec![1], Data::from_f64(dt, [3.0]));
            check(&group(&[ty(dt, &[2]), ty(dt, &[1])], &[(Op::Div, &[], &[IN0, IN1])]), &[big, three], "div big");
            let g = fused(&native(), "t", &f).expect("generates");
            let mut out = vec![0u8; 70 * dt.size_bytes()];
            let (mut xb, mut yb) = (x.to_le_bytes(), y.to_le_bytes());
            let status = run(&native(), g.func, &mut [&mut out, &mut xb, &mut yb]);
            assert_eq!(status, STATUS_DIVISION_BY_ZERO, "div {dt} by a zero");
        }
    }

    #[test]
    fn every_cast() {
        for from in DType::ALL {
            // Halves are widened on loading, never written (`a_half_result_is_refused`).
            for to in DType::ALL.into_iter().filter(|t| !t.is_half()) {
                for shape in UNARY_SHAPES {
                    let f = group(&[ty(from, shape)], &[(Op::Cast, &[("to", to.name())], &[IN0])]);
                    check_random(&f, 400, &format!("cast {from} -> {to} {shape:?}"));
                }
            }
        }
        // Saturation and rounding edges.
        let x = Tensor::f32(vec![8], vec![3e9, -3e9, 1e19, -1e19, 2.9, -2.9, f32::NAN, f32::INFINITY]);
        for to in ["i32", "i64", "u16", "u32", "u64"] {
            check(
                &group(&[f32t(&[8])], &[(Op::Cast, &[("to", to)], &[IN0])]),
                std::slice::from_ref(&x),
                &format!("f32 -> {to} edges"),
            );
        }
        // A u64 from 2^63 on is unsigned into f32 (its rounding too), its bits into an int.
        let x = Tensor::new(vec![5], Data::U64(vec![u64::MAX, 1 << 63, (1 << 63) + (1 << 39) + 1, 16_777_217, 0]));
        for to in ["f32", "i64", "i32", "u32", "bool"] {
            check(
                &group(&[ty(DType::U64, &[5])], &[(Op::Cast, &[("to", to)], &[IN0])]),
                std::slice::from_ref(&x),
                &format!("u64 -> {to} edges"),
            );
        }
        let x = Tensor::new(vec![4], Data::I64(vec![16_777_217, (1 << 40) + 1, i64::MAX, i64::MIN + 1]));
        for to in ["f32", "i32"] {
            check(
                &group(&[ty(DType::I64, &[4])], &[(Op::Cast, &[("to", to)], &[IN0])]),
                std::slice::from_ref(&x),
                &format!("i64 -> {to} edges"),
            );
        }
    }

    #[test]
    fn where_every_dtype() {
        for (k, dt) in DType::ALL.into_iter().filter(|t| !t.is_half()).enumerate() {
            for (c, a, b) in [(&[1023][..], &[1023][..], &[1023][..]), (&[5, 1], &[7], &[1]), (&[3], &[3], &[3])] {
                let f = group(&[ty(DType::Bool, c), ty(dt, a), ty(dt, b)], &[(Op::Where, &[], &[IN0, IN1, IN2])]);
                check_random(&f, 500 + k as u64, &format!("where {dt} {c:?} {a:?} {b:?}"));
            }
        }
    }

    /// The GELU MLP's bias + activation, both forms, on [8,32] + [32].
    #[test]
    fn bias_gelu() {
        for form in ["none", "tanh"] {
            let f = group(
                &[f32t(&[8, 32]), f32t(&[32])],
                &[(Op::Add, &[], &[IN0, IN1]), (Op::Gelu, &[("approximate", form)], &[Arg::Node(0)])],
            );
            check_random(&f, 600, &format!("gelu({form})(x + b)"));
        }
    }

    /// Chains through where and casts, at sizes around the vector width: one ending in an
    /// int cast (of exactly computed values, as the comparison is exact), one in f32.
    #[test]
    fn chain_with_where_and_casts() {
        for n in [1, 3, 4, 7, 1023] {
            for (unary, to) in [(Op::Abs, "i32"), (Op::Exp, "f32")] {
                let f = group(
                    &[f32t(&[n]), f32t(&[n]), ty(DType::I32, &[1])],
                    &[
                        (Op::Relu, &[], &[IN0]),                                       // 0
                        (Op::Cast, &[("to", "bool")], &[Arg::Node(0)]),                // 1: x > 0
                        (unary, &[], &[IN1]),                                          // 2
                        (Op::Cast, &[("to", "f32")], &[IN2]),                          // 3
                        (Op::Where, &[], &[Arg::Node(1), Arg::Node(2), Arg::Node(3)]), // 4
                        (Op::Mul, &[], &[Arg::Node(4), IN0]),                          // 5
                        (Op::Cast, &[("to", to)], &[Arg::Node(5)]),                    // 6
                    ],
                );
                check_random(&f, 700 + n as u64, &format!("chain {unary} {to} n={n}"));
            }
        }
    }

    /// [4,1,6] + [5,1] → [4,5,6], and an intermediate smaller than the result.
    #[test]
    fn broadcasting() {
        let f =
            group(&[f32t(&[4, 1, 6]), f32t(&[5, 1])], &[(Op::Add, &[], &[IN0, IN1]), (Op::Tanh, &[], &[Arg::Node(0)])]);
        check_random(&f, 800, "tanh([4,1,6] + [5,1])");
        let f = group(
            &[f32t(&[4, 8]), f32t(&[8]), f32t(&[8])],
            &[(Op::Mul, &[], &[IN1, IN2]), (Op::Add, &[], &[IN0, Arg::Node(0)])],
        );
        check_random(&f, 801, "x[4,8] + b[8]·c[8]");
        // Inner-invariant operands and nodes: a column [16,1] through exp, then scalars.
        let f = group(
            &[f32t(&[16, 9]), f32t(&[16, 1]), f32t(&[])],
            &[(Op::Exp, &[], &[IN1]), (Op::Mul, &[], &[Arg::Node(0), IN2]), (Op::Sub, &[], &[IN0, Arg::Node(1)])],
        );
        check_random(&f, 802, "x[16,9] - exp(c[16,1])·s[]");
        // Everything broadcast: a scalar result, and a result of only invariant values.
        let f = group(&[f32t(&[]), f32t(&[1])], &[(Op::Add, &[], &[IN0, IN1])]);
        check_random(&f, 803, "scalar");
        let f =
            group(&[f32t(&[3, 1]), f32t(&[1, 1])], &[(Op::Sigmoid, &[], &[IN0]), (Op::Mul, &[], &[Arg::Node(0), IN1])]);
        check_random(&f, 804, "column result");
        // Bools broadcast along the inner dim, and bool results.
        let f = group(
            &[ty(DType::Bool, &[6, 1]), f32t(&[6, 10])],
            &[(Op::Cast, &[("to", "bool")], &[IN1]), (Op::Where, &[], &[IN0, IN0, Arg::Node(0)])],
        );
        check_random(&f, 805, "bool where");
    }

    /// Groups with an i64 value run the scalar body only.
    #[test]
    fn int64_chain() {
        let f = group(
            &[ty(DType::I64, &[9, 13]), ty(DType::I32, &[13])],
            &[
                (Op::Cast, &[("to", "i64")], &[IN1]),
                (Op::Mul, &[], &[IN0, Arg::Node(0)]),
                (Op::Relu, &[], &[Arg::Node(1)]),
                (Op::Cast, &[("to", "f32")], &[Arg::Node(2)]),
                (Op::Sqrt, &[], &[Arg::Node(3)]),
            ],
        );
        check_random(&f, 900, "sqrt(f32(relu(x * i64(y))))");
    }

    /// A group using every op compiles, relocation-free, for every named target (the
    /// run-time tests cover the targets this host can execute).
    #[test]
    fn compiles_for_every_target() {
        let n = |i: usize| Arg::Node(i);
        let f = group(
            &[f32t(&[5, 7]), f32t(&[7]), ty(DType::I32, &[5, 1]), ty(DType::I64, &[7])],
            &[
                (Op::Add, &[], &[IN0, IN1]),
                (Op::Sub, &[], &[n(0), IN1]),
                (Op::Mul, &[], &[n(1), IN0]),
                (Op::Div, &[], &[n(2), IN1]),
                (Op::Maximum, &[], &[n(3), IN0]),
                (Op::Minimum, &[], &[n(4), IN1]),
                (Op::Pow, &[], &[n(5), IN0]),
                (Op::Neg, &[], &[n(6)]),
                (Op::Abs, &[], &[n(7)]),
                (Op::Exp, &[], &[n(8)]),
                (Op::Log, &[], &[n(9)]),
                (Op::Sqrt, &[], &[n(10)]),
                (Op::Rsqrt, &[], &[n(11)]),
                (Op::Tanh, &[], &[n(12)]),
                (Op::Erf, &[], &[n(13)]),
                (Op::Sigmoid, &[], &[n(14)]),
                (Op::Relu, &[], &[n(15)]),
                (Op::Gelu, &[], &[n(16)]),
                (Op::Gelu, &[("approximate", "tanh")], &[n(17)]),
                (Op::Cast, &[("to", "bool")], &[IN2]),
                (Op::Where, &[], &[n(19), n(18), IN0]),
                (Op::Cast, &[("to", "i64")], &[n(20)]),
                (Op::Mul, &[], &[n(21), Arg::Input(3)]),
                (Op::Cast, &[("to", "f32")], &[n(22)]),
            ],
        );
        for name in ["native", "x86-64-v2", "x86-64-v3"] {
            let t = Target::by_name(name).unwrap();
            Kernels::artifact(&t)
                .define(fused(&t, "all", &f).unwrap().func)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        let f32_only = Fused { inputs: f.inputs[..2].to_vec(), nodes: f.nodes[..19].to_vec() };
        for name in ["native", "x86-64-v2", "x86-64-v3"] {
            let t = Target::by_name(name).unwrap();
            let func = fused(&t, "all_f32", &f32_only).unwrap().func;
            Kernels::artifact(&t).define(func).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        check_random(&f, 950, "every op");
        check_random(&f32_only, 951, "every f32 op");
    }

    #[test]
    fn bytes_computed_inside_a_group_take_the_vector_loop() {
        // QuantizeLinear's cast into a byte then MatMulInteger's widening, less a zero point
        // read once: vectorised, as the scalar tail is, every float (specials included)
        // truncated, saturated and wrapped to 8 bits.
        for (k, (to, dt)) in [("u8", DType::U8), ("i8", DType::I8)].into_iter().enumerate() {
            let wide = [("to", "i32")];
            let f = group(
                &[f32t(&[1023]), ty(dt, &[])],
                &[
                    (Op::Cast, &[("to", to)], &[IN0]),
                    (Op::Cast, &wide, &[Arg::Node(0)]),
                    (Op::Cast, &wide, &[IN1]),
                    (Op::Sub, &[], &[Arg::Node(1), Arg::Node(2)]),
                ],
            );
            assert!(Plan::new(&f).unwrap().vector, "{to}");
            check_random(&f, 960 + k as u64, &format!("f32 -> {to} -> i32 - zero point"));
            // A group whose result is the byte (DynamicQuantizeLinear's, which an integer
            // matmul reads as it is: `passes::zero_point`) stores four lanes at a time.
            let f = group(
                &[f32t(&[1023]), f32t(&[])],
                &[(Op::Mul, &[], &[IN0, IN1]), (Op::Cast, &[("to", to)], &[Arg::Node(0)])],
            );
            assert!(Plan::new(&f).unwrap().vector, "{to}");
            check_random(&f, 970 + k as u64, &format!("f32 * scale -> {to}"));
            // Bytes loaded element by element still take the scalar loop.
            let f = group(&[ty(dt, &[1023])], &[(Op::Cast, &wide, &[IN0])]);
            assert!(!Plan::new(&f).unwrap().vector, "{to}");
        }
    }

    #[test]
    fn collapses_contiguous_dims() {
        let f = group(&[f32t(&[16, 1024]), f32t(&[16, 1024])], &[(Op::Add, &[], &[IN0, IN1])]);
        let p = Plan::new(&f).unwrap();
        assert_eq!(p.dims, [16384]);
        assert!(p.vector);
        // A flat loop long enough to split is cut into chunks and a tail.
        let f = group(&[f32t(&[5, 16384]), f32t(&[])], &[(Op::Add, &[], &[IN0, IN1])]);
        let p = Plan::new(&f).unwrap();
        assert_eq!((p.dims.clone(), p.strides.clone(), p.tail), (vec![5, CHUNK], vec![vec![CHUNK, 1], vec![0, 0]], 0));
        let f = group(&[f32t(&[2 * CHUNK + 3])], &[(Op::Neg, &[], &[IN0])]);
        assert_eq!((Plan::new(&f).unwrap().dims, Plan::new(&f).unwrap().tail), (vec![2, CHUNK], 3));
        let f = group(&[f32t(&[2, 1, 3, 4, 5]), f32t(&[4, 5])], &[(Op::Add, &[], &[IN0, IN1])]);
        let p = Plan::new(&f).unwrap();
        assert_eq!(
            (p.dims.clone(), p.strides.clone(), p.out_strides.clone()),
            (vec![6, 20], vec![vec![20, 1], vec![0, 1]], vec![20, 1])
        );
        let f = group(&[f32t(&[8, 32]), f32t(&[32])], &[(Op::Add, &[], &[IN0, IN1])]);
        assert_eq!(Plan::new(&f).unwrap().dims, [8, 32]);
        let f = group(&[f32t(&[5, 1])], &[(Op::Neg, &[], &[IN0])]);
        let p = Plan::new(&f).unwrap();
        assert_eq!(p.dims, [5]);
        assert!(p.vector && !p.invariant[0]);
    }

    /// Called as any number of parts, a kernel writes every element of the result exactly
    /// once, each with the value the whole call gives (which is the interpreter's).
    #[test]
    fn parts_tile_the_result() {
        let t = native();
        let gelu: (Op, &[(&str, &str)], &[Arg]) = (Op::Gelu, &[("approximate", "none")], &[Arg::Node(1)]);
        let chain = [(Op::Mul, &[][..], &[IN0, IN1][..]), (Op::Add, &[], &[Arg::Node(0), IN2]), gelu];
        let cases = [
            group(&[f32t(&[2 * CHUNK + 5]), f32t(&[]), f32t(&[2 * CHUNK + 5])], &chain),
            group(&[f32t(&[3 * CHUNK]), f32t(&[3 * CHUNK]), f32t(&[])], &chain),
            group(&[f32t(&[37, 1000]), f32t(&[1000]), f32t(&[37, 1])], &chain),
            group(&[f32t(&[5, 7, 301]), f32t(&[7, 1]), f32t(&[301])], &chain),
        ];
        for (c, f) in cases.iter().enumerate() {
            let mut rng = Rng(40 + c as u64);
            let inputs: Vec<Tensor> = f.inputs.iter().map(|ty| random(&mut rng, ty)).collect();
            let whole = run_fused(&t, f, &inputs);
            assert_close(&whole, &reference(f, &inputs), &inputs, &format!("case {c}"));
            let mut ins: Vec<Vec<u8>> = inputs.iter().map(Tensor::to_le_bytes).collect();
            let func = fused(&t, "parts", f).unwrap().func;
            check_parts(&t, func, whole.ty().size_bytes(), &mut ins, &format!("case {c}"));
        }
    }

    /// Only work worth a thread hand-off splits: a part is at least 256 KiB read and written.
    #[test]
    fn parts_by_size() {
        let t = native();
        let parts = |shapes: &[&[usize]]| {
            let inputs: Vec<TensorType> = shapes.iter().map(|s| f32t(s)).collect();
            let args: Vec<Arg> = (0..inputs.len()).map(Arg::Input).collect();
            fused(&t, "p", &group(&inputs, &[(Op::Add, &[], &args)])).unwrap().parts
        };
        assert_eq!(parts(&[&[1024, 1024], &[1024]]), 32);
        assert_eq!(parts(&[&[1 << 22], &[1 << 22]]), 192);
        assert_eq!(parts(&[&[3, 1 << 22], &[1 << 22]]), 3);
        assert_eq!(parts(&[&[128, 128], &[128]]), 1);
        assert_eq!(parts(&[&[2 * CHUNK - 1], &[]]), 1);
    }

    #[test]
    fn empty_result() {
        let f = group(&[f32t(&[0, 4]), f32t(&[4])], &[(Op::Add, &[], &[IN0, IN1])]);
        let out = run_fused(&native(), &f, &[Tensor::f32(vec![0, 4], vec![]), Tensor::f32(vec![4], vec![1.0; 4])]);
        assert_eq!(out.numel(), 0);
    }

    #[test]
    fn rejects_bad_groups() {
        let t = native();
        let err = |f: Fused| format!("{:#}", fused(&t, "bad", &f).err().expect("rejected"));
        let x = f32t(&[4]);
        let node = |op: Op, args: Vec<Arg>, ty: TensorType| FusedNode { op, attrs: Attrs::new(), args, ty };
        assert!(err(Fused { inputs: vec![x.clone()], nodes: vec![] }).contains("at least one node"));
        let e = err(Fused { inputs: vec![x.clone()], nodes: vec![node(Op::Neg, vec![Arg::Node(0)], x.clone())] });
        assert!(e.contains("is not an input or an earlier node"), "{e}");
        let e = err(Fused { inputs: vec![x.clone()], nodes: vec![node(Op::Softmax, vec![IN0], x.clone())] });
        assert!(e.contains("not an elementwise op"), "{e}");
        let e = err(Fused { inputs: vec![x.clone()], nodes: vec![node(Op::Add, vec![IN0], x.clone())] });
        assert!(e.contains("takes 2 operands"), "{e}");
        let e = err(Fused {
            inputs: vec![x.clone(), ty(DType::I32, &[4])],
            nodes: vec![node(Op::Add, vec![IN0, IN1], x.clone())],
        });
        assert!(e.contains("dtypes differ"), "{e}");
        let e = err(Fused { inputs: vec![x.clone()], nodes: vec![node(Op::Neg, vec![IN0], f32t(&[5]))] });
        assert!(e.contains("declared type f32[5]"), "{e}");
        let mut g = node(Op::Gelu, vec![IN0], x.clone());
        g.attrs.insert("approximate".into(), Attr::Str("fast".into()));
        let e = err(Fused { inputs: vec![x.clone()], nodes: vec![g] });
        assert!(e.contains("attribute 'approximate' must be one of none, tanh"), "{e}");
        // An intermediate or input that does not broadcast to the result.
        let e = err(Fused {
            inputs: vec![f32t(&[2, 3])],
            nodes: vec![node(Op::Neg, vec![IN0], f32t(&[2, 3])), node(Op::Neg, vec![IN0], f32t(&[3]))],
        });
        assert!(e.contains("does not broadcast to the result"), "{e}");
    }

    /// Prints the machine code (Cranelift's VCode listing) of the unrolled loop of
    /// `gelu(x·a + b)`, both forms, with its instruction count per f32x4 vector: the figure
    /// to watch when changing math.rs. Run with `cargo test --lib codegen::elementwise::tests::
    /// gelu_code -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gelu_code() {
        let t = native();
        for form in ["none", "tanh"] {
            let f = group(
                &[f32t(&[4096]), f32t(&[4096]), f32t(&[4096])],
                &[
                    (Op::Mul, &[], &[IN0, IN1]),
                    (Op::Add, &[], &[Arg::Node(0), IN2]),
                    (Op::Gelu, &[("approximate", form)], &[Arg::Node(1)]),
                ],
            );
            let mut ctx = cranelift_codegen::Context::for_function(fused(&t, "gelu", &f).unwrap().func);
            ctx.set_disasm(true);
            let code = ctx.compile(&*t.isa, &mut Default::default()).unwrap();
            let listing = code.vcode.clone().unwrap();
            // The unrolled loop is the largest block.
            let blocks: Vec<&str> = listing.split("\nblock").collect();
            let body = blocks.iter().max_by_key(|b| b.lines().count()).unwrap();
            eprintln!("{body}");
            let n = body.lines().filter(|l| l.starts_with("  ")).count();
            eprintln!(
                "gelu({form}): {n} instructions in the unrolled loop, {:.1} per vector",
                n as f64 / UNROLL as f64
            );
        }
    }
}
