//! The kernel ABI shared by the compiler that emits kernels and the runtime that calls
//! them: the kernel signature and its status codes, the CPU features a target may require
//! (recorded in the artifact, checked against the host before any code is mapped), and
//! the seam through which the runner finds kernels that do not come from an artifact file.
//!
//! Every kernel is `extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize) -> u32`.
//! `bufs[i]` is the address of the kernel's i-th buffer (by convention the result first,
//! then the operands, then any scratch space the kernel asked for). Shapes are baked into
//! the code. A kernel that can split its work does the `part`-th of `parts` disjoint
//! pieces, so that the runner may call it once per part on several threads at once; `(0, 1)`
//! always means the whole work. A kernel returns 0, or a non-zero status the runner turns
//! into an error. Kernels embed no absolute address and call only functions of their own
//! code section, PC-relative, so the section runs wherever it is copied, with no
//! relocation step.

/// The signature of every generated kernel.
pub type KernelFn = unsafe extern "C" fn(bufs: *const *mut u8, part: usize, parts: usize) -> u32;

/// Status a kernel returns when a gather index is out of range.
pub const STATUS_INDEX_OUT_OF_RANGE: u32 = 1;

/// Status a kernel returns when an integer divisor is zero (the division would trap).
pub const STATUS_DIVISION_BY_ZERO: u32 = 2;

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

/// Kernels already in executable memory of this process, owned by whoever compiled them
/// (the compiler's JIT: `meshc run GRAPH` and the tests run kernels without an artifact
/// file), found by the offsets the programs name in the code section an artifact of the
/// same compile would hold. The runtime itself compiles nothing.
pub trait KernelTable: Send + Sync {
    /// The length of that code section: no kernel reaches past it.
    fn section_len(&self) -> usize;

    /// The function starting at `offset` of the section, if one does.
    fn get(&self, offset: usize) -> Option<KernelFn>;
}

/// No code: programs whose steps are all collectives, transfers and library calls.
impl KernelTable for () {
    fn section_len(&self) -> usize {
        0
    }

    fn get(&self, _: usize) -> Option<KernelFn> {
        None
    }
}
