//! Cranelift code generation: the target ISA (`Target`) and the kernel ABI; `module` turns
//! kernel functions into the artifact's code section or into executable memory.
//!
//! Kernel ABI: every kernel is `extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize)
//! -> u32`. `bufs[i]` is the address of the kernel's i-th buffer (by convention the result
//! first, then the operands, then any scratch space the kernel asked for). Shapes are baked
//! into the code, but for the row count of a graph compiled with symbolic dims, which a kernel
//! reads from the size table passed as its last buffer (`rows`). A kernel that can split its work (`Generated::parts` > 1) does the `part`-th
//! of `parts` disjoint pieces, so that the runner may call it once per part on several
//! threads at once; the others ignore both arguments, and `(0, 1)` always means the whole
//! work. A kernel returns 0, or a non-zero status the runner turns into an error (e.g. a
//! gather index out of range). Kernels embed no absolute address and call only functions of
//! their own code section, PC-relative, so the section runs wherever it is mapped: straight
//! from the artifact file, with no relocation step.

pub mod conv;
pub mod elementwise;
pub mod emit;
pub mod math;
pub mod matmul;
pub mod module;
pub mod movement;
pub mod nest;
pub mod reduce;
pub mod rows;
pub mod scan;

pub use meshc_runtime::format::abi::{
    host_features, KernelFn, KernelTable, KNOWN_FEATURES, STATUS_DIVISION_BY_ZERO, STATUS_INDEX_OUT_OF_RANGE,
};

use anyhow::{anyhow, bail, Result};
use cranelift_codegen::ir::{types, AbiParam, Function, Signature, UserFuncName};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};

/// A code-generation target: the Cranelift ISA plus the CPU features its code may use.
pub struct Target {
    pub name: String,
    pub isa: OwnedTargetIsa,
    /// Features (names as in `KNOWN_FEATURES`) the generated code may rely on.
    pub features: Vec<String>,
}

impl Target {
    /// `native` (the host's features), `x86-64-v2` or `x86-64-v3`.
    pub fn by_name(name: &str) -> Result<Target> {
        let isa = isa(name, true)?;
        let features = isa_features(&isa);
        Ok(Target { name: name.to_string(), isa, features })
    }

    /// The ISA again, position-independent or not: cranelift-jit wants code that is not
    /// (it resolves addresses itself), which is the same bytes for kernels that address
    /// nothing outside their code section.
    pub fn isa(&self, pic: bool) -> Result<OwnedTargetIsa> {
        isa(&self.name, pic)
    }

    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}

fn isa(name: &str, pic: bool) -> Result<OwnedTargetIsa> {
    let mut flags = settings::builder();
    // PIC keeps constant pools RIP-relative, so code needs no relocation.
    flags.set("is_pic", if pic { "true" } else { "false" }).expect("known flag");
    flags.set("opt_level", "speed").expect("known flag");
    flags.set("enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" }).expect("known flag");
    let isa = match name {
        "native" => cranelift_native::builder().map_err(|e| anyhow!("cannot target this host: {e}"))?,
        "x86-64-v2" | "x86-64-v3" => {
            let mut b = cranelift_codegen::isa::lookup_by_name("x86_64").map_err(|e| anyhow!("x86_64: {e}"))?;
            b.enable(name).map_err(|e| anyhow!("{name}: {e}"))?;
            if name == "x86-64-v3" {
                // Cranelift's v3 preset omits AVX itself, without which VEX encodings
                // (and so FMA) are unavailable; every v3 CPU has AVX.
                b.enable("has_avx").map_err(|e| anyhow!("{name}: {e}"))?;
            }
            b
        }
        other => bail!("unknown target '{other}' (expected native, x86-64-v2 or x86-64-v3)"),
    };
    isa.finish(settings::Flags::new(flags)).map_err(|e| anyhow!("target {name}: {e}"))
}

/// Reads back which of `KNOWN_FEATURES` the finished ISA has enabled.
fn isa_features(isa: &OwnedTargetIsa) -> Vec<String> {
    let enabled: Vec<String> = isa
        .isa_flags()
        .iter()
        .filter(|v| v.as_bool() == Some(true))
        .map(|v| v.name.trim_start_matches("has_").replace("sse4", "sse4.").replace("sse4..", "sse4."))
        .collect();
    KNOWN_FEATURES.iter().filter(|f| enabled.iter().any(|e| e == *f)).map(|f| f.to_string()).collect()
}

/// A fresh function with the kernel signature.
pub fn kernel_function(target: &Target, name: &str) -> Function {
    let ptr = target.isa.pointer_type();
    let mut sig = Signature::new(CallConv::SystemV);
    sig.params.extend([AbiParam::new(ptr); 3]);
    sig.returns.push(AbiParam::new(types::I32));
    Function::with_name_signature(UserFuncName::testcase(name), sig)
}

/// The least work, in bytes read and written, worth a part of its own. It was 4 MiB when
/// handing a part to another thread cost the runner 15–30 µs (at 2 MiB two parts were
/// slower than one); the runner's own pool (`meshc_runtime::kernels::pool`) hands one over
/// in ~0.1 µs, and a part of 256 KiB takes some 10 µs at the least. At 4 MiB the loops of
/// a layer at 8×128 (MiniLM-L3's dynamic quantization of its 8×128×1536 FFN activation:
/// 6 MiB read, 1.5 MiB written) ran on one core while the other waited. (Splitting the
/// 2 × 13 encoder's kernels from 16 KiB or 64 KiB up bought nothing measurable either way,
/// `cargo bench --bench models`.)
const MIN_PART_BYTES: usize = 256 << 10;

/// Into how many parts a kernel may split that reads and writes `bytes` in all, in `units`
/// independent pieces (rows, iterations of its outermost loop).
pub fn parts_for(bytes: usize, units: usize) -> usize {
    (bytes / MIN_PART_BYTES).clamp(1, units.max(1))
}

/// A generated kernel and the scratch space (bytes, 64-byte aligned) it wants as its last
/// buffer (0: no scratch buffer is passed); `parts`: into how many pieces its work may be
/// split (1: it ignores `part` and `parts`).
pub struct Generated {
    pub func: Function,
    pub scratch: usize,
    pub parts: usize,
}

#[cfg(test)]
mod tests {
    use super::module::Kernels;
    use super::*;
    use cranelift_codegen::ir::{FuncRef, InstBuilder};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
    use cranelift_jit::{JITBuilder, JITModule};
    use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};

    /// A kernel that returns what `callee` (declared in `module`) returns.
    fn calling(target: &Target, module: &mut dyn Module, callee: FuncId) -> Function {
        let mut func = kernel_function(target, "calls");
        let callee: FuncRef = module.declare_func_in_func(callee, &mut func);
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let call = b.ins().call(callee, &[]);
        let status = b.inst_results(call)[0];
        b.ins().return_(&[status]);
        b.seal_all_blocks();
        b.finalize(target.isa.frontend_config());
        func
    }

    /// A function with no parameters returning 7.
    fn seven(target: &Target) -> (Signature, Function) {
        let mut sig = Signature::new(CallConv::SystemV);
        sig.returns.push(AbiParam::new(types::I32));
        let mut func = Function::with_name_signature(UserFuncName::testcase("seven"), sig.clone());
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut fctx);
        let entry = b.create_block();
        b.switch_to_block(entry);
        let v = b.ins().iconst(types::I32, 7);
        b.ins().return_(&[v]);
        b.seal_all_blocks();
        b.finalize(target.isa.frontend_config());
        (sig, func)
    }

    /// Artifact code runs unrelocated: a kernel that calls out of the code section (and so
    /// would need its callee's address patched in at load time) is refused, as is one that
    /// calls a function the section never defines; a call to a function of the section is
    /// resolved PC-relative in the bytes themselves.
    #[test]
    fn kernels_needing_relocation_are_refused() {
        let target = Target::by_name("native").unwrap();
        let (sig, _) = seven(&target);

        let mut k = Kernels::artifact(&target);
        let outside = k.module().declare_function("elsewhere", Linkage::Import, &sig).unwrap();
        let func = calling(&target, k.module(), outside);
        let err = k.define(func).unwrap_err().to_string();
        assert!(err.contains("needs a relocation"), "{err}");

        let mut k = Kernels::artifact(&target);
        let never = k.module().declare_function("never", Linkage::Local, &sig).unwrap();
        let func = calling(&target, k.module(), never);
        k.define(func).unwrap();
        let err = k.finish().unwrap_err().to_string();
        assert!(err.contains("not in the code section"), "{err}");

        // Laid out in the section and called PC-relative: the patched bytes, copied
        // anywhere, run as they are. And the same calls through the JIT.
        fn run<M: Module>(target: &Target, k: &mut Kernels<M>) -> usize {
            let (sig, callee) = seven(target);
            let helper = k.module().declare_function("seven", Linkage::Local, &sig).unwrap();
            let func = calling(target, k.module(), helper);
            let kernel = k.define(func).unwrap();
            k.define_callee(helper, callee).unwrap();
            kernel.offset
        }
        let mut k = Kernels::artifact(&target);
        let offset = run(&target, &mut k);
        let section = k.finish().unwrap();
        let mut copy = JITModule::new(JITBuilder::with_isa(target.isa(false).unwrap(), default_libcall_names()));
        let id = copy.declare_anonymous_function(&sig).unwrap();
        copy.define_function_bytes(id, 64, &section, &[]).unwrap();
        copy.finalize_definitions().unwrap();
        // SAFETY: a kernel compiled for this host, at its offset; it touches no buffer.
        let status = unsafe {
            let f = std::mem::transmute::<*const u8, KernelFn>(copy.get_finalized_function(id).add(offset));
            let status = f(std::ptr::null(), 0, 1);
            copy.free_memory();
            status
        };
        assert_eq!(status, 7);

        let mut k = Kernels::jit(&target).unwrap();
        let offset = run(&target, &mut k);
        let code = k.finish().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { code.get(offset).unwrap()(std::ptr::null(), 0, 1) }, 7);
    }
}
