//! The matmul kernel: numpy `matmul` on f32 (docs/ops.md), as a Cranelift-generated,
//! packed, register-blocked GEMM. Also owns `MatmulShape`, the reduction of a matmul's
//! shapes to a loop nest of plain row-major GEMMs, which the library path
//! (`meshc_runtime::kernels::library`) shares so both paths agree on the semantics.
//!
//! Design (BLIS-style loop nest; all shapes are baked in, block edges are runtime values
//! computed from constants):
//!
//! ```text
//! for each batch matrix (offsets from broadcast strides)
//!   for jc in 0..N step NC            B block kc×nc packed into NR-column panels
//!     for pc in 0..K step KC
//!       for ic in 0..M step MC        A block mc×kc packed into MR-row panels
//!         for jr in 0..nc step NR     one B micro-panel (kc×NR, stays in L1)
//!           for ir in 0..mc step MR   one A micro-panel (MR×kc, streams from L2)
//!             MR×NR micro-kernel, accumulators in registers, then C (+)= tile
//! ```
//!
//! The micro-kernel holds a 12×4 tile of C in 12 f32x4 accumulators. Each k step loads one
//! B vector (4 columns) and, per row, broadcasts one A element and does one FMA. The shape
//! is chosen for Cranelift's x64 lowering: `fma` becomes `vfmadd213ps`, whose destination is
//! tied to a *multiplicand*, not to the addend. Giving every FMA its own freshly broadcast A
//! value (used exactly once) lets that value's register take the new sum with no copy; a
//! shape that reuses each broadcast for two B vectors (e.g. 6×8) would need a register copy
//! per FMA and spill with 16 xmm registers. 12 accumulators + the KU = 2 B vectors of an
//! unrolled iteration + one broadcast in flight fit in the 16 xmm registers, and 12
//! independent FMA chains cover the FMA latency (4 cycles × 2 ports). Panels are zero-padded to whole tiles and to a multiple of KU k-steps, so the
//! micro-kernel has no edge cases; edge tiles go through a small scratch tile and a scalar
//! copy of their valid part.

use anyhow::{bail, Result};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::Variable;
use meshc_ir::{DType, TensorType};

use super::emit::{build_kernel, load_widened, mem, KernelBuilder, F32X4, LANES};
use super::{Generated, Target};
pub use meshc_runtime::kernels::matmul_shape::{BatchDim, MatmulShape};

/// Rows of the register tile (one accumulator vector per row).
const MR: usize = 12;
/// Columns of the register tile: one f32x4 vector.
const NR: usize = LANES;
/// k steps per micro-kernel loop iteration (unrolled); packed panels pad k to a multiple.
const KU: usize = 2;
const _: () = assert!(KU.is_power_of_two());
/// K block: an A micro-panel (MR×KC) and a B micro-panel (KC×NR) together use 16 KiB of L1.
const KC: usize = 256;
/// M block: the packed A block (MC×KC, 144 KiB) lives in L2 while every B micro-panel of
/// the block sweeps over it.
const MC: usize = 144;
/// N block: the packed B block (KC×NC, 1 MiB) is reused by every M block.
const NC: usize = 1024;

const F32: usize = 4;

/// The checked f32 shapes of a matmul kernel and its cache blocking (`None` when there is
/// nothing to multiply: an empty result or an empty contraction).
fn plan(name: &str, a: &TensorType, b: &TensorType, out: &TensorType) -> Result<(MatmulShape, Option<Blocks>)> {
    for (what, t) in [("operand a", a), ("operand b", b), ("result", out)] {
        // A weight may be stored as f16/bf16: packing B widens it (a conversion per panel).
        let half_b = what == "operand b" && t.dtype.is_half();
        if t.dtype != DType::F32 && !half_b {
            bail!("matmul kernel {name}: {what} is {}, only f32 (and f16/bf16 for b) is supported", t.dtype);
        }
    }
    let shape = MatmulShape::new(&a.shape, &b.shape, &out.shape)?;
    let blocks = (shape.out_len() > 0 && shape.k > 0).then(|| Blocks::new(&shape));
    Ok((shape, blocks))
}

/// Generates the matmul kernel: bufs[0] = result, bufs[1] = a, bufs[2] = b, then the
/// packing scratch buffer.
pub fn matmul(target: &Target, name: &str, a: &TensorType, b: &TensorType, out: &TensorType) -> Result<Generated> {
    let (shape, blocks) = plan(name, a, b, out)?;
    let b_dt = b;
    let fma = target.has("fma");
    let func = build_kernel(target, name, |kb| {
        let (c, a, b) = (kb.buf(0), kb.buf(1), kb.buf(2));
        match &blocks {
            // An empty contraction: every result element is an empty sum.
            None => {
                let zero = kb.f32const(0.0);
                kb.for_const(0, (shape.out_len() * F32) as i64, F32 as i64, |k, i| {
                    let p = k.b.ins().iadd(c, i);
                    k.b.ins().store(mem(), zero, p, 0);
                });
            }
            Some(blocks) => {
                let scratch = kb.buf(3);
                let g = Gemm { s: &shape, blocks, fma, scratch, b_dtype: b_dt.dtype };
                let sizes = [F32, g.b_size(), F32];
                batch_loops(kb, &shape.batch, [a, b, c], sizes, &mut |k, [a, b, c]| g.emit(k, a, b, c));
            }
        }
    });
    Ok(Generated { func, scratch: blocks.map_or(0, |bl| bl.scratch_bytes()), parts: 1 })
}

/// Generates the masked matmul kernel (conditional execution, docs/design.md §4.3): the same
/// numpy matmul, but `b` (a weight `[.., K, N]`) is preceded by a mask record
/// (`meshc_runtime::format::mask`) that the kernel finds from `b`'s address at run time. It zeroes the
/// result, then for each kept row run of the record runs the packed loop nest over the kept
/// column runs only (`Gemm::emit_runs`), so pruned columns and rows cost nothing but the
/// zeroing. The code depends only on the
/// shapes: weights with different masks share one kernel.
pub fn masked(target: &Target, name: &str, a: &TensorType, b: &TensorType, out: &TensorType) -> Result<Generated> {
    let (shape, blocks) = plan(name, a, b, out)?;
    if b.dtype != DType::F32 {
        bail!("matmul kernel {name}: a masked operand b must be f32, not {}", b.dtype);
    }
    if b.shape.len() < 2 {
        bail!("matmul kernel {name}: a masked operand b must be a matrix, not {:?}", b.shape);
    }
    let fma = target.has("fma");
    let func = build_kernel(target, name, |kb| {
        let (c, a, b) = (kb.buf(0), kb.buf(1), kb.buf(2));
        // Zero the result: vectors, then the scalar tail.
        let bytes = shape.out_len() * F32;
        let vectors = kb.iconst((bytes & !15) as i64);
        zero_fill(kb, c, vectors);
        let zero = kb.f32const(0.0);
        kb.for_const((bytes & !15) as i64, bytes as i64, F32 as i64, |k, i| {
            let p = k.b.ins().iadd(c, i);
            k.b.ins().store(mem(), zero, p, 0);
        });
        let Some(blocks) = &blocks else { return };
        let scratch = kb.buf(3);
        let u32_at = |k: &mut KernelBuilder, p: Value, off: i32| k.b.ins().uload32(mem(), p, off);
        let len = u32_at(kb, b, -4);
        let record = kb.b.ins().isub(b, len);
        let (col_runs, row_runs) = (u32_at(kb, record, 4), u32_at(kb, record, 8));
        let runs = kb.b.ins().iadd_imm_s(record, meshc_runtime::format::mask::HEADER as i64);
        let rows_at = kb.addr(runs, col_runs, 8);
        let g = Gemm { s: &shape, blocks, fma, scratch, b_dtype: DType::F32 };
        let n = shape.n;
        batch_loops(kb, &shape.batch, [a, b, c], [F32; 3], &mut |k, [a, b, c]| {
            let zero = k.iconst(0);
            k.for_range(zero, row_runs, 1, |k, rr| {
                let e = k.addr(rows_at, rr, 8);
                let (k0, depth) = (u32_at(k, e, 0), u32_at(k, e, 4));
                let first = k.b.ins().icmp_imm_s(IntCC::Equal, rr, 0);
                let a = k.addr(a, k0, F32 as i64);
                let b = k.addr(b, k0, (n * F32) as i64);
                g.emit_runs(k, [a, b, c], (runs, col_runs), depth, first);
            });
        });
    });
    Ok(Generated { func, scratch: blocks.map_or(0, |bl| bl.scratch_bytes()), parts: 1 })
}

/// Loads of packed panels in the micro-kernel, marked movable (`readonly`, `can_move`) so
/// the optimiser places each right before its use. Left in program order, the loads of a
/// whole unrolled step would be issued first and all their values held live until the
/// FMAs (which the optimiser sinks to the loop's end), spilling most of them. `readonly`
/// promises the memory does not change during the call; the panels do change between
/// packs, but every such load's address depends on the micro-kernel's loop counter, so no
/// code motion can take it out of the loop that reads the freshly packed panel.
fn packed() -> MemFlagsData {
    mem().with_readonly().with_can_move()
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// The packing buffers' capacities for one shape (blocks never exceed the matrix).
struct Blocks {
    mc: usize,
    kcp: usize,
    nc: usize,
}

impl Blocks {
    fn new(s: &MatmulShape) -> Blocks {
        Blocks { mc: MC.min(round_up(s.m, MR)), kcp: round_up(KC.min(s.k), KU), nc: NC.min(round_up(s.n, NR)) }
    }

    /// Scratch layout: packed A block, packed B block, one MR×NR tile (each 64-byte aligned).
    fn b_offset(&self) -> usize {
        round_up(self.mc * self.kcp * F32, 64)
    }

    fn tile_offset(&self) -> usize {
        self.b_offset() + round_up(self.kcp * self.nc * F32, 64)
    }

    fn scratch_bytes(&self) -> usize {
        self.tile_offset() + round_up(MR * NR * F32, 64)
    }
}

/// Emits nested loops over the batch dims; `body` gets the (a, b, out) matrix addresses,
/// whose elements are `sizes` bytes.
fn batch_loops(
    k: &mut KernelBuilder,
    dims: &[BatchDim],
    ptrs: [Value; 3],
    sizes: [usize; 3],
    body: &mut dyn FnMut(&mut KernelBuilder, [Value; 3]),
) {
    let Some((d, rest)) = dims.split_first() else {
        return body(k, ptrs);
    };
    k.for_const(0, d.size as i64, 1, |k, i| {
        let strides = [d.a_stride, d.b_stride, d.out_stride];
        let ptrs = std::array::from_fn(|j| {
            if strides[j] == 0 {
                ptrs[j]
            } else {
                k.addr(ptrs[j], i, (strides[j] * sizes[j]) as i64)
            }
        });
        batch_loops(k, rest, ptrs, sizes, body);
    });
}

/// Emits one `[m,k] @ [k,n]` GEMM.
struct Gemm<'a> {
    s: &'a MatmulShape,
    blocks: &'a Blocks,
    fma: bool,
    scratch: Value,
    /// B's element type as stored: f32, or a half that packing widens.
    b_dtype: DType,
}

/// `kc` rounded up to KU, not as `(kc + KU-1) & -KU`: the optimiser recomputes an op with an
/// immediate at every use, which would drag all that depends on the result into the
/// innermost loops.
fn round_up_ku(k: &mut KernelBuilder, kc: Value) -> Value {
    let pad = k.b.ins().ineg(kc);
    let pad = k.b.ins().band_imm_s(pad, KU as i64 - 1);
    k.b.ins().iadd(kc, pad)
}

impl Gemm<'_> {
    fn b_size(&self) -> usize {
        self.b_dtype.size_bytes()
    }

    fn emit(&self, k: &mut KernelBuilder, a: Value, b: Value, c: Value) {
        let MatmulShape { m, k: kk, n, .. } = *self.s;
        let [ap, bp, tile] = self.scratch_parts(k);
        k.for_const(0, n as i64, NC as i64, |k, jc| {
            let nc = block_len(k, n, jc, NC);
            k.for_const(0, kk as i64, KC as i64, |k, pc| {
                let kc = block_len(k, kk, pc, KC);
                let kcp = round_up_ku(k, kc);
                let first = k.b.ins().icmp_imm_s(IntCC::Equal, pc, 0);
                let b_row = k.addr(b, pc, (n * self.b_size()) as i64);
                let b_blk = k.addr(b_row, jc, self.b_size() as i64);
                pack_b(k, (b_blk, self.b_dtype), n, kc, kcp, nc, bp);
                k.for_const(0, m as i64, MC as i64, |k, ic| {
                    let mc = block_len(k, m, ic, MC);
                    let a_row = k.addr(a, ic, (kk * F32) as i64);
                    let a_blk = k.addr(a_row, pc, F32 as i64);
                    pack_a(k, a_blk, kk, mc, kc, kcp, ap);
                    let c_row = k.addr(c, ic, (n * F32) as i64);
                    let c_blk = k.addr(c_row, jc, F32 as i64);
                    self.panels(k, [ap, bp, tile], c_blk, nc, mc, kcp, first);
                });
            });
        });
    }

    /// The scratch space's three parts: packed A, packed B and the edge tile.
    fn scratch_parts(&self, k: &mut KernelBuilder) -> [Value; 3] {
        let bp = k.b.ins().iadd_imm_s(self.scratch, self.blocks.b_offset() as i64);
        let tile = k.b.ins().iadd_imm_s(self.scratch, self.blocks.tile_offset() as i64);
        [self.scratch, bp, tile]
    }

    /// A masked GEMM's part for one run of kept rows (`a` and `b` at its first row, `depth`
    /// rows, `first` on the first run): the kept column runs (`col_runs` pairs of u32 at
    /// `runs`) are iterated inside each packed A block, so A is packed once per block
    /// rather than once per column run.
    #[allow(clippy::too_many_arguments)]
    fn emit_runs(
        &self,
        k: &mut KernelBuilder,
        [a, b, c]: [Value; 3],
        (runs, col_runs): (Value, Value),
        depth: Value,
        first_run: Value,
    ) {
        let MatmulShape { m, k: kk, n, .. } = *self.s;
        let [ap, bp, tile] = self.scratch_parts(k);
        let start = k.iconst(0);
        k.for_range(start, depth, KC as i64, |k, pc| {
            let kc = remaining(k, depth, pc, KC);
            let kcp = round_up_ku(k, kc);
            let first = k.b.ins().icmp_imm_s(IntCC::Equal, pc, 0);
            let first = k.b.ins().band(first, first_run);
            k.for_const(0, m as i64, MC as i64, |k, ic| {
                let mc = block_len(k, m, ic, MC);
                let a_row = k.addr(a, ic, (kk * F32) as i64);
                let a_blk = k.addr(a_row, pc, F32 as i64);
                pack_a(k, a_blk, kk, mc, kc, kcp, ap);
                let zero = k.iconst(0);
                k.for_range(zero, col_runs, 1, |k, cr| {
                    let e = k.addr(runs, cr, 8);
                    let c0 = k.b.ins().uload32(mem(), e, 0);
                    let cols = k.b.ins().uload32(mem(), e, 4);
                    let zero = k.iconst(0);
                    k.for_range(zero, cols, NC as i64, |k, jc| {
                        let nc = remaining(k, cols, jc, NC);
                        let col = k.b.ins().iadd(c0, jc);
                        let b_row = k.addr(b, pc, (n * F32) as i64);
                        let b_blk = k.addr(b_row, col, F32 as i64);
                        pack_b(k, (b_blk, DType::F32), n, kc, kcp, nc, bp);
                        let c_row = k.addr(c, ic, (n * F32) as i64);
                        let c_blk = k.addr(c_row, col, F32 as i64);
                        self.panels(k, [ap, bp, tile], c_blk, nc, mc, kcp, first);
                    });
                });
            });
        });
    }

    /// The micro-kernel over every MR×NR tile of the packed `mc × nc` block (packed A at
    /// `ap`, packed B at `bp`), stored or added (`first`) into C at `c_blk`.
    #[allow(clippy::too_many_arguments)]
    fn panels(
        &self,
        k: &mut KernelBuilder,
        [ap, bp, tile]: [Value; 3],
        c_blk: Value,
        nc: Value,
        mc: Value,
        kcp: Value,
        first: Value,
    ) {
        let n = self.s.n;
        let zero = k.iconst(0);
        k.for_range(zero, nc, NR as i64, |k, jr| {
            let cols = remaining(k, nc, jr, NR);
            // Panel jr / NR starts at (jr / NR) * kcp * NR = jr * kcp floats.
            let b_off = k.b.ins().imul(jr, kcp);
            let b_panel = k.addr(bp, b_off, F32 as i64);
            let c_col = k.addr(c_blk, jr, F32 as i64);
            let zero = k.iconst(0);
            k.for_range(zero, mc, MR as i64, |k, ir| {
                let rows = remaining(k, mc, ir, MR);
                let a_off = k.b.ins().imul(ir, kcp);
                let a_panel = k.addr(ap, a_off, F32 as i64);
                let acc = self.micro_kernel(k, a_panel, b_panel, kcp);
                let c_tile = k.addr(c_col, ir, (n * F32) as i64);
                store_tile(k, &acc, c_tile, n, rows, cols, first, tile);
            });
        });
    }

    /// The MR×NR register tile of `A panel @ B panel` over `kcp` (a multiple of KU) steps.
    fn micro_kernel(&self, k: &mut KernelBuilder, a_panel: Value, b_panel: Value, kcp: Value) -> Vec<Value> {
        let acc: Vec<_> = (0..MR).map(|_| k.b.declare_var(F32X4)).collect();
        // The first KU steps start the sums with a multiply: no zero vector is needed, which
        // would otherwise stay live in a register through the whole loop nest.
        self.steps(k, a_panel, b_panel, &acc, true);
        let a_ptr = k.b.declare_var(k.ptr);
        let a_next = k.b.ins().iadd_imm_s(a_panel, (KU * MR * F32) as i64);
        k.b.def_var(a_ptr, a_next);
        let b_next = k.b.ins().iadd_imm_s(b_panel, (KU * NR * F32) as i64);
        let b_end = k.addr(b_panel, kcp, (NR * F32) as i64);
        k.for_range(b_next, b_end, (KU * NR * F32) as i64, |k, b| {
            let a = k.b.use_var(a_ptr);
            self.steps(k, a, b, &acc, false);
            let a_next = k.b.ins().iadd_imm_s(a, (KU * MR * F32) as i64);
            k.b.def_var(a_ptr, a_next);
        });
        acc.iter().map(|&v| k.b.use_var(v)).collect()
    }

    /// KU k-steps of the micro-kernel with the panels at `a` and `b`.
    fn steps(&self, k: &mut KernelBuilder, a: Value, b: Value, acc: &[Variable], first: bool) {
        for u in 0..KU {
            let bv = k.b.ins().load(F32X4, packed(), b, (u * NR * F32) as i32);
            for (r, &var) in acc.iter().enumerate() {
                // A fresh broadcast per FMA: see the module doc.
                let x = k.b.ins().load(types::F32, packed(), a, ((u * MR + r) * F32) as i32);
                let x = k.b.ins().splat(F32X4, x);
                let sum = if first && u == 0 {
                    k.b.ins().fmul(x, bv)
                } else {
                    let old = k.b.use_var(var);
                    if self.fma {
                        k.b.ins().fma(x, bv, old)
                    } else {
                        let prod = k.b.ins().fmul(x, bv);
                        k.b.ins().fadd(old, prod)
                    }
                };
                k.b.def_var(var, sum);
            }
        }
    }
}

/// `min(step, total - start)`: the length of the block starting at `start`.
fn block_len(k: &mut KernelBuilder, total: usize, start: Value, step: usize) -> Value {
    let t = k.iconst(total as i64);
    remaining(k, t, start, step)
}

/// `min(step, end - start)`.
fn remaining(k: &mut KernelBuilder, end: Value, start: Value, step: usize) -> Value {
    let left = k.b.ins().isub(end, start);
    let step = k.iconst(step as i64);
    k.b.ins().umin(left, step)
}

/// Fills `bytes` (a multiple of 16) bytes at `dst` with zeros.
fn zero_fill(k: &mut KernelBuilder, dst: Value, bytes: Value) {
    let zero = k.splat(0.0);
    let start = k.iconst(0);
    k.for_range(start, bytes, 16, |k, i| {
        let p = k.b.ins().iadd(dst, i);
        k.b.ins().store(mem(), zero, p, 0);
    });
}

/// Zero-fills a packed buffer of `panels` panels of `kcp × width` floats when its block
/// does not cover it exactly (a partial last panel, or k padded to a multiple of KU).
fn zero_padding(k: &mut KernelBuilder, dst: Value, len: Value, width: usize, kc: Value, kcp: Value) {
    let rem = if width.is_power_of_two() {
        k.b.ins().band_imm_s(len, width as i64 - 1)
    } else {
        k.b.ins().urem_imm_s(len, width as i64)
    };
    let partial = k.b.ins().icmp_imm_s(IntCC::NotEqual, rem, 0);
    let padded = k.b.ins().icmp(IntCC::NotEqual, kc, kcp);
    let needed = k.b.ins().bor(partial, padded);
    let fill = k.b.create_block();
    let done = k.b.create_block();
    k.b.ins().brif(needed, fill, &[], done, &[]);
    k.b.switch_to_block(fill);
    let len_padded = k.b.ins().iadd_imm_s(len, width as i64 - 1);
    let panels = k.b.ins().udiv_imm_s(len_padded, width as i64);
    let floats = k.b.ins().imul(panels, kcp);
    let bytes = k.b.ins().imul_imm_s(floats, (width * F32) as i64);
    zero_fill(k, dst, bytes);
    k.b.ins().jump(done, &[]);
    k.b.switch_to_block(done);
}

/// Copies `count` values of type `ty` from `src` to `dst`, advancing the two addresses by
/// the given byte strides; elements of `src_dt` f16/bf16 are widened to f32 as they are
/// read. The loop carries the addresses themselves: Cranelift does not
/// hoist address arithmetic involving constants out of loops, so computing each address
/// from a counter would redo it for every element.
fn copy_strided(
    k: &mut KernelBuilder,
    (ty, src_dt): (Type, DType),
    count: Value,
    (src, src_stride): (Value, i64),
    (dst, dst_stride): (Value, i64),
) {
    let (header, body, exit) = (k.b.create_block(), k.b.create_block(), k.b.create_block());
    for _ in 0..3 {
        k.b.append_block_param(header, k.ptr);
    }
    k.b.ins().jump(header, &[count.into(), src.into(), dst.into()]);
    k.b.switch_to_block(header);
    let [left, from, to] = [0, 1, 2].map(|i| k.b.block_params(header)[i]);
    let more = k.b.ins().icmp_imm_s(IntCC::NotEqual, left, 0);
    k.b.ins().brif(more, body, &[], exit, &[]);
    k.b.switch_to_block(body);
    let x = if src_dt.is_half() {
        load_widened(&mut k.b, src_dt, ty.is_vector(), from)
    } else {
        k.b.ins().load(ty, mem(), from, 0)
    };
    k.b.ins().store(mem(), x, to, 0);
    let left = k.b.ins().iadd_imm_s(left, -1);
    let from = k.b.ins().iadd_imm_s(from, src_stride);
    let to = k.b.ins().iadd_imm_s(to, dst_stride);
    k.b.ins().jump(header, &[left.into(), from.into(), to.into()]);
    k.b.switch_to_block(exit);
}

/// Packs the `kc × nc` block of B at `src` (row stride `n` elements of `dt`) into f32
/// NR-column panels: element (p, j) goes to `dst[((j / NR) * kcp + p) * NR + j % NR]`.
fn pack_b(k: &mut KernelBuilder, (src, dt): (Value, DType), n: usize, kc: Value, kcp: Value, nc: Value, dst: Value) {
    zero_padding(k, dst, nc, NR, kc, kcp);
    let size = dt.size_bytes() as i64;
    let row_stride = n as i64 * size;
    // Whole panels, a vector per k step; panel jr / NR starts at jr * kcp floats.
    let full = k.b.ins().band_imm_s(nc, !(NR as i64 - 1));
    let zero = k.iconst(0);
    k.for_range(zero, full, NR as i64, |k, jr| {
        let from = k.addr(src, jr, size);
        let off = k.b.ins().imul(jr, kcp);
        let to = k.addr(dst, off, F32 as i64);
        copy_strided(k, (F32X4, dt), kc, (from, row_stride), (to, (NR * F32) as i64));
    });
    // The last, partial panel: column by column.
    let off = k.b.ins().imul(full, kcp);
    let panel = k.addr(dst, off, F32 as i64);
    k.for_range(full, nc, 1, |k, j| {
        let from = k.addr(src, j, size);
        let lane = k.b.ins().isub(j, full);
        let to = k.addr(panel, lane, F32 as i64);
        copy_strided(k, (types::F32, dt), kc, (from, row_stride), (to, (NR * F32) as i64));
    });
}

/// Packs the `mc × kc` block of A at `src` (row stride `kk`) into MR-row panels:
/// element (i, p) goes to `dst[((i / MR) * kcp + p) * MR + i % MR]`.
fn pack_a(k: &mut KernelBuilder, src: Value, kk: usize, mc: Value, kc: Value, kcp: Value, dst: Value) {
    zero_padding(k, dst, mc, MR, kc, kcp);
    let zero = k.iconst(0);
    k.for_range(zero, mc, 1, |k, i| {
        let from = k.addr(src, i, (kk * F32) as i64);
        // Row i sits in panel i / MR (which starts at (i / MR) * MR * kcp floats), lane i % MR.
        let lane = k.b.ins().urem_imm_s(i, MR as i64);
        let panel = k.b.ins().isub(i, lane);
        let off = k.b.ins().imul(panel, kcp);
        let off = k.b.ins().iadd(off, lane);
        let to = k.addr(dst, off, F32 as i64);
        copy_strided(k, (types::F32, DType::F32), kc, (from, F32 as i64), (to, (MR * F32) as i64));
    });
}

/// Adds the register tile to C (or stores it, on the first K block) at `c` (row stride
/// `n`); only `rows × cols` of it are inside C.
#[allow(clippy::too_many_arguments)]
fn store_tile(
    k: &mut KernelBuilder,
    acc: &[Value],
    c: Value,
    n: usize,
    rows: Value,
    cols: Value,
    first: Value,
    tile: Value,
) {
    let full_rows = k.b.ins().icmp_imm_s(IntCC::Equal, rows, MR as i64);
    let full_cols = k.b.ins().icmp_imm_s(IntCC::Equal, cols, NR as i64);
    let full = k.b.ins().band(full_rows, full_cols);
    let (whole, edge, done) = (k.b.create_block(), k.b.create_block(), k.b.create_block());
    k.b.ins().brif(full, whole, &[], edge, &[]);

    k.b.switch_to_block(whole);
    let (store, add) = (k.b.create_block(), k.b.create_block());
    k.b.ins().brif(first, store, &[], add, &[]);
    for (block, accumulate) in [(store, false), (add, true)] {
        k.b.switch_to_block(block);
        for (r, &v) in acc.iter().enumerate() {
            let p = k.b.ins().iadd_imm_s(c, (r * n * F32) as i64);
            let v = if accumulate {
                let old = k.b.ins().load(F32X4, mem(), p, 0);
                k.b.ins().fadd(old, v)
            } else {
                v
            };
            k.b.ins().store(mem(), v, p, 0);
        }
        k.b.ins().jump(done, &[]);
    }

    k.b.switch_to_block(edge);
    for (r, &v) in acc.iter().enumerate() {
        k.b.ins().store(mem(), v, tile, (r * NR * F32) as i32);
    }
    let zero = k.f32const(0.0);
    let start = k.iconst(0);
    k.for_range(start, rows, 1, |k, r| {
        let c_row = k.addr(c, r, (n * F32) as i64);
        let t_row = k.addr(tile, r, (NR * F32) as i64);
        let start = k.iconst(0);
        k.for_range(start, cols, 1, |k, j| {
            let p = k.addr(c_row, j, F32 as i64);
            let old = k.b.ins().load(types::F32, mem(), p, 0);
            let old = k.b.ins().select(first, zero, old);
            let from = k.addr(t_row, j, F32 as i64);
            let x = k.b.ins().load(types::F32, mem(), from, 0);
            let sum = k.b.ins().fadd(old, x);
            k.b.ins().store(mem(), sum, p, 0);
        });
    });
    k.b.ins().jump(done, &[]);
    k.b.switch_to_block(done);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::emit::testing::{bytes_f32, f32_bytes, native, run};
    use super::*;
    use meshc_ir::infer::{infer, Operand};
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Node, Op, Tensor};
    pub(crate) use meshc_runtime::kernels::matmul_shape::testing::{assert_close, oracle, product, random};

    /// The pilot pass's default block is whole micro-panels, so that a pruned block skips
    /// whole panels of this kernel.
    #[test]
    fn pilot_blocks_are_whole_micro_panels() {
        assert_eq!(crate::passes::pilot::DEFAULT_BLOCK % NR, 0);
    }

    /// A zeroed buffer of `len` bytes starting at a 64-byte boundary, as the runner gives.
    fn aligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
        *storage = vec![0; len + 64];
        let skip = storage.as_ptr().align_offset(64);
        &mut storage[skip..skip + len]
    }

    fn check_on(target: &Target, a_shape: &[usize], b_shape: &[usize], seed: u64) {
        let (a, b, want) = oracle(a_shape, b_shape, seed);
        check_product(target, &a, &b, &want, &format!("{a_shape:?} @ {b_shape:?} on {}", target.name));
    }

    /// The kernel for `a @ b` (b as stored: f32 or a half) gives `want`.
    fn check_product(target: &Target, a: &Tensor, b: &Tensor, want: &Tensor, what: &str) {
        let g = matmul(target, "mm", &a.ty(), &b.ty(), &want.ty()).expect("kernel generates");
        let (mut sa, mut sb, mut so, mut ss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (ab, bb) = (a.to_le_bytes(), b.to_le_bytes());
        let ba = aligned(&mut sa, ab.len());
        ba.copy_from_slice(&ab);
        let bbuf = aligned(&mut sb, bb.len());
        bbuf.copy_from_slice(&bb);
        // Garbage in the result buffer: the kernel must overwrite, not accumulate into it.
        let out = aligned(&mut so, want.numel() * 4);
        out.fill(0x7f);
        let mut bufs: Vec<&mut [u8]> = vec![out, ba, bbuf];
        if g.scratch > 0 {
            bufs.push(aligned(&mut ss, g.scratch));
        }
        assert_eq!(run(target, g.func, &mut bufs), 0, "{what}");
        assert_close(&bytes_f32(bufs[0]), want.as_f32().unwrap(), what);
    }

    /// A weight stored as f16 or bf16 is widened as B is packed: the product is the f32
    /// product with the rounded weight (full panels, a partial panel, batches, several K
    /// blocks).
    #[test]
    fn half_precision_b_is_widened_as_it_is_packed() {
        use meshc_ir::Data;
        for dt in [DType::F16, DType::BF16] {
            for (t, (a_shape, b_shape)) in
                [(&[13, 300][..], &[300, 37][..]), (&[2, 5, 7], &[7, 9]), (&[3, 600], &[600, 8])]
                    .into_iter()
                    .enumerate()
            {
                let (a, b, _) = oracle(a_shape, b_shape, t as u64);
                let half = Tensor::new(b.shape.clone(), Data::from_f64(dt, b.data.to_f64()));
                let widened = Tensor::new(b.shape.clone(), Data::from_f64(DType::F32, half.data.to_f64()));
                let want = product(&a, &widened);
                check_product(&native(), &a, &half, &want, &format!("{a_shape:?} @ {dt}{b_shape:?}"));
            }
        }
    }

    fn check(a_shape: &[usize], b_shape: &[usize]) {
        check_on(&native(), a_shape, b_shape, (a_shape.len() * 31 + b_shape.len()) as u64);
    }

    #[test]
    fn small_and_odd_shapes() {
        check(&[1, 1], &[1, 1]);
        check(&[7, 13], &[13, 5]);
        check(&[12, 8], &[8, 4]);
        check(&[13, 9], &[9, 7]);
        check(&[65, 33], &[33, 129]);
    }

    #[test]
    fn one_d_operands() {
        check(&[1], &[1]);
        check(&[17], &[17]);
        check(&[5], &[5, 3]);
        check(&[4, 5], &[5]);
        check(&[5], &[2, 5, 3]);
        check(&[2, 3, 5], &[5]);
    }

    #[test]
    fn batched_with_broadcasting() {
        check(&[2, 1, 3, 4], &[3, 4, 5]);
        check(&[3, 4], &[2, 4, 5]);
        check(&[2, 3, 4], &[4, 5]);
        check(&[2, 3, 4], &[2, 4, 5]);
        check(&[1, 3, 4], &[2, 1, 4, 6]);
        check(&[4, 1, 2, 3], &[1, 5, 3, 2]);
    }

    #[test]
    fn empty_and_zero_k() {
        check(&[3, 0], &[0, 4]);
        check(&[0, 3], &[3, 4]);
        check(&[2, 0, 3], &[3, 4]);
        check(&[0], &[0]);
    }

    /// Shapes that cross every block boundary: M > MC, K > KC (two K blocks, the second
    /// padded to KU), N > NC.
    #[test]
    fn multiple_blocks() {
        check(&[150, 300], &[300, 9]);
        check(&[3, 20], &[20, 1030]);
        check(&[13, 257], &[257, 6]);
    }

    #[test]
    fn random_shapes() {
        let draws = random(7, 200);
        let mut next = draws.iter().map(|x| (x + 1.0) * 0.5);
        let mut dim = |max: f32| (next.next().unwrap() * max) as usize + 1;
        for t in 0..12 {
            let (m, k, n) = (dim(40.0), dim(300.0), dim(40.0));
            check_on(&native(), &[m, k], &[k, n], t);
        }
        // Batched, with each operand's batch dims randomly broadcast (1) or absent.
        for t in 0..8 {
            let (m, k, n) = (dim(20.0), dim(40.0), dim(20.0));
            let batch: Vec<usize> = (0..dim(2.0)).map(|_| dim(3.0)).collect();
            let mut operand = |matrix: [usize; 2]| {
                let skip = dim(2.0) - 1;
                let mut s: Vec<usize> =
                    batch[skip.min(batch.len())..].iter().map(|&d| if dim(2.0) == 1 { 1 } else { d }).collect();
                s.extend(matrix);
                s
            };
            let (a, b) = (operand([m, k]), operand([k, n]));
            check_on(&native(), &a, &b, 100 + t);
        }
    }

    /// Without FMA (and without AVX) the kernel uses mul + add and SSE encodings, whose
    /// memory operands must be 16-byte aligned: C rows of odd width are not.
    #[test]
    fn without_fma() {
        let v2 = Target::by_name("x86-64-v2").unwrap();
        assert!(!v2.has("fma"));
        for (a, b) in [(&[7usize, 13][..], &[13usize, 5][..]), (&[2, 1, 3, 9], &[3, 9, 5]), (&[26, 31], &[31, 11])] {
            check_on(&v2, a, b, 5);
        }
    }

    /// The masked kernel finds the mask record before its weight operand and equals the
    /// interpreter on the weight with the pruned columns and rows zeroed; batched too, and
    /// across K and N blocks (two K blocks, N > NC).
    #[test]
    fn masked_kernel_reads_the_record_before_the_weight() {
        for (a_shape, b_shape) in
            [(&[13usize, 300][..], &[300usize, 37][..]), (&[2, 5, 41], &[2, 41, 29]), (&[3, 20], &[20, 1030])]
        {
            let (a, b, _) = oracle(a_shape, b_shape, 3);
            let (k, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
            let col_keep: Vec<bool> = (0..n).map(|c| (c / 5) % 3 != 1).collect();
            let row_keep: Vec<bool> = (0..k).map(|r| (r / 7) % 4 != 2).collect();
            let mask = meshc_runtime::format::mask::Mask::new(&col_keep, &row_keep, 1);
            let pruned: Vec<f32> = (b.as_f32().unwrap().iter().enumerate())
                .map(|(i, &x)| if col_keep[i % n] && row_keep[(i / n) % k] { x } else { 0.0 })
                .collect();
            let node = Node::new("mm", Op::MatMul, &["a", "b"]);
            let out_ty =
                infer(&node, &[Operand { ty: &a.ty(), dims: None }, Operand { ty: &b.ty(), dims: None }]).unwrap().ty;
            let want = eval_node(&node, &[&a, &Tensor::f32(b_shape.to_vec(), pruned)], &out_ty).unwrap();
            // x86-64-v2: SSE encodings, whose memory operands must be aligned, and no FMA.
            for target in [native(), Target::by_name("x86-64-v2").unwrap()] {
                let g = masked(&target, "mm", &a.ty(), &b.ty(), &out_ty).unwrap();
                let (mut sa, mut sb, mut so, mut ss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let ab = f32_bytes(a.as_f32().unwrap());
                let ba = aligned(&mut sa, ab.len());
                ba.copy_from_slice(&ab);
                let record = mask.encode();
                let wb = aligned(&mut sb, record.len() + b.numel() * 4);
                wb[..record.len()].copy_from_slice(&record);
                wb[record.len()..].copy_from_slice(&f32_bytes(b.as_f32().unwrap()));
                let (_, weight) = wb.split_at_mut(record.len());
                let out = aligned(&mut so, want.numel() * 4);
                out.fill(0x7f);
                let mut bufs: Vec<&mut [u8]> = vec![out, ba, weight, aligned(&mut ss, g.scratch)];
                assert_eq!(run(&target, g.func, &mut bufs), 0);
                assert_close(
                    &bytes_f32(bufs[0]),
                    want.as_f32().unwrap(),
                    &format!("masked {a_shape:?} @ {b_shape:?} on {}", target.name),
                );
            }
        }
    }

    #[test]
    fn shape_planning() {
        let s = MatmulShape::new(&[2, 3, 4], &[4, 5], &[2, 3, 5]).unwrap();
        assert_eq!((s.m, s.k, s.n, s.batch.len()), (6, 4, 5, 0), "b shared: the batch folds into m");
        let s = MatmulShape::new(&[2, 1, 3, 4], &[3, 4, 5], &[2, 3, 3, 5]).unwrap();
        assert_eq!(
            s.batch,
            [
                BatchDim { size: 2, a_stride: 12, b_stride: 0, out_stride: 45 },
                BatchDim { size: 3, a_stride: 0, b_stride: 20, out_stride: 15 }
            ]
        );
        assert_eq!(s.batch_offset(4), (12, 20, 60));
        assert!(MatmulShape::new(&[2, 3], &[4, 5], &[2, 5])
            .unwrap_err()
            .to_string()
            .contains("contraction dims differ"));
        assert!(MatmulShape::new(&[3, 2, 2], &[2, 2, 2], &[3, 2, 2])
            .unwrap_err()
            .to_string()
            .contains("cannot be broadcast"));
        assert!(MatmulShape::new(&[2, 3], &[3, 5], &[2, 6]).unwrap_err().to_string().contains("does not match"));
        assert!(MatmulShape::new(&[], &[3], &[]).is_err());
        let i32t = TensorType::new(DType::I32, vec![2, 2]);
        assert!(matmul(&native(), "mm", &i32t, &i32t, &i32t).is_err());
    }
}
