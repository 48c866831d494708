//! `cargo bench --bench gemm`: GFLOP/s of the two matmul paths on n×n×n f32 — the
//! Cranelift kernel (single thread) and the library GEMM (1 thread and all cores) — next to
//! the machine's single-thread 128-bit FMA peak, measured here with a tight FMA loop
//! (2 FMA ports × 4 lanes × 2 flops per cycle when the loop saturates both ports).
//! Timings are best-of-N with `std::time::Instant`. Sizes can be picked with
//! `GEMM_SIZES=256,1024`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use meshc::codegen::{compile, matmul::matmul, ExecCode, Target};
use meshc::library;
use meshc_ir::{DType, TensorType};

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

    fn f32s(&self, len: usize) -> &mut [f32] {
        assert!(len * 4 <= self.layout.size());
        // SAFETY: the allocation is large enough, aligned, and initialised (zeroed).
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

/// Single-thread 128-bit FMA throughput (GFLOP/s): 12 independent chains cover the FMA
/// latency on both ports, so this is the peak the micro-kernel can aim for.
fn fma_peak() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;

        #[target_feature(enable = "fma")]
        unsafe fn chains(iters: usize, x: __m128, y: __m128) -> f32 {
            let mut acc = [_mm_setzero_ps(); 12];
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm_fmadd_ps(*a, x, y);
                }
            }
            let mut sum = _mm_setzero_ps();
            for a in acc {
                sum = _mm_add_ps(sum, a);
            }
            _mm_cvtss_f32(sum)
        }

        if !std::arch::is_x86_feature_detected!("fma") {
            return None;
        }
        let iters = 20_000_000;
        // SAFETY: FMA support was just checked.
        let secs = best(5, || unsafe {
            black_box(chains(iters, _mm_set1_ps(black_box(0.999)), _mm_set1_ps(black_box(0.001))));
        });
        Some((iters * 12 * 8) as f64 / secs / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

fn square(n: usize) -> TensorType {
    TensorType::new(DType::F32, vec![n, n])
}

/// GFLOP/s of the Cranelift kernel, and its result (for a cross-check).
fn cranelift(target: &Target, n: usize, a: &Buf, b: &Buf, reps: usize) -> Result<(f64, Vec<f32>)> {
    let g = matmul(target, "mm", &square(n), &square(n), &square(n))?;
    let exec = ExecCode::new(&compile(target, g.func)?)?;
    let (out, scratch) = (Buf::new(n * n * 4), Buf::new(g.scratch));
    let bufs = [out.ptr, a.ptr, b.ptr, scratch.ptr];
    let mut status = 0;
    let secs = best(reps, || {
        // SAFETY: the kernel was compiled for this host; every buffer has the size and
        // alignment the kernel ABI asks for.
        status = unsafe { exec.kernel(0)(bufs.as_ptr()) };
    });
    if status != 0 {
        bail!("kernel returned status {status}");
    }
    Ok((2.0 * (n as f64).powi(3) / secs / 1e9, out.f32s(n * n).to_vec()))
}

fn library_gflops(n: usize, a: &Buf, b: &Buf, threads: usize, reps: usize) -> Result<(f64, Vec<f32>)> {
    let out = Buf::new(n * n * 4);
    let (a, b, c) = (a.f32s(n * n), b.f32s(n * n), out.f32s(n * n));
    let mut res = Ok(());
    let secs = best(reps, || res = library::matmul_threads(a, b, c, &[n, n], &[n, n], &[n, n], threads));
    res?;
    Ok((2.0 * (n as f64).powi(3) / secs / 1e9, c.to_vec()))
}

fn main() -> Result<()> {
    let sizes: Vec<usize> = match std::env::var("GEMM_SIZES") {
        Ok(s) => s.split(',').map(|x| x.trim().parse().context("GEMM_SIZES: comma-separated sizes")).collect::<Result<_>>()?,
        Err(_) => vec![256, 512, 1024, 2048],
    };
    let target = Target::by_name("native")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peak = fma_peak();
    match peak {
        Some(p) => println!("128-bit FMA peak (1 thread, measured): {p:.1} GFLOP/s = 16 flops/cycle at {:.2} GHz", p / 16.0),
        None => println!("128-bit FMA peak: no FMA on this CPU"),
    }
    println!("{:>6} {:>12} {:>8} {:>12} {:>12}", "n", "cranelift", "% peak", "library 1T", format!("library {threads}T"));
    for n in sizes {
        let reps = if n >= 2048 { 3 } else { 10 };
        let (a, b) = (Buf::new(n * n * 4), Buf::new(n * n * 4));
        for (i, x) in a.f32s(n * n).iter_mut().enumerate() {
            *x = ((i * 7919 % 1000) as f32) / 1000.0 - 0.5;
        }
        for (i, x) in b.f32s(n * n).iter_mut().enumerate() {
            *x = ((i * 104_729 % 997) as f32) / 997.0 - 0.5;
        }
        let (cl, got) = cranelift(&target, n, &a, &b, reps)?;
        let (l1, want) = library_gflops(n, &a, &b, 1, reps)?;
        let (ln, _) = library_gflops(n, &a, &b, threads, reps)?;
        let err = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0f32, f32::max);
        if err > 1e-3 {
            bail!("n={n}: the kernel and the library disagree (relative error {err})");
        }
        let pct = peak.map_or("-".to_string(), |p| format!("{:.0}%", 100.0 * cl / p));
        println!("{n:>6} {cl:>12.1} {pct:>8} {l1:>12.1} {ln:>12.1}");
    }
    Ok(())
}
