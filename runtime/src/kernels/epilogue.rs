//! Matmul epilogues: elementwise steps after a library matmul — a bias or residual add, a
//! scale, relu, GELU (both forms), SiLU — that the GEMM applies to each block of its result right
//! after computing it, while the block is still in cache, instead of separate passes over
//! memory (the compiler's `epilogue` pass folds them into the matmul). Each step takes the
//! running value as its left operand; a binary step's right operand is the matmul's next
//! extra operand, broadcast (numpy's rules) to the result without growing it. The steps as
//! the program describes them are `crate::format::epilogue`; this is their arithmetic.
//!
//! The GEMMs call `Bound::apply` on each block they finish: a tile of the panel kernel, a
//! strip of the small-M kernel, a block of rows of the general one. Apply runs step by step
//! over each row of the block, the row's operand elements either contiguous or one value.

use crate::format::epilogue::{operands, Step};
use crate::format::isa::Isa;
use crate::kernels::vmath;

/// An operand as the rows of the result see it.
struct Operand {
    /// Where each row of the result finds its elements.
    rows: Rows,
    /// 1 where the operand spans the result's columns, 0 where it is broadcast along them.
    col: usize,
}

/// Where the elements of an operand for a row of the result start.
enum Rows {
    /// At the start, for every row (a bias, a scale): no division per row.
    Same,
    /// At the row times this (an operand of the result's shape).
    Dense(usize),
    /// Per dim of the result but the last, up to the last the operand varies along: (size,
    /// the operand's stride along it, 0 where broadcast); `inner` is the number of rows per
    /// step along the last of them.
    Strided { dims: Vec<(usize, usize)>, inner: usize },
}

/// An epilogue prepared for its result's shape: where each operand's elements lie for each
/// row of the result. Built once when a program is loaded, so a call allocates nothing.
pub struct Epilogue {
    steps: Vec<Step>,
    operands: Vec<Operand>,
    phi: ([f32; 6], [f32; 6]),
}

/// No epilogue.
static NONE: Epilogue = Epilogue { steps: Vec::new(), operands: Vec::new(), phi: ([0.0; 6], [0.0; 6]) };

impl Epilogue {
    /// `steps` after a matmul whose result has shape `out` (rank ≥ 2), each binary step's
    /// operand one that `meshc_ir::ops::check_epilogue_operand` accepted against `out`.
    pub fn new(steps: &[Step], out: &[usize]) -> Epilogue {
        let operands = operands(steps)
            .map(|shape| {
                // Strides of the operand left-padded to the result's rank, 0 where broadcast.
                let pad = out.len() - shape.len();
                let mut strides = vec![0; out.len()];
                let mut s = 1;
                for d in (0..shape.len()).rev() {
                    strides[pad + d] = if shape[d] == 1 { 0 } else { s };
                    s *= shape[d];
                }
                let rank = out.len();
                let dims = (0..rank - 1).map(|d| (out[d], strides[d])).collect::<Vec<_>>();
                let rows = match dims.iter().rposition(|&(_, stride)| stride != 0) {
                    None => Rows::Same,
                    Some(_) if shape.len() == rank && shape == out => Rows::Dense(out[rank - 1]),
                    Some(last) => {
                        let inner = out[last + 1..rank - 1].iter().product::<usize>().max(1);
                        Rows::Strided { dims: dims[..=last].to_vec(), inner }
                    }
                };
                Operand { rows, col: strides[rank - 1] }
            })
            .collect();
        Epilogue { steps: steps.to_vec(), operands, phi: vmath::erf_coefficients(0.5, 2.0) }
    }

    /// The epilogue reading its binary steps' operands at `ptrs`, in order.
    ///
    /// # Safety
    /// Each pointer addresses an f32 tensor of its step's shape and stays valid while the
    /// result is computed.
    pub unsafe fn bind<'a>(&'a self, ptrs: &'a [*mut u8]) -> Bound<'a> {
        assert!(ptrs.len() >= self.operands.len(), "an epilogue's operands are bound");
        Bound { epilogue: self, ptrs }
    }
}

/// An epilogue bound to its operands' memory for one call.
pub struct Bound<'a> {
    epilogue: &'a Epilogue,
    ptrs: &'a [*mut u8],
}

// SAFETY: the operands are only read, by the GEMM's parts, while the call that bound them
// runs.
unsafe impl Sync for Bound<'_> {}

impl Bound<'_> {
    /// No epilogue.
    pub fn none() -> Bound<'static> {
        Bound { epilogue: &NONE, ptrs: &[] }
    }

    /// Applies the epilogue to `rows` rows × columns `cols` of the result from row `row0`
    /// (rows counted over all of the result's matrices, as if it were one matrix), whose
    /// first element (row `row0`, column 0) is at `c`, rows `ldc` apart.
    ///
    /// # Safety
    /// Those rows and columns lie inside the result; nobody else touches them during the
    /// call.
    pub unsafe fn apply(&self, c: *mut f32, ldc: usize, (row0, rows): (usize, usize), cols: std::ops::Range<usize>) {
        if self.epilogue.steps.is_empty() || cols.is_empty() {
            return;
        }
        match crate::format::isa::current() {
            // SAFETY: as the caller promises; the CPU has AVX-512F and FMA (`format::isa`
            // forces no ISA above the CPU's).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { self.apply_avx512(c, ldc, (row0, rows), cols) },
            // SAFETY: as above, with AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { self.apply_avx2(c, ldc, (row0, rows), cols) },
            // SAFETY: as the caller promises.
            _ => unsafe { self.apply_on::<false>(c, ldc, (row0, rows), cols) },
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn apply_avx512(&self, c: *mut f32, ldc: usize, rows: (usize, usize), cols: std::ops::Range<usize>) {
        // SAFETY: as `apply`'s caller promises.
        unsafe { self.apply_on::<true>(c, ldc, rows, cols) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn apply_avx2(&self, c: *mut f32, ldc: usize, rows: (usize, usize), cols: std::ops::Range<usize>) {
        // SAFETY: as `apply`'s caller promises.
        unsafe { self.apply_on::<true>(c, ldc, rows, cols) }
    }

    /// `apply`, with fused multiply-adds where `FMA`: inlined into its callers, whose
    /// target features the loops are vectorized for.
    #[inline(always)]
    unsafe fn apply_on<const FMA: bool>(
        &self,
        c: *mut f32,
        ldc: usize,
        (row0, rows): (usize, usize),
        cols: std::ops::Range<usize>,
    ) {
        let (j0, width) = (cols.start, cols.len());
        // A copy the loops can keep in registers: stores to the result might alias `self`.
        let phi = self.epilogue.phi;
        for i in 0..rows {
            let r = row0 + i;
            // SAFETY: row r, columns `cols` of the result (the caller's promise).
            let x = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc + j0), width) };
            let mut next = 0;
            for step in &self.epilogue.steps {
                if step.operand().is_some() {
                    let (o, ptr) = (&self.epilogue.operands[next], self.ptrs[next] as *const f32);
                    next += 1;
                    // The operand's element at (row r, column 0), from r's index per dim.
                    let at = match o.rows {
                        Rows::Same => 0,
                        Rows::Dense(len) => r * len,
                        Rows::Strided { ref dims, inner } => {
                            let (mut rest, mut at) = (r / inner, 0);
                            for &(size, stride) in dims.iter().rev() {
                                at += rest % size * stride;
                                rest /= size;
                            }
                            at
                        }
                    };
                    // SAFETY: `new`'s caller promised an operand that broadcasts to the
                    // result: these are its elements for this row.
                    unsafe {
                        if o.col == 1 {
                            let y = std::slice::from_raw_parts(ptr.add(at + j0), width);
                            match step {
                                Step::Add(_) => x.iter_mut().zip(y).for_each(|(x, y)| *x += y),
                                Step::Mul(_) => x.iter_mut().zip(y).for_each(|(x, y)| *x *= y),
                                _ => x.iter_mut().zip(y).for_each(|(x, y)| *x /= y),
                            }
                        } else {
                            let y = *ptr.add(at);
                            match step {
                                Step::Add(_) => x.iter_mut().for_each(|x| *x += y),
                                Step::Mul(_) => x.iter_mut().for_each(|x| *x *= y),
                                _ => x.iter_mut().for_each(|x| *x /= y),
                            }
                        }
                    }
                    continue;
                }
                match step {
                    // The tile holds the integer GEMM's i32 sums.
                    Step::ToF32 => x.iter_mut().for_each(|x| *x = x.to_bits() as i32 as f32),
                    // maximum(x, 0) as the interpreter has it: NaN and −0 pass through.
                    Step::Relu => x.iter_mut().for_each(|x| *x = if *x < 0.0 { 0.0 } else { *x }),
                    Step::Gelu => x.iter_mut().for_each(|x| *x = vmath::gelu_erf::<FMA>(*x, &phi)),
                    Step::GeluTanh => x.iter_mut().for_each(|x| *x = vmath::gelu_tanh::<FMA>(*x)),
                    Step::Silu => x.iter_mut().for_each(|x| *x = vmath::silu::<FMA>(*x)),
                    _ => unreachable!("binary steps are above"),
                }
            }
        }
    }
}

/// The interpreter's epilogue, the oracle of the GEMMs' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use meshc_ir::interp::eval_node;
    use meshc_ir::{DType, Node, Op, Tensor, TensorType};

    /// The interpreter's value of `steps` after a result `c` of shape `out`.
    pub(crate) fn oracle(c: &Tensor, steps: &[Step], operands: &[Tensor]) -> Vec<f32> {
        let mut y = c.clone();
        let mut next = operands.iter();
        let ty = TensorType::new(DType::F32, c.shape.clone());
        for s in steps {
            if *s == Step::Silu {
                let sig = eval_node(&Node::new("s", Op::Sigmoid, &["x0"]), &[&y], &ty).unwrap();
                y = eval_node(&Node::new("s", Op::Mul, &["x0", "x1"]), &[&y, &sig], &ty).unwrap();
                continue;
            }
            let (op, attrs, args): (Op, &[(&str, &str)], Vec<&Tensor>) = match s {
                Step::Add(_) => (Op::Add, &[], vec![&y, next.next().unwrap()]),
                Step::Mul(_) => (Op::Mul, &[], vec![&y, next.next().unwrap()]),
                Step::Div(_) => (Op::Div, &[], vec![&y, next.next().unwrap()]),
                Step::ToF32 => (Op::Cast, &[("to", "f32")], vec![&y]),
                Step::Relu => (Op::Relu, &[], vec![&y]),
                Step::Gelu => (Op::Gelu, &[], vec![&y]),
                Step::GeluTanh => (Op::Gelu, &[("approximate", "tanh")], vec![&y]),
                Step::Silu => unreachable!("computed above"),
            };
            let names: Vec<String> = (0..args.len()).map(|i| format!("x{i}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut node = Node::new("s", op, &names);
            for (k, v) in attrs {
                node.attrs.insert(k.to_string(), meshc_ir::Attr::Str(v.to_string()));
            }
            y = eval_node(&node, &args, &ty).unwrap();
        }
        y.as_f32().unwrap().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::oracle;
    use super::*;
    use crate::kernels::matmul_shape::testing::{assert_close, random};
    use meshc_ir::Tensor;

    /// Every step kind and operand kind (scalar, bias, a mask broadcast over rows and heads,
    /// a residual), applied in blocks of every shape (whole, tiles of rows × 32 columns,
    /// single rows) on every path the CPU has, gives the interpreter's values; values span
    /// GELU's and SiLU's tails.
    #[test]
    fn blocks_match_the_interpreter() {
        let out = [2, 3, 5, 40];
        let c = Tensor::f32(out.to_vec(), random(1, 1200).iter().map(|v| v * 8.0).collect());
        let shapes: [&[usize]; 4] = [&[], &[40], &[2, 1, 1, 40], &[2, 3, 5, 40]];
        let operands: Vec<Tensor> = (shapes.iter().enumerate())
            .map(|(i, s)| {
                let n = s.iter().product();
                Tensor::f32(s.to_vec(), random(2 + i as u64, n).iter().map(|v| v + 1.5).collect())
            })
            .collect();
        let chains: Vec<(Vec<Step>, Vec<usize>)> = vec![
            (vec![Step::Add(vec![40]), Step::Gelu], vec![1]),
            (vec![Step::Mul(vec![]), Step::Add(vec![2, 1, 1, 40]), Step::Relu], vec![0, 2]),
            (vec![Step::Div(vec![]), Step::GeluTanh, Step::Add(out.to_vec())], vec![0, 3]),
            (vec![Step::Add(vec![40]), Step::Silu, Step::Add(out.to_vec())], vec![1, 3]),
            (vec![Step::Add(vec![2, 3, 5, 40]), Step::Mul(vec![40]), Step::Div(vec![2, 1, 1, 40])], vec![3, 1, 2]),
        ];
        let (rows, n) = (30, 40);
        for (steps, which) in &chains {
            let ops: Vec<Tensor> = which.iter().map(|&i| operands[i].clone()).collect();
            let want = oracle(&c, steps, &ops);
            let ptrs: Vec<*mut u8> = ops.iter().map(|t| t.as_f32().unwrap().as_ptr() as *mut u8).collect();
            let epilogue = Epilogue::new(steps, &out);
            // SAFETY: each operand holds its step's shape, which broadcasts to `out`.
            let ep = unsafe { epilogue.bind(&ptrs) };
            let blocks: [&[(usize, usize, usize, usize)]; 3] = [
                &[(0, rows, 0, n)],
                &[(0, 12, 0, 32), (0, 12, 32, 40), (12, 18, 0, 32), (12, 18, 32, 40)],
                &[(0, 1, 0, n), (1, 29, 0, 7), (1, 29, 7, 40)],
            ];
            // The portable path, the AVX2 one where the CPU has it, and the best one.
            let paths =
                ["portable", "avx2", "best"].into_iter().filter(|&p| p != "avx2" || Isa::detected() >= Isa::Avx2);
            for (path, blocks) in paths.flat_map(|p| blocks.map(|b| (p, b))) {
                let mut got = c.as_f32().unwrap().to_vec();
                for &(r, count, j0, j1) in blocks {
                    // SAFETY: rows r..r + count, columns j0..j1 of the 30 × 40 result; the
                    // CPU has AVX2 and FMA where that path is taken.
                    unsafe {
                        let at = got.as_mut_ptr().add(r * n);
                        match path {
                            "portable" => ep.apply_on::<false>(at, n, (r, count), j0..j1),
                            #[cfg(target_arch = "x86_64")]
                            "avx2" => ep.apply_avx2(at, n, (r, count), j0..j1),
                            _ => ep.apply(at, n, (r, count), j0..j1),
                        }
                    }
                }
                assert_close(&got, &want, &format!("{steps:?}, path {path}, blocks {blocks:?}"));
            }
        }
    }

    /// SiLU where e^−x is clamped (x below −88.5) and at the infinities is the interpreter's
    /// x · sigmoid(x): −0 far below, NaN at −∞, x far above, on every path.
    #[test]
    fn silu_far_out_is_the_interpreters() {
        let extremes = [-f32::INFINITY, -3e38, -1e30, -100.0, -88.6, -88.4, -87.0, 88.6, 100.0, 1e30, f32::INFINITY];
        let c = Tensor::f32(vec![1, extremes.len()], extremes.to_vec());
        let steps = [Step::Silu];
        let want = oracle(&c, &steps, &[]);
        let epilogue = Epilogue::new(&steps, &c.shape);
        // SAFETY: no operands.
        let ep = unsafe { epilogue.bind(&[]) };
        let paths = ["portable", "avx2", "best"].into_iter().filter(|&p| p != "avx2" || Isa::detected() >= Isa::Avx2);
        for path in paths {
            let mut got = c.as_f32().unwrap().to_vec();
            let n = got.len();
            // SAFETY: the one row of `got`; AVX2 and FMA where that path is taken.
            unsafe {
                match path {
                    "portable" => ep.apply_on::<false>(got.as_mut_ptr(), n, (0, 1), 0..n),
                    #[cfg(target_arch = "x86_64")]
                    "avx2" => ep.apply_avx2(got.as_mut_ptr(), n, (0, 1), 0..n),
                    _ => ep.apply(got.as_mut_ptr(), n, (0, 1), 0..n),
                }
            }
            for ((g, w), x) in got.iter().zip(&want).zip(extremes) {
                let same = g.to_bits() == w.to_bits()
                    || (g.is_nan() && w.is_nan())
                    || (g - w).abs() <= 1e-6 * w.abs().max(1.0);
                assert!(same, "silu({x}) on {path}: {g}, the interpreter {w}");
            }
        }
    }
}
