//! Kernels as functions of a `cranelift_module::Module`, one codegen for two homes:
//! `ArtifactModule` lays them out in the artifact's code section, cranelift-jit's
//! `JITModule` puts them in executable memory for an in-memory compile (`JitCode`).
//! `Kernels` is the one path both take: it compiles each function once, gives identical
//! functions one place, and lays the distinct ones out in the code section the programs
//! name kernels by (offsets, `KERNEL_ALIGN`-aligned).
//!
//! Calls between functions of the section are PC-relative, which `ArtifactModule`
//! patches when it finishes: the section still runs wherever it is mapped, with no
//! load-time relocation, and is the same bytes on every compile. Anything else a function
//! would need patched (an imported symbol, data, an absolute address) is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Result};
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{self, Function};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::Context;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{
    DataDescription, DataId, FuncId, Linkage, Module, ModuleDeclarations, ModuleError, ModuleReloc, ModuleRelocTarget,
    ModuleResult,
};
use meshc_runtime::format::abi::{KernelFn, KernelTable};
use meshc_runtime::format::program::align_up;

use super::Target;

/// Kernels start at this alignment inside the code section (a cache-line boundary); the
/// runner refuses a kernel offset anywhere else (docs/artifact.md).
pub const KERNEL_ALIGN: usize = 64;

/// Where a defined function is in the code section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub offset: usize,
    pub len: usize,
}

/// Functions defined in `M`, each distinct one once, laid out as the code section.
pub struct Kernels<M: Module> {
    module: M,
    ctx: Context,
    /// A kernel's bytes and what they call (the callees' ids: equal bytes calling
    /// different functions are different functions), and where it went.
    placed: HashMap<(Vec<u8>, Vec<String>), Place>,
    /// Every function defined.
    defined: Vec<(Place, FuncId)>,
    /// The length of the code section so far.
    len: usize,
}

impl Kernels<ArtifactModule> {
    pub fn artifact(target: &Target) -> Kernels<ArtifactModule> {
        Kernels::new(ArtifactModule::new(target.isa.clone()))
    }

    /// The code section, its calls patched.
    pub fn finish(self) -> Result<Vec<u8>> {
        for (place, id) in &self.defined {
            // `define` lays out in the module's own order: the two layouts are one.
            debug_assert_eq!(self.module.offset(*id), Some(place.offset));
        }
        self.module.finish()
    }
}

impl Kernels<JITModule> {
    pub fn jit(target: &Target) -> Result<Kernels<JITModule>> {
        let builder = JITBuilder::with_isa(target.isa(false)?, cranelift_module::default_libcall_names());
        Ok(Kernels::new(JITModule::new(builder)))
    }

    /// The defined functions in executable memory, found by their offsets.
    pub fn finish(mut self) -> Result<JitCode> {
        self.module.finalize_definitions().map_err(|e| anyhow!("JIT: {e}"))?;
        let kernels = (self.defined.iter())
            .map(|(place, id)| {
                let ptr = self.module.get_finalized_function(*id);
                // SAFETY: every function of the section is a kernel or a helper compiled for
                // this ISA; only kernel offsets (checked by the runner) are ever called.
                (place.offset, unsafe { std::mem::transmute::<*const u8, KernelFn>(ptr) })
            })
            .collect();
        Ok(JitCode { module: Mutex::new(Some(self.module)), kernels, len: self.len })
    }
}

impl<M: Module> Kernels<M> {
    fn new(module: M) -> Kernels<M> {
        Kernels { module, ctx: Context::new(), placed: HashMap::new(), defined: Vec::new(), len: 0 }
    }

    /// The module, to declare the functions a kernel calls.
    pub fn module(&mut self) -> &mut M {
        &mut self.module
    }

    /// Compiles `func` and defines it as a kernel, unless an identical function already is
    /// (e.g. the q, k and v projections, or the same op on every device); returns its place.
    pub fn define(&mut self, func: Function) -> Result<Place> {
        self.emit(func, None)
    }

    /// Compiles `func` and defines it as function `id`, which the module declared for the
    /// kernels that call it.
    pub fn define_callee(&mut self, id: FuncId, func: Function) -> Result<Place> {
        self.emit(func, Some(id))
    }

    fn emit(&mut self, func: Function, id: Option<FuncId>) -> Result<Place> {
        let name = func.name.to_string();
        self.ctx.clear();
        self.ctx.func = func;
        (self.ctx)
            .compile(self.module.isa(), &mut ControlPlane::default())
            .map_err(|e| anyhow!("codegen of {name} failed: {:?}", e.inner))?;
        let code = self.ctx.compiled_code().expect("just compiled");
        let bytes = code.code_buffer().to_vec();
        let relocs = |id: FuncId| -> Vec<ModuleReloc> {
            code.buffer.relocs().iter().map(|r| ModuleReloc::from_mach_reloc(r, &self.ctx.func, id)).collect()
        };
        // A function's own id only names offsets inside itself: any id keys them alike.
        let key: Vec<String> = relocs(FuncId::from_u32(0))
            .iter()
            .map(|r| format!("{:?}", (r.offset, r.kind, &r.name, r.addend)))
            .collect();
        let key = (bytes, key);
        let id = match id {
            Some(id) => id,
            None => match self.placed.get(&key) {
                Some(place) => return Ok(*place),
                None => self.module.declare_anonymous_function(&self.ctx.func.signature)?,
            },
        };
        (self.module)
            .define_function_bytes(id, KERNEL_ALIGN as u64, &key.0, &relocs(id))
            .map_err(|e| anyhow!("{name}: {}", module_error(e)))?;
        let place = Place { offset: align_up(self.len, KERNEL_ALIGN), len: key.0.len() };
        self.len = place.offset + place.len;
        self.defined.push((place, id));
        self.placed.entry(key).or_insert(place);
        Ok(place)
    }
}

/// `ModuleError`'s own text drops the source of a backend error.
fn module_error(e: ModuleError) -> String {
    match e {
        ModuleError::Backend(e) => format!("{e:#}"),
        e => e.to_string(),
    }
}

/// A function defined in an `ArtifactModule`: where it starts, and the calls to patch.
struct Defined {
    offset: usize,
    relocs: Vec<ModuleReloc>,
}

/// The artifact's code section as a `Module`: each function appended at its alignment,
/// calls to functions of the section patched PC-relative by `finish`. It defines no data:
/// constants live in each function's own pool, addressed RIP-relative.
pub struct ArtifactModule {
    isa: OwnedTargetIsa,
    declarations: ModuleDeclarations,
    code: Vec<u8>,
    defined: BTreeMap<FuncId, Defined>,
}

impl ArtifactModule {
    pub fn new(isa: OwnedTargetIsa) -> ArtifactModule {
        ArtifactModule { isa, declarations: ModuleDeclarations::default(), code: Vec::new(), defined: BTreeMap::new() }
    }

    /// Where function `id` starts, once defined.
    pub fn offset(&self, id: FuncId) -> Option<usize> {
        self.defined.get(&id).map(|d| d.offset)
    }

    /// The code section with every call resolved; refused if a function calls one that
    /// was declared but never defined here.
    pub fn finish(mut self) -> Result<Vec<u8>> {
        for d in self.defined.values() {
            for r in &d.relocs {
                let (callee, within) = match r.name {
                    ModuleRelocTarget::FunctionOffset(id, at) => (id, at as usize),
                    ref name => (FuncId::from_name(name), 0),
                };
                let Some(target) = self.defined.get(&callee) else {
                    let name = self.declarations.get_function_decl(callee).linkage_name(callee).into_owned();
                    bail!("code calls {name}, which is not in the code section");
                };
                let at = d.offset + r.offset as usize;
                let rel = (target.offset + within) as i64 + r.addend - at as i64;
                let rel = i32::try_from(rel).map_err(|_| anyhow!("a call spans more than 2 GiB of code"))?;
                self.code[at..at + 4].copy_from_slice(&rel.to_le_bytes());
            }
        }
        Ok(self.code)
    }
}

/// Whether the artifact can resolve `r` itself: a PC-relative reference to a function of
/// the section (the only relocations a colocated call or a function's own label makes).
fn internal(r: &ModuleReloc) -> bool {
    let kind = matches!(r.kind, Reloc::X86CallPCRel4 | Reloc::X86PCRel4);
    let target = match &r.name {
        ModuleRelocTarget::FunctionOffset(..) => true,
        name @ ModuleRelocTarget::User { .. } => ModuleDeclarations::is_function(name),
        _ => false,
    };
    kind && target
}

impl Module for ArtifactModule {
    fn isa(&self) -> &dyn TargetIsa {
        &*self.isa
    }

    fn declarations(&self) -> &ModuleDeclarations {
        &self.declarations
    }

    fn declare_function(&mut self, name: &str, linkage: Linkage, signature: &ir::Signature) -> ModuleResult<FuncId> {
        Ok(self.declarations.declare_function(name, linkage, signature)?.0)
    }

    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        self.declarations.declare_anonymous_function(signature)
    }

    fn declare_data(&mut self, name: &str, linkage: Linkage, writable: bool, tls: bool) -> ModuleResult<DataId> {
        Ok(self.declarations.declare_data(name, linkage, writable, tls)?.0)
    }

    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        self.declarations.declare_anonymous_data(writable, tls)
    }

    fn define_function_with_control_plane(
        &mut self,
        id: FuncId,
        ctx: &mut Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        ctx.compile(&*self.isa, ctrl_plane)?;
        let code = ctx.compiled_code().expect("just compiled");
        let relocs: Vec<ModuleReloc> =
            code.buffer.relocs().iter().map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id)).collect();
        let bytes = code.code_buffer().to_vec();
        let align = u64::from(code.buffer.alignment).max(KERNEL_ALIGN as u64);
        self.define_function_bytes(id, align, &bytes, &relocs)
    }

    fn define_function_bytes(
        &mut self,
        id: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        let decl = self.declarations.get_function_decl(id);
        if !decl.linkage.is_definable() {
            return Err(ModuleError::InvalidImportDefinition(decl.linkage_name(id).into_owned()));
        }
        if self.defined.contains_key(&id) {
            return Err(ModuleError::DuplicateDefinition(decl.linkage_name(id).into_owned()));
        }
        if let Some(r) = relocs.iter().find(|r| !internal(r)) {
            return Err(ModuleError::Backend(anyhow!(
                "needs a relocation ({:?} against {}); artifact code may only call functions of its own code section",
                r.kind,
                r.name
            )));
        }
        let offset = align_up(self.code.len(), alignment as usize);
        self.code.resize(offset, 0);
        self.code.extend_from_slice(bytes);
        self.defined.insert(id, Defined { offset, relocs: relocs.to_vec() });
        Ok(())
    }

    fn define_data(&mut self, id: DataId, _: &DataDescription) -> ModuleResult<()> {
        let name = self.declarations.get_data_decl(id).linkage_name(id).into_owned();
        Err(ModuleError::Backend(anyhow!("data object {name}: the code section holds functions only")))
    }
}

/// Kernels an in-memory compile put in cranelift-jit's executable memory, found by the
/// offsets its programs name (the ones an artifact of the same compile would hold), and
/// freed when dropped — which the runner does only once no kernel can run any more.
pub struct JitCode {
    /// Only kept to be freed: the lock makes the handle shareable with the runner's
    /// threads, which never touch it.
    module: Mutex<Option<JITModule>>,
    kernels: BTreeMap<usize, KernelFn>,
    len: usize,
}

impl KernelTable for JitCode {
    fn section_len(&self) -> usize {
        self.len
    }

    fn get(&self, offset: usize) -> Option<KernelFn> {
        self.kernels.get(&offset).copied()
    }
}

impl Drop for JitCode {
    fn drop(&mut self) {
        let module = self.module.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(module) = module {
            // SAFETY: the function pointers never leave this value but as copies used while
            // it is borrowed (the runner calls kernels only during a run of the `Loaded`
            // that owns it), so nothing runs this code any more.
            unsafe { module.free_memory() }
        }
    }
}

/// Compiles one kernel into executable memory: the whole code of `func`'s compile, the
/// kernel at offset 0 (test and bench harnesses that call a kernel directly).
pub fn jit(target: &Target, func: Function) -> Result<JitCode> {
    let mut k = Kernels::jit(target)?;
    k.define(func)?;
    k.finish()
}
