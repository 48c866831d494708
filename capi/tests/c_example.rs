//! examples/c/main.c built with the system C compiler against libmeshcrt.so and run on the mlp
//! testdata artifact: its outputs are numpy's, and under valgrind it makes no invalid access
//! and leaks nothing. Needs the meshc binary and a libmeshcrt.so newer than every source of
//! the runtime and of capi: `cargo test` builds a library crate's rlib only, so `make test`
//! builds the shared library first (`cargo build -p meshc-capi`). And valgrind (CI installs
//! it; MESHC_NO_VALGRIND=1 skips only that part, saying so).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo put this build's binaries and libraries in (target/debug).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// Every file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_c_example_runs_the_mlp_as_numpy_does_and_valgrind_finds_nothing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let build = build_dir();
    let (meshc, lib) = (build.join("meshc"), build.join("libmeshcrt.so"));
    for f in [&meshc, &lib] {
        assert!(f.is_file(), "{} is missing: run `make test` (or build meshc and meshc-capi first)", f.display());
    }
    let built = std::fs::metadata(&lib).and_then(|m| m.modified()).unwrap();
    for src in ["capi/src", "runtime/src"].iter().flat_map(|d| sources(&root.join(d))) {
        let changed = std::fs::metadata(&src).and_then(|m| m.modified()).unwrap();
        assert!(
            changed <= built,
            "{} is older than {}: run `cargo build -p meshc-capi` (make test does)",
            lib.display(),
            src.display()
        );
    }
    let dir = build.join("c-example");
    std::fs::create_dir_all(&dir).unwrap();
    let art = dir.join("mlp.mshc");
    // x86-64-v2: valgrind does not run AVX-512 code.
    run(Command::new(&meshc)
        .current_dir(root)
        .args(["compile", "testdata/mlp/graph.json", "--target", "x86-64-v2", "-o"])
        .arg(&art));
    let x = meshc_ir::Tensor::read_npy(&root.join("testdata/mlp/inputs/x.npy")).unwrap();
    std::fs::write(dir.join("x.bin"), x.to_le_bytes()).unwrap();
    let exe = dir.join("example");
    run(Command::new(std::env::var("CC").unwrap_or("cc".into()))
        .arg(root.join("examples/c/main.c"))
        .arg("-I")
        .arg(root.join("capi/include"))
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(format!("-L{}", build.display()))
        .arg(format!("-Wl,-rpath,{}", build.display()))
        .args(["-lmeshcrt", "-lpthread"]));
    let args = [art.display().to_string(), format!("x={}", dir.join("x.bin").display())];
    let out = run(Command::new(&exe).args(&args));
    let y = meshc_ir::Tensor::read_npy(&root.join("testdata/mlp/expected/y.npy")).unwrap();
    let y = y.as_f32().unwrap();
    let line = out.lines().find_map(|l| l.strip_prefix("y = [")).unwrap_or_else(|| panic!("no output line:\n{out}"));
    let got: Vec<f32> = line.split(", ").take(2).map(|v| v.parse().unwrap()).collect();
    for (g, w) in got.iter().zip(y) {
        assert!((g - w).abs() <= 1e-4 * w.abs() + 1e-5, "y starts {got:?}, numpy's {:?}", &y[..2]);
    }
    // The mlp's `x` is `dims(batch, embed)`, and its output keeps both names.
    assert!(out.contains("input x: dtype 0, rank 2, 4096 bytes, dims (batch, embed)\n"), "{out}");
    assert!(out.contains("output y: dtype 0, rank 2, 4096 bytes, dims (batch, embed)\n"), "{out}");
    assert!(out.contains("misnamed input: the graph has no input 'no_such_input' (its inputs: x)"), "{out}");
    assert!(out.contains("NULL session: session is NULL") && out.ends_with("ok\n"), "{out}");
    assert!(out.contains("freed session: session is not open (freed already, or not a session)"), "{out}");
    if std::env::var_os("MESHC_NO_VALGRIND").is_some() {
        eprintln!("MESHC_NO_VALGRIND: the C example was not run under valgrind");
        return;
    }
    let vg = run(Command::new("valgrind")
        .args(["--error-exitcode=9", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect"])
        .args(["--show-leak-kinds=definite,indirect", "-q"])
        .arg(&exe)
        .args(&args));
    assert!(vg.contains("ok\n"), "{vg}");
}
