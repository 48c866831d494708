//! The kernel ABI shared by the compiler that emits kernels and the runtime that calls
//! them: the kernel signature and its status codes, the CPU features a target may require
//! (recorded in the artifact, checked against the host before any code is mapped), and
//! executable memory for code that does not come from an artifact file.
//!
//! Every kernel is `extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize) -> u32`.
//! `bufs[i]` is the address of the kernel's i-th buffer (by convention the result first,
//! then the operands, then any scratch space the kernel asked for). Shapes are baked into
//! the code. A kernel that can split its work does the `part`-th of `parts` disjoint
//! pieces, so that the runner may call it once per part on several threads at once; `(0, 1)`
//! always means the whole work. A kernel returns 0, or a non-zero status the runner turns
//! into an error. Kernels embed no absolute address, so their bytes run wherever they are
//! mapped: straight from the artifact file, with no relocation step.

use anyhow::Result;

/// The signature of every generated kernel.
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize) -> u32;

/// Status a kernel returns when a gather index is out of range.
pub const STATUS_INDEX_OUT_OF_RANGE: u32 = 1;

/// CPU features a target may require; recorded in the artifact and checked by the runner.
pub const KNOWN_FEATURES: &[&str] =
    &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2", "lzcnt"];

/// The CPU features of the machine this process runs on.
pub fn host_features() -> Vec<String> {
    #[cfg(target_arch = "x86_64")]
    {
        let checks: [(&str, bool); 11] = [
            ("sse3", std::arch::is_x86_feature_detected!("sse3")),
            ("ssse3", std::arch::is_x86_feature_detected!("ssse3")),
            ("sse4.1", std::arch::is_x86_feature_detected!("sse4.1")),
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("popcnt", std::arch::is_x86_feature_detected!("popcnt")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("bmi1", std::arch::is_x86_feature_detected!("bmi1")),
            ("bmi2", std::arch::is_x86_feature_detected!("bmi2")),
            ("lzcnt", std::arch::is_x86_feature_detected!("lzcnt")),
        ];
        checks.iter().filter(|(_, ok)| *ok).map(|(f, _)| f.to_string()).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Machine code copied into fresh executable memory: how `meshc run GRAPH` and the tests
/// run kernels without an artifact file. (Kernels need no relocation, so a plain copy into
/// executable memory runs exactly the bytes an artifact would hold.)
pub struct ExecCode {
    map: memmap2::Mmap,
}

impl ExecCode {
    pub fn new(code: &[u8]) -> Result<ExecCode> {
        let mut map = memmap2::MmapMut::map_anon(code.len().max(1))?;
        map[..code.len()].copy_from_slice(code);
        Ok(ExecCode { map: map.make_exec()? })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The kernel starting at `offset`.
    ///
    /// # Safety
    /// `offset` must be the start of a kernel compiled for a target this CPU supports.
    pub unsafe fn kernel(&self, offset: usize) -> KernelFn {
        unsafe { std::mem::transmute::<*const u8, KernelFn>(self.map.as_ptr().add(offset)) }
    }
}
