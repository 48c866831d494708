//! Compiled paths against the reference: every testdata graph compiled to an artifact and
//! run (`meshc compile` + `meshc run ARTIFACT`) and compiled in memory (`meshc run GRAPH`),
//! with both matmul paths, must reproduce the numpy-computed expected outputs within the
//! tolerance of testdata/README.md. Also: byte-identical artifacts, the depfile, `inspect`
//! pinned in golden/, and refusal of damaged artifacts before any code is mapped.

use crate::common::{compare_expected, golden, input_args, meshc, scratch, testdata_graphs};
use std::path::Path;

fn graph_name(g: &Path) -> String {
    g.parent().unwrap().file_name().unwrap().to_string_lossy().to_string()
}

fn run_and_compare(program: &str, g: &Path, extra: &[&str], out: &Path) -> Result<usize, String> {
    let mut args = vec!["run".to_string(), program.to_string()];
    args.extend(input_args(g));
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--output-dir".to_string(), out.display().to_string()]);
    let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    if run.status != Some(0) {
        return Err(format!("meshc {}: {run:?}", args.join(" ")));
    }
    compare_expected(g, out)
}

#[test]
fn artifacts_and_in_memory_runs_match_numpy_with_both_gemm_paths() {
    let mut failures = Vec::new();
    for g in testdata_graphs() {
        let name = graph_name(&g);
        for gemm in ["cranelift", "library"] {
            let dir = scratch(&format!("compiled-{name}-{gemm}"));
            let art = dir.join("a.mshc");
            let c = meshc(&["compile", &g.display().to_string(), "-o", &art.display().to_string(), "--gemm", gemm]);
            if c.status != Some(0) {
                failures.push(format!("{name} compile --gemm {gemm}: {c:?}"));
                continue;
            }
            if let Err(e) = run_and_compare(&art.display().to_string(), &g, &[], &dir.join("out-artifact")) {
                failures.push(format!("{name} artifact --gemm {gemm}: {e}"));
            }
            if let Err(e) = run_and_compare(&g.display().to_string(), &g, &["--gemm", gemm], &dir.join("out-graph")) {
                failures.push(format!("{name} run GRAPH --gemm {gemm}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn same_inputs_give_byte_identical_artifacts_and_a_depfile() {
    let dir = scratch("determinism");
    let g = "testdata/transformer/graph.json";
    let (a, b) = (dir.join("a.mshc"), dir.join("b.mshc"));
    let dep = dir.join("a.d");
    for (out, extra) in [(&a, vec!["-MF", dep.to_str().unwrap()]), (&b, vec![])] {
        let mut args = vec!["compile", g, "-o", out.to_str().unwrap()];
        args.extend(extra);
        assert_eq!(meshc(&args).status, Some(0));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "artifacts differ");
    let depfile = std::fs::read_to_string(&dep).unwrap();
    assert!(depfile.starts_with(&format!("{}:", a.display())), "{depfile}");
    for f in ["testdata/transformer/graph.json", "testdata/transformer/weights/model.safetensors"] {
        assert!(depfile.contains(f), "depfile lacks {f}: {depfile}");
    }
}

#[test]
fn inspect_is_pinned() {
    let dir = scratch("inspect");
    let mut failures = Vec::new();
    for g in testdata_graphs() {
        let name = graph_name(&g);
        let art = dir.join(format!("{name}.mshc"));
        // A fixed target and GEMM choice keep the pinned text independent of the host.
        let c = meshc(&[
            "compile",
            &g.display().to_string(),
            "-o",
            art.to_str().unwrap(),
            "--target",
            "x86-64-v3",
            "--gemm",
            "cranelift",
        ]);
        assert_eq!(c.status, Some(0), "{c:?}");
        let run = meshc(&["inspect", art.to_str().unwrap()]);
        assert_eq!(run.status, Some(0), "{run:?}");
        // The scratch path differs per run; pin the text without it.
        let text = run.stdout.replace(&art.display().to_string(), &format!("{name}.mshc"));
        if let Err(e) = golden(&format!("inspect/{name}.txt"), &text) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Byte offsets of each section of an artifact, from `inspect`.
fn sections(art: &Path) -> Vec<(String, usize, usize)> {
    let run = meshc(&["inspect", art.to_str().unwrap()]);
    run.stdout
        .lines()
        .filter(|l| l.contains(" offset ") && l.contains(" crc32 "))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[2].parse().unwrap(), w[4].parse().unwrap())
        })
        .collect()
}

#[test]
fn damaged_artifacts_are_refused_with_one_line() {
    let dir = scratch("damaged");
    let art = dir.join("mlp.mshc");
    let g = "testdata/mlp/graph.json";
    assert_eq!(meshc(&["compile", g, "-o", art.to_str().unwrap()]).status, Some(0));
    let good = std::fs::read(&art).unwrap();
    let secs = sections(&art);
    assert_eq!(secs.len(), 4, "{secs:?}");
    let x = "x=testdata/mlp/inputs/x.npy";
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for (kind, offset, size) in &secs {
        let mut bad = good.clone();
        bad[offset + size / 2] ^= 0x40;
        cases.push((format!("flipped byte in {kind}"), bad));
    }
    cases.push(("truncated".into(), good[..good.len() - 100].to_vec()));
    cases.push(("truncated header".into(), good[..20].to_vec()));
    let mut magic = good.clone();
    magic[0] = b'X';
    cases.push(("wrong magic".into(), magic));
    let mut version = good.clone();
    version[8] = 99;
    cases.push(("wrong version".into(), version));
    for (what, bytes) in cases {
        let path = dir.join("bad.mshc");
        std::fs::write(&path, &bytes).unwrap();
        for cmd in [vec!["run", path.to_str().unwrap(), "--input", x], vec!["inspect", path.to_str().unwrap()]] {
            let r = meshc(&cmd);
            assert_eq!(r.status, Some(1), "{what}: {r:?}");
            assert_eq!(r.stderr.lines().count(), 1, "{what}: {r:?}");
        }
    }
}

#[test]
fn run_refuses_bad_inputs_with_pinned_errors() {
    let dir = scratch("run-inputs");
    let art = dir.join("mlp.mshc");
    assert_eq!(meshc(&["compile", "testdata/mlp/graph.json", "-o", art.to_str().unwrap()]).status, Some(0));
    let a = art.to_str().unwrap();
    let no_inputs = dir.join("params-only.mshc");
    assert_eq!(
        meshc(&["compile", "testdata/regress/params-only.txt", "-o", no_inputs.to_str().unwrap()]).status,
        Some(0)
    );
    let cases: [(&str, Vec<&str>); 5] = [
        ("run-missing-input", vec!["run", a]),
        (
            "run-extra-input",
            vec!["run", a, "--input", "x=testdata/mlp/inputs/x.npy", "--input", "z=testdata/mlp/inputs/x.npy"],
        ),
        ("run-wrong-shape", vec!["run", a, "--input", "x=testdata/gelu_mlp/inputs/x.npy"]),
        ("run-unreadable-npy", vec!["run", a, "--input", "x=testdata/bad/weights/w_truncated.npy"]),
        ("run-input-to-no-inputs", vec!["run", no_inputs.to_str().unwrap(), "--input", "x=testdata/mlp/inputs/x.npy"]),
    ];
    let mut failures = Vec::new();
    for (name, args) in cases {
        let r = meshc(&args);
        if r.status != Some(1) || r.stderr.lines().count() != 1 {
            failures.push(format!("{name}: {r:?}"));
        } else if let Err(e) = golden(&format!("cli/{name}.txt"), &r.stderr) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sse_only_target_matches_numpy() {
    // x86-64-v2 code uses no AVX/FMA: the non-VEX paths (where unaligned memory operands
    // fault) must be right too.
    let mut failures = Vec::new();
    for g in testdata_graphs() {
        let name = graph_name(&g);
        let out = scratch(&format!("v2-{name}"));
        if let Err(e) = run_and_compare(&g.display().to_string(), &g, &["--target", "x86-64-v2"], &out) {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn check_against_fails_on_a_wrong_reference() {
    let dir = scratch("check-against");
    let want = meshc_ir::Tensor::read_npy(Path::new("testdata/mlp/expected/y.npy")).unwrap();
    let bumped: Vec<f32> = want.as_f32().unwrap().iter().map(|v| v * 1.01 + 1e-3).collect();
    meshc_ir::Tensor::f32(want.shape.clone(), bumped).write_npy(&dir.join("y.npy")).unwrap();
    let args = ["run", "testdata/mlp/graph.json", "--input", "x=testdata/mlp/inputs/x.npy", "--check-against"];
    let ok = meshc(&[&args[..], &["testdata/mlp/expected"]].concat());
    assert_eq!(ok.status, Some(0), "{ok:?}");
    assert!(ok.stdout.contains("check y: max abs error") && ok.stdout.contains("(ok)"), "{ok:?}");
    let bad = meshc(&[&args[..], &[dir.to_str().unwrap()]].concat());
    assert_eq!(bad.status, Some(1), "{bad:?}");
    assert!(bad.stdout.contains("FAILED") && bad.stderr.contains("differ"), "{bad:?}");
}

/// Kernels large enough to split (elementwise chains over a 2-D nest and over a flat loop
/// with a tail, softmax, layer_norm, and reductions of the whole tensor, which
/// `passes::reduce_split` makes two, the first of many results) give bit-identical results
/// on 1 and 2 threads, and the interpreter's within tolerance; `inspect` shows into how
/// many parts each may split.
#[test]
fn split_kernels_match_one_thread_and_the_interpreter() {
    let dir = scratch("split");
    let graph = dir.join("wide.txt");
    std::fs::write(
        &graph,
        "graph wide {
           input x: f32[1024, 1100]
           param a: f32[1100] = init uniform{seed = 1, low = 0.5, high = 1.5}
           param b: f32[1100] = init uniform{seed = 2, low = -1.0, high = 1.0}
           m = mul(x, a)  s = add(m, b)  chain = gelu(s)
           t = tanh(x)  flat = mul(t, x)
           sm = softmax(x)
           ln = layer_norm(x, a, b)
           total = reduce_sum(x) {keepdims = false}  avg = reduce_mean(x) {keepdims = true}
           top = reduce_max(x) {keepdims = false}  nx = neg(x)  low = reduce_max(nx) {keepdims = false}
           output chain, flat, sm, ln, total, avg, top, low
         }",
    )
    .unwrap();
    let mut seed = 7u64;
    let x: Vec<f32> = (0..1024 * 1100)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect();
    let input = dir.join("x.npy");
    meshc_ir::Tensor::f32(vec![1024, 1100], x).write_npy(&input).unwrap();
    let x_arg = format!("x={}", input.display());
    let art = dir.join("wide.mshc");
    let (g, a) = (graph.display().to_string(), art.display().to_string());
    let c = meshc(&["compile", &g, "-o", &a]);
    assert_eq!(c.status, Some(0), "{c:?}");
    let inspect = meshc(&["inspect", &a]);
    let parts: Vec<&str> = inspect.stdout.lines().filter(|l| l.ends_with(" parts")).collect();
    assert_eq!(parts.len(), 8, "{}", inspect.stdout);
    let outs: Vec<std::path::PathBuf> = ["interp", "1", "2"].iter().map(|t| dir.join(format!("out-{t}"))).collect();
    let r = meshc(&["interp", &g, "--input", &x_arg, "--output-dir", outs[0].to_str().unwrap()]);
    assert_eq!(r.status, Some(0), "{r:?}");
    for (threads, out) in ["1", "2"].iter().zip(&outs[1..]) {
        let r = meshc(&["run", &a, "--input", &x_arg, "--threads", threads, "--output-dir", out.to_str().unwrap()]);
        assert_eq!(r.status, Some(0), "{r:?}");
    }
    for name in ["chain", "flat", "sm", "ln", "total", "avg", "top", "low"] {
        let read = |d: &Path| meshc_ir::Tensor::read_npy(&d.join(format!("{name}.npy"))).unwrap();
        let (want, one, two) = (read(&outs[0]), read(&outs[1]), read(&outs[2]));
        crate::common::assert_close(name, &one, &want).unwrap();
        assert!(one.to_le_bytes() == two.to_le_bytes(), "{name}: 2 threads differ from 1");
    }
}
