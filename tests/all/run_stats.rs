//! `meshc run --link-stats` and `--trace` through the real binary, on one device and on a
//! 2×4 torus: the link report names neighbouring links only and ends with their maximum; the
//! trace is Chrome trace-event JSON with one named track per device and an event per step.

use std::path::Path;

use crate::common::{input_args, meshc, scratch};

/// Runs the MLP (with `layout`, if any) with both flags; returns stdout and the trace.
fn run(layout: Option<&str>, name: &str) -> (String, serde_json::Value) {
    let graph = Path::new("testdata/mlp/graph.json");
    let dir = scratch(name);
    let trace = dir.join("trace.json");
    let mut args = vec!["run".to_string(), graph.display().to_string()];
    if let Some(l) = layout {
        args.extend(["--layout".to_string(), l.to_string()]);
    }
    args.extend(input_args(graph));
    args.extend(["--link-stats".to_string(), "--trace".to_string(), trace.display().to_string()]);
    let r = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(r.status, Some(0), "{r:?}");
    let json = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    (r.stdout, json)
}

fn events<'a>(trace: &'a serde_json::Value, ph: &str) -> Vec<&'a serde_json::Value> {
    trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == ph).collect()
}

#[test]
fn one_device_has_no_links_and_one_track() {
    let (out, trace) = run(None, "single");
    assert!(out.ends_with("\nmax link bytes 0\n"), "{out}");
    let names: Vec<&str> = events(&trace, "M").iter().filter_map(|e| e["args"]["name"].as_str()).collect();
    assert_eq!(names, ["mlp", "device 0 (0)"]);
    let steps = events(&trace, "X");
    assert!(!steps.is_empty() && steps.iter().all(|e| e["tid"] == 0 && e["dur"].as_f64().is_some()));
    assert!(steps.iter().all(|e| ["kernel", "library"].contains(&e["cat"].as_str().unwrap())));
}

#[test]
fn a_torus_reports_neighbour_links_and_a_track_per_device() {
    let (out, trace) = run(Some("testdata/mlp/layouts/torus-2x4.json"), "torus");
    let mut max = 0;
    let mut lines = out.lines().skip_while(|l| !l.starts_with("link "));
    for line in lines.by_ref().take_while(|l| l.starts_with("link ")) {
        // "link (0,1) -> (0,2) 8192 bytes": neighbours along one axis of the 2×4 torus.
        let w: Vec<&str> = line.split(' ').collect();
        let c = |s: &str| -> Vec<usize> { s.trim_matches(['(', ')']).split(',').map(|x| x.parse().unwrap()).collect() };
        let (a, b) = (c(w[1]), c(w[3]));
        let steps: Vec<usize> = (0..2).map(|i| (b[i] + [2, 4][i] - a[i]) % [2, 4][i]).collect();
        assert!(matches!(steps[..], [1, 0] | [0, 1] | [0, 3]), "{line}");
        max = max.max(w[4].parse::<u64>().unwrap());
    }
    assert!(max > 0, "{out}");
    // The spec names a degraded link: the fault-free plan's maximum follows.
    assert!(out.contains(&format!("\nmax link bytes {max}\nfault-free max link bytes ")), "{out}");
    let tracks: Vec<String> =
        events(&trace, "M").iter().skip(1).map(|e| e["args"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(tracks.len(), 8);
    assert_eq!(tracks[6], "device 6 (1,2)");
    let x = events(&trace, "X");
    for d in 0..8 {
        assert!(x.iter().any(|e| e["tid"] == d && e["cat"] == "collective"), "device {d}");
    }
}
