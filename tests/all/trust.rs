//! Hostile files and edge values through the real binaries (issue "Trust nothing, again"):
//! an artifact rewritten while it runs, casts to halves, integer division, NaN params, and
//! the committed artifact `meshc-run`'s own tests (runtime/tests/meshc_run.rs) run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{input_args, meshc, scratch};
use meshc_ir::{Data, Tensor};

/// `cp other.mshc running.mshc` truncates the running artifact and writes other bytes into
/// the same inode. The runner read the file into memory of its own when it opened it (no
/// mapping of the file is left), so the run goes on with what it verified: exit 0, never
/// SIGBUS (a mapped weights section past the new end of the file faulted).
#[test]
fn rewriting_a_running_artifact_in_place_never_crashes_it() {
    let tmp = scratch("trust-rewrite");
    let art = tmp.join("mlp.mshc");
    let graph = Path::new("testdata/mlp/graph.json");
    let c = meshc(&["compile", "testdata/mlp/graph.json", "-o", art.to_str().unwrap()]);
    assert_eq!(c.status, Some(0), "{c:?}");
    let original = std::fs::read(&art).unwrap();
    let mut args: Vec<String> = vec!["run".into(), art.display().to_string()];
    args.extend(input_args(graph));
    args.extend(["--check-against", "testdata/mlp/expected", "--bench", "20000"].map(String::from));
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("meshc starts");
    // The check's line comes after the first run, before the bench's runs: the artifact
    // has been opened and used.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("check y:") && first.contains("(ok)"), "{first:?}");
    let mut while_running = 0;
    for i in 0..50 {
        // As cp does: the same file cut to nothing, then other bytes (a shorter file).
        let other: &[u8] = if i % 2 == 0 { b"MESHC\0AR, cut short" } else { &original[..original.len() / 3] };
        std::fs::write(&art, other).unwrap();
        if child.try_wait().unwrap().is_none() {
            while_running += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The rest of stdout is read as it comes (a closed pipe would end the run by SIGPIPE).
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "killed or failed: {:?} {stderr}", out.status);
    assert!(while_running > 0, "the run ended before the file was rewritten: nothing was tested");
    assert!(stderr.contains("bench: 20000 runs"), "{stderr}");
}

/// A graph of one input `x: f32[n]` and the nodes `body` (text format), output `out`.
fn graph(dir: &Path, name: &str, input: &str, body: &str, out: &str) -> String {
    let path = dir.join(format!("{name}.txt"));
    std::fs::write(&path, format!("graph {name} {{\n  input x: {input}\n{body}  output {out}\n}}\n")).unwrap();
    path.display().to_string()
}

/// Runs `graph` compiled (`run`) and on the interpreter (`interp`) on the input `x`,
/// returning each one's output `y`, or the failed run.
fn both(dir: &Path, graph: &str, x: &Tensor) -> [Result<Tensor, String>; 2] {
    let xf = dir.join("x.npy");
    x.write_npy(&xf).unwrap();
    ["run", "interp"].map(|cmd| {
        let yf = dir.join(format!("y-{cmd}.npy"));
        let _ = std::fs::remove_file(&yf);
        let r =
            meshc(&[cmd, graph, "--input", &format!("x={}", xf.display()), "--output", &format!("y={}", yf.display())]);
        match r.status {
            Some(0) => Ok(Tensor::read_npy(&yf).unwrap()),
            _ => Err(r.stderr),
        }
    })
}

/// Casts to f16 and bf16 round to nearest even and overflow to infinity as IEEE (numpy's
/// `astype(float16)` gives the same bits), compiled and interpreted alike: the values of
/// the cases numpy decides, and around the largest f16 (65504; 65520 is the first value
/// that rounds to infinity).
#[test]
fn casts_to_halves_round_and_overflow_as_ieee_compiled_and_interpreted() {
    // Half an f16 ulp at 1: 1 + TIE is a tie, which goes to the even 1.
    const TIE: f32 = 1.0 / 2048.0;
    let tmp = scratch("trust-half");
    let x = [1e5, 65504.0, 65519.996, 65520.0, -65520.0, 5.96e-8, 2.98e-8, 2.9802326e-8, 1.0 + TIE, 1.0 + 2.0 * TIE]
        .into_iter()
        .chain([-0.0, f32::INFINITY, f32::NAN, 0.1, 3.0e38, f32::MIN_POSITIVE])
        .collect::<Vec<f32>>();
    let n = x.len();
    let x = Tensor::f32(vec![n], x);
    // numpy: np.array(x, np.float32).astype(np.float16).astype(np.float32)
    let f16 = [
        f32::INFINITY,
        65504.0,
        65504.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        5.9604645e-8,
        0.0,
        5.9604645e-8,
        1.0,
        1.0 + 2.0 * TIE,
        -0.0,
        f32::INFINITY,
        f32::NAN,
        0.099975586,
        f32::INFINITY,
        0.0,
    ];
    for (dt, want) in [("f16", Some(f16)), ("bf16", None)] {
        let g = graph(
            &tmp,
            &format!("cast_{dt}"),
            &format!("f32[{n}]"),
            &format!("  h = cast(x) {{to = \"{dt}\"}}\n  y = cast(h) {{to = \"f32\"}}\n"),
            "y",
        );
        let [run, interp] = both(&tmp, &g, &x);
        let (run, interp) = (run.expect("compiles and runs"), interp.expect("interprets"));
        let bits = |t: &Tensor| match &t.data {
            Data::F32(v) => v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(bits(&run), bits(&interp), "{dt}: compiled and interpreted differ");
        if let Some(want) = want {
            assert_eq!(bits(&run), bits(&Tensor::f32(vec![n], want.to_vec())), "{dt}: not numpy's values");
        }
    }
}

/// Integer division is exact and truncating (2^40 + 1 is not an f32: through f32 it came
/// out wrong), and a zero divisor is one line naming the node, from compiled code (which
/// checks the divisor rather than trap) as from the interpreter; never a SIGFPE.
#[test]
fn integer_division_is_exact_and_a_zero_divisor_is_an_error_naming_the_node() {
    let tmp = scratch("trust-div");
    let path = tmp.join("div.txt");
    std::fs::write(&path, "graph div {\n  input x: i64[4]\n  input d: i64[4]\n  q = div(x, d)\n  output q\n}\n")
        .unwrap();
    let x = tmp.join("x.npy");
    let d = tmp.join("d.npy");
    Tensor::new(vec![4], Data::I64(vec![1_099_511_627_777, -7, 7, i64::MIN])).write_npy(&x).unwrap();
    for cmd in ["run", "interp"] {
        Tensor::new(vec![4], Data::I64(vec![3, 2, -2, -1])).write_npy(&d).unwrap();
        let q = tmp.join(format!("q-{cmd}.npy"));
        let args = [
            cmd,
            path.to_str().unwrap(),
            "--input",
            &format!("x={}", x.display()),
            "--input",
            &format!("d={}", d.display()),
        ];
        let r = meshc(&[&args[..], &["--output", &format!("q={}", q.display())]].concat());
        assert_eq!(r.status, Some(0), "{r:?}");
        let got = Tensor::read_npy(&q).unwrap();
        assert_eq!(got.data, Data::I64(vec![366_503_875_925, -3, -3, i64::MIN]), "{cmd}");
        Tensor::new(vec![4], Data::I64(vec![3, 0, 1, 1])).write_npy(&d).unwrap();
        let r = meshc(&args);
        assert_eq!(r.status, Some(1), "{cmd}: {r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
        assert!(r.stderr.contains("node 'q': integer division by zero"), "{cmd}: {r:?}");
    }
}

/// A NaN in a weights file is valid (onnxruntime runs such a model), so it is not refused,
/// but `check`, `interp`, `compile` and `run` each warn in one line naming the param and
/// counting; a trained param (`--loss`) holding NaN or infinity is refused.
#[test]
fn nan_params_are_reported_and_trained_ones_must_be_finite() {
    let tmp = scratch("trust-nan");
    let w = tmp.join("w.npy");
    let mut v = vec![0.5f32; 12];
    v[3] = f32::NAN;
    v[7] = f32::NEG_INFINITY;
    Tensor::f32(vec![3, 4], v).write_npy(&w).unwrap();
    let g = tmp.join("g.txt");
    std::fs::write(
        &g,
        "graph g {\n  input x: f32[2, 3]\n  param w: f32[3, 4] = file(\"w.npy\")\n  y = matmul(x, w)\n  l = reduce_sum(y)\n  output y, l\n}\n",
    )
    .unwrap();
    let x = tmp.join("x.npy");
    Tensor::f32(vec![2, 3], vec![1.0; 6]).write_npy(&x).unwrap();
    let (g, xa) = (g.display().to_string(), format!("x={}", x.display()));
    let art = tmp.join("g.mshc").display().to_string();
    let want = format!("warning: {g}: param 'w' holds 1 NaN and 1 infinite values of 12\n");
    for args in [
        vec!["check", &g],
        vec!["interp", &g, "--input", &xa],
        vec!["compile", &g, "-o", &art],
        vec!["run", &g, "--input", &xa],
    ] {
        let r = meshc(&args);
        assert_eq!(r.status, Some(0), "{args:?}: {r:?}");
        assert!(r.stderr.starts_with(&want), "{args:?}: {r:?}");
    }
    let r = meshc(&["compile", &g, "--loss", "l", "--optimizer", "sgd:0.1", "-o", &art]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert!(
        r.stderr.ends_with("param 'w' is trained (--wrt) but holds 1 NaN and 1 infinite values of 12: every update would spread them\n"),
        "{r:?}"
    );
}

/// The artifact runtime/tests/meshc_run.rs runs is what meshc compiles today from its
/// graph: a change of the format or of code generation shows here first, with the command
/// that brings the file up to date.
#[test]
fn the_artifact_meshc_run_is_tested_on_is_current() {
    let tmp = scratch("trust-meshc-run");
    let art = tmp.join("small.mshc");
    let r = meshc(&["compile", "testdata/meshc_run/graph.txt", "--target", "x86-64-v2", "-o", art.to_str().unwrap()]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(
        std::fs::read(&art).unwrap() == std::fs::read("testdata/meshc_run/small.mshc").unwrap(),
        "testdata/meshc_run/small.mshc is stale: meshc compile testdata/meshc_run/graph.txt --target x86-64-v2 -o testdata/meshc_run/small.mshc"
    );
}
