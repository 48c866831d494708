//! The pipeline's table (`meshc::pipeline::PASSES`) and what the command line does with
//! it: `--stop-after PASS` stops after the pass, prints its IR as `--dump-after` would and
//! writes no artifact (`compile` and `check`); `--time-passes` reports the wall time of
//! every pass that ran.

use crate::common::{meshc, scratch};
use meshc::pipeline::{Level, DOT_NAMES, NAMES, PASSES};

const MLP: &str = "testdata/mlp/graph.json";
const MP: &str = "testdata/mlp/layouts/mp-2x4.json";
const STAGES: &str = "testdata/mlp/layouts/stages-2.json";

/// driver runs the global and stage passes, then compile the device and program ones: the
/// table lists them in that order, each name once, and the derived name lists agree.
#[test]
fn the_table_lists_front_passes_before_back_ones_each_name_once() {
    let front = PASSES.iter().take_while(|p| p.level.is_front()).count();
    assert!(PASSES[front..].iter().all(|p| !p.level.is_front()), "a global or stage pass after a device pass");
    assert!(matches!(PASSES[front].level, Level::Device(_)), "the back starts with the device passes");
    let mut names = NAMES.to_vec();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), PASSES.len(), "a pass name twice: {NAMES:?}");
    assert_eq!(NAMES.to_vec(), PASSES.iter().map(|p| p.name).collect::<Vec<_>>());
    assert_eq!(DOT_NAMES.to_vec(), PASSES.iter().filter(|p| p.dot).map(|p| p.name).collect::<Vec<_>>());
    assert_eq!(DOT_NAMES, ["place", "lower", "sendrecv", "streams"]);
}

/// Stopping after a pass prints exactly what `--dump-after` prints of it, and writes no
/// artifact even when `-o` names one; a later pass is neither dumped nor run.
#[test]
fn stop_after_prints_the_pass_and_writes_nothing() {
    let dir = scratch("stop-after");
    let art = dir.join("mlp.mshc");
    let art = art.to_str().unwrap();
    for pass in ["layout", "lower", "fold", "codegen", "buffers"] {
        let full = meshc(&["compile", MLP, "--layout", MP, "-o", art, "--dump-after", pass]);
        assert_eq!(full.status, Some(0), "{full:?}");
        std::fs::remove_file(art).unwrap();
        let stop = meshc(&["compile", MLP, "--layout", MP, "-o", art, "--stop-after", pass, "--dump-after", "fuse"]);
        assert_eq!(stop.status, Some(0), "{stop:?}");
        // fuse runs after fold and codegen after it: with --stop-after fold, fuse prints nothing.
        let before_fuse = NAMES.iter().position(|p| *p == pass) < NAMES.iter().position(|p| *p == "fuse");
        if before_fuse {
            assert_eq!(stop.stdout, full.stdout, "--stop-after {pass}");
        } else {
            assert!(stop.stdout.ends_with(&full.stdout) && stop.stdout.starts_with("device 0: "), "{}", stop.stdout);
        }
        assert!(!std::path::Path::new(art).exists(), "--stop-after {pass} wrote {art}");
        assert!(stop.stderr.is_empty(), "{}", stop.stderr);
    }
    // No -o is needed when nothing is written.
    let r = meshc(&["compile", MLP, "--stop-after", "verify"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert_eq!(r.stdout, meshc(&["fmt", MLP, "--to", "text"]).stdout, "verify prints the graph as read");
}

/// With `--dump-dir` the stopped pass's dump is the last file, and the dot form works too.
#[test]
fn stop_after_writes_its_dump_where_the_dumps_go() {
    let dir = scratch("stop-after-dir");
    let dumps = dir.join("dumps");
    let d = dumps.to_str().unwrap();
    let r = meshc(&[
        "compile",
        MLP,
        "--layout",
        STAGES,
        "--stop-after",
        "sendrecv",
        "--dump-after",
        "all",
        "--dump-dir",
        d,
    ]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let mut files: Vec<String> =
        std::fs::read_dir(&dumps).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files, ["01-verify.txt", "03-place.txt", "04-layout.txt", "05-lower.txt", "06-sendrecv.txt"]);
    let r = meshc(&["compile", MLP, "--layout", STAGES, "--stop-after", "place", "--dump-format", "dot"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stdout.starts_with("digraph"), "{}", r.stdout);
}

/// `check --stop-after` prints the IR instead of the summary, with the spec given.
#[test]
fn check_stops_after_a_pass_instead_of_summarising() {
    let summary = meshc(&["check", MLP]);
    assert!(summary.stdout.starts_with("graph 'mlp'"), "{summary:?}");
    let r = meshc(&["check", MLP, "--layout", MP, "--stop-after", "lower"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let dir = scratch("check-stop-after");
    let art = dir.join("mlp.mshc");
    let compiled = meshc(&["compile", MLP, "--layout", MP, "-o", art.to_str().unwrap(), "--stop-after", "lower"]);
    assert_eq!(r.stdout, compiled.stdout);
    assert!(r.stdout.starts_with("# device 0 (0,0)\ngraph mlp {"), "{}", r.stdout);
    let r = meshc(&["check", MLP, "--stop-after", "buffers"]);
    assert!(r.status == Some(0) && r.stdout.starts_with("device 0: ") && r.stdout.contains("arena"), "{r:?}");
}

/// `--time-passes`: one row per pass that ran (those that cannot run are not listed), the
/// slowest first, their shares summing to the total.
#[test]
fn time_passes_reports_every_pass_that_ran() {
    let dir = scratch("time-passes");
    let art = dir.join("mlp.mshc");
    let r = meshc(&["compile", MLP, "--layout", MP, "-o", art.to_str().unwrap(), "--time-passes"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(art.exists(), "the artifact is written as usual");
    assert!(r.stderr.contains("Pass execution timing report"), "{}", r.stderr);
    let rows: Vec<(f64, &str)> = (r.stderr.lines())
        .filter_map(|l| {
            let (time, rest) = l.trim().split_once(" (")?;
            Some((time.parse().ok()?, rest.split_once(")  ")?.1))
        })
        .collect();
    let (total, passes) = rows.split_last().unwrap();
    assert_eq!(total.1, "Total");
    let mut ran: Vec<&str> = passes.iter().map(|r| r.1).collect();
    ran.sort_by_key(|p| NAMES.iter().position(|n| n == p));
    let placed = ["pilot", "place", "sendrecv"];
    assert_eq!(ran, NAMES.iter().filter(|p| !placed.contains(p)).copied().collect::<Vec<_>>(), "{}", r.stderr);
    assert!(passes.windows(2).all(|w| w[0].0 >= w[1].0), "slowest first: {}", r.stderr);
    let sum: f64 = passes.iter().map(|r| r.0).sum();
    assert!((sum - total.0).abs() <= 1e-4 * passes.len() as f64, "{sum} vs {}", total.0);
    // Stopped early, only the passes that ran are timed.
    let r = meshc(&["check", MLP, "--stop-after", "fold", "--time-passes"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stderr.contains("  expand\n") && r.stderr.contains("  fold\n") && !r.stderr.contains("fuse"), "{r:?}");
}

/// A pass that cannot run, or an unknown one, is refused before anything is printed; the
/// flags that make an artifact do not go with `--stop-after`.
#[test]
fn stop_after_refuses_what_it_cannot_do() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["compile", MLP, "--stop-after", "lower", "--dump-after", "verify"],
            "--stop-after lower needs a layout spec",
        ),
        (
            &["compile", MLP, "--layout", MP, "--stop-after", "sendrecv"],
            "--stop-after sendrecv needs a layout spec with a \"placement\"",
        ),
        (&["check", MLP, "--stop-after", "pilot"], "--stop-after pilot needs pilot inputs"),
        (&["compile", MLP, "--stop-after", "parse"], "--stop-after: unknown pass 'parse' (passes: verify, pilot,"),
        (&["compile", MLP, "--stop-after", "fold", "--dump-format", "dot"], "pass 'fold' has no dot form"),
        (&["compile", MLP, "--stop-after", "fold", "--MF", "x.d"], "cannot be used with"),
        (&["check", MLP, "--time-passes"], "required arguments were not provided: --stop-after"),
        (&["compile", MLP], "required arguments were not provided: -o"),
    ];
    for (args, want) in cases {
        let r = meshc(args);
        assert_eq!(r.status, Some(1), "{args:?}: {r:?}");
        assert!(r.stdout.is_empty() && r.stderr.lines().count() == 1, "{args:?}: {r:?}");
        assert!(r.stderr.contains(want), "{args:?}: {}", r.stderr);
    }
}
