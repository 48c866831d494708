//! Placement and send/recv through the real binary. The placed specs of testdata
//! (`testdata/*/layouts/{stages,pipeline}-*.json`, `design-2x4`, `embed-on-0`: explicit and
//! automatic stages, with and without per-stage layouts, stages sharing devices, with and
//! without micro-batches, with sub-axis layouts carried across stages)
//! already give the single-device answer in tests/all/distributed.rs (reference execution,
//! `meshc run GRAPH`, compiled artifacts); here:
//! - each states the transfers it costs (`TRANSFERS`), read from `meshc inspect`;
//! - the dumps after `place` and `sendrecv` are pinned in golden/place/, and `inspect` of a
//!   placed artifact in golden/inspect/;
//! - the auto placer cuts a graph that does not fit one device's `memory_per_device` over
//!   several, gives the single-device answer, and says by how much a graph fits nowhere;
//! - explicit placements that cannot be honoured are refused with a one-line error.

use crate::common::{golden, input_args, layout_cases, meshc, scratch, LayoutCase};

/// A send/recv pair as stated: (key, bytes, protocol).
type Pair = (&'static str, usize, &'static str);

/// The send/recv pairs of each placed spec. A tensor moves once per destination device, in
/// the pieces the destination's layout needs.
#[rustfmt::skip]
const TRANSFERS: &[(&str, &[Pair])] = &[
    // The example of docs/layout.md: h and a on row 0, y on the whole mesh (the default). Devices 0-3
    // keep the rows of a they hold for y (a local slice), devices 4-7 receive theirs.
    ("mlp-design-2x4", &[
        ("a.stage1:0->4", 2048, "move"), ("a.stage1:1->5", 2048, "move"), ("a.stage1:2->6", 2048, "move"),
        ("a.stage1:3->7", 2048, "move"),
    ]),
    // Micro-batches: one transfer per micro-batch, in micro-batch order.
    ("mlp-pipeline-2", &[
        ("a.mb0:0->1", 4096, "move"), ("a.mb1:0->1", 4096, "move"), ("a.mb2:0->1", 4096, "move"), ("a.mb3:0->1", 4096, "move"),
    ]),
    ("mlp-stages-2", &[("a:0->1", 16384, "move")]),
    // a leaves split on hidden over devices 0-3 and arrives split on batch over 4-7: every
    // destination takes a quarter of its rows from each source, nothing is gathered first.
    ("mlp-stages-2x4", &[
        ("a:0->4", 1024, "move"), ("a:0->5", 1024, "move"), ("a:0->6", 1024, "move"), ("a:0->7", 1024, "move"),
        ("a:1->4", 1024, "move"), ("a:1->5", 1024, "move"), ("a:1->6", 1024, "move"), ("a:1->7", 1024, "move"),
        ("a:2->4", 1024, "move"), ("a:2->5", 1024, "move"), ("a:2->6", 1024, "move"), ("a:2->7", 1024, "move"),
        ("a:3->4", 1024, "move"), ("a:3->5", 1024, "move"), ("a:3->6", 1024, "move"), ("a:3->7", 1024, "move"),
    ]),
    // The embedding on device 0, the rest on the whole 2x2 mesh: h goes to the others by
    // their batch rows; device 0 keeps its own.
    ("transformer-embed-on-0", &[("h.stage1:0->1", 1024, "move"), ("h.stage1:0->2", 1024, "move"), ("h.stage1:0->3", 1024, "move")]),
    // Auto-placed in 4 stages of 2 devices, qkv and hidden split over model: h (replicated)
    // goes from each device to its counterpart, q (split) piece by piece.
    ("transformer-pipeline-4x2", &[
        ("h.mb0:0->2", 1024, "copy"), ("q.mb0:0->2", 512, "move"), ("h.mb1:0->2", 1024, "copy"), ("q.mb1:0->2", 512, "move"),
        ("h.mb0:1->3", 1024, "copy"), ("q.mb0:1->3", 512, "move"), ("h.mb1:1->3", 1024, "copy"), ("q.mb1:1->3", 512, "move"),
        ("h2.mb0:2->4", 1024, "copy"), ("h2.mb0:2->6", 1024, "move"), ("h2.mb1:2->4", 1024, "copy"), ("h2.mb1:2->6", 1024, "move"),
        ("h2.mb0:3->5", 1024, "copy"), ("h2.mb0:3->7", 1024, "move"), ("h2.mb1:3->5", 1024, "copy"), ("h2.mb1:3->7", 1024, "move"),
        ("f1_b.mb0:4->6", 2048, "move"), ("f1_b.mb1:4->6", 2048, "move"), ("f1_b.mb0:5->7", 2048, "move"), ("f1_b.mb1:5->7", 2048, "move"),
    ]),
    // Sub-axes under a placement, micro-batched: ctx leaves stage 0 as [-, model:(1)2, -,
    // model:(2)2] and stage 1 reads it with the two factors swapped, so device 1 (heads
    // block 0, head_dim block 1) sends to device 6 and device 2 to device 5.
    ("transformer-pipeline-sub-2x4", &[
        ("h.mb0:0->4", 1024, "copy"), ("ctx.mb0:0->4", 256, "move"), ("h.mb1:0->4", 1024, "copy"), ("ctx.mb1:0->4", 256, "move"),
        ("h.mb0:1->5", 1024, "copy"), ("ctx.mb0:1->6", 256, "move"), ("h.mb1:1->5", 1024, "copy"), ("ctx.mb1:1->6", 256, "move"),
        ("h.mb0:2->6", 1024, "copy"), ("ctx.mb0:2->5", 256, "move"), ("h.mb1:2->6", 1024, "copy"), ("ctx.mb1:2->5", 256, "move"),
        ("h.mb0:3->7", 1024, "copy"), ("ctx.mb0:3->7", 256, "move"), ("h.mb1:3->7", 1024, "copy"), ("ctx.mb1:3->7", 256, "move"),
    ]),
    // h is still read on device 0 after it is sent (q, k, v): copied; the others move.
    ("transformer-stages-2", &[("h:0->1", 2048, "copy"), ("v_h:0->1", 2048, "move"), ("probs:0->1", 2048, "move")]),
    ("transformer-stages-3", &[("h:0->1", 2048, "copy"), ("h:0->2", 2048, "move"), ("ctx_r:1->2", 2048, "move")]),
    // Sub-axes under a placement: ctx, split over 2 heads blocks x 2 head_dim halves on
    // stage 0, is read in the same layout on stage 1: each device sends its counterpart its block.
    ("transformer-stages-sub-2x4", &[
        ("h:0->4", 2048, "copy"), ("ctx:0->4", 512, "move"), ("h:1->5", 2048, "copy"), ("ctx:1->5", 512, "move"),
        ("h:2->6", 2048, "copy"), ("ctx:2->6", 512, "move"), ("h:3->7", 2048, "copy"), ("ctx:3->7", 512, "move"),
    ]),
    // h split on batch (stage 0) goes whole to stage 1 and split on seq to stage 2; ctx_r
    // split on qkv goes split on seq; h2 split on seq goes whole to both devices of stage 3.
    ("transformer-stages-4x2", &[
        ("h:0->2", 1024, "copy"), ("h:0->3", 1024, "copy"), ("h:0->4", 512, "move"), ("h:0->5", 512, "move"),
        ("h:1->2", 1024, "copy"), ("h:1->3", 1024, "copy"), ("h:1->4", 512, "move"), ("h:1->5", 512, "move"),
        ("ctx_r:2->4", 512, "move"), ("ctx_r:2->5", 512, "move"), ("ctx_r:3->4", 512, "move"), ("ctx_r:3->5", 512, "move"),
        ("h2:4->6", 1024, "copy"), ("h2:4->7", 1024, "move"), ("h2:5->6", 1024, "copy"), ("h2:5->7", 1024, "move"),
    ]),
];

fn placed_cases() -> Vec<LayoutCase> {
    let cases: Vec<LayoutCase> = layout_cases()
        .into_iter()
        .filter(|c| std::fs::read_to_string(&c.spec).unwrap().contains("\"placement\""))
        .collect();
    assert!(cases.len() >= 9, "expected the placed specs of mlp and transformer, found {}", cases.len());
    cases
}

fn compile(graph: &str, spec: &str, out: &std::path::Path, extra: &[&str]) -> crate::common::Run {
    let mut args = vec!["compile", graph, "--layout", spec, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    meshc(&args)
}

/// The `transfers:` section of `meshc inspect`: (key, bytes, protocol).
fn transfers(inspect: &str) -> Vec<(String, usize, String)> {
    inspect
        .lines()
        .skip_while(|l| !l.starts_with("transfers:"))
        .skip(1)
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[6].parse().unwrap(), w[8].to_string())
        })
        .collect()
}

#[test]
fn every_placed_spec_costs_the_stated_transfers() {
    let dir = scratch("placement-transfers");
    let mut failures = Vec::new();
    for c in placed_cases() {
        let art = dir.join(format!("{}.mshc", c.label));
        let run = compile(c.graph.to_str().unwrap(), c.spec.to_str().unwrap(), &art, &[]);
        assert_eq!(run.status, Some(0), "{run:?}");
        let inspect = meshc(&["inspect", art.to_str().unwrap()]);
        let got = transfers(&inspect.stdout);
        let Some((_, want)) = TRANSFERS.iter().find(|(l, _)| *l == c.label) else {
            failures.push(format!("{}: no entry in TRANSFERS; it costs {got:?}", c.label));
            continue;
        };
        let want: Vec<(String, usize, String)> =
            want.iter().map(|(k, b, p)| (k.to_string(), *b, p.to_string())).collect();
        if got != want {
            failures.push(format!("{}: transfers {got:?}, stated {want:?}", c.label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The placed specs whose `place` and `sendrecv` dumps are pinned whole: a pipeline of
/// micro-batches over sub-meshes, and stages that are slices of a 2x4 mesh. The small
/// cases are in tests/passes/place and tests/passes/sendrecv; every placed spec's transfers
/// are stated above and its results checked.
const PINNED_PLACEMENTS: &[&str] = &["transformer-pipeline-4x2", "mlp-stages-2x4"];

#[test]
fn dumps_after_place_and_sendrecv_are_pinned() {
    let dir = scratch("placement-dumps");
    let mut failures = Vec::new();
    let cases: Vec<LayoutCase> =
        placed_cases().into_iter().filter(|c| PINNED_PLACEMENTS.contains(&c.label.as_str())).collect();
    assert_eq!(cases.len(), PINNED_PLACEMENTS.len(), "a pinned spec is missing from testdata");
    for c in cases {
        let art = dir.join(format!("{}.mshc", c.label));
        let run =
            compile(c.graph.to_str().unwrap(), c.spec.to_str().unwrap(), &art, &["--dump-after", "place,sendrecv"]);
        assert_eq!(run.status, Some(0), "{run:?}");
        failures.extend(golden(&format!("place/{}.txt", c.label), &run.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn inspect_of_a_placed_artifact_is_pinned() {
    let dir = scratch("placement-inspect");
    let art = dir.join("mlp-stages-2x4.mshc");
    let fixed = ["--target", "x86-64-v3", "--gemm", "cranelift"];
    let run = compile("testdata/mlp/graph.json", "testdata/mlp/layouts/stages-2x4.json", &art, &fixed);
    assert_eq!(run.status, Some(0), "{run:?}");
    let inspect = meshc(&["inspect", art.to_str().unwrap()]);
    assert_eq!(inspect.status, Some(0), "{inspect:?}");
    golden("inspect/mlp-stages-2x4.txt", &inspect.stdout.replace(art.to_str().unwrap(), "mlp-stages-2x4.mshc"))
        .unwrap();
}

/// Runs `graph` compiled with `spec` (written to the scratch dir) against its expected
/// outputs; returns the compile's result.
fn compile_and_run(name: &str, graph: &str, spec: &str) -> crate::common::Run {
    let dir = scratch(&format!("placement-{name}"));
    let spec_file = dir.join(format!("{name}.json"));
    std::fs::write(&spec_file, spec).unwrap();
    let art = dir.join(format!("{name}.mshc"));
    let dump: &[&str] = if spec.contains("placement") { &["--dump-after", "place"] } else { &[] };
    let run = compile(graph, spec_file.to_str().unwrap(), &art, dump);
    if run.status != Some(0) {
        return run;
    }
    let graph = std::path::Path::new(graph);
    let expected = graph.parent().unwrap().join("expected");
    let mut args = vec!["run".to_string(), art.display().to_string()];
    args.extend(input_args(graph));
    args.extend(["--check-against".into(), expected.display().to_string()]);
    let ran = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(ran.status, Some(0), "{name}: {ran:?}");
    run
}

fn auto_spec(devices: usize, stages: usize, memory: usize) -> String {
    format!(
        r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [{devices}], "axes": ["stage"]}},
            "placement": {{"auto": {{"stages": {stages}}}}}, "memory_per_device": {memory}}}"#
    )
}

#[test]
fn the_auto_placer_splits_a_graph_too_big_for_one_device() {
    // The MLP needs 160 KiB on one device (w1 and w2, 64 KiB each, and h and a, 16 KiB
    // each, live at once), and fits 100000 bytes per device only cut in two.
    let one = compile_and_run("mlp-1", "testdata/mlp/graph.json", &auto_spec(1, 1, 100_000));
    assert_eq!(one.status, Some(1));
    assert!(
        one.stderr.contains(
            "memory_per_device 100000 bytes: the graph does not fit in 1 stage(s): the best cut needs 163840 bytes on a \
             device, 63840 bytes more than the budget"
        ),
        "{}",
        one.stderr
    );
    let two = compile_and_run("mlp-2", "testdata/mlp/graph.json", &auto_spec(2, 2, 100_000));
    assert_eq!(two.status, Some(0), "{two:?}");
    assert!(two.stdout.contains("cut stage 0 -> stage 1: 16384 bytes (h)"), "{}", two.stdout);
    // Nothing fits 70000 bytes: the error says by how much the best cut misses.
    let none = compile_and_run("mlp-none", "testdata/mlp/graph.json", &auto_spec(2, 2, 70_000));
    assert_eq!(none.status, Some(1));
    assert!(none.stderr.contains("the best cut needs 98304 bytes on a device, 28304 bytes more"), "{}", none.stderr);
}

#[test]
fn the_auto_placer_cuts_the_transformer_into_2_3_and_4_stages() {
    for stages in [2, 3, 4] {
        let run = compile_and_run(
            &format!("transformer-auto-{stages}"),
            "testdata/transformer/graph.json",
            &auto_spec(stages, stages, 1 << 30),
        );
        assert_eq!(run.status, Some(0), "{run:?}");
        golden(&format!("place/transformer-auto-{stages}.txt"), &run.stdout).unwrap();
    }
    // Over a 2-D mesh the stages are rows, laid out by the spec's rules within each.
    let spec = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2, 2], "axes": ["stage", "model"]},
        "rules": {"qkv": "model", "hidden": "model"}, "placement": {"auto": {"stages": 2}}}"#;
    let run = compile_and_run("transformer-auto-2x2", "testdata/transformer/graph.json", spec);
    assert_eq!(run.status, Some(0), "{run:?}");
}

#[test]
fn placements_that_cannot_be_honoured_are_refused() {
    let dir = scratch("placement-refused");
    let cases: &[(&str, &str)] = &[
        (r#"[{"nodes": ["hh"], "devices": "0,*"}]"#, "placement: entry 1: graph 'mlp' has no node or input 'hh'"),
        (
            r#"[{"nodes": ["w1"], "devices": "0,*"}]"#,
            "entry 1: 'w1' is a param; params are placed with the nodes that read them",
        ),
        (
            r#"[{"nodes": ["h"], "devices": "0,*"}, {"nodes": ["h"], "devices": "1,*"}]"#,
            "entry 2: 'h' is placed by entry 1 already",
        ),
        (
            r#"[{"nodes": ["h"], "devices": "0,*"}, {"nodes": ["y"], "devices": "0,*", "rules": {}}]"#,
            "entry 2: layouts or rules for stage 0 are given by an earlier entry already",
        ),
        (
            r#"[{"nodes": ["h"], "devices": "2,*"}]"#,
            "entry 1: devices \"2,*\": '2' is not a non-empty range of axis 'data' (size 2)",
        ),
        (r#"[{"nodes": ["h"], "devices": 8}]"#, "entry 1: device 8 does not exist (the mesh has 8 devices)"),
        (
            r#"[{"nodes": ["h"], "device": 0}]"#,
            "unknown field `device`, expected one of `nodes`, `devices`, `layouts`, `rules`",
        ),
        (r#"[]"#, "placement: the list is empty"),
        (
            r#"[{"nodes": ["h"], "devices": "0,*", "layouts": {"h": ["model", null]}}]"#,
            "layout of 'h': dim 0 (size 16) does not divide by mesh axis 'model' (size 3)",
        ),
        (r#"{"auto": {"stages": 3}}"#, "placement: auto: no axis of the mesh [2, 4] divides into 3 equal sub-meshes"),
        (r#"{"auto": {"stages": 0}}"#, "placement: auto: \"stages\" must be a positive number"),
        (
            r#"{"stages": [{"nodes": ["h"], "devices": "0,*"}], "microbatches": 3}"#,
            "placement: microbatches: the batch of 'x' (size 16) does not divide into 3 micro-batches",
        ),
        (
            r#"{"auto": {"stages": 2}, "microbatches": 0}"#,
            "placement: \"microbatches\": 0 is not a number of micro-batches (1 to 1024)",
        ),
    ];
    for (placement, want) in cases {
        let mesh = if placement.contains("\"layouts\"") { "[1, 3]" } else { "[2, 4]" };
        let spec = dir.join("spec.json");
        std::fs::write(
            &spec,
            format!(
                r#"{{"format": "meshc-layout/1", "mesh": {{"shape": {mesh}, "axes": ["data", "model"]}}, "placement": {placement}}}"#
            ),
        )
        .unwrap();
        let run = compile("testdata/mlp/graph.json", spec.to_str().unwrap(), &dir.join("x.mshc"), &[]);
        assert_eq!(run.status, Some(1), "{placement}: {run:?}");
        assert!(run.stderr.contains(want) && run.stderr.lines().count() == 1, "{placement}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"));
    }
    let run = meshc(&["compile", "testdata/mlp/graph.json", "-o", "/dev/null", "--dump-after", "place"]);
    assert_eq!(run.status, Some(1));
    assert!(run.stderr.contains("--dump-after place needs a layout spec with a \"placement\""), "{}", run.stderr);
}

#[test]
fn micro_batches_run_in_gpipe_order_in_the_trace() {
    let dir = scratch("placement-trace");
    let trace = dir.join("trace.json");
    let graph = std::path::Path::new("testdata/mlp/graph.json");
    let mut args = vec!["run".to_string(), graph.display().to_string()];
    args.extend(["--layout".into(), "testdata/mlp/layouts/pipeline-2.json".into()]);
    args.extend(input_args(graph));
    args.extend(["--trace".into(), trace.display().to_string()]);
    let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(run.status, Some(0), "{run:?}");
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let steps = |tid: u64| -> Vec<String> {
        let events = t["traceEvents"].as_array().unwrap().iter();
        let steps = events.filter(|e| e["ph"] == "X" && e["tid"] == tid && e["cat"] != "wait");
        steps.map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    // Stage 0 slices, computes and sends micro-batch k before it starts k+1 (the schedule of
    // `passes::streams` slices each micro-batch just before it is needed, which keeps one
    // slice live instead of four); stage 1 receives and computes k before k+1, then
    // concatenates the output. The relu `a` after the matmul `h` is its epilogue: one step.
    let mb = |k: usize, names: &[&str]| names.iter().map(|n| format!("{n}.mb{k}")).collect::<Vec<_>>();
    let sent = |k: usize| vec![format!("a.mb{k}.send")];
    let want0: Vec<String> = (0..4).flat_map(|k| [mb(k, &["x", "a"]), sent(k)].concat()).collect();
    assert_eq!(steps(0), want0, "device 0");
    let got1 = steps(1);
    let want1: Vec<String> = (0..4).flat_map(|k| mb(k, &["a", "y"])).chain(["y".to_string()]).collect();
    assert_eq!(got1, want1, "device 1");
}

/// One random placement of a testdata graph: every node on a random row of a
/// `rows x cols` mesh or on the whole mesh (stages need not be contiguous: a tensor may go
/// back and forth; the whole mesh shares its devices with every row), each stage with
/// random rules, optionally micro-batched.
fn random_placement(graph: &str, rows: usize, cols: usize, picks: &[u8], rules: &[u8], microbatches: usize) -> String {
    let g = meshc_ir::load::load(std::path::Path::new(graph)).unwrap().0;
    // Rules whose dims divide by the axis sizes here (the transformer's batch of 2 only by 2).
    let choices: &[&str] = if graph.contains("mlp") {
        &[r#"{}"#, r#"{"batch": "model"}"#, r#"{"hidden": "model"}"#, r#"{"embed": "model"}"#]
    } else if cols == 2 {
        &[
            r#"{}"#,
            r#"{"batch": "model"}"#,
            r#"{"qkv": "model", "hidden": "model"}"#,
            r#"{"seq": "model"}"#,
            r#"{"embed": "model"}"#,
        ]
    } else {
        &[r#"{}"#, r#"{"heads": "model", "qkv": "model"}"#, r#"{"seq": "model"}"#, r#"{"embed": "model"}"#]
    };
    // A micro-batch of the transformer holds one sequence: nothing left to split.
    let choices: Vec<&str> = choices
        .iter()
        .copied()
        .filter(|c| !(graph.contains("transformer") && microbatches > 1 && c.contains("batch")))
        .collect();
    // Stage `rows` is the whole mesh: it shares every device with the others.
    let mut stages: Vec<Vec<&str>> = vec![Vec::new(); rows + 1];
    for (n, p) in g.nodes.iter().zip(picks.iter().cycle()) {
        stages[*p as usize % (rows + 1)].push(&n.name);
    }
    let entries: Vec<String> = stages
        .iter()
        .enumerate()
        .filter(|(_, nodes)| !nodes.is_empty())
        .map(|(r, nodes)| {
            let names: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
            let rule = choices[rules[r % rules.len()] as usize % choices.len()];
            let devices = if r == rows { "*,*".to_string() } else { format!("{r},*") };
            format!(r#"{{"nodes": [{}], "devices": "{devices}", "rules": {rule}}}"#, names.join(", "))
        })
        .collect();
    format!(
        r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [{rows}, {cols}], "axes": ["stage", "model"]}},
            "placement": {{"stages": [{}], "microbatches": {microbatches}}}}}"#,
        entries.join(", ")
    )
}

type Case =
    (meshc_ir::Graph, meshc_ir::verify::Info, std::collections::HashMap<String, meshc_ir::Tensor>, meshc::layout::Spec);

/// The testdata `graph` with its params, and the layout spec text `spec`.
fn load_case(graph: &str, spec: &str) -> Result<Case, String> {
    let path = std::path::Path::new(graph);
    let (g, info) = meshc_ir::load::load(path).map_err(|e| e.to_string())?;
    let params = meshc_ir::params::load_all(&g, path.parent().unwrap()).map_err(|e| e.to_string())?;
    let spec = meshc::layout::parse(spec, "random.json").map_err(|e| e.to_string())?;
    Ok((g, info, params, spec))
}

/// A testdata graph (the MLP or the transformer) and a random placement of it: the mesh
/// shape, stage picks and per-stage rules, micro-batched or not (`random_placement`).
fn placements() -> impl proptest::strategy::Strategy<Value = (&'static str, String)> {
    use proptest::prelude::*;
    let picks = proptest::collection::vec(0u8..8, 1..40);
    (any::<bool>(), 0usize..4, picks, proptest::collection::vec(0u8..8, 4), any::<bool>()).prop_map(
        |(transformer, shape, picks, rules, microbatched)| {
            let (rows, cols) = [(2, 2), (3, 2), (4, 2), (2, 4)][shape];
            let graph = if transformer { "testdata/transformer/graph.json" } else { "testdata/mlp/graph.json" };
            (graph, random_placement(graph, rows, cols, &picks, &rules, if microbatched { 2 } else { 1 }))
        },
    )
}

/// Places, lowers and joins `graph` under `spec` in-process and runs the per-device programs
/// on the reference execution (transfers included); compares with expected/.
fn reference_run(graph: &str, spec: &str) -> Result<(), String> {
    let (path, (g, info, params, spec)) = (std::path::Path::new(graph), load_case(graph, spec)?);
    let (lowered, _) = meshc::driver::lower_spec(&g, &info, &spec).map_err(|e| format!("{e:#}"))?;
    let inputs = crate::common::testdata_inputs(path, &g).map_err(|e| e.to_string())?;
    let got = meshc::mesh_interp::run(&lowered, &params, &inputs).map_err(|e| format!("{e:#}"))?;
    crate::common::matches_expected(path, &got)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, failure_persistence: None, ..Default::default() })]

    /// Any placement with any per-stage rules, micro-batched or not, gives the single-device
    /// answer, and its transfers never deadlock.
    #[test]
    fn random_placements_give_the_single_device_result((graph, spec) in placements()) {
        if let Err(e) = reference_run(graph, &spec) {
            proptest::prop_assert!(false, "{spec}\n{e}");
        }
    }
}

/// As `reference_run`, compiled and run by the runner (device threads, the exchange).
fn compiled_run(graph: &str, spec: &str) -> Result<(), String> {
    let (path, (g, info, params, spec)) = (std::path::Path::new(graph), load_case(graph, spec)?);
    let opts = meshc::compile::Options::default();
    let c = meshc::driver::Job::new(&g, &info, &params, &opts)
        .spec(Some(&spec))
        .build(&Default::default())
        .map_err(|e| format!("{e:#}"))?;
    let l = c.load().map_err(|e| format!("{e:#}"))?;
    let inputs = crate::common::testdata_inputs(path, &g).map_err(|e| e.to_string())?;
    for _ in 0..2 {
        crate::common::matches_expected(path, &l.run(&inputs).map_err(|e| format!("{e:#}"))?)?;
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, failure_persistence: None, ..Default::default() })]

    /// The same through code generation and the runner: every transfer pairs up, moves or
    /// copies the right bytes, and the run (twice, reusing the arenas) gives the answer.
    #[test]
    fn random_placements_compiled_give_the_single_device_result((graph, spec) in placements()) {
        if let Err(e) = compiled_run(graph, &spec) {
            proptest::prop_assert!(false, "{spec}\n{e}");
        }
    }
}

#[test]
fn memory_per_device_is_checked_on_every_device() {
    // Megatron-style over 2 devices: each holds half of w1 and w2 (64 KiB) and a 12 KiB arena.
    let spec = |memory: usize| {
        format!(
            r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [2], "axes": ["model"]}},
                "rules": {{"hidden": "model"}}, "memory_per_device": {memory}}}"#
        )
    };
    let over = compile_and_run("mlp-mp-over", "testdata/mlp/graph.json", &spec(70_000));
    assert_eq!(over.status, Some(1));
    assert!(
        over.stderr.contains(
            "memory_per_device 70000 bytes: device 0 needs 77824 bytes (weights 65536 + arena 12288), 7824 more"
        ),
        "{}",
        over.stderr
    );
    let fits = compile_and_run("mlp-mp-fits", "testdata/mlp/graph.json", &spec(77_824));
    assert_eq!(fits.status, Some(0), "{fits:?}");
}

#[test]
fn a_broken_artifact_times_out_naming_the_key_and_both_devices() {
    // transformer-stages-2 sends h (copied: device 0 still reads it), v_h and probs from
    // device 0 to device 1. Device 1 is made to wait for probs before taking h: device 0 is
    // stuck handing h over, device 1 waits for a send that never comes. The pairs still
    // match, so the artifact loads; the run must end after --timeout, not hang.
    let graph = std::path::Path::new("testdata/transformer/graph.json");
    let (g, info) = meshc_ir::load::load(graph).unwrap();
    let params = meshc_ir::params::load_all(&g, graph.parent().unwrap()).unwrap();
    let spec = meshc::layout::load(std::path::Path::new("testdata/transformer/layouts/stages-2.json")).unwrap();
    let opts = meshc::compile::Options { emit: meshc::compile::Emit::Artifact, ..Default::default() };
    let mut c =
        meshc::driver::Job::new(&g, &info, &params, &opts).spec(Some(&spec)).build(&Default::default()).unwrap();
    let steps = &mut c.programs[1].steps;
    let key = |s: &meshc_runtime::format::program::Step| match &s.exec {
        meshc_runtime::format::program::Exec::Recv(t) => t.key.clone(),
        _ => String::new(),
    };
    let h = steps.iter().position(|s| key(s) == "h:0->1").unwrap();
    let probs = steps.iter().position(|s| key(s) == "probs:0->1").unwrap();
    let moved = steps.remove(probs);
    steps.insert(h, moved);
    let dir = scratch("placement-broken");
    let art = dir.join("broken.mshc");
    meshc::artifact::write_artifact(&c, &art, None).unwrap();
    let mut args = vec!["run".to_string(), art.display().to_string(), "--timeout".into(), "0.5".into()];
    args.extend(input_args(graph));
    let start = std::time::Instant::now();
    let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(start.elapsed() < std::time::Duration::from_secs(20), "{run:?}");
    assert_eq!(run.status, Some(1), "{run:?}");
    let recv = "recv 'probs:0->1' on device 1 from device 0: no send came within 500ms";
    let send = "send 'h:0->1' from device 0 to device 1: the recv was not ready after 500ms";
    assert!(run.stderr.contains(recv) || run.stderr.contains(send), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    // A timeout must be a positive number of seconds.
    let bad = meshc(&["run", art.to_str().unwrap(), "--timeout", "0"]);
    assert!(bad.stderr.contains("--timeout 0: expected a positive number of seconds"), "{bad:?}");
}

#[test]
fn check_reports_the_stages_and_their_layouts() {
    let run = meshc(&[
        "check",
        "testdata/transformer/graph.json",
        "--layout",
        "testdata/transformer/layouts/stages-4x2.json",
    ]);
    assert_eq!(run.status, Some(0), "{run:?}");
    // Every tensor of the stage, with where its layout came from.
    let stage2 = run.stdout.split("stage 2: devices [4,5] (slice 2,0:2), 4 nodes\n").nth(1).expect("stage 2");
    let stage2 = stage2.split("stage 3:").next().unwrap();
    assert!(stage2.contains("  layout res1 [-, model, -] (spec)\n"), "{}", run.stdout);
    assert!(stage2.contains("  layout h [-, model, -] (propagated from res1)\n"), "{}", run.stdout);
    assert!(stage2.contains("  layout wo [-, -] (replicated)\n"), "{}", run.stdout);
    assert_eq!(stage2.lines().count(), 10, "{stage2}");
}

/// The auto placer cuts the nodes an output needs: a node nothing reads used to make stage
/// 0 on its own, which the placer then refused ("stage 0 computes nothing any other stage
/// or output needs"). It now joins its operands' stage, and the run gives the graph's result.
#[test]
fn auto_placement_ignores_nodes_nothing_reads() {
    let dir = scratch("auto-dead-node");
    let graph = dir.join("g.txt");
    std::fs::write(
        &graph,
        "graph g {\n  input x: f32[4,8]\n  param w: f32[8,8] = init normal{seed = 3, std = 0.5}\n  dead = relu(x)\n  \
         h = matmul(x, w)\n  y = tanh(h)\n  output y\n}\n",
    )
    .unwrap();
    let spec = dir.join("auto.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["stage"]}, "placement": {"auto": {"stages": 2}}}"#,
    )
    .unwrap();
    let (g, s) = (graph.to_str().unwrap(), spec.to_str().unwrap());
    let check = meshc(&["check", g, "--layout", s]);
    assert_eq!(check.status, Some(0), "{check:?}");
    assert!(
        check.stdout.contains("stage 0: devices [0]") && check.stdout.contains("stage 1: devices [1]"),
        "{check:?}"
    );
    let x = dir.join("x.npy");
    meshc_ir::Tensor::f32(vec![4, 8], (0..32).map(|i| i as f32 / 10.0).collect()).write_npy(&x).unwrap();
    let input = format!("x={}", x.display());
    let (one, two) = (dir.join("one"), dir.join("two"));
    let single = meshc(&["run", g, "--input", &input, "--output-dir", one.to_str().unwrap()]);
    assert_eq!(single.status, Some(0), "{single:?}");
    let placed = meshc(&["run", g, "--layout", s, "--input", &input, "--output-dir", two.to_str().unwrap()]);
    assert_eq!(placed.status, Some(0), "{placed:?}");
    assert_eq!(std::fs::read(one.join("y.npy")).unwrap(), std::fs::read(two.join("y.npy")).unwrap());
}
