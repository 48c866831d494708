//! `KernelBuilder`: the few building blocks every kernel generator shares — reading buffer
//! addresses from the ABI's argument, counted loops, address arithmetic and vector
//! constants — so each generator reads as its algorithm, not as Cranelift plumbing.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, Function, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

use meshc_ir::DType;

use super::{kernel_function, Target};

/// f32 vector type: x64 vectors are 128-bit.
pub const F32X4: Type = types::F32X4;
pub const LANES: usize = 4;

pub struct KernelBuilder<'a> {
    pub b: FunctionBuilder<'a>,
    bufs: Value,
    /// The ABI's `part` and `parts` arguments (pointer-sized).
    pub part: Value,
    pub parts: Value,
    pub ptr: Type,
}

/// Flags for kernel memory accesses: they never trap (the runner sized every buffer for its
/// kernel), but are NOT marked aligned — with `aligned`, x64 may fold a vector load into an
/// SSE memory operand, which faults unless the address is 16-byte aligned, and element
/// offsets such as `x[i+1..i+5]` are not.
pub fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Builds one kernel: `body` gets a builder positioned in the entry block and must leave
/// it in a block that falls through to the final `return 0`.
pub fn build_kernel(target: &Target, name: &str, body: impl FnOnce(&mut KernelBuilder)) -> Function {
    let mut func = kernel_function(target, name);
    let mut fctx = FunctionBuilderContext::new();
    {
        let b = FunctionBuilder::new(&mut func, &mut fctx);
        let none = Value::from_u32(0);
        let mut kb = KernelBuilder { b, bufs: none, part: none, parts: none, ptr: target.isa.pointer_type() };
        let entry = kb.b.create_block();
        kb.b.append_block_params_for_function_params(entry);
        kb.b.switch_to_block(entry);
        kb.b.seal_block(entry);
        let params = kb.b.block_params(entry);
        (kb.bufs, kb.part, kb.parts) = (params[0], params[1], params[2]);
        body(&mut kb);
        let zero = kb.b.ins().iconst(types::I32, 0);
        kb.b.ins().return_(&[zero]);
        kb.b.seal_all_blocks();
        kb.b.finalize(target.isa.frontend_config());
    }
    func
}

impl KernelBuilder<'_> {
    /// Address of the kernel's buffer `i`.
    pub fn buf(&mut self, i: usize) -> Value {
        self.b.ins().load(self.ptr, mem(), self.bufs, (i * 8) as i32)
    }

    pub fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(self.ptr, v)
    }

    pub fn f32const(&mut self, v: f32) -> Value {
        self.b.ins().f32const(v)
    }

    /// A vector with `v` in every lane.
    pub fn splat(&mut self, v: f32) -> Value {
        let s = self.b.ins().f32const(v);
        self.b.ins().splat(F32X4, s)
    }

    /// `base + index * scale` (bytes).
    pub fn addr(&mut self, base: Value, index: Value, scale: i64) -> Value {
        let off = if scale == 1 { index } else { self.b.ins().imul_imm_s(index, scale) };
        self.b.ins().iadd(base, off)
    }

    /// `for i in (start..end).step_by(step) { body(i) }`, with `start`/`end` pointer-sized.
    /// The loop is skipped when `start >= end`.
    pub fn for_range(&mut self, start: Value, end: Value, step: i64, body: impl FnOnce(&mut Self, Value)) {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.append_block_param(header, self.ptr);
        self.b.ins().jump(header, &[start.into()]);

        self.b.switch_to_block(header);
        let i = self.b.block_params(header)[0];
        // Branch to the exit first: Cranelift's loop analysis visits the first target first,
        // and with the body there it loses the loop and sinks loop-invariant values (splats,
        // constants) back into the body instead of hoisting them.
        let done = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, i, end);
        self.b.ins().brif(done, exit, &[], body_block, &[]);

        self.b.switch_to_block(body_block);
        body(self, i);
        let next = self.b.ins().iadd_imm_s(i, step);
        self.b.ins().jump(header, &[next.into()]);

        self.b.switch_to_block(exit);
    }

    /// `for_range` over constant bounds.
    pub fn for_const(&mut self, start: i64, end: i64, step: i64, body: impl FnOnce(&mut Self, Value)) {
        let (s, e) = (self.iconst(start), self.iconst(end));
        self.for_range(s, e, step, body);
    }

    /// This call's share of `n` units, `[n·part/parts, n·(part+1)/parts)`: the parts tile
    /// `0..n` exactly, in order, and differ in size by at most one unit.
    pub fn part_range(&mut self, n: Value) -> (Value, Value) {
        let bound = |k: &mut Self, p: Value| {
            let units = k.b.ins().imul(n, p);
            k.b.ins().udiv(units, k.parts)
        };
        let next = self.b.ins().iadd_imm_s(self.part, 1);
        (bound(self, self.part), bound(self, next))
    }

    /// `if cond { body }`.
    pub fn when(&mut self, cond: Value, body: impl FnOnce(&mut Self)) {
        let then = self.b.create_block();
        let after = self.b.create_block();
        self.b.ins().brif(cond, then, &[], after, &[]);
        self.b.switch_to_block(then);
        body(self);
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(after);
    }

    /// Returns `status` from the kernel right away when `cond` is true.
    pub fn fail_if(&mut self, cond: Value, status: u32) {
        let fail = self.b.create_block();
        let cont = self.b.create_block();
        self.b.ins().brif(cond, fail, &[], cont, &[]);
        self.b.switch_to_block(fail);
        let s = self.b.ins().iconst(types::I32, status as i64);
        self.b.ins().return_(&[s]);
        self.b.switch_to_block(cont);
    }
}

/// One f16 or bf16 lane group loaded and widened to f32, exactly (`widen`).
pub fn load_widened(b: &mut FunctionBuilder, dt: DType, vector: bool, addr: Value) -> Value {
    let bits = if vector { b.ins().uload16x4(mem(), addr, 0) } else { b.ins().uload16(types::I32, mem(), addr, 0) };
    widen(b, dt, vector, bits)
}

/// A 32-bit integer constant as a scalar or in every lane.
fn int(b: &mut FunctionBuilder, vector: bool, v: i64) -> Value {
    let c = b.ins().iconst(types::I32, v);
    if vector {
        b.ins().splat(types::I32X4, c)
    } else {
        c
    }
}

/// `select` for a scalar condition, `bitselect` for a lane mask.
fn pick(b: &mut FunctionBuilder, vector: bool, cond: Value, yes: Value, no: Value) -> Value {
    if vector {
        b.ins().bitselect(cond, yes, no)
    } else {
        b.ins().select(cond, yes, no)
    }
}

/// Half bits (in the low 16 bits of i32 lanes) widened to f32, exactly. bf16 is the top
/// half of an f32. f16: its exponent and mantissa moved into f32 position and scaled by
/// 2^112 (which rebiases the exponent, and makes subnormals normal), infinities and NaNs
/// given the f32 exponent of all ones, the sign put back.
pub fn widen(b: &mut FunctionBuilder, dt: DType, vector: bool, bits: Value) -> Value {
    let (ity, fty) = if vector { (types::I32X4, types::F32X4) } else { (types::I32, types::F32) };
    let flags = cranelift_codegen::ir::MemFlagsData::new();
    if dt == DType::BF16 {
        let f = b.ins().ishl_imm_u(bits, 16);
        return b.ins().bitcast(fty, flags, f);
    }
    let sign_mask = int(b, vector, 0x8000);
    let sign = b.ins().band(bits, sign_mask);
    let sign = b.ins().ishl_imm_u(sign, 16);
    let em_mask = int(b, vector, 0x7fff);
    let em = b.ins().band(bits, em_mask);
    let shifted = b.ins().ishl_imm_u(em, 13);
    let scaled = b.ins().bitcast(fty, flags, shifted);
    let scale = b.ins().f32const(2f32.powi(112));
    let scale = if vector { b.ins().splat(fty, scale) } else { scale };
    let normal = b.ins().fmul(scaled, scale);
    let normal = b.ins().bitcast(ity, flags, normal);
    let all_ones = int(b, vector, 0x7f80_0000);
    let special = b.ins().bor(shifted, all_ones);
    // `em` is below 2^15, so a signed compare is the unsigned one (and SSE has only signed).
    let limit = int(b, vector, 0x7c00);
    let is_special = b.ins().icmp(IntCC::SignedGreaterThanOrEqual, em, limit);
    let r = pick(b, vector, is_special, special, normal);
    let r = b.ins().bor(r, sign);
    b.ins().bitcast(fty, flags, r)
}

/// f32 lanes rounded to f16 or bf16 as IEEE 754 does (to nearest, ties to even; beyond the
/// largest finite half to infinity; NaN stays NaN, made quiet): the half's bits in the low
/// 16 bits of i32 lanes, as the `half` crate (and so the interpreter) and numpy's `astype`
/// give them.
pub fn narrow(b: &mut FunctionBuilder, dt: DType, vector: bool, x: Value) -> Value {
    let ity = if vector { types::I32X4 } else { types::I32 };
    let fty = if vector { types::F32X4 } else { types::F32 };
    let flags = cranelift_codegen::ir::MemFlagsData::new();
    let bits = b.ins().bitcast(ity, flags, x);
    let sign_mask = int(b, vector, 0x8000_0000u32 as i32 as i64);
    let sign = b.ins().band(bits, sign_mask);
    let abs = b.ins().bxor(bits, sign);
    let sign = b.ins().ushr_imm_u(sign, 16);
    // |x| as bits is below 2^31: signed compares order it as the magnitudes.
    let inf = int(b, vector, 0x7f80_0000);
    let is_nan = b.ins().icmp(IntCC::SignedGreaterThan, abs, inf);
    let r = if dt == DType::BF16 {
        // Add just under half a bf16 ulp, plus one more when the kept part is odd, and cut:
        // ties go to even, and a carry out of the largest finite value gives infinity.
        let odd = b.ins().ushr_imm_u(abs, 16);
        let one = int(b, vector, 1);
        let odd = b.ins().band(odd, one);
        let bias = int(b, vector, 0x7fff);
        let rounded = b.ins().iadd(abs, bias);
        let rounded = b.ins().iadd(rounded, odd);
        let rounded = b.ins().ushr_imm_u(rounded, 16);
        let quiet = b.ins().ushr_imm_u(abs, 16);
        let q = int(b, vector, 0x40);
        let quiet = b.ins().bor(quiet, q);
        pick(b, vector, is_nan, quiet, rounded)
    } else {
        // From 2^16 on (as f32) every value rounds to infinity; below 2^-14 the half is
        // subnormal: adding 0.5 puts its bits at the bottom of the f32's mantissa, the
        // hardware's addition doing the rounding. Normal halves: rebias the exponent, add
        // just under half an ulp plus the kept part's lowest bit, and cut (a carry into
        // the exponent is the right rounding up, to infinity above 65520).
        let big = int(b, vector, 0x4780_0000);
        let is_big = b.ins().icmp(IntCC::SignedGreaterThanOrEqual, abs, big);
        let inf16 = int(b, vector, 0x7c00);
        let nan16 = int(b, vector, 0x7e00);
        let huge = pick(b, vector, is_nan, nan16, inf16);
        let small_limit = int(b, vector, 0x3880_0000);
        let is_small = b.ins().icmp(IntCC::SignedLessThan, abs, small_limit);
        let magic = int(b, vector, 0x3f00_0000);
        let absf = b.ins().bitcast(fty, flags, abs);
        let magicf = b.ins().bitcast(fty, flags, magic);
        let sum = b.ins().fadd(absf, magicf);
        let sum = b.ins().bitcast(ity, flags, sum);
        let small = b.ins().isub(sum, magic);
        let odd = b.ins().ushr_imm_u(abs, 13);
        let one = int(b, vector, 1);
        let odd = b.ins().band(odd, one);
        let rebias = int(b, vector, ((15 - 127) << 23) + 0xfff);
        let normal = b.ins().iadd(abs, rebias);
        let normal = b.ins().iadd(normal, odd);
        let normal = b.ins().ushr_imm_u(normal, 13);
        let finite = pick(b, vector, is_small, small, normal);
        pick(b, vector, is_big, huge, finite)
    };
    b.ins().bor(r, sign)
}

/// Half bits (low 16 bits of i32 lanes) stored as 2-byte elements, one per lane.
pub fn store_half(b: &mut FunctionBuilder, vector: bool, bits: Value, addr: Value) {
    if !vector {
        b.ins().istore16(mem(), bits, addr, 0);
        return;
    }
    // Sign-extend each lane's low half so the saturating narrow keeps it as it is.
    let hi = b.ins().ishl_imm_u(bits, 16);
    let ext = b.ins().sshr_imm_u(hi, 16);
    let packed = b.ins().snarrow(ext, ext);
    store_first_lane(b, types::I64X2, packed, addr);
}

/// The first lane of `v` viewed as `lanes` (I32X4: its first 4 bytes, I64X2: 8) stored at
/// `addr`: the values a narrow packed into the low bytes of a vector.
pub fn store_first_lane(b: &mut FunctionBuilder, lanes: Type, v: Value, addr: Value) {
    let flags = cranelift_codegen::ir::MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    let wide = b.ins().bitcast(lanes, flags, v);
    let low = b.ins().extractlane(wide, 0);
    b.ins().store(mem(), low, addr, 0);
}

#[cfg(test)]
pub mod testing {
    use super::super::module::jit;
    use super::super::{KernelTable, Target};
    use cranelift_codegen::ir::Function;

    pub fn native() -> Target {
        Target::by_name("native").expect("host target")
    }

    /// Compiles `func` for `target` and calls it with the given buffers; returns its status.
    pub fn run(target: &Target, func: Function, bufs: &mut [&mut [u8]]) -> u32 {
        let code = jit(target, func).expect("kernel compiles");
        let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        // SAFETY: the kernel was compiled for this host and reads/writes only its buffers,
        // which the caller sized for it.
        unsafe { code.get(0).expect("a kernel at 0")(ptrs.as_ptr(), 0, 1) }
    }

    /// Checks that the kernel `func`, called as any of 2, 3 or 7 parts, writes every element
    /// of its `out_bytes`-byte f32 result exactly once, each with the bits the whole call
    /// (0 of 1) gives. `ins`: its other buffers.
    pub fn check_parts(target: &Target, func: Function, out_bytes: usize, ins: &mut [Vec<u8>], what: &str) {
        let code = jit(target, func).expect("kernel compiles");
        let kernel = code.get(0).expect("a kernel at 0");
        let call = |ins: &mut [Vec<u8>], part: usize, parts: usize| {
            let mut out = vec![0xa5u8; out_bytes];
            let mut ptrs = vec![out.as_mut_ptr()];
            ptrs.extend(ins.iter_mut().map(|b| b.as_mut_ptr()));
            // SAFETY: compiled for this host; the caller sized the buffers for the kernel.
            assert_eq!(unsafe { kernel(ptrs.as_ptr(), part, parts) }, 0, "{what}");
            out
        };
        let whole = call(ins, 0, 1);
        for parts in [2, 3, 7] {
            let mut writer = vec![None; out_bytes / 4];
            for part in 0..parts {
                let out = call(ins, part, parts);
                for (i, (got, want)) in out.chunks(4).zip(whole.chunks(4)).enumerate() {
                    if got != [0xa5; 4] {
                        assert_eq!(got, want, "{what}: element {i} of part {part}/{parts}");
                        assert_eq!(writer[i].replace(part), None, "{what}: element {i} written twice");
                    }
                }
            }
            let missed = writer.iter().position(Option::is_none);
            assert_eq!(missed, None, "{what}: an element no part of {parts} writes");
        }
    }

    pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// The scaffolding itself: a vector loop over a buffer, and an early-exit status.
    #[test]
    fn vector_loop_and_status() {
        let t = native();
        let f = build_kernel(&t, "add_one", |k| {
            let (out, inp) = (k.buf(0), k.buf(1));
            let one = k.splat(1.0);
            k.for_const(0, 8, LANES as i64, |k, i| {
                let src = k.addr(inp, i, 4);
                let dst = k.addr(out, i, 4);
                let v = k.b.ins().load(F32X4, mem(), src, 0);
                let r = k.b.ins().fadd(v, one);
                k.b.ins().store(mem(), r, dst, 0);
            });
        });
        let mut out = vec![0u8; 32];
        let mut inp = f32_bytes(&[0., 1., 2., 3., 4., 5., 6., 7.]);
        assert_eq!(run(&t, f, &mut [&mut out, &mut inp]), 0);
        assert_eq!(bytes_f32(&out), [1., 2., 3., 4., 5., 6., 7., 8.]);

        let f = build_kernel(&t, "fails", |k| {
            let c = k.iconst(1);
            k.fail_if(c, 7);
        });
        assert_eq!(run(&t, f, &mut []), 7);
    }

    #[test]
    fn targets_record_features() {
        let v3 = crate::codegen::Target::by_name("x86-64-v3").unwrap();
        assert!(v3.has("avx2") && v3.has("fma"), "{:?}", v3.features);
        let v2 = crate::codegen::Target::by_name("x86-64-v2").unwrap();
        assert!(v2.has("sse4.2") && !v2.has("avx"), "{:?}", v2.features);
        assert!(crate::codegen::Target::by_name("arm").is_err());
    }
}
