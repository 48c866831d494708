//! The testdata graphs spread over meshes: every layout spec `testdata/<graph>/layouts/<layout>.json`
//! (data parallel, Megatron-style model parallel, 1-D, 2-D, 3-D and torus meshes) must give the
//! single-device answer, `testdata/<graph>/expected/`, under the tolerance of `Tensor::closeness`:
//! - lowered in-process and run by the reference execution of per-device programs (`mesh_interp`);
//! - through the real binary: `meshc run GRAPH --layout SPEC`, and `meshc compile` to an artifact
//!   then `meshc run ARTIFACT`.
//!
//! Each spec also states what it costs: the collectives each device runs are listed in
//! `COMMUNICATION`, so a lowering change that adds a transfer fails here even when a bless
//! would accept the new dump. The dumps after `layout` and `lower` are pinned in
//! golden/lower/<graph>-<layout>.txt and `meshc inspect` of one multi-device artifact in
//! golden/inspect/; MESHC_BLESS=1 rewrites those.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::{
    compare_expected, golden, input_args, layout_cases, matches_expected, meshc, scratch, testdata_inputs, LayoutCase,
};
use anyhow::{Context, Result};
use meshc::passes::layout::propagate;
use meshc::passes::lower::{lower, Lowered};
use meshc_ir::Tensor;

fn cases() -> Vec<LayoutCase> {
    let cases = layout_cases();
    assert!(cases.len() >= 14, "expected the layouts of mlp and transformer, found {} specs", cases.len());
    cases
}

/// A collective as `COMMUNICATION` states it: (op, node, mesh axes).
type Stated = (&'static str, &'static str, &'static [&'static str]);

/// A collective as a lowered program has it: (op, node, groups of devices).
type Collective = (String, String, Vec<Vec<i64>>);

/// The collectives every device of a case runs, in program order: (op, the lowered node it
/// defines, the mesh axes its groups span). Data-parallel inference needs none; Megatron-style
/// layouts one all_reduce after each row-split matmul — a reduce_scatter where only
/// elementwise ops lead from it to outputs the spec leaves free (which then stay split); the
/// rest what their splits imply.
#[rustfmt::skip]
const COMMUNICATION: &[(&str, &[Stated])] = &[
    // The batch passes through convs and pools; only scatter_elements along the batch axis
    // (sc_0) reads its data and updates whole.
    ("cnn-dp-2", &[
        ("all_gather", "su.all_gather", &["data"]),
        ("all_gather", "a.all_gather", &["data"]),
        ("all_gather", "su2.all_gather", &["data"]),
    ]),
    // Output channels split: the depthwise conv and the pools keep the split, the grouped
    // conv (groups = 2 < C) gathers its input, the head contracts over the split channels
    // into a free output, so its partial sum is reduce-scattered and logits stay split.
    ("cnn-mp-2", &[("all_gather", "r1.all_gather", &["model"]), ("reduce_scatter", "logits", &["model"])]),
    // Both: the batch rule fixes the batch dims only, so the flattened features keep their
    // channels split and the head's partial sums are all-reduced into logits (whose batch
    // dim the rule pins, so they are not left split).
    ("cnn-dp-mp-2x2", &[
        ("all_gather", "r1.all_gather", &["model"]),
        ("all_reduce", "logits", &["model"]),
        ("all_gather", "su.all_gather", &["data"]),
        ("all_gather", "a.all_gather", &["data"]),
        ("all_gather", "su2.all_gather", &["data"]),
    ]),
    // Megatron-style decoding: the heads' caches stay split and are updated where they
    // are; one all_reduce after attention's output projection, one after the MLP.
    ("decoder-heads-2", &[("all_reduce", "o", &["model"]), ("all_reduce", "f2", &["model"])]),
    ("mlp-cube-2x2x2", &[("all_reduce", "h", &["row"]), ("all_reduce", "y", &["col"])]),
    ("mlp-dp-2", &[]),
    ("mlp-dp-2x4", &[]),
    ("mlp-mp-2x4", &[("all_reduce", "y", &["model"])]),
    ("mlp-mp-4", &[("all_reduce", "y", &["model"])]),
    // y is an output the spec leaves free (mp-4 gives it [-, -]).
    ("mlp-mp-8", &[("reduce_scatter", "y", &["model"])]),
    // x split on embed, the dim h contracts: the all_reduce moves to h.
    ("mlp-torus-2x4", &[("all_reduce", "h", &["model"])]),
    // Sequence split: keys, values and the mask are gathered along seq for attention.
    ("transformer-cube-2x2x2", &[
        ("all_gather", "k_t.all_gather", &["seq"]),
        ("all_gather", "mask.all_gather", &["seq"]),
        ("all_gather", "v_h.all_gather", &["seq"]),
        ("all_reduce", "o", &["model"]),
        ("all_reduce", "f2", &["model"]),
    ]),
    // One replica per device: the gradient means and the loss over the whole torus.
    ("dp_train-torus-4x4", &[
        ("all_reduce", "loss", &["dx", "dy"]),
        ("all_reduce", "g1", &["dx", "dy"]),
        ("all_reduce", "g2", &["dx", "dy"]),
    ]),
    ("transformer-dp-2", &[]),
    ("transformer-dp-2x4", &[]),
    // mp-8's plan, written out with sub-axes in the spec.
    ("transformer-heads-8", &[
        ("all_reduce", "scores", &["model:(4)2"]),
        ("all_reduce", "o", &["model"]),
        ("reduce_scatter", "f2", &["model"]),
    ]),
    // The rule batch -> data pins f2, f2_b and y: f2 stays an all_reduce.
    ("transformer-mp-2x4", &[("all_reduce", "o", &["model"]), ("all_reduce", "f2", &["model"])]),
    // f2 reaches the free output y through adds only: reduce-scattered, y left split on seq.
    ("transformer-mp-4", &[("all_reduce", "o", &["model"]), ("reduce_scatter", "f2", &["model"])]),
    // 8 shards of qkv over 4 heads x 2 halves of head_dim (model:(1)4, model:(4)2): the
    // scores are partial sums over the halves, added by one all_reduce within each pair.
    ("transformer-mp-8", &[
        ("all_reduce", "scores", &["model:(4)2"]),
        ("all_reduce", "o", &["model"]),
        ("reduce_scatter", "f2", &["model"]),
    ]),
    // probs split on heads, h2 on embed, and the hidden rule splits every hidden dim: both
    // layer_norms combine their two statistics over model and gather their result for the
    // matmuls that read it whole; the attention context and the FFN's activations are
    // gathered where their readers contract. Nothing is computed twice (before rules left
    // the other dims open, 109% of the FLOPs were replicated here).
    ("transformer-torus-2x4", &[
        ("all_reduce", "h.all_reduce", &["model"]),
        ("all_reduce", "h.all_reduce2", &["model"]),
        ("all_gather", "h.all_gather", &["model"]),
        ("all_gather", "ctx_r.all_gather", &["model"]),
        ("all_reduce", "h2.all_reduce", &["model"]),
        ("all_reduce", "h2.all_reduce2", &["model"]),
        ("all_gather", "h2.all_gather", &["model"]),
        ("all_gather", "f1_a.all_gather", &["model"]),
    ]),
];

/// Lowers `c` in-process as `meshc compile` does, and runs the per-device programs on the
/// reference execution.
fn lower_and_run(c: &LayoutCase) -> Result<(Lowered, BTreeMap<String, Tensor>)> {
    let (g, info) = meshc_ir::load::load(&c.graph)?;
    let params = meshc_ir::params::load_all(&g, c.graph.parent().unwrap())?;
    let spec = meshc::layout::load(&c.spec)?;
    let lowered = match spec.placement {
        Some(_) => meshc::driver::lower_spec(&g, &info, &spec)?.0,
        None => lower(&g, &info, &propagate(&g, &info, &spec.mesh, spec.seed_layouts(&g, &info)?))?,
    };
    let results = meshc::mesh_interp::run(&lowered, &params, &testdata_inputs(&c.graph, &g)?)?;
    Ok((lowered, results))
}

/// The collectives of each device's program, as (op, node, groups).
fn collectives(l: &Lowered) -> Vec<Vec<Collective>> {
    l.devices
        .iter()
        .map(|g| {
            g.nodes
                .iter()
                .filter(|n| n.op.is_communication())
                .map(|n| {
                    let groups = n.groups().unwrap();
                    (n.op.name().to_string(), n.name.clone(), groups)
                })
                .collect()
        })
        .collect()
}

fn communication_as_stated(c: &LayoutCase, l: &Lowered) -> Result<(), String> {
    let (_, stated) = COMMUNICATION
        .iter()
        .find(|(label, _)| *label == c.label)
        .ok_or_else(|| "no entry in COMMUNICATION: state the collectives this layout costs".to_string())?;
    let mesh = &l.mesh;
    let want: Vec<Collective> = stated
        .iter()
        .map(|(op, node, axes)| {
            let axes: Vec<usize> = axes
                .iter()
                .map(|a| meshc::layout::resolve_entry(mesh, &meshc::layout::AxisRef::Name(a.to_string())))
                .collect::<Result<_, _>>()
                .expect("a mesh axis of the spec");
            let groups = mesh.groups(&axes).into_iter().map(|g| g.into_iter().map(|d| d as i64).collect()).collect();
            (op.to_string(), node.to_string(), groups)
        })
        .collect();
    for (d, got) in collectives(l).into_iter().enumerate() {
        if got != want {
            return Err(format!("device {d} runs collectives {got:?}, the layout should cost {want:?}"));
        }
    }
    Ok(())
}

#[test]
fn reference_execution_of_every_layout_gives_the_expected_outputs() {
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| {
            let r = lower_and_run(c)
                .with_context(|| c.spec.display().to_string())
                .map_err(|e| format!("{e:#}"))
                .and_then(|(lowered, results)| {
                    if lowered.devices.len() != lowered.mesh.devices() {
                        return Err(format!(
                            "{} programs for {} devices",
                            lowered.devices.len(),
                            lowered.mesh.devices()
                        ));
                    }
                    // Placed specs state their transfers in tests/all/placement.rs instead.
                    if lowered.io_stages.is_empty() {
                        communication_as_stated(c, &lowered)?;
                    }
                    matches_expected(&c.graph, &results)
                });
            r.err().map(|e| format!("{}: {e}", c.label))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_stated_communication_has_its_spec() {
    let labels: Vec<String> = cases().into_iter().map(|c| c.label).collect();
    let stale: Vec<&str> = COMMUNICATION.iter().map(|(l, _)| *l).filter(|l| !labels.iter().any(|x| x == l)).collect();
    assert!(stale.is_empty(), "COMMUNICATION names layouts that have no spec: {stale:?}");
}

/// The testdata specs whose `layout` and `lower` dumps are pinned whole: models and meshes
/// the small cases of tests/passes/lower do not reach (attention over a 2x4 mesh, heads on
/// sub-axes, convs split two ways, a training step on a torus, a 3-D mesh). Every spec's
/// lowering is checked against its stated communication and the reference run above.
const PINNED_LOWERINGS: &[&str] =
    &["transformer-mp-2x4", "transformer-heads-8", "cnn-dp-mp-2x2", "dp_train-torus-4x4", "mlp-cube-2x2x2"];

#[test]
fn dumps_after_layout_and_lower_are_pinned() {
    let dir = scratch("distributed-dumps");
    let mut failures = Vec::new();
    let cases: Vec<LayoutCase> = cases().into_iter().filter(|c| PINNED_LOWERINGS.contains(&c.label.as_str())).collect();
    assert_eq!(cases.len(), PINNED_LOWERINGS.len(), "a pinned spec is missing from testdata");
    for c in cases {
        let art = dir.join(format!("{}.mshc", c.label));
        let (graph, spec) = (c.graph.display().to_string(), c.spec.display().to_string());
        let run =
            meshc(&["compile", &graph, "--layout", &spec, "--dump-after", "layout,lower", "-o", art.to_str().unwrap()]);
        if run.status != Some(0) {
            failures.push(format!("meshc compile {graph} --layout {spec}: {run:?}"));
            continue;
        }
        failures.extend(golden(&format!("lower/{}.txt", c.label), &run.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Runs `meshc run PROGRAM` on the case's inputs, writing the outputs to `out`; the binary
/// checks them against expected/ itself, and so does this test.
fn run_and_compare(c: &LayoutCase, program: &Path, extra: &[&str], out: &Path) -> Result<(), String> {
    let expected = c.graph.parent().unwrap().join("expected");
    let mut args = vec!["run".to_string(), program.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(input_args(&c.graph));
    args.extend(["--check-against".into(), expected.display().to_string(), "--output-dir".into()]);
    args.push(out.display().to_string());
    let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    if run.status != Some(0) || run.stdout.contains("FAILED") {
        return Err(format!("meshc {}: {run:?}", args.join(" ")));
    }
    compare_expected(&c.graph, out).map(|_| ())
}

#[test]
fn run_graph_with_each_layout_gives_the_expected_outputs() {
    let dir = scratch("distributed-run");
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| {
            let spec = c.spec.display().to_string();
            run_and_compare(c, &c.graph, &["--layout", &spec], &dir.join(&c.label)).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn compiled_multi_device_artifacts_give_the_expected_outputs() {
    let dir = scratch("distributed-artifacts");
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|c| {
            let art = dir.join(format!("{}.mshc", c.label));
            let (graph, spec) = (c.graph.display().to_string(), c.spec.display().to_string());
            let compiled = meshc(&["compile", &graph, "--layout", &spec, "-o", art.to_str().unwrap()]);
            if compiled.status != Some(0) {
                return Some(format!("meshc compile {graph} --layout {spec}: {compiled:?}"));
            }
            run_and_compare(c, &art, &[], &dir.join(&c.label)).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn inspect_of_a_multi_device_artifact_is_pinned() {
    let dir = scratch("distributed-inspect");
    let art = dir.join("mlp-mp-2x4.mshc");
    // A fixed target and GEMM choice keep the pinned text independent of the host.
    let args = ["--layout", "testdata/mlp/layouts/mp-2x4.json", "--target", "x86-64-v3", "--gemm", "cranelift"];
    let c = meshc(&[&["compile", "testdata/mlp/graph.json", "-o", art.to_str().unwrap()][..], &args[..]].concat());
    assert_eq!(c.status, Some(0), "{c:?}");
    let run = meshc(&["inspect", art.to_str().unwrap()]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let text = run.stdout.replace(&art.display().to_string(), "mlp-mp-2x4.mshc");
    golden("inspect/mlp-mp-2x4.txt", &text).unwrap();
}

/// The stream options through the binary: every collective on the communication stream
/// (traced on its own track), two compute streams, one stream — all give the expected
/// outputs on every layout of the transformer with collectives that can overlap.
#[test]
fn stream_options_give_the_expected_outputs_and_trace_each_stream() {
    let dir = scratch("distributed-streams");
    let case = cases().into_iter().find(|c| c.label == "transformer-mp-8").expect("the layout");
    let spec = case.spec.display().to_string();
    let trace = dir.join("trace.json");
    let options: [&[&str]; 3] = [
        &["--comm-stream", "always", "--trace", trace.to_str().unwrap()],
        &["--compute-streams", "2", "--comm-stream", "always"],
        &["--single-stream"],
    ];
    for extra in options {
        let args = [&["--layout", spec.as_str()][..], extra].concat();
        run_and_compare(&case, &case.graph, &args, &dir.join("out")).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let comm = events.iter().find(|e| e["args"]["name"] == "device 7 (7) s1 comm").expect("a comm track");
    let on_comm = events.iter().filter(|e| e["tid"] == comm["tid"] && e["cat"] == "collective").count();
    assert!(on_comm > 0, "no collective on device 7's comm stream");
}

/// Eight devices on a machine of fewer cores take turns at the cores for their long GEMMs
/// (`meshc_runtime::exec::gate`): an MLP on a 2×4 mesh whose every GEMM is long enough to
/// wait for a core gives the one-device answer, and the same bits run after run.
#[test]
fn long_gemms_of_more_devices_than_cores_give_the_one_device_answer() {
    let graph = "graph gated {
  input x: f32[512,1024] dims(batch, embed)
  param w1: f32[1024,1024] dims(embed, hidden) = init normal{seed = 1, std = 0.03}
  param w2: f32[1024,1024] dims(hidden, embed) = init normal{seed = 2, std = 0.03}
  h = matmul(x, w1)
  a = relu(h)
  y = matmul(a, w2)
  output y
}";
    let spec = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2, 4], "axes": ["data", "model"]},
  "rules": {"batch": "data", "hidden": "model"}}"#;
    let g = meshc_ir::text::parse(graph).unwrap();
    let info = meshc_ir::verify::verify(&g).unwrap();
    let params = meshc_ir::params::load_all(&g, Path::new(".")).unwrap();
    let spec = meshc::layout::parse(spec, "gated").unwrap();
    let build = |spec| {
        let opts = meshc::compile::Options::default();
        let job = meshc::driver::Job::new(&g, &info, &params, &opts).spec(spec);
        job.build(&meshc::pipeline::Dumps::default()).unwrap().load().unwrap()
    };
    let x: Vec<f32> = (0..512 * 1024).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
    let inputs =
        std::collections::HashMap::from([("x".to_string(), Tensor::new(vec![512, 1024], meshc_ir::Data::F32(x)))]);
    let one = build(None).run(&inputs).unwrap().remove("y").unwrap();
    let mesh = build(Some(&spec));
    let first = mesh.run(&inputs).unwrap().remove("y").unwrap();
    let c = first.closeness(&one);
    assert!(c.first_bad.is_none(), "{c:?}");
    for _ in 0..3 {
        assert!(mesh.run(&inputs).unwrap()["y"] == first);
    }
}
