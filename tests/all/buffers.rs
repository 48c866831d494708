//! The buffer- and stream-assignment passes: on random graphs (one device and random layouts
//! over several meshes) and on every testdata graph and layout, the stream plan is sound
//! (every wait has its record, none is redundant, every dependency through a buffer is
//! ordered, the main stream joins the others), no two buffers that may be touched at the
//! same time — by the happens-before of the streams, computed here independently — share
//! arena bytes except an elementwise result and the operand that dies at its step, and the
//! planned programs with a communication stream, with two compute streams and on one stream
//! compute exactly what the naive layout on one stream computes. Plus the golden dumps of
//! the device passes on whole models (the small cases are tests/passes/<pass>/).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use meshc::compile::{compile, compile_lowered, Compiled, Options};
use meshc::layout::Seed;
use meshc::passes::buffers::naive_bytes;
use meshc::passes::layout::propagate;
use meshc::passes::lower::lower;
use meshc::passes::streams::Config;
use meshc_runtime::format::mesh::Mesh;
use meshc_runtime::format::program::{Exec, Program, Storage, ALIGN};

use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};
use proptest::prelude::*;

/// The happens-before relation of a program's stream plan, computed directly (reachability
/// over stream order and event waits), independently of `passes::streams::Order`:
/// `hb[a][b]` when step `a` finishes before step `b` starts. Without a plan: program order.
fn happens_before(p: &Program, skip_wait: Option<usize>) -> Vec<Vec<bool>> {
    let n = p.steps.len();
    let plan = &p.streams;
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    if plan.streams.is_empty() {
        (1..n).for_each(|i| next[i - 1].push(i));
    }
    for st in &plan.streams {
        st.steps.windows(2).for_each(|w| next[w[0]].push(w[1]));
    }
    for (_, w) in plan.waits.iter().enumerate().filter(|&(k, _)| Some(k) != skip_wait) {
        next[plan.events[w.event].after].push(w.before);
    }
    let mut hb = vec![vec![false; n]; n];
    for (a, row) in hb.iter_mut().enumerate() {
        let mut todo = next[a].clone();
        while let Some(b) = todo.pop() {
            if !row[b] {
                row[b] = true;
                todo.extend(&next[b]);
            }
        }
    }
    hb
}

/// Checks the stream plan of one program: every step on one stream, in order; every wait
/// for an event some step records, none implied by the others (transitive reduction); every
/// dependency through a buffer ordered; the main stream joins every stream.
fn check_streams(p: &Program) -> Result<(), String> {
    let n = p.steps.len();
    let plan = &p.streams;
    let d = p.device;
    let mut on = vec![usize::MAX; n];
    for (k, st) in plan.streams.iter().enumerate() {
        if !st.steps.windows(2).all(|w| w[0] < w[1]) {
            return Err(format!("device {d}: stream {k} is out of order"));
        }
        for &i in &st.steps {
            if on[i] != usize::MAX {
                return Err(format!("device {d}: step {i} is on two streams"));
            }
            on[i] = k;
        }
    }
    if !plan.streams.is_empty() && on.contains(&usize::MAX) {
        return Err(format!("device {d}: a step is on no stream"));
    }
    for w in &plan.waits {
        let Some(e) = plan.events.get(w.event) else {
            return Err(format!("device {d}: step {} waits for event {}, which nothing records", w.before, w.event));
        };
        if e.after >= w.before || on[e.after] == on[w.before] {
            return Err(format!("device {d}: step {} waits for event {} of step {}", w.before, w.event, e.after));
        }
    }
    let hb = happens_before(p, None);
    for (k, w) in plan.waits.iter().enumerate() {
        if happens_before(p, Some(k))[plan.events[w.event].after][w.before] {
            return Err(format!("device {d}: the wait of step {} for event {} is redundant", w.before, w.event));
        }
    }
    // Every reader of a buffer after its writer; every writer after the earlier readers.
    for b in 0..p.buffers.len() {
        // (step, writes it): a step writes its first buffer, but a send only reads it.
        let writes = |s: &meshc_runtime::format::program::Step, k: usize| k == 0 && !matches!(s.exec, Exec::Send(_));
        let touch: Vec<(usize, bool)> = (p.steps.iter().enumerate())
            .flat_map(|(i, s)| {
                s.buffers.iter().enumerate().filter(|&(_, &x)| x == b).map(move |(k, _)| (i, writes(s, k)))
            })
            .collect();
        for (x, &(i, wi)) in touch.iter().enumerate() {
            for &(j, wj) in &touch[x + 1..] {
                if i != j && (wi || wj) && !hb[i][j] {
                    return Err(format!("device {d}: steps {i} and {j} both touch b{b} unordered"));
                }
            }
        }
    }
    if let Some(main) = plan.streams.first() {
        let ends: Vec<usize> =
            main.steps.last().copied().into_iter().chain(plan.join.iter().map(|&e| plan.events[e].after)).collect();
        for st in &plan.streams[1..] {
            if let Some(&t) = st.steps.last() {
                if !ends.iter().any(|&x| x == t || hb[t][x]) {
                    return Err(format!("device {d}: the main stream does not join step {t}"));
                }
            }
        }
    }
    Ok(())
}

/// Checks the arena plan of one program against its streams: two buffers that share arena
/// bytes are touched one after the other — every touch of one happens before every touch of
/// the other — except an elementwise result and the operand that dies at its step. The
/// error names the two buffers at fault.
fn check_plan(p: &Program) -> Result<(), String> {
    check_streams(p)?;
    let hb = happens_before(p, None);
    // Touches: None = copied in before / read after every step.
    const IN: usize = usize::MAX - 1;
    const OUT: usize = usize::MAX;
    let touches = |b: usize| -> Vec<usize> {
        let mut t: Vec<usize> = (0..p.steps.len()).filter(|&i| p.steps[i].buffers.contains(&b)).collect();
        if p.inputs.contains(&b) {
            t.push(IN);
        }
        // The receiver of a `move` send reads the sender's buffer until the run ends.
        let moved = |s: &meshc_runtime::format::program::Step| {
            matches!(&s.exec, Exec::Send(t) if t.protocol == meshc_runtime::format::program::Protocol::Move)
                && s.buffers.contains(&b)
        };
        if p.outputs.contains(&b) || p.steps.iter().any(moved) {
            t.push(OUT);
        }
        t
    };
    let before = |a: usize, b: usize| match (a, b) {
        (IN, x) => x != IN,
        (_, OUT) => a != OUT,
        (OUT, _) | (_, IN) => false,
        (x, y) => hb[x][y],
    };
    let apart = |x: &[usize], y: &[usize]| x.iter().all(|&a| y.iter().all(|&b| before(a, b)));
    let arena: Vec<(usize, usize, usize)> = (p.buffers.iter().enumerate())
        .filter_map(|(b, buf)| match buf.storage {
            Storage::Arena { offset } => Some((b, offset, buf.bytes)),
            Storage::Weights { .. } | Storage::Sizes => None,
        })
        .collect();
    for &(b, offset, bytes) in &arena {
        if offset % ALIGN != 0 || offset + bytes > p.arena_bytes {
            return Err(format!("device {}: b{b} at {offset} (+{bytes}) in an arena of {}", p.device, p.arena_bytes));
        }
    }
    // The deliberate pair: result and operand of the step where the operand dies, in the
    // same place, and the step a kernel (collectives and library calls never share).
    let in_place = |r: usize, o: usize| {
        let Some(i) = p.steps.iter().position(|s| s.buffers[0] == r) else { return false };
        let s = &p.steps[i];
        s.buffers[1..].contains(&o)
            && touches(o).iter().all(|&t| t == i || before(t, i))
            && matches!(s.exec, Exec::Kernel(_))
            && p.buffers[r].storage == p.buffers[o].storage
            && p.buffers[r].bytes == p.buffers[o].bytes
    };
    for (i, &(a, oa, na)) in arena.iter().enumerate() {
        for &(b, ob, nb) in &arena[i + 1..] {
            let overlap = oa < ob + nb && ob < oa + na;
            let (ta, tb) = (touches(a), touches(b));
            if overlap && !apart(&ta, &tb) && !apart(&tb, &ta) && !in_place(a, b) && !in_place(b, a) {
                return Err(format!(
                    "device {}: b{a} '{}' {ta:?} at {oa} (+{na}) and b{b} '{}' {tb:?} at {ob} (+{nb}) overlap",
                    p.device, p.buffers[a].name, p.buffers[b].name
                ));
            }
        }
    }
    Ok(())
}

fn run(c: Compiled, inputs: &HashMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>, String> {
    let loaded = c.load().map_err(|e| format!("{e:#}"))?;
    loaded.run(inputs).map_err(|e| format!("{e:#}"))
}

/// Compiles `g` (lowered by `layouts` if given) planned and naive, checks the plan of every
/// device, and runs both: their outputs must be bit-identical. Returns the planned and the
/// naive arena bytes of device 0.
fn check_graph(
    g: &Graph,
    info: &Info,
    layouts: Option<(&Mesh, BTreeMap<String, Seed>)>,
    params: &HashMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<(usize, usize), String> {
    let lowered = match layouts {
        Some((mesh, seeds)) => Some(lower(g, info, &propagate(g, info, mesh, seeds)).map_err(|e| format!("{e:#}"))?),
        None => None,
    };
    let build = |plan_arena: bool, streams: Config| {
        let opts = Options { plan_arena, streams, ..Options::default() };
        match &lowered {
            Some(l) => compile_lowered(g, info, l, params, &opts, &Default::default()),
            None => compile(g, info, params, &opts),
        }
        .map_err(|e| format!("{e:#}"))
    };
    let single = Config { single: true, ..Config::default() };
    let (planned, naive) = (build(true, Config::default())?, build(false, single.clone())?);
    for p in &planned.programs {
        check_plan(p)?;
    }
    let sizes = (planned.programs[0].arena_bytes, naive.programs[0].arena_bytes);
    if sizes.1 != naive_bytes(&planned.programs[0]) || sizes.0 > sizes.1 {
        return Err(format!("arena {} bytes, naive {} bytes", sizes.0, sizes.1));
    }
    let want = run(naive, inputs)?;
    let mut planned = Some(planned);
    // The planned arenas with a communication stream, with two compute streams, and on one
    // stream, all against the naive layout on one stream.
    let others = [
        ("", None),
        (
            " with two compute streams and every collective on the communication stream",
            Some(Config { compute_streams: 2, comm_always: true, ..Config::default() }),
        ),
        (" on one stream", Some(single)),
    ];
    for (how, streams) in others {
        let c = match streams {
            None => planned.take().expect("the first variant"),
            Some(cfg) => {
                let c = build(true, cfg)?;
                for p in &c.programs {
                    check_plan(p).map_err(|e| format!("{how}: {e}"))?;
                }
                c
            }
        };
        let got = run(c, inputs)?;
        for (name, w) in &want {
            if got[name].ty() != w.ty() || got[name].to_le_bytes() != w.to_le_bytes() {
                return Err(format!("output '{name}'{how} differs from the naive layout's on one stream"));
            }
        }
    }
    Ok(sizes)
}

fn random_input(g: &Graph) -> HashMap<String, Tensor> {
    g.inputs
        .iter()
        .map(|i| {
            let v: Vec<f32> = (0..i.ty.numel()).map(|k| ((k * 37) % 17) as f32 / 8.0 - 1.0).collect();
            (i.name.clone(), Tensor::new(i.ty.shape.clone(), meshc_ir::Data::F32(v)))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_graphs_plan_sound_arenas_that_compute_the_same(
        b in 0usize..2, d in 0usize..2, ops in proptest::collection::vec((0u8..12, 0u8..16, 0u8..4), 2..12),
        mesh in 0usize..8, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 24), density in 1usize..4
    ) {
        let src = crate::common::random_graph([4, 8][b], [4, 8][d], &ops);
        let g = meshc_ir::text::parse(&src).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        let params = meshc_ir::params::load_all(&g, Path::new(".")).unwrap();
        let meshes = crate::common::meshes();
        // The last draw is one device without a layout.
        let layouts = meshes.get(mesh).map(|m| (m, crate::common::random_seeds(&g, &info, m, &picks, density)));
        check_graph(&g, &info, layouts, &params, &random_input(&g)).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    }
}

#[test]
fn testdata_graphs_and_layouts_plan_sound_arenas_that_compute_the_same() {
    for graph in crate::common::testdata_graphs() {
        let (g, info) = meshc_ir::load::load(&graph).unwrap();
        let params = meshc_ir::params::load_all(&g, graph.parent().unwrap()).unwrap();
        let inputs = crate::common::testdata_inputs(&graph, &g).unwrap();
        let (arena, naive) =
            check_graph(&g, &info, None, &params, &inputs).unwrap_or_else(|e| panic!("{}: {e}", graph.display()));
        if graph.parent().unwrap().ends_with("transformer") {
            assert!(arena * 10 <= naive * 4, "transformer: arena {arena} bytes is over 40% of naive {naive}");
        }
    }
    for case in crate::common::layout_cases() {
        let (g, info) = meshc_ir::load::load(&case.graph).unwrap();
        let params = meshc_ir::params::load_all(&g, case.graph.parent().unwrap()).unwrap();
        let spec = meshc::layout::load(&case.spec).unwrap();
        let seeds = spec.seed_layouts(&g, &info).unwrap();
        check_graph(
            &g,
            &info,
            Some((&spec.mesh, seeds)),
            &params,
            &crate::common::testdata_inputs(&case.graph, &g).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.label));
    }
}

/// Every testdata layout through the whole driver (placement, send/recv, lowering): the
/// plans with every communication step on the communication stream and two compute streams
/// are sound and compute bit for bit what one stream computes.
#[test]
fn testdata_layouts_through_the_driver_plan_sound_streams() {
    for case in crate::common::layout_cases() {
        let (g, info) = meshc_ir::load::load(&case.graph).unwrap();
        let params = meshc_ir::params::load_all(&g, case.graph.parent().unwrap()).unwrap();
        let spec = meshc::layout::load(&case.spec).unwrap();
        let build = |streams: Config| {
            let opts = Options { streams, ..Options::default() };
            meshc::driver::Job::new(&g, &info, &params, &opts)
                .spec(Some(&spec))
                .build(&meshc::pipeline::Dumps::default())
                .unwrap_or_else(|e| panic!("{}: {e:#}", case.label))
        };
        let inputs = crate::common::testdata_inputs(&case.graph, &g).unwrap();
        let want = run(build(Config { single: true, ..Config::default() }), &inputs).unwrap();
        let c = build(Config { compute_streams: 2, comm_always: true, ..Config::default() });
        for p in &c.programs {
            check_plan(p).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        }
        let got = run(c, &inputs).unwrap_or_else(|e| panic!("{}: {e}", case.label));
        for (name, w) in &want {
            assert_eq!(got[name].to_le_bytes(), w.to_le_bytes(), "{}: output '{name}'", case.label);
        }
    }
}

/// The device and program passes on whole models, pinned where the small cases of
/// tests/passes do not reach: the transformer's attention, epilogues, fusion and arena, the
/// CNN's expanded convs and pools and its folded weights, and the streams of a real layout
/// (which overlaps too little to use the communication stream by default: forced).
#[test]
fn dumps_of_the_device_passes_on_whole_models_are_pinned() {
    let dir = crate::common::scratch("buffers-dump");
    let out = dir.join("graph.mshc");
    let mut failures = Vec::new();
    let mp8 = crate::common::layout_cases().into_iter().find(|c| c.label == "transformer-mp-8").expect("the layout");
    let cases: [(&str, Vec<&str>, &[&str]); 3] = [
        ("transformer", vec!["testdata/transformer/graph.json"], &["attention", "epilogue", "fuse", "buffers"]),
        ("cnn", vec!["testdata/cnn/graph.json"], &["expand", "fold"]),
        (
            "transformer-mp-8-comm",
            vec![mp8.graph.to_str().unwrap(), "--layout", mp8.spec.to_str().unwrap(), "--comm-stream=always"],
            &["streams", "buffers"],
        ),
    ];
    for (label, args, passes) in cases {
        for pass in passes {
            let mut all = vec!["compile", args[0], "-o", out.to_str().unwrap(), "--dump-after", pass];
            all.extend(&args[1..]);
            let r = crate::common::meshc(&all);
            assert_eq!(r.status, Some(0), "{label}: {}", r.stderr);
            failures.extend(crate::common::golden(&format!("{pass}/{label}.txt"), &r.stdout).err());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--dump-dir` numbers its files in the order the passes run (`pipeline::NAMES`), each
/// pass's file written as it completes; `all` leaves out the passes that do not run
/// (no pilot inputs, no placement).
#[test]
fn dump_dir_files_follow_the_pipeline_order() {
    let dir = crate::common::scratch("dump-dir");
    let spec = "testdata/transformer/layouts/mp-2x4.json";
    let out = dir.join("t.mshc");
    let dumps = dir.join("dumps");
    let args = ["compile", "testdata/transformer/graph.json", "--layout", spec, "-o", out.to_str().unwrap()];
    let r =
        crate::common::meshc(&[&args[..], &["--dump-after", "all", "--dump-dir", dumps.to_str().unwrap()]].concat());
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let mut files: Vec<String> =
        std::fs::read_dir(&dumps).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    let want = [
        "01-verify",
        "04-layout",
        "05-lower",
        "07-expand",
        "08-quantize",
        "09-fold",
        "10-gelu",
        "11-attention",
        "12-epilogue",
        "13-zero_point",
        "14-reduce_split",
        "15-fuse",
        "16-codegen",
        "17-streams",
        "18-buffers",
    ];
    assert_eq!(files, want.map(|f| format!("{f}.txt")));
    let passes: Vec<&str> = meshc::pipeline::NAMES.to_vec();
    assert_eq!(
        passes,
        [
            "verify",
            "pilot",
            "place",
            "layout",
            "lower",
            "sendrecv",
            "expand",
            "quantize",
            "fold",
            "gelu",
            "attention",
            "epilogue",
            "zero_point",
            "reduce_split",
            "fuse",
            "codegen",
            "streams",
            "buffers"
        ]
    );
}
