//! `MatmulShape`: a matmul's operand shapes (numpy `matmul` rules) reduced to a loop nest
//! of plain row-major GEMMs. The compiler's Cranelift kernel and the runtime's library GEMM
//! both plan from it, so the two paths agree on the semantics.

use anyhow::{bail, Result};

/// One batch dimension of the result, with the element strides of the operands' matrices
/// along it (0 where an operand is broadcast).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchDim {
    pub size: usize,
    pub a_stride: usize,
    pub b_stride: usize,
    pub out_stride: usize,
}

/// A matmul as a loop nest over `batch` of `[m,k] @ [k,n]` products of dense row-major
/// matrices. Size-1 batch dims are dropped, and a batch over which `b` is shared but `a`
/// is not is folded into `m` (one tall GEMM instead of many short ones).
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub batch: Vec<BatchDim>,
}

impl MatmulShape {
    /// numpy `matmul` shape rules; `out` must be exactly the result shape.
    pub fn new(a: &[usize], b: &[usize], out: &[usize]) -> Result<MatmulShape> {
        MatmulShape::checked(a, b, out, true)
    }

    /// `new`, but every matrix of `a` stays a GEMM of its own: an `a` stored transposed
    /// has no consecutive rows to fold into a tall one.
    pub fn unfolded(a: &[usize], b: &[usize], out: &[usize]) -> Result<MatmulShape> {
        MatmulShape::checked(a, b, out, false)
    }

    fn checked(a: &[usize], b: &[usize], out: &[usize], fold: bool) -> Result<MatmulShape> {
        let (shape, want) = MatmulShape::plan(a, b, fold)?;
        if want != out {
            bail!("matmul result shape {out:?} does not match {a:?} @ {b:?} (expected {want:?})");
        }
        Ok(shape)
    }

    /// The plan for `a @ b`, and the result's shape.
    pub fn infer(a: &[usize], b: &[usize]) -> Result<(MatmulShape, Vec<usize>)> {
        MatmulShape::plan(a, b, true)
    }

    fn plan(a: &[usize], b: &[usize], fold: bool) -> Result<(MatmulShape, Vec<usize>)> {
        let (a_batch, m, k) = match a {
            [] => bail!("matmul operand a is a scalar"),
            [k] => (&[][..], 1, *k),
            [batch @ .., m, k] => (batch, *m, *k),
        };
        let (b_batch, k2, n) = match b {
            [] => bail!("matmul operand b is a scalar"),
            [k] => (&[][..], *k, 1),
            [batch @ .., k, n] => (batch, *k, *n),
        };
        if k != k2 {
            bail!("matmul contraction dims differ: {a:?} @ {b:?}");
        }
        let rank = a_batch.len().max(b_batch.len());
        let aligned = |s: &[usize], i: usize| (i + s.len()).checked_sub(rank).map(|j| s[j]);
        let mut batch_shape = Vec::with_capacity(rank);
        for i in 0..rank {
            let (da, db) = (aligned(a_batch, i).unwrap_or(1), aligned(b_batch, i).unwrap_or(1));
            batch_shape.push(match (da, db) {
                _ if da == db => da,
                (1, d) | (d, 1) => d,
                _ => bail!("matmul batch dims cannot be broadcast together: {a:?} @ {b:?}"),
            });
        }
        let mut out = batch_shape.clone();
        out.extend(a.len().ge(&2).then_some(m));
        out.extend(b.len().ge(&2).then_some(n));

        // Matrix strides (elements) of each operand along each result batch dim.
        let strides = |s: &[usize], matrix: usize| -> Vec<usize> {
            let mut st = vec![0; rank];
            let mut step = matrix;
            for i in (0..rank).rev() {
                if let Some(d) = aligned(s, i) {
                    st[i] = if d == 1 { 0 } else { step };
                    step *= d;
                }
            }
            st
        };
        let (sa, sb, so) = (strides(a_batch, m * k), strides(b_batch, k * n), strides(&batch_shape, m * n));
        let batch: Vec<BatchDim> = (0..rank)
            .filter(|&i| batch_shape[i] != 1)
            .map(|i| BatchDim { size: batch_shape[i], a_stride: sa[i], b_stride: sb[i], out_stride: so[i] })
            .collect();
        let count: usize = batch.iter().map(|d| d.size).product();
        let a_count: usize = a_batch.iter().product();
        if fold && batch.iter().all(|d| d.b_stride == 0) && a_count == count {
            // a's matrices, like the result's, are consecutive: rows of one tall GEMM.
            return Ok((MatmulShape { m: m * count, k, n, batch: Vec::new() }, out));
        }
        Ok((MatmulShape { m, k, n, batch }, out))
    }

    /// The number of result elements.
    pub fn out_len(&self) -> usize {
        self.m * self.n * self.batch.iter().map(|d| d.size).product::<usize>()
    }

    /// How many matrices the batch holds.
    pub fn batch_count(&self) -> usize {
        self.batch.iter().map(|d| d.size).product()
    }

    /// Element offsets `(a, b, out)` of the matrices of batch entry `i` (`i` <
    /// `batch_count`), in result order: the last batch dim fastest. Computed, not listed:
    /// the GEMMs ask for them on every call, which must not allocate.
    pub fn batch_offset(&self, mut i: usize) -> (usize, usize, usize) {
        let (mut a, mut b, mut o) = (0, 0, 0);
        for d in self.batch.iter().rev() {
            let j = i % d.size;
            i /= d.size;
            (a, b, o) = (a + j * d.a_stride, b + j * d.b_stride, o + j * d.out_stride);
        }
        (a, b, o)
    }

    /// Elements of `a`, `b` and the result the product reads or writes, from the first
    /// matrix's start to the last one's end: what each slice must hold at least. Refuses a
    /// plan `new` could not have made — whose sizes overflow, or whose result matrices are
    /// not laid out one after the other (the GEMMs' parts write them in parallel): the
    /// fields are public, and the GEMMs' unsafe code relies on both.
    pub fn spans(&self) -> Result<[usize; 3]> {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut dense = m.checked_mul(n);
        for d in self.batch.iter().rev() {
            if Some(d.out_stride) != dense {
                bail!("matmul plan: the result's matrices are not laid out one after the other");
            }
            dense = dense.and_then(|x| x.checked_mul(d.size));
        }
        let span = |stride: fn(&BatchDim) -> usize, matrix: Option<usize>| -> Option<usize> {
            if self.batch.iter().any(|d| d.size == 0) {
                return Some(0);
            }
            let last = self.batch.iter().try_fold(0usize, |x, d| x.checked_add((d.size - 1).checked_mul(stride(d))?));
            last?.checked_add(matrix?)
        };
        match [
            span(|d| d.a_stride, m.checked_mul(k)),
            span(|d| d.b_stride, k.checked_mul(n)),
            span(|d| d.out_stride, dense.map(|_| m * n)),
        ] {
            [Some(a), Some(b), Some(out)] => Ok([a, b, out]),
            _ => bail!("matmul plan: its sizes overflow"),
        }
    }

    /// Every batch entry's offsets (`batch_offset`), in result order.
    pub fn batch_offsets(&self) -> impl ExactSizeIterator<Item = (usize, usize, usize)> + '_ {
        (0..self.batch_count()).map(|i| self.batch_offset(i))
    }
}

/// Operands, the interpreter's results and a tolerance for the GEMM tests of both crates.
#[doc(hidden)]
pub mod testing {
    use meshc_ir::infer::{infer, Operand};
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Node, Op, Tensor};

    /// Deterministic pseudo-random values in [-1, 1) (SplitMix64).
    pub fn random(seed: u64, len: usize) -> Vec<f32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The interpreter's result for `a @ b` on random operands: (a, b, result).
    pub fn oracle(a_shape: &[usize], b_shape: &[usize], seed: u64) -> (Tensor, Tensor, Tensor) {
        let a = Tensor::f32(a_shape.to_vec(), random(seed, a_shape.iter().product()));
        let b = Tensor::f32(b_shape.to_vec(), random(seed ^ 0xabcd, b_shape.iter().product()));
        let want = product(&a, &b);
        (a, b, want)
    }

    /// `a @ b` by the interpreter.
    pub fn product(a: &Tensor, b: &Tensor) -> Tensor {
        let node = Node::new("mm", Op::MatMul, &["a", "b"]);
        let (ta, tb) = (a.ty(), b.ty());
        let ops = [Operand { ty: &ta, dims: None }, Operand { ty: &tb, dims: None }];
        let out = infer(&node, &ops).expect("valid matmul").ty;
        eval_node(&node, &[a, b], &out).expect("interpreter")
    }

    pub fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{what}: element {i}: got {g}, want {w}");
        }
    }
}
