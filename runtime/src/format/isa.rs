//! The vector ISA of the runtime's own kernels — the library GEMMs (panels and small-M), the
//! integer GEMM (at `Avx512` its VNNI path where the CPU has VNNI, else its AVX2 one), fused
//! attention, the GEMM epilogues, the collectives' reductions: the best one the host
//! has, unless forced lower (`--isa` of `meshc run` and `meshc-run`, the environment
//! variable `MESHC_ISA`, `meshc_runtime::api::force_isa`), so that every path runs, is
//! tested and is measured on one machine — an AVX2-only CPU's paths on an AVX-512 one.
//! Code that Cranelift compiled into an artifact follows the artifact's `--target` instead.
//!
//! It lives with the kernel ABI because both rooms below the runner read it (`kernels`,
//! `comm`), and they share nothing else. The choice is one per process: each kernel call
//! reads it (one relaxed atomic load) and runs whole on that path.

use std::sync::atomic::{AtomicU8, Ordering};

/// A vector ISA, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, vectorised by the compiler for the baseline x86-64 (SSE2) or the host
    /// architecture: every kernel has this path.
    Portable,
    /// AVX2 with FMA: 16 registers of 8 floats.
    Avx2,
    /// AVX-512F with FMA: 32 registers of 16 floats.
    Avx512,
}

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// `avx512`, `avx2` or `portable`.
    pub fn parse(s: &str) -> Result<Isa, String> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Isa::ALL.iter().rev().map(|i| i.name()).collect();
            format!("unknown ISA '{s}' (expected {})", names.join(", "))
        })
    }

    /// The best ISA this CPU runs.
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("fma");
            if fma && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if fma && std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

/// 0 until decided; else 1 + the `Isa` as a number.
static CURRENT: AtomicU8 = AtomicU8::new(0);

fn encode(isa: Isa) -> u8 {
    1 + Isa::ALL.iter().position(|&i| i == isa).expect("in ALL") as u8
}

/// The ISA the kernels use: the one forced, else the best the CPU has.
pub fn current() -> Isa {
    match CURRENT.load(Ordering::Relaxed) {
        0 => {
            let isa = Isa::detected();
            CURRENT.store(encode(isa), Ordering::Relaxed);
            isa
        }
        n => Isa::ALL[n as usize - 1],
    }
}

/// Makes the kernels use `isa` from their next call on; one this CPU cannot run is refused.
pub fn force(isa: Isa) -> Result<(), String> {
    let best = Isa::detected();
    if isa > best {
        return Err(format!("this CPU cannot run {} kernels (the best it has is {})", isa.name(), best.name()));
    }
    CURRENT.store(encode(isa), Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_list_the_choices() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Ok(isa));
        }
        assert_eq!(Isa::parse("sse9").unwrap_err(), "unknown ISA 'sse9' (expected avx512, avx2, portable)");
    }

    #[test]
    fn an_isa_above_the_cpus_is_refused() {
        let best = Isa::detected();
        for isa in Isa::ALL.into_iter().filter(|&i| i > best) {
            assert!(force(isa).unwrap_err().contains("cannot run"), "{isa:?}");
        }
        assert_eq!(force(best), Ok(()));
        assert_eq!(current(), best);
    }
}
