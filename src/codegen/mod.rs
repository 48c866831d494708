//! Cranelift code generation: the target ISA (`Target`), the kernel ABI, and turning a
//! Cranelift function into position-independent machine code with no relocations.
//!
//! Kernel ABI: every kernel is `extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize)
//! -> u32`. `bufs[i]` is the address of the kernel's i-th buffer (by convention the result
//! first, then the operands, then any scratch space the kernel asked for). Shapes are baked
//! into the code. A kernel that can split its work (`Generated::parts` > 1) does the `part`-th
//! of `parts` disjoint pieces, so that the runner may call it once per part on several
//! threads at once; the others ignore both arguments, and `(0, 1)` always means the whole
//! work. A kernel returns 0, or a non-zero status the runner turns into an error (e.g. a
//! gather index out of range). Kernels call nothing and embed no absolute address, so their bytes run
//! wherever they are mapped: straight from the artifact file, with no relocation step.

pub mod elementwise;
pub mod emit;
pub mod math;
pub mod matmul;
pub mod movement;
pub mod nest;
pub mod reduce;

pub use meshc_runtime::abi::{host_features, ExecCode, KernelFn, KNOWN_FEATURES, STATUS_INDEX_OUT_OF_RANGE};

use anyhow::{anyhow, bail, Result};
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{types, AbiParam, Function, Signature, UserFuncName};
use cranelift_codegen::isa::{CallConv, OwnedTargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;

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
        let mut flags = settings::builder();
        // PIC keeps constant pools RIP-relative, so code needs no relocation.
        flags.set("is_pic", "true").expect("known flag");
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
        let isa = isa.finish(settings::Flags::new(flags)).map_err(|e| anyhow!("target {name}: {e}"))?;
        let features = isa_features(&isa);
        Ok(Target { name: name.to_string(), isa, features })
    }

    pub fn has(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
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

/// Compiles a kernel to machine code, refusing any relocation: the bytes must run
/// wherever they are mapped.
pub fn compile(target: &Target, func: Function) -> Result<Vec<u8>> {
    let name = func.name.to_string();
    let mut ctx = Context::for_function(func);
    let code = ctx
        .compile(&*target.isa, &mut ControlPlane::default())
        .map_err(|e| anyhow!("codegen of kernel {name} failed: {:?}", e.inner))?;
    if let Some(r) = code.buffer.relocs().first() {
        bail!("kernel {name} needs a relocation ({:?}); kernels must be position-independent", r.kind);
    }
    Ok(code.code_buffer().to_vec())
}

/// The least work, in bytes read and written, worth a part of its own: handing a part to
/// another thread costs the runner 15–30 µs (median, on the 2-core development VM), which
/// 4 MiB of streaming (~100 µs) repays; at 2 MiB two parts were slower than one.
const MIN_PART_BYTES: usize = 4 << 20;

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
    use super::*;
    use cranelift_codegen::ir::{ExtFuncData, ExternalName, InstBuilder, UserExternalName};
    use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

    /// A kernel that calls out (and so would need its callee's address patched in) is
    /// refused: artifact code must run unrelocated.
    #[test]
    fn kernels_needing_relocation_are_refused() {
        let target = Target::by_name("native").unwrap();
        let mut func = kernel_function(&target, "calls_out");
        let mut fctx = FunctionBuilderContext::new();
        let mut b = FunctionBuilder::new(&mut func, &mut fctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let sig = b.import_signature(Signature::new(CallConv::SystemV));
        let name = b.func.declare_imported_user_function(UserExternalName::new(0, 0));
        let callee = b.import_function(ExtFuncData {
            name: ExternalName::user(name),
            signature: sig,
            colocated: false,
            patchable: false,
        });
        b.ins().call(callee, &[]);
        let zero = b.ins().iconst(types::I32, 0);
        b.ins().return_(&[zero]);
        b.seal_all_blocks();
        b.finalize(target.isa.frontend_config());
        let err = compile(&target, func).unwrap_err().to_string();
        assert!(err.contains("needs a relocation"), "{err}");
    }
}
