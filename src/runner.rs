//! The runner: executes a device program over its buffers. It knows nothing of the passes,
//! only what the artifact (or an in-memory compile) provides: metadata, the program, code
//! bytes mapped executable, and the weights.

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, bail, Result};
use meshc_ir::{Tensor, TensorType};

use crate::codegen::{self, KernelFn};
use crate::library;
use crate::program::{Exec, Library, Meta, Program, Storage, ALIGN};

/// A zeroed, 64-byte aligned heap block (the arena, and weights compiled in memory).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation like a Vec<u8> does.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Result<AlignedBuf> {
        if len == 0 {
            return Ok(AlignedBuf { ptr: std::ptr::null_mut(), len: 0 });
        }
        let layout = std::alloc::Layout::from_size_align(len, ALIGN)?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("cannot allocate {len} bytes");
        }
        Ok(AlignedBuf { ptr, len })
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bytes.len())?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr points to len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

/// Executable code: from an artifact mapping or copied into memory by an in-memory compile.
pub enum Code {
    Mapped(memmap2::Mmap),
    Copied(codegen::ExecCode),
}

/// Checks every number in the program that indexes something — buffer numbers, kernel
/// numbers, the input and output lists against the metadata and their sizes — so that a
/// well-formed but wrong program is refused instead of indexing out of bounds.
fn check_indices(meta: &Meta, p: &Program) -> Result<()> {
    let buffer = |b: usize, what: &str| -> Result<()> {
        if b >= p.buffers.len() {
            bail!("{what} names buffer {b}, but the program has {}", p.buffers.len());
        }
        Ok(())
    };
    for s in &p.steps {
        for &b in &s.buffers {
            buffer(b, &format!("step '{}'", s.node))?;
        }
        if let Exec::Kernel(k) = s.exec {
            if k >= p.kernels.len() {
                bail!("step '{}' names kernel {k}, but the program has {}", s.node, p.kernels.len());
            }
        }
    }
    for (list, specs, what) in [(&p.inputs, &meta.inputs, "input"), (&p.outputs, &meta.outputs, "output")] {
        if list.len() != specs.len() {
            bail!("the program has {} {what}s, the metadata {}", list.len(), specs.len());
        }
        for (&b, spec) in list.iter().zip(specs) {
            buffer(b, &format!("{what} '{}'", spec.name))?;
            let ty = spec.ty().ok_or_else(|| anyhow!("{what} '{}' has unknown dtype {}", spec.name, spec.dtype))?;
            if ty.checked_size_bytes() != Some(p.buffers[b].bytes) {
                bail!("{what} '{}' ({ty}) does not fit its buffer of {} bytes", spec.name, p.buffers[b].bytes);
            }
        }
    }
    Ok(())
}

/// A program ready to run: the runner's whole view of a compiled graph.
pub struct Loaded<'w> {
    pub meta: Meta,
    pub program: Program,
    code: Code,
    weights: &'w [u8],
    /// Allocated once: repeated runs (`--bench`) reuse its pages.
    arena: std::sync::Mutex<AlignedBuf>,
}

impl<'w> Loaded<'w> {
    /// Checks that this CPU has every feature the code was compiled for, then wraps the
    /// pieces. `code` must hold the kernels `program` refers to.
    pub fn new(meta: Meta, mut programs: Vec<Program>, code: Code, weights: &'w [u8]) -> Result<Loaded<'w>> {
        if programs.len() != 1 {
            bail!("this runner runs single-device programs; got {}", programs.len());
        }
        let program = programs.remove(0);
        let host = codegen::host_features();
        let missing: Vec<&str> = meta.features.iter().filter(|f| !host.contains(f)).map(String::as_str).collect();
        if !missing.is_empty() {
            bail!(
                "this CPU lacks {} needed by code compiled for target '{}'; recompile with --target x86-64-v2 or native",
                missing.join(", "),
                meta.target
            );
        }
        let code_len = match &code {
            Code::Mapped(m) => m.len(),
            Code::Copied(c) => c.len(),
        };
        if let Some(k) = program.kernels.iter().find(|k| k.offset.checked_add(k.len).is_none_or(|end| end > code_len)) {
            bail!("kernel {} lies outside the code section", k.name);
        }
        let check = |b: &crate::program::Buffer| match b.storage {
            Storage::Arena { offset } => offset.checked_add(b.bytes).is_some_and(|end| end <= program.arena_bytes),
            Storage::Weights { offset } => offset.checked_add(b.bytes).is_some_and(|end| end <= weights.len()),
        };
        if let Some(b) = program.buffers.iter().find(|b| !check(b)) {
            bail!("buffer '{}' lies outside its storage", b.name);
        }
        check_indices(&meta, &program)?;
        let arena = std::sync::Mutex::new(AlignedBuf::zeroed(program.arena_bytes)?);
        Ok(Loaded { meta, program, code, weights, arena })
    }

    fn kernel(&self, k: usize) -> KernelFn {
        let offset = self.program.kernels[k].offset;
        // SAFETY: `new` checked the kernel lies inside the code, which was compiled for a
        // target whose features this CPU has.
        unsafe {
            match &self.code {
                Code::Mapped(m) => std::mem::transmute::<*const u8, KernelFn>(m.as_ptr().add(offset)),
                Code::Copied(c) => c.kernel(offset),
            }
        }
    }

    /// Checks the inputs against the metadata: each once, with its dtype and shape.
    pub fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<()> {
        for spec in &self.meta.inputs {
            let want = spec.ty().ok_or_else(|| anyhow!("input '{}' has unknown dtype {}", spec.name, spec.dtype))?;
            match inputs.get(&spec.name) {
                None => bail!("missing input '{}' ({want})", spec.name),
                Some(t) if t.ty() != want => bail!("input '{}' is {}, the graph expects {want}", spec.name, t.ty()),
                Some(_) => {}
            }
        }
        if let Some(extra) = inputs.keys().find(|k| !self.meta.inputs.iter().any(|s| &s.name == *k)) {
            bail!("the graph has no input '{extra}'");
        }
        Ok(())
    }

    /// Runs the program once.
    pub fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        self.run_timed(inputs, &mut |_, _| {})
    }

    /// Runs the program once, reporting each step's index and wall time to `timed` (the
    /// per-step profile behind `--bench` and the kernel benchmarks).
    pub fn run_timed(
        &self,
        inputs: &HashMap<String, Tensor>,
        timed: &mut dyn FnMut(usize, std::time::Duration),
    ) -> Result<BTreeMap<String, Tensor>> {
        self.check_inputs(inputs)?;
        let p = &self.program;
        let mut arena = self.arena.lock().map_err(|_| anyhow!("a previous run panicked"))?;
        let base = arena.as_mut_slice().as_mut_ptr();
        let ptrs: Vec<*mut u8> = p
            .buffers
            .iter()
            .map(|b| match b.storage {
                // SAFETY (both): `new` checked every buffer lies inside its storage.
                Storage::Arena { offset } => unsafe { base.add(offset) },
                // Kernels never write their operands, so weights stay read-only.
                Storage::Weights { offset } => unsafe { self.weights.as_ptr().add(offset) as *mut u8 },
            })
            .collect();
        for (spec, &b) in self.meta.inputs.iter().zip(&p.inputs) {
            let t = &inputs[&spec.name];
            // SAFETY: the buffer has exactly the input's byte size (checked by check_inputs).
            t.write_le_bytes(unsafe { std::slice::from_raw_parts_mut(ptrs[b], t.ty().size_bytes()) });
        }
        let mut args: Vec<*mut u8> = Vec::new();
        for (i, step) in p.steps.iter().enumerate() {
            let start = std::time::Instant::now();
            args.clear();
            args.extend(step.buffers.iter().map(|&b| ptrs[b]));
            match &step.exec {
                Exec::Kernel(k) => {
                    // SAFETY: the step's buffers are the ones its kernel was generated for.
                    let status = unsafe { self.kernel(*k)(args.as_ptr()) };
                    if status == codegen::STATUS_INDEX_OUT_OF_RANGE {
                        bail!("node '{}': gather index out of range", step.node);
                    } else if status != 0 {
                        bail!("node '{}': kernel failed with status {status}", step.node);
                    }
                }
                Exec::Library(Library::Matmul { a, b, out }) => {
                    let len = |s: &[usize]| s.iter().product::<usize>();
                    // SAFETY: the buffers hold f32 tensors of exactly these shapes, and the
                    // result does not alias the operands.
                    let (o, x, y) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)),
                            std::slice::from_raw_parts(args[1] as *const f32, len(a)),
                            std::slice::from_raw_parts(args[2] as *const f32, len(b)),
                        )
                    };
                    library::matmul(x, y, o, a, b, out)?;
                }
                Exec::Collective(_) => bail!("node '{}': collectives need the multi-device runner", step.node),
            }
            timed(i, start.elapsed());
        }
        let mut results = BTreeMap::new();
        for (spec, &b) in self.meta.outputs.iter().zip(&p.outputs) {
            let ty: TensorType = spec.ty().ok_or_else(|| anyhow!("output '{}' has unknown dtype", spec.name))?;
            // SAFETY: the buffer holds exactly the output's bytes.
            let bytes = unsafe { std::slice::from_raw_parts(ptrs[b], ty.size_bytes()) };
            results.insert(spec.name.clone(), Tensor::from_le_bytes(&ty, bytes));
        }
        Ok(results)
    }
}
