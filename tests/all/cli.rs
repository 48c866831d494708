//! The command line through the real `meshc` binary: every user error leaves with exit
//! status 1, one line on stderr (pinned in golden/cli/<case>.txt) and no panic; `fmt`
//! round-trips every testdata graph; `interp --output` writes exactly what it is asked to.
//! `make golden` (MESHC_BLESS=1) rewrites the pinned messages instead.

use crate::common::{golden, meshc, scratch, testdata_graphs, Run};
use std::path::{Path, PathBuf};

const MLP: &str = "testdata/mlp/graph.json";
const MLP_X: &str = "x=testdata/mlp/inputs/x.npy";

/// Checks that `args` fail like a user error should: exit 1, nothing on stdout, exactly one
/// line on stderr that is not a panic; then compares that line with golden/cli/`case`.txt.
fn user_error(case: &str, args: &[&str]) -> Result<(), String> {
    let run = meshc(args);
    let what = format!("{case}: meshc {}", args.join(" "));
    if run.status != Some(1) || !run.stdout.is_empty() || run.stderr.lines().count() != 1 {
        return Err(format!("{what}: expected exit 1, empty stdout and one stderr line, got {run:?}"));
    }
    if run.stderr.contains("panicked") || run.stderr.contains("RUST_BACKTRACE") {
        return Err(format!("{what}: panicked: {}", run.stderr));
    }
    if !run.stderr.starts_with("error: ") {
        return Err(format!("{what}: the message should start with 'error: ', got {:?}", run.stderr));
    }
    golden(&format!("cli/{case}.txt"), &run.stderr)
}

/// Runs every case and reports all failures at once.
pub(crate) fn all_user_errors(cases: &[(&str, &[&str])]) {
    let failures: Vec<String> = cases.iter().filter_map(|(case, args)| user_error(case, args).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn ok(args: &[&str]) -> Run {
    let run = meshc(args);
    assert_eq!(run.status, Some(0), "meshc {} failed: {run:?}", args.join(" "));
    run
}

#[test]
fn interp_input_errors() {
    all_user_errors(&[
        // transformer has two inputs; only one is given.
        (
            "interp-missing-input",
            &["interp", "testdata/transformer/graph.json", "--input", "ids=testdata/transformer/inputs/ids.npy"],
        ),
        ("interp-no-inputs", &["interp", MLP]),
        ("interp-unknown-input", &["interp", MLP, "--input", MLP_X, "--input", "z=testdata/mlp/inputs/x.npy"]),
        // gelu_mlp's x is f32[8,32]; mlp's is f32[16,64].
        ("interp-input-wrong-shape", &["interp", MLP, "--input", "x=testdata/gelu_mlp/inputs/x.npy"]),
        // all_ops' n is i32[4,6]; its x is f32[4,6]: only the dtype differs.
        (
            "interp-input-wrong-dtype",
            &["interp", "testdata/all_ops/graph.json", "--input", "x=testdata/all_ops/inputs/n.npy"],
        ),
        ("interp-input-nonexistent", &["interp", MLP, "--input", "x=testdata/mlp/inputs/no_such_file.npy"]),
        ("interp-input-truncated", &["interp", MLP, "--input", "x=testdata/bad/weights/w_truncated.npy"]),
        ("interp-input-not-npy", &["interp", MLP, "--input", "x=testdata/bad/weights/not_npy.npy"]),
        ("interp-input-fortran", &["interp", MLP, "--input", "x=testdata/bad/weights/w_fortran.npy"]),
        ("interp-input-float64", &["interp", MLP, "--input", "x=testdata/bad/weights/w_f64.npy"]),
        ("interp-input-is-directory", &["interp", MLP, "--input", "x=testdata/mlp/inputs"]),
        ("interp-input-without-equals", &["interp", MLP, "--input", "testdata/mlp/inputs/x.npy"]),
        ("interp-input-empty-name", &["interp", MLP, "--input", "=testdata/mlp/inputs/x.npy"]),
        ("interp-input-empty-file", &["interp", MLP, "--input", "x="]),
        ("interp-input-twice", &["interp", MLP, "--input", MLP_X, "--input", MLP_X]),
        ("interp-input-without-value", &["interp", MLP, "--input"]),
    ]);
}

#[test]
fn interp_output_errors() {
    let dir = scratch("output-errors");
    let h = format!("h={}", dir.join("h.npy").display());
    all_user_errors(&[
        // `h` is a node of mlp but not one of its outputs.
        ("interp-output-not-an-output", &["interp", MLP, "--input", MLP_X, "--output", &h]),
        ("interp-output-without-equals", &["interp", MLP, "--input", MLP_X, "--output", "y"]),
        ("interp-output-unwritable", &["interp", MLP, "--input", MLP_X, "--output", "y=/nonexistent-meshc-dir/y.npy"]),
        (
            "interp-output-and-output-dir",
            &["interp", MLP, "--input", MLP_X, "--output", "y=y.npy", "--output-dir", "out"],
        ),
        // A bad graph fails the same way under interp as under check.
        ("interp-bad-graph", &["interp", "testdata/bad/verify-cycle.json"]),
        (
            "interp-bad-param",
            &["interp", "testdata/bad/param-truncated-npy.json", "--input", "x=testdata/bad/weights/x.npy"],
        ),
    ]);
    assert!(!dir.join("h.npy").exists(), "a refused --output must not write its file");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing may be written on error");
}

/// A bool param whose file holds a byte other than 0 or 1 is refused by every command that
/// reads it, as a bool input is: compiled code would take it as true in one place and false
/// in another, the interpreter as true everywhere.
#[test]
fn bool_params_with_other_bytes_are_refused() {
    let dir = scratch("bool-param-byte");
    let art = dir.join("bad.mshc").display().to_string();
    let graph = "testdata/bad/param-npy-bool-byte.json";
    let x = "x=testdata/bad/weights/w.npy";
    all_user_errors(&[
        ("interp-bool-param-byte", &["interp", graph, "--input", x]),
        ("compile-bool-param-byte", &["compile", graph, "-o", &art]),
    ]);
    assert!(!Path::new(&art).exists(), "a refused compile must not write its artifact");
}

/// Names holding ESC and other control characters (an OSC that retitles the terminal, a
/// CSI that clears it, a C1 CSI) reach stdout escaped from every command that prints them,
/// as they reach stderr in errors: the text a terminal would obey never leaves meshc.
#[test]
fn control_characters_in_names_are_printed_escaped() {
    let dir = scratch("control-names");
    let graph = dir.join("g.txt");
    std::fs::write(
        &graph,
        "graph \"g\\u001b]0;t\\u0007\" {\n  input \"x\\u001b[2J\": f32[2,3]\n  \"h\\u009b31m\" = relu(\"x\\u001b[2J\")\n  y = neg(\"h\\u009b31m\")\n  output y\n}\n",
    )
    .unwrap();
    let (g, art) = (graph.display().to_string(), dir.join("g.mshc").display().to_string());
    let layout = dir.join("l.json");
    std::fs::write(
        &layout,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["d"]}, "layouts": {"x*": [0, null]}}"#,
    )
    .unwrap();
    let layout = layout.display().to_string();
    let want = dir.join("want");
    let y = format!("y={}", want.join("y.npy").display());
    let want = want.display().to_string();
    std::fs::create_dir_all(&want).unwrap();
    let input = "x\u{1b}[2J=testdata/bad/weights/x.npy";
    ok(&["interp", &g, "--input", input, "--output", &y]);
    let cases: [(&[&str], &str); 7] = [
        (&["check", &g], "input  x\\u{1b}[2J: f32[2,3]"),
        (&["check", &g, "--layout", &layout], "layout h\\u{9b}31m [d, -] (propagated from x\\u{1b}[2J)"),
        (&["interp", &g, "--input", input], "y: "),
        (&["compile", &g, "-o", &art, "--dump-after", "fuse"], "y <- h\\u{9b}31m, y"),
        (&["inspect", &art], "graph g\\u{1b}]0;t\\u{7} |"),
        (&["run", &art, "--input", input, "--check-against", &want], "check y: "),
        (&["explain", &g, "--layout", &layout], "# explain g\\u{1b}]0;t\\u{7}:"),
    ];
    for (args, shows) in cases {
        let run = ok(args);
        let raw = run.stdout.chars().find(|&c| c.is_control() && c != '\n');
        assert!(raw.is_none(), "meshc {}: prints {raw:?} raw:\n{}", args.join(" "), run.stdout);
        assert!(run.stdout.contains(shows), "meshc {}: no {shows:?} in\n{}", args.join(" "), run.stdout);
    }
}

#[test]
fn file_and_argument_errors() {
    all_user_errors(&[
        ("fmt-nonexistent-graph", &["fmt", "testdata/no_such_graph.json", "--to", "text"]),
        ("check-nonexistent-graph", &["check", "testdata/no_such_graph.txt"]),
        ("check-directory", &["check", "testdata"]),
        ("check-not-utf8", &["check", "testdata/bad/weights/w.npy"]),
        ("fmt-unwritable-output", &["fmt", MLP, "--to", "text", "-o", "/nonexistent-meshc-dir/mlp.txt"]),
        ("fmt-missing-to", &["fmt", MLP]),
        ("fmt-bad-to", &["fmt", MLP, "--to", "yaml"]),
        ("unknown-subcommand", &["frobnicate", MLP]),
        ("unknown-flag", &["check", MLP, "--frobnicate"]),
        ("no-subcommand", &[]),
        ("check-missing-graph", &["check"]),
        ("check-extra-argument", &["check", MLP, MLP]),
        ("check-bad-max-memory", &["check", MLP, "--max-memory", "8x"]),
    ]);
}

#[test]
fn help_and_version_exit_0() {
    for args in [&["--help"][..], &["-h"], &["help"], &["check", "--help"], &["interp", "--help"], &["--version"]] {
        let run = ok(args);
        assert!(run.stderr.is_empty(), "meshc {}: unexpected stderr {:?}", args.join(" "), run.stderr);
        assert!(!run.stdout.is_empty(), "meshc {}: prints nothing", args.join(" "));
    }
    let help = ok(&["--help"]).stdout;
    for cmd in ["check", "fmt", "interp"] {
        assert!(help.contains(cmd), "--help does not mention {cmd}:\n{help}");
    }
}

/// JSON → text → JSON is the identity on the printed form, for every testdata graph; text
/// → text is too, and `-o` writes what stdout shows. `fmt` reads only the graph (not the
/// params), so the text copy may live in a scratch directory.
#[test]
fn fmt_round_trips_every_testdata_graph() {
    let dir = scratch("fmt-round-trip");
    for g in testdata_graphs() {
        let name = g.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        let path = g.display().to_string();
        let json = ok(&["fmt", &path, "--to", "json"]).stdout;
        let text = ok(&["fmt", &path, "--to", "text"]).stdout;
        let text_file = dir.join(format!("{name}.txt"));
        std::fs::write(&text_file, &text).unwrap();
        let text_path = text_file.display().to_string();
        let json_again = ok(&["fmt", &text_path, "--to", "json"]).stdout;
        assert!(
            json == json_again,
            "{name}: JSON -> text -> JSON changed the graph:\n{}",
            first_difference(&json, &json_again)
        );
        let text_again = ok(&["fmt", &text_path, "--to", "text"]).stdout;
        assert!(
            text == text_again,
            "{name}: text -> text changed the graph:\n{}",
            first_difference(&text, &text_again)
        );

        // The canonical JSON reads back as itself, and `-o` writes exactly stdout.
        let json_file = dir.join(format!("{name}.json"));
        ok(&["fmt", &text_path, "--to", "json", "-o", &json_file.display().to_string()]);
        assert_eq!(std::fs::read_to_string(&json_file).unwrap(), json, "{name}: fmt -o differs from stdout");
        let json_json = ok(&["fmt", &json_file.display().to_string(), "--to", "json"]).stdout;
        assert!(
            json == json_json,
            "{name}: canonical JSON is not a fixed point:\n{}",
            first_difference(&json, &json_json)
        );

        // `check` agrees on both forms (it needs the weights, so only the JSON is checked
        // in place; the summary of the text copy would fail on relative weight paths).
        ok(&["check", &path]);
    }
}

fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    for i in 0..la.len().max(lb.len()) {
        if la.get(i) != lb.get(i) {
            return format!(
                "line {}:\n  - {}\n  + {}",
                i + 1,
                la.get(i).unwrap_or(&"<end>"),
                lb.get(i).unwrap_or(&"<end>")
            );
        }
    }
    "identical lines, different line endings".to_string()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

/// `--output NAME=FILE` writes that file and nothing else, holding the expected values;
/// with `--output` nothing goes to stdout.
#[test]
fn interp_output_writes_exactly_that_file() {
    let dir = scratch("interp-output");
    let graph = Path::new("testdata/reductions/graph.json");
    let out = dir.join("the_max.npy");
    let mut args: Vec<String> = vec!["interp".into(), graph.display().to_string()];
    args.extend(crate::common::input_args(graph));
    args.extend(["--output".to_string(), format!("max_1={}", out.display())]);
    let run = ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(run.stdout.is_empty(), "--output should print nothing, got {:?}", run.stdout);
    assert_eq!(files_in(&dir), vec![out.clone()], "exactly the requested file is written");
    let got = meshc_ir::Tensor::read_npy(&out).unwrap();
    let want = meshc_ir::Tensor::read_npy(Path::new("testdata/reductions/expected/max_1.npy")).unwrap();
    crate::common::assert_close("reductions max_1", &got, &want).unwrap();

    // Two outputs, two files.
    let dir2 = scratch("interp-output-two");
    let (a, b) = (dir2.join("a.npy"), dir2.join("b.npy"));
    let mut args: Vec<String> = vec!["interp".into(), graph.display().to_string()];
    args.extend(crate::common::input_args(graph));
    args.extend([
        "--output".into(),
        format!("sum_all={}", a.display()),
        "--output".into(),
        format!("c_sum={}", b.display()),
    ]);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(files_in(&dir2), vec![a.clone(), b.clone()]);
    let want_b = meshc_ir::Tensor::read_npy(Path::new("testdata/reductions/expected/c_sum.npy")).unwrap();
    crate::common::assert_close("reductions c_sum", &meshc_ir::Tensor::read_npy(&b).unwrap(), &want_b).unwrap();
}

/// `--output-dir` writes one NAME.npy per graph output, and nothing else.
#[test]
fn interp_output_dir_writes_every_output() {
    let dir = scratch("interp-output-dir");
    let graph = Path::new("testdata/reductions/graph.json");
    let mut args: Vec<String> = vec!["interp".into(), graph.display().to_string()];
    args.extend(crate::common::input_args(graph));
    args.extend(["--output-dir".to_string(), dir.join("out").display().to_string()]);
    ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let names =
        |d: &Path| files_in(d).iter().map(|p| p.file_name().unwrap().to_string_lossy().to_string()).collect::<Vec<_>>();
    assert_eq!(names(&dir.join("out")), names(Path::new("testdata/reductions/expected")));
    assert_eq!(crate::common::compare_expected(graph, &dir.join("out")), Ok(16));
}

/// Without `--output`, interp prints one summary line per output to stdout.
#[test]
fn interp_prints_a_summary_without_output_flags() {
    let run = ok(&["interp", MLP, "--input", MLP_X]);
    assert!(run.stderr.is_empty(), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{run:?}");
    assert!(lines[0].starts_with("y: f32[16,64] ["), "{run:?}");
}

/// Files that are not regular are refused at once, whatever names them: a device never
/// ends (/dev/zero was read until memory ran out), a FIFO with no writer would block the
/// open forever. Each run must end within seconds with exit 1 and one line.
#[test]
fn non_regular_files_are_refused_at_once() {
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let fifo = fifo.display().to_string();
    let input = format!("x={fifo}");
    let cases: [(&[&str], &str); 6] = [
        (&["check", "/dev/zero"], "error: /dev/zero: cannot read graph: is a device"),
        (&["check", &fifo], "cannot read graph: is a FIFO"),
        (&["check", MLP, "--layout", "/dev/zero"], "error: /dev/zero: cannot read layout spec: is a device"),
        (&["check", MLP, "--layout", &fifo], "cannot read layout spec: is a FIFO"),
        (&["interp", MLP, "--input", &input], "cannot read: is a FIFO"),
        (&["interp", MLP, "--input", "x=/dev/zero"], "error: --input x: /dev/zero: cannot read: is a device"),
    ];
    for (args, want) in cases {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("meshc starts");
        let start = std::time::Instant::now();
        while child.try_wait().expect("waits").is_none() {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().ok();
                panic!("meshc {} hangs", args.join(" "));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "meshc {}: {stderr}", args.join(" "));
        assert_eq!(stderr.lines().count(), 1, "meshc {}: {stderr}", args.join(" "));
        assert!(stderr.trim_end().ends_with(want.trim_start_matches("error: ")), "meshc {}: {stderr}", args.join(" "));
    }
}

/// The interpreter refuses a result over the memory budget (a broadcast to 40 GB, the
/// budget 1 GiB), instead of aborting.
#[test]
fn interp_refuses_results_it_cannot_allocate() {
    let dir = scratch("huge-result");
    let graph = dir.join("g.txt");
    std::fs::write(
        &graph,
        "graph big {\n  input x: f32[4]\n  y = broadcast_to(x) {shape = [2500000000, 4]}\n  output y\n}\n",
    )
    .unwrap();
    let x = dir.join("x.npy");
    meshc_ir::Tensor::f32(vec![4], vec![1.0; 4]).write_npy(&x).unwrap();
    let input = format!("x={}", x.display());
    let run = meshc(&["interp", &graph.display().to_string(), "--input", &input, "--max-memory", "1G"]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(
        run.stderr.trim_end().ends_with(
            "node 'y': its result f32[2500000000,4] needs 37.3 GiB, more than the 1 GiB meshc may allocate (--max-memory)"
        ),
        "{run:?}"
    );
}

/// The memory budget: by default from the memory available, named in the refusal;
/// `--max-memory` sets it on every command that reads graphs and models.
#[test]
fn max_memory_sets_the_budget() {
    let tile = "testdata/bad/onnx-tile-huge.onnx";
    let run = meshc(&["check", tile]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.trim_end().ends_with("meshc may allocate (--max-memory)"), "{run:?}");
    let run = meshc(&["check", tile, "--max-memory", "512M"]);
    assert!(run.stderr.contains("needs 8 TiB, more than the 512 MiB meshc may allocate"), "{run:?}");
    let dir = scratch("max-memory");
    let (art, graph) = (dir.join("mlp.mshc").display().to_string(), dir.join("m.json").display().to_string());
    ok(&["check", MLP, "--max-memory", "8G"]);
    ok(&["interp", MLP, "--input", MLP_X, "--max-memory", "1073741824"]);
    ok(&["compile", MLP, "-o", &art, "--max-memory", "2 GiB"]);
    ok(&["run", MLP, "--input", MLP_X, "--max-memory", "8G"]);
    ok(&["import", "testdata/onnx/mlp/model.onnx", "-o", &graph, "--dim", "batch=2", "--max-memory", "8G"]);
    // Below what the MLP's largest tensor needs, the interpreter refuses it.
    let run = meshc(&["interp", MLP, "--input", MLP_X, "--max-memory", "1K"]);
    assert!(run.status == Some(1) && run.stderr.contains("more than the 1 KiB meshc may allocate"), "{run:?}");
}

/// A weight file truncated while compile reads it is one line, "changed while meshc read
/// it" (or, cut before its header was read, not a valid file), exit 1 — never the SIGBUS
/// of a mapped file (exit 135 before). Compile opens the weights first and reads them last,
/// when it writes the artifact; the file is cut as soon as meshc has it open.
#[test]
fn a_weight_file_truncated_during_compile_is_an_error() {
    let dir = scratch("truncated-weights");
    let (k, n) = (2048, 4096);
    let w = meshc_ir::Tensor::f32(vec![k, n], (0..k * n).map(|i| (i % 7) as f32).collect());
    let weights = dir.join("w.safetensors");
    std::fs::write(&weights, meshc_ir::tensor::safetensors_bytes(&[("w", &w)], None).unwrap()).unwrap();
    let graph = dir.join("g.txt");
    let text = format!(
        "graph g {{\n  input x: f32[2,{k}]\n  param w: f32[{k},{n}] = file(\"w.safetensors\", key = \"w\")\n  \
         y = matmul(x, w)\n  output y\n}}\n"
    );
    std::fs::write(&graph, text).unwrap();
    let art = dir.join("g.mshc");
    for attempt in 0.. {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
            .args(["compile", &graph.display().to_string(), "-o", &art.display().to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("meshc starts");
        // Open, or mapped (as meshc once did, closing the file).
        let (fds, maps) = (format!("/proc/{}/fd", child.id()), format!("/proc/{}/maps", child.id()));
        let open = || {
            let mapped = std::fs::read_to_string(&maps).is_ok_and(|m| m.contains(&*weights.to_string_lossy()));
            mapped
                || std::fs::read_dir(&fds)
                    .map(|d| d.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|p| p == weights)))
                    .unwrap_or(false)
        };
        while !open() && child.try_wait().unwrap().is_none() {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let cut = child.try_wait().unwrap().is_none();
        if cut {
            std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(100).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !cut {
            // meshc was done before the file was seen open: try again, a few times.
            assert!(attempt < 5, "meshc always finished before the file could be cut: {stderr}");
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("w.safetensors: changed while meshc read it")
                || stderr.contains("not a valid .safetensors"),
            "{stderr}"
        );
        break;
    }
}

/// A name of a megabyte is quoted by its first characters and its length, not whole.
#[test]
fn long_names_are_cut_in_messages() {
    let dir = scratch("long-name");
    let graph = dir.join("g.txt");
    let name = "n".repeat(1 << 20);
    std::fs::write(&graph, format!("graph g {{\n  input x: f32[2]\n  y = relu({name})\n  output y\n}}\n")).unwrap();
    let run = meshc(&["check", &graph.display().to_string()]);
    assert_eq!(run.status, Some(1), "{:?}", run.status);
    assert!(run.stderr.len() < 400, "{} bytes: {}", run.stderr.len(), &run.stderr[..400.min(run.stderr.len())]);
    assert!(run.stderr.contains("(1048576 characters)"), "{}", run.stderr);
}

/// The smaller contract fixes, through the binary: options a compiled artifact cannot
/// honour are refused, `--bench 0` is refused, an empty `.mshc` is an artifact error, the
/// flag a message blames is the one given, a spec that leaves no healthy device is refused
/// at compile time, and a closed pipe ends the output quietly.
#[test]
fn options_and_files_are_held_to_what_they_mean() {
    let dir = scratch("contract");
    let art = dir.join("mlp8.mshc").display().to_string();
    ok(&["compile", MLP, "--layout", "testdata/mlp/layouts/mp-8.json", "-o", &art]);
    let fails = |args: &[&str], want: &str| {
        let r = meshc(args);
        assert_eq!(r.status, Some(1), "{args:?}: {r:?}");
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{args:?}: want {want:?}: {r:?}");
    };
    fails(&["run", &art, "--input", MLP_X, "--gemm", "library"], "--gemm applies when a graph is compiled");
    fails(&["run", &art, "--input", MLP_X, "--layout", "x.json"], "--layout applies when a graph is compiled");
    fails(&["run", MLP, "--input", MLP_X, "--bench", "0"], "--bench");
    let empty = dir.join("empty.mshc");
    std::fs::write(&empty, "").unwrap();
    fails(&["run", &empty.display().to_string(), "--input", MLP_X], "not a meshc artifact (empty file)");
    fails(
        &["run", &art, "--input", MLP_X, "--degrade-link", "0:9"],
        "--degrade-link: device '9' is not in the [8] mesh",
    );
    // Three of four devices of a line degraded: the fourth has no healthy neighbour left.
    let spec = dir.join("spec.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [4], "axes": ["data"]}, "rules": {"batch": "data"},
            "degraded": {"nodes": [[1], [2], [3]]}}"#,
    )
    .unwrap();
    let out = dir.join("none.mshc").display().to_string();
    fails(
        &["compile", MLP, "--layout", &spec.display().to_string(), "-o", &out],
        "every device of the [4] mesh is degraded",
    );
    // `inspect | head`: the reader goes away; meshc ends by SIGPIPE (141 in a shell), quietly.
    let script = format!(
        "{} inspect {art} 2>{}/err | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        env!("CARGO_BIN_EXE_meshc"),
        dir.display()
    );
    let out = std::process::Command::new("bash").args(["-c", &script]).output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(status == "141" || status == "0", "status {status}");
    assert_eq!(std::fs::read_to_string(dir.join("err")).unwrap(), "", "nothing on stderr");
}

/// `meshc completions SHELL` prints a completion script generated from the CLI's own
/// definition; an unknown shell is one line listing the known ones.
#[test]
fn completions_are_generated_for_each_shell() {
    for (shell, marker) in [("bash", "_meshc()"), ("zsh", "#compdef meshc"), ("fish", "complete -c meshc")] {
        let run = meshc(&["completions", shell]);
        assert_eq!(run.status, Some(0), "{run:?}");
        assert!(run.stdout.contains(marker) && run.stdout.contains("compile"), "{shell}: {}", run.stdout);
    }
    let bad = meshc(&["completions", "tcsh"]);
    assert_eq!(bad.status, Some(1), "{bad:?}");
    assert!(bad.stderr.contains("possible values: bash"), "{bad:?}");
}

/// `-o -` is standard output where a stream makes sense (fmt) and a one-line refusal where
/// the result must be a file; it never writes a file named `-`.
#[test]
fn dash_is_stdout_or_refused() {
    let dir = crate::common::scratch("dash-output");
    let fmt = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
        .current_dir(&dir)
        .args(["fmt", std::fs::canonicalize("testdata/mlp/graph.json").unwrap().to_str().unwrap(), "--to", "text"])
        .args(["-o", "-"])
        .output()
        .unwrap();
    assert_eq!(fmt.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&fmt.stdout).starts_with("graph mlp {"));
    for args in [
        &["compile", "testdata/mlp/graph.json", "-o", "-"][..],
        &["grad", "testdata/mlp/graph.json", "--loss", "y", "-o", "-"],
        &["keygen", "-o", "-"],
    ] {
        let run = meshc(args);
        assert_eq!(run.status, Some(1), "{args:?}: {run:?}");
        assert!(run.stderr.starts_with("error: -o -: standard output cannot take this"), "{args:?}: {run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    }
    assert!(!dir.join("-").exists() && !std::path::Path::new("-").exists());
}

/// A mistyped input or layout key gets the closest real name ("did you mean"), case first.
#[test]
fn mistyped_names_get_a_suggestion() {
    let run = meshc(&["interp", "testdata/mlp/graph.json", "--input", "X=testdata/mlp/inputs/x.npy"]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert_eq!(run.stderr, "error: --input X: the graph has no input 'X' (did you mean 'x'?) (its inputs: x)\n");
    let dir = crate::common::scratch("did-you-mean");
    let spec = dir.join("spec.json");
    let text = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["model"]}, "layouts": {"W1": [null, "model"]}}"#;
    std::fs::write(&spec, text).unwrap();
    let run = meshc(&["check", "testdata/mlp/graph.json", "--layout", spec.to_str().unwrap()]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.ends_with("layout of 'W1': graph 'mlp' has no tensor 'W1' (did you mean 'w1'?)\n"), "{run:?}");
}

/// `meshc` in `dir` with `stdin` piped in; stdout kept as bytes (it may carry a `.npy`).
fn meshc_piped(dir: &str, args: &[&str], stdin: &[u8]) -> (Option<i32>, Vec<u8>, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
        .current_dir(dir)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A command that refuses before reading closes its end: a broken pipe here is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    (out.status.code(), out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `-` is standard input for a graph (either format, told apart by its first character), a
/// layout spec and an `.npy` input, and standard output for an `--output`; one command
/// reads standard input once. A graph from standard input finds its weights from the
/// working directory.
#[test]
fn dash_is_stdin_for_graphs_specs_and_inputs() {
    let graph = std::fs::read("testdata/mlp/graph.json").unwrap();
    let (status, out, err) = meshc_piped("testdata/mlp", &["check", "-"], &graph);
    assert_eq!(status, Some(0), "{err}");
    assert!(String::from_utf8_lossy(&out).starts_with("graph 'mlp': 1 inputs"));
    let text = meshc(&["fmt", "testdata/mlp/graph.json", "--to", "text"]).stdout;
    let (status, out, err) = meshc_piped("testdata/mlp", &["check", "-"], text.as_bytes());
    assert_eq!(
        (status, String::from_utf8_lossy(&out).lines().next()),
        (Some(0), Some("graph 'mlp': 1 inputs, 2 params (131072 bytes), 3 nodes, 1 outputs")),
        "{err}"
    );
    let spec = std::fs::read("testdata/mlp/layouts/mp-4.json").unwrap();
    let (status, out, err) = meshc_piped(".", &["check", "testdata/mlp/graph.json", "--layout", "-"], &spec);
    assert_eq!(status, Some(0), "{err}");
    assert!(String::from_utf8_lossy(&out).contains("(4 devices)"));
    // An input from stdin, the output to stdout: the .npy bytes the file output would hold.
    let x = std::fs::read("testdata/mlp/inputs/x.npy").unwrap();
    let (status, y, err) =
        meshc_piped(".", &["interp", "testdata/mlp/graph.json", "--input", "x=-", "--output", "y=-"], &x);
    assert_eq!(status, Some(0), "{err}");
    let got = meshc_ir::Tensor::from_npy_bytes(&y).unwrap();
    let want = meshc_ir::Tensor::read_npy(std::path::Path::new("testdata/mlp/expected/y.npy")).unwrap();
    crate::common::assert_close("y", &got, &want).unwrap();
    let (status, _, err) = meshc_piped("testdata/mlp", &["interp", "-", "--input", "x=-"], &graph);
    assert_eq!(status, Some(1));
    assert_eq!(err, "error: --input x: -: standard input is already the graph; give the .npy as a file\n");
}

/// `check --json` and `inspect --json`: the summaries as data, with what the text says.
#[test]
fn check_and_inspect_speak_json() {
    let run = meshc(&["check", "testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/mp-4.json", "--json"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let j: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(j["graph"], "mlp");
    assert_eq!(j["inputs"][0]["shape"], serde_json::json!([16, 64]));
    assert_eq!(j["mesh"]["devices"], 4);
    let w1 = j["layouts"].as_array().unwrap().iter().find(|l| l["tensor"] == "w1").unwrap();
    let text = meshc(&["check", "testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/mp-4.json"]).stdout;
    let line = format!("layout w1 {} ({})", w1["layout"].as_str().unwrap(), w1["origin"].as_str().unwrap());
    assert!(text.lines().any(|l| l == line), "{line} not in {text}");
    let dir = crate::common::scratch("inspect-json");
    let art = dir.join("m.mshc");
    let art = art.to_str().unwrap();
    let run = meshc(&["compile", "testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/mp-4.json", "-o", art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let run = meshc(&["inspect", art, "--json"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let j: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(j["meta"]["inputs"][0]["name"], "x");
    assert_eq!(j["programs"].as_array().unwrap().len(), 4);
    let kinds: Vec<&str> = j["sections"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"meta") && kinds.contains(&"weights"), "{kinds:?}");
}

/// `--dump-after all --dump-format dot` says which passes it leaves out; the artifact goes
/// into /dev/null, which stays the device (renamed over, it was replaced when run as root).
#[test]
fn dot_dumps_name_the_passes_without_a_dot_form() {
    let run = meshc(&[
        "compile",
        "testdata/mlp/graph.json",
        "-o",
        "/dev/null",
        "--dump-after",
        "all",
        "--dump-format",
        "dot",
    ]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(
        run.stderr.contains("note: --dump-after all --dump-format dot dumps place, lower, sendrecv, streams; verify,"),
        "{run:?}"
    );
    let null = std::fs::metadata("/dev/null").unwrap().file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&null), "/dev/null is no longer a device");
}
