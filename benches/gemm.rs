//! `cargo bench --bench gemm`: GFLOP/s of the two matmul paths on n×n×n f32 — the
//! Cranelift kernel (single thread) and the library GEMM (1 thread and all cores) — next to
//! the machine's single-thread 128-bit FMA peak: 2 FMA ports × 4 lanes × 2 flops per cycle
//! at the clock measured here (a chain of dependent adds), checked against a tight FMA loop.
//! The library's GEMM on a weight prepacked in panels (`meshc_runtime::kernels::panels`, what the
//! compiler stores constant weights as) runs on all cores beside it, also as a share of the
//! FMA peak of the ISA its kernels run (a tight loop of 128-, 256- or 512-bit FMAs per core;
//! `MESHC_ISA=avx2` forces the AVX2 kernels on an AVX-512 machine). At 2048, numpy's
//! `a @ b` is timed in the same run (through python3, when it has numpy).
//! Timings are best-of-N with `std::time::Instant`. Sizes can be picked with
//! `GEMM_SIZES=256,1024`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use meshc::codegen::{matmul::matmul, module::jit, KernelTable, Target};
use meshc_ir::{DType, TensorType};
use meshc_runtime::kernels::epilogue::Bound;
use meshc_runtime::kernels::library;
use meshc_runtime::kernels::matmul_shape::MatmulShape;

mod common;

/// A zeroed, 64-byte aligned buffer, as the runner hands kernels.
struct Buf {
    ptr: *mut u8,
    layout: Layout,
}

impl Buf {
    fn new(bytes: usize) -> Buf {
        let layout = Layout::from_size_align(bytes.max(64), 64).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Buf { ptr, layout }
    }

    fn f32s(&self, len: usize) -> &[f32] {
        assert!(len * 4 <= self.layout.size());
        // SAFETY: the allocation is large enough, aligned, and initialised (zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), len) }
    }

    fn f32s_mut(&mut self, len: usize) -> &mut [f32] {
        assert!(len * 4 <= self.layout.size());
        // SAFETY: as in `f32s`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast(), len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Seconds of the fastest of `reps` runs (after one warm-up run).
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The core clock (GHz), from a chain of dependent register-register adds (one per cycle;
/// adds of an immediate are not used: recent cores can fold those at rename).
fn clock_ghz() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let iters: u64 = 50_000_000;
        let secs = best(5, || {
            let mut x: u64 = 0;
            // SAFETY: register arithmetic only.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "add {x}, {one}",
                    "dec {n}",
                    "jnz 2b",
                    x = inout(reg) x,
                    one = in(reg) 1u64,
                    n = inout(reg) iters => _,
                    options(nomem, nostack),
                );
            }
            black_box(x);
        });
        Some((iters * 8) as f64 / secs / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Single-thread FMA throughput (GFLOP/s) of a tight loop of 12 independent chains (enough
/// to cover the FMA latency on both ports) of `bits`-wide vectors (128, 256 or 512): the
/// peak each ISA's kernels are measured against; `None` where the CPU lacks the width.
fn fma_loop(bits: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;

        /// 12 chains of `$fma` on `$v`, summed (so the loop is not dead code).
        macro_rules! chains {
            ($name:ident, $feature:literal, $v:ty, $zero:ident, $set1:ident, $fma:ident, $add:ident, $first:expr) => {
                #[target_feature(enable = $feature)]
                unsafe fn $name(iters: usize, x: f32, y: f32) -> f32 {
                    let (x, y) = ($set1(x), $set1(y));
                    let mut acc: [$v; 12] = [$zero(); 12];
                    for _ in 0..iters {
                        for a in acc.iter_mut() {
                            *a = $fma(*a, x, y);
                        }
                    }
                    let mut sum = $zero();
                    for a in acc {
                        sum = $add(sum, a);
                    }
                    $first(sum)
                }
            };
        }
        chains!(c128, "fma", __m128, _mm_setzero_ps, _mm_set1_ps, _mm_fmadd_ps, _mm_add_ps, _mm_cvtss_f32);
        chains!(c256, "avx,fma", __m256, _mm256_setzero_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, |v| {
            _mm_cvtss_f32(_mm256_castps256_ps128(v))
        });
        chains!(c512, "avx512f", __m512, _mm512_setzero_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, |v| {
            _mm512_reduce_add_ps(v)
        });

        let (f, lanes): (unsafe fn(usize, f32, f32) -> f32, usize) = match bits {
            128 if std::arch::is_x86_feature_detected!("fma") => (c128, 4),
            256 if std::arch::is_x86_feature_detected!("fma") => (c256, 8),
            512 if std::arch::is_x86_feature_detected!("avx512f") => (c512, 16),
            _ => return None,
        };
        let iters = 20_000_000;
        // SAFETY: the CPU has the features `f` was compiled for (checked above).
        let secs = best(5, || unsafe {
            black_box(f(iters, black_box(0.999), black_box(0.001)));
        });
        Some((iters * 12 * lanes * 2) as f64 / secs / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = bits;
        None
    }
}

fn f32_type(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// Operands of `[m,k] @ [k,n]` with arbitrary but fixed values.
fn operands(m: usize, k: usize, n: usize) -> (Buf, Buf) {
    let (mut a, mut b) = (Buf::new(m * k * 4), Buf::new(k * n * 4));
    for (i, x) in a.f32s_mut(m * k).iter_mut().enumerate() {
        *x = ((i * 7919 % 1000) as f32) / 1000.0 - 0.5;
    }
    for (i, x) in b.f32s_mut(k * n).iter_mut().enumerate() {
        *x = ((i * 104_729 % 997) as f32) / 997.0 - 0.5;
    }
    (a, b)
}

/// Seconds per call of the Cranelift kernel for `[m,k] @ [k,n]`, and its result.
fn cranelift(
    target: &Target,
    (m, k, n): (usize, usize, usize),
    a: &Buf,
    b: &Buf,
    reps: usize,
) -> Result<(f64, Vec<f32>)> {
    let g = matmul(target, "mm", &f32_type(&[m, k]), &f32_type(&[k, n]), &f32_type(&[m, n]))?;
    let code = jit(target, g.func)?;
    let kernel = code.get(0).context("a kernel at 0")?;
    let (out, scratch) = (Buf::new(m * n * 4), Buf::new(g.scratch));
    let bufs = [out.ptr, a.ptr, b.ptr, scratch.ptr];
    let mut status = 0;
    let secs = best(reps, || {
        // SAFETY: the kernel was compiled for this host; every buffer has the size and
        // alignment the kernel ABI asks for.
        status = unsafe { kernel(bufs.as_ptr(), 0, 1) };
    });
    if status != 0 {
        bail!("kernel returned status {status}");
    }
    Ok((secs, out.f32s(m * n).to_vec()))
}

/// Seconds per call of the library GEMM on `threads` threads, and its result.
fn library_time(
    (m, k, n): (usize, usize, usize),
    a: &Buf,
    b: &Buf,
    threads: usize,
    reps: usize,
) -> Result<(f64, Vec<f32>)> {
    let mut out = Buf::new(m * n * 4);
    let (a, b, c) = (a.f32s(m * k), b.f32s(k * n), out.f32s_mut(m * n));
    let (mut res, s) = (Ok(()), MatmulShape::new(&[m, k], &[k, n], &[m, n])?);
    let secs = best(reps, || res = library::matmul(a, b, c, &s, library::Threads::Exactly(threads), &Bound::none()));
    res?;
    Ok((secs, c.to_vec()))
}

/// Seconds per call of the library GEMM with `b` prepacked in panels, on `threads`
/// threads, and its result.
fn panels_time(
    (m, k, n): (usize, usize, usize),
    a: &Buf,
    b: &Buf,
    threads: usize,
    reps: usize,
) -> Result<(f64, Vec<f32>)> {
    let bytes: Vec<u8> = b.f32s(k * n).iter().flat_map(|v| v.to_le_bytes()).collect();
    let panels: Vec<f32> = meshc_runtime::kernels::panels::pack_bytes(&bytes, 1, k, n)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut out = Buf::new(m * n * 4);
    let (a, c) = (a.f32s(m * k), out.f32s_mut(m * n));
    let (mut res, s) = (Ok(()), MatmulShape::new(&[m, k], &[k, n], &[m, n])?);
    let t = library::Threads::Exactly(threads);
    let secs = best(reps, || res = library::matmul_panels(a, &panels, c, &s, t, &Bound::none()));
    res?;
    Ok((secs, c.to_vec()))
}

/// Times every path on one shape; fails if their results disagree.
fn all_paths(target: &Target, mkn: (usize, usize, usize), threads: usize, reps: usize) -> Result<[f64; 4]> {
    let (a, b) = operands(mkn.0, mkn.1, mkn.2);
    let (cl, got) = cranelift(target, mkn, &a, &b, reps)?;
    let (l1, want) = library_time(mkn, &a, &b, 1, reps)?;
    let (ln, _) = library_time(mkn, &a, &b, threads, reps)?;
    let (pn, packed) = panels_time(mkn, &a, &b, threads, reps)?;
    for (what, got) in [("the kernel", got), ("the prepacked GEMM", packed)] {
        let err = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0f32, f32::max);
        if err > 1e-3 {
            bail!("{mkn:?}: {what} and the library disagree (relative error {err})");
        }
    }
    Ok([cl, l1, ln, pn])
}

fn main() -> Result<()> {
    let sizes: Vec<usize> = match std::env::var("GEMM_SIZES") {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().context("GEMM_SIZES: comma-separated sizes"))
            .collect::<Result<_>>()?,
        Err(_) => vec![256, 512, 1024, 2048],
    };
    common::isa_from_env();
    let target = Target::by_name("native")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Peak: 2 FMA ports × 4 lanes × 2 flops per cycle.
    let peak = clock_ghz().map(|ghz| ghz * 16.0);
    match (peak, fma_loop(128)) {
        (Some(p), Some(l)) => {
            println!(
                "128-bit FMA peak, 1 thread: 16 flops/cycle × {:.2} GHz = {p:.1} GFLOP/s (tight FMA loop: {l:.1})",
                p / 16.0
            )
        }
        _ => println!("128-bit FMA peak: not measured (no x86-64 FMA)"),
    }
    // The peak of the ISA the runtime's own kernels run (`prepacked`: the panel GEMM), so
    // that each ISA's kernels are read as a share of what that ISA can do. (The library
    // column is the gemm crate, which picks its own kernels whatever MESHC_ISA says.)
    let isa = meshc_runtime::format::isa::current();
    let bits = match isa {
        meshc_runtime::format::isa::Isa::Avx512 => 512,
        meshc_runtime::format::isa::Isa::Avx2 => 256,
        _ => 128,
    };
    let widths: Vec<String> = [128, 256, 512]
        .into_iter()
        .map(|w| fma_loop(w).map_or(format!("{w}-bit -"), |g| format!("{w}-bit {g:.1}")))
        .collect();
    println!("FMA tight loop, 1 thread, GFLOP/s: {}", widths.join(", "));
    let isa_peak = fma_loop(bits).map(|g| g * threads as f64);
    let gflops = |(m, k, n): (usize, usize, usize), secs: f64| 2.0 * (m * k * n) as f64 / secs / 1e9;
    println!("GFLOP/s, n×n×n:");
    println!(
        "{:>6} {:>12} {:>8} {:>12} {:>12} {:>12} {:>14}",
        "n",
        "cranelift",
        "% peak",
        "library 1T",
        format!("library {threads}T"),
        format!("prepacked {threads}T"),
        format!("% {} peak", isa.name())
    );
    let mut library_at = Vec::new();
    for n in sizes {
        let reps = if n >= 2048 { 3 } else { 10 };
        let [cl, l1, ln, pn] = all_paths(&target, (n, n, n), threads, reps)?.map(|t| gflops((n, n, n), t));
        let pct = peak.map_or("-".to_string(), |p| format!("{:.0}%", 100.0 * cl / p));
        let share = isa_peak.map_or("-".to_string(), |p| format!("{:.0}%", 100.0 * pn / p));
        println!("{n:>6} {cl:>12.1} {pct:>8} {l1:>12.1} {ln:>12.1} {pn:>12.1} {share:>14}");
        library_at.push((n, ln, pn));
    }
    // The yardstick of issue 3: numpy's `a @ b` in the same run, with the environment's
    // OpenBLAS settings and with none (a machine's OPENBLAS_CORETYPE may pick slower kernels).
    for (n, ln, pn) in library_at.into_iter().filter(|&(n, ..)| n == 2048) {
        for (label, unset) in [("environment as is", false), ("OPENBLAS_* unset", true)] {
            match numpy_gflops(n, unset) {
                Some(np) => println!(
                    "numpy a @ b, {n}³ f32 ({label}): {np:.1} GFLOP/s; library {threads}T / numpy = {:.0}%, \
                     prepacked {threads}T / numpy = {:.0}%",
                    100.0 * ln / np,
                    100.0 * pn / np
                ),
                None => println!("numpy a @ b, {n}³ f32 ({label}): not measured (python3 with numpy not found)"),
            }
        }
    }
    // Where each path wins (what `library::prefer_library` encodes): small and skinny shapes.
    println!("microseconds per call, [m,k] @ [k,n]:");
    println!(
        "{:>16} {:>12} {:>12} {:>12} {:>12}",
        "m,k,n",
        "cranelift",
        "library 1T",
        format!("library {threads}T"),
        format!("prepacked {threads}T")
    );
    for mkn in SMALL {
        let reps = (20_000_000 / (mkn.0 * mkn.1 * mkn.2)).clamp(5, 2000);
        let [cl, l1, ln, pn] = all_paths(&target, mkn, threads, reps)?.map(|t| t * 1e6);
        println!("{:>16} {cl:>12.2} {l1:>12.2} {ln:>12.2} {pn:>12.2}", format!("{},{},{}", mkn.0, mkn.1, mkn.2));
    }
    Ok(())
}

/// numpy's `a @ b` on two n×n f32 matrices: GFLOP/s, best of 5 after a warm-up; `None`
/// without python3 and numpy. `unset`: with every OPENBLAS_* variable removed.
fn numpy_gflops(n: usize, unset: bool) -> Option<f64> {
    let script = format!(
        "import numpy as np, time\n\
         a = np.random.default_rng(0).standard_normal(({n}, {n})).astype(np.float32)\n\
         b = np.random.default_rng(1).standard_normal(({n}, {n})).astype(np.float32)\n\
         a @ b\n\
         best = 1e9\n\
         for _ in range(5):\n    t = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t)\n\
         print(2 * {n}**3 / best / 1e9)"
    );
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c").arg(script);
    if unset {
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("OPENBLAS_")) {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Small and skinny shapes, then the weight GEMMs of the models bench's encoder (2 × 13 and
/// 32 × 128 tokens, width 384, FFN 1536).
const SMALL: [(usize, usize, usize); 22] = [
    (4, 4, 4),
    (8, 8, 8),
    (12, 12, 12),
    (8, 16, 16),
    (1, 64, 32),
    (16, 16, 16),
    (32, 32, 32),
    (64, 64, 64),
    (128, 128, 128),
    (1, 256, 256),
    (1, 1024, 1024),
    (256, 256, 1),
    (12, 512, 512),
    (512, 512, 12),
    (4096, 64, 64),
    (64, 64, 4096),
    (64, 4096, 64),
    (26, 384, 384),
    (26, 384, 1536),
    (26, 1536, 384),
    (4096, 384, 1536),
    (4096, 1536, 384),
];
