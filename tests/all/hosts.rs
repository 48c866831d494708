//! Devices spread over hosts (`hosts` in the layout spec, `runtime/src/comm/transport.rs`)
//! without MPI: each host is a thread of this test with its own `Loaded` of the same
//! artifact, joined by the `Threads` transport, so everything above the transport seam
//! (hierarchical collectives, send/recv between hosts, outputs gathered on host 0) is
//! tested in `make test`. `make test-mpi` (tests/all/mpi.rs) runs the same over MPI.
//!
//! Every testdata graph × layout, its devices over 2 hosts and over hosts of 2 devices,
//! gives outputs bit-identical to the in-process run of the same artifact; so does the
//! degraded 4×4 torus over 4 hosts. A recv whose send never comes ends every host's run
//! with a timeout naming the key, devices and hosts. A decoder whose heads are split over
//! 2 hosts generates its greedy ids with the caches resident on each host, and its state
//! gathered on host 0 is the in-process run's.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use meshc_ir::Tensor;
use meshc_runtime::comm::transport::Threads;
use meshc_runtime::exec::loader::load_artifact;
use meshc_runtime::exec::runner::Loaded;
use meshc_runtime::format::artifact::{Artifact, Verify};
use meshc_runtime::format::degradation::Degradation;
use meshc_runtime::format::mesh::{Mesh, Topology};
use meshc_runtime::format::program::{
    Buffer, Collective, CollectiveOp, Exec, IoSpec, Meta, Program, Reduce, Step, Storage, ALIGN,
};
use meshc_runtime::tools::cli::{self, RunArgs};

use crate::common::{layout_cases, meshc, scratch};

/// `out`, compiled from `graph` under `spec` by the real binary.
pub fn compile(graph: &Path, spec: &Path, out: &Path) {
    let run = meshc(&[
        "compile",
        &graph.display().to_string(),
        "--layout",
        &spec.display().to_string(),
        "-o",
        &out.display().to_string(),
    ]);
    assert_eq!(run.status, Some(0), "compile {}: {}", spec.display(), run.stderr);
}

fn open(artifact: &Path) -> Loaded {
    load_artifact(Artifact::open_with(artifact, Verify::All).unwrap(), "test").unwrap()
}

/// The graph's inputs, `<graph dir>/inputs/NAME.npy` for each input of the artifact.
fn inputs(graph: &Path, l: &Loaded) -> HashMap<String, Tensor> {
    let dir = graph.parent().unwrap().join("inputs");
    l.meta
        .inputs
        .iter()
        .map(|s| (s.name.clone(), Tensor::read_npy(&dir.join(format!("{}.npy", s.name))).unwrap()))
        .collect()
}

/// Runs `artifact` with its devices over `hosts` (one `Loaded` per host, each on its own
/// thread; `setup` applied to each first): every host's result, host 0's holding the outputs.
fn over_hosts(
    artifact: &Path,
    hosts: &[Vec<usize>],
    inputs: &HashMap<String, Tensor>,
    setup: impl Fn(&mut Loaded) + Sync,
) -> Vec<Result<BTreeMap<String, Tensor>, String>> {
    let transports = Threads::joined(hosts.len());
    std::thread::scope(|s| {
        let runs: Vec<_> = transports
            .into_iter()
            .map(|t| {
                let setup = &setup;
                s.spawn(move || {
                    let mut l = open(artifact);
                    l.meta.hosts = hosts.to_vec();
                    setup(&mut l);
                    l.set_transport(t).map_err(|e| format!("{e:#}"))?;
                    l.run(inputs).map_err(|e| format!("{e:#}"))
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

/// Bit-for-bit equality of two runs' outputs.
fn identical(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> Result<(), String> {
    if a.keys().ne(b.keys()) {
        return Err(format!("outputs {:?} and {:?}", a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>()));
    }
    match a.iter().find(|(k, t)| t.to_le_bytes() != b[*k].to_le_bytes()) {
        Some((k, _)) => Err(format!("output {k} differs")),
        None => Ok(()),
    }
}

/// The ways to spread `n` devices over hosts the tests use: two hosts of n/2 (2×4 on 8
/// devices) and hosts of two devices (4×2), each group contiguous.
pub fn groupings(n: usize) -> Vec<Vec<Vec<usize>>> {
    let by = |size: usize| (0..n / size).map(|h| (h * size..(h + 1) * size).collect()).collect();
    let mut v: Vec<Vec<Vec<usize>>> = vec![by(n / 2)];
    if n >= 4 && n / 2 != 2 {
        v.push(by(2));
    }
    v
}

#[test]
fn every_layout_over_hosts_gives_the_in_process_outputs_bit_for_bit() {
    let dir = scratch("hosts");
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in layout_cases() {
        let art = dir.join(format!("{}.mshc", case.label));
        compile(&case.graph, &case.spec, &art);
        let here = open(&art);
        let devices = here.meta.mesh.devices();
        if devices < 2 {
            continue;
        }
        let inputs = inputs(&case.graph, &here);
        let want = here.run(&inputs).unwrap();
        for hosts in groupings(devices) {
            let label = format!("{} over {}x{}", case.label, hosts.len(), hosts[0].len());
            let got = over_hosts(&art, &hosts, &inputs, |_| {});
            for (h, r) in got.iter().enumerate() {
                match (h, r) {
                    (0, Ok(out)) => failures.extend(identical(out, &want).err().map(|e| format!("{label}: {e}"))),
                    (_, Ok(out)) if out.is_empty() => {}
                    (_, Ok(_)) => failures.push(format!("{label}: host {h} returned outputs")),
                    (_, Err(e)) => failures.push(format!("{label}: host {h}: {e}")),
                }
            }
            runs += 1;
        }
    }
    assert!(runs >= 30, "only {runs} runs over hosts");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_degraded_torus_over_four_hosts_gives_its_in_process_outputs() {
    let dir = scratch("hosts-degraded");
    let graph = Path::new("testdata/dp_train/graph.json");
    let art = dir.join("dp.mshc");
    compile(graph, Path::new("testdata/dp_train/layouts/torus-4x4.json"), &art);
    // A failed device and a failed link, crossing between hosts (rows of the torus).
    let deg = Degradation { nodes: vec![6], links: vec![(1, 5), (12, 0)], ..Default::default() };
    let degrade = |l: &mut Loaded| l.degrade(&deg, false).unwrap();
    let mut here = open(&art);
    degrade(&mut here);
    let inputs = inputs(graph, &here);
    let want = here.run(&inputs).unwrap();
    let rows: Vec<Vec<usize>> = (0..4).map(|r| (4 * r..4 * r + 4).collect()).collect();
    let got = over_hosts(&art, &rows, &inputs, degrade);
    identical(got[0].as_ref().unwrap(), &want).unwrap();
    assert!(got[1..].iter().all(|r| r.as_ref().is_ok_and(BTreeMap::is_empty)));
}

#[test]
fn a_recv_across_hosts_whose_send_never_comes_times_out_on_every_host() {
    let dir = scratch("hosts-timeout");
    let graph = Path::new("testdata/mlp/graph.json");
    let art = dir.join("stages.mshc");
    compile(graph, Path::new("testdata/mlp/layouts/stages-2.json"), &art);
    let here = open(&art);
    let inputs = inputs(graph, &here);
    // Only host 1 (stage 1, device 1) runs: the activations stage 0 sends it never come.
    let transports = Threads::joined(2);
    let mut l = open(&art);
    l.meta.hosts = vec![vec![0], vec![1]];
    l.set_transport(Arc::clone(&transports[1])).unwrap();
    l.set_timeout(Duration::from_millis(300));
    let start = std::time::Instant::now();
    let e = format!("{:#}", l.run(&inputs).unwrap_err());
    assert!(start.elapsed() < Duration::from_secs(10), "{e}");
    assert!(
        e.contains("on device 1 on host 1 (device 1) from device 0 on host 0 (device 0): no send came within 300ms"),
        "{e}"
    );
}

/// `RunArgs` as `run ARGS` gives them.
fn run_args(args: &[&str]) -> RunArgs {
    #[derive(clap::Parser)]
    struct Run {
        #[command(flatten)]
        run: RunArgs,
    }
    <Run as clap::Parser>::parse_from(std::iter::once("run").chain(args.iter().copied())).run
}

/// Before the first run the hosts compare digests of their artifact, run options and
/// inputs (`cli::agreement`), and every host refuses one that differs, naming it: a host
/// with other weights or inputs would otherwise give silently wrong outputs, and one with
/// another --bench count or layout a timeout that blames another.
#[test]
fn hosts_that_differ_in_artifact_options_or_inputs_are_refused_before_they_run() {
    let dir = scratch("hosts-agree");
    let graph = Path::new("testdata/mlp/graph.json");
    let (dp, stages) = (dir.join("dp.mshc"), dir.join("stages.mshc"));
    compile(graph, Path::new("testdata/mlp/layouts/dp-2.json"), &dp);
    compile(graph, Path::new("testdata/mlp/layouts/stages-2.json"), &stages);
    let same = inputs(graph, &open(&dp));
    let mut other = same.clone();
    let x = &same["x"];
    let mut v = x.as_f32().unwrap().to_vec();
    *v.last_mut().unwrap() += 1.0;
    other.insert("x".into(), Tensor::new(x.shape.clone(), meshc_ir::Data::F32(v)));
    let (dp, stages, plain): (&Path, &Path, &[&str]) = (&dp, &stages, &[]);
    let cases = [
        (dp, plain, &same, None),
        (stages, plain, &same, Some("runs another artifact")),
        (
            dp,
            &["--bench", "2"],
            &same,
            Some("was given other options (--bench, --degrade*, --fail-device, --stop-host)"),
        ),
        (dp, plain, &other, Some("was given other inputs")),
    ];
    for (art, args, inputs, differs) in cases {
        // Host 0 as given; host 1 as the case has it.
        let hosts = [(dp, plain, &same), (art, args, inputs)];
        let transports = Threads::joined(2);
        let got: Vec<Result<(), String>> = std::thread::scope(|s| {
            let runs: Vec<_> = (hosts.iter().zip(transports))
                .map(|(&(art, args, inputs), t)| {
                    s.spawn(move || {
                        let mut l = open(art);
                        l.meta.hosts = vec![vec![0], vec![1]];
                        l.set_transport(t).map_err(|e| format!("{e:#}"))?;
                        let args = run_args(args);
                        l.agree(|| cli::agreement(&l, &args, inputs), Duration::from_secs(5))
                            .map_err(|e| format!("{e:#}"))
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let want = differs.map(|d| format!("host 1 (device 1) {d} than host 0 (device 0)"));
        assert_eq!(got, vec![want.clone().map_or(Ok(()), Err); 2], "{differs:?}");
    }
}

#[test]
fn degrade_host_degrades_every_device_of_that_host() {
    let dir = scratch("hosts-degrade-host");
    let graph = Path::new("testdata/dp_train/graph.json");
    let spec = dir.join("torus.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("testdata/dp_train/layouts/torus-4x4.json").unwrap()).unwrap();
    v["hosts"] = serde_json::json!({"axis": "dx"});
    std::fs::write(&spec, v.to_string()).unwrap();
    let art = dir.join("t.mshc").display().to_string();
    compile(graph, &spec, Path::new(&art));
    let inputs = crate::common::input_args(graph);
    let run = |out: &str, extra: &[&str]| {
        let out = dir.join(out).display().to_string();
        let mut args: Vec<&str> = vec!["run", &art, "--output-dir", &out];
        args.extend(inputs.iter().map(String::as_str));
        args.extend(extra);
        let r = meshc(&args);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        let mut files: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files.iter().map(|f| std::fs::read(f).unwrap()).collect::<Vec<_>>()
    };
    let by_host = run("by-host", &["--degrade-host", "1"]);
    let by_device = run("by-device", &["--degrade", "1,0", "--degrade", "1,1", "--degrade", "1,2", "--degrade", "1,3"]);
    assert_eq!(by_host, by_device);
    assert_ne!(by_host, run("healthy", &[]), "degrading a host changed nothing");
    let bad = meshc(&["run", &art, "--degrade-host", "4"]);
    assert_eq!((bad.status, bad.stderr.trim()), (Some(1), "error: --degrade-host 4: the artifact has hosts 0 to 3"));
}

#[test]
fn stop_host_stops_a_process_only_where_the_other_hosts_end_the_job() {
    // tests/all/mpi.rs stops host 0 with it; here, what it refuses.
    let dir = scratch("hosts-stop-host");
    let graph = Path::new("testdata/transformer/graph.json");
    let art = dir.join("t.mshc").display().to_string();
    compile(graph, Path::new("testdata/transformer/hosts/mp-2x4.json"), Path::new(&art));
    let inputs = crate::common::input_args(graph);
    for (stop, error) in [
        ("0-2", "--stop-host '0-2': expected HOST@RUN such as 0@2"),
        ("2@0", "--stop-host 2: the artifact has hosts 0 to 1"),
        ("1@2", "--stop-host 1@2: the command makes 2 run(s) (1 + --bench), none numbered 2"),
        ("1@1", "--stop-host: only under --transport mpi (a stopped process running every host would hang)"),
    ] {
        let mut args: Vec<&str> = vec!["run", &art, "--stop-host", stop, "--bench", "1"];
        args.extend(inputs.iter().map(String::as_str));
        let bad = meshc(&args);
        assert_eq!((bad.status, bad.stderr.trim()), (Some(1), format!("error: {error}").as_str()));
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_mpi_feature_transport_mpi_says_how_to_build_it() {
    let dir = scratch("hosts-no-mpi");
    let art = dir.join("t.mshc");
    compile(Path::new("testdata/transformer/graph.json"), Path::new("testdata/transformer/hosts/mp-2x4.json"), &art);
    let art = art.display().to_string();
    let prompt = "testdata/decoder/generate/prompt.npy";
    let generate = ["generate", &art, "--prompt", prompt, "--context", "8", "--max-new-tokens", "2"];
    for args in [&["run", &art][..], &generate] {
        let run = meshc(&[args, &["--transport", "mpi"]].concat());
        assert_eq!(run.status, Some(1), "{args:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(
            run.stderr.contains("built without MPI; build it with `cargo build --release --features mpi`"),
            "{}",
            run.stderr
        );
    }
}

/// Collective `op` over 4 devices on a 1-D torus, the input x [4·rows, 4] split over the
/// devices (each operand its own block), the result the output y of `y_shape`, split along
/// axis 0 over the devices when `y_split`: programs to load in-process or per host.
fn one_collective(op: CollectiveOp, rows: usize, y_shape: &[usize], y_split: bool) -> (Meta, Vec<Program>) {
    use meshc_ir::{DType, TensorType};
    let mesh = Mesh { shape: vec![4], axes: vec!["x".into()], topology: Topology::Torus };
    let x = TensorType::new(DType::F32, vec![4 * rows, 4]);
    let y = TensorType::new(DType::F32, y_shape.to_vec());
    let block = |t: &TensorType, split: bool| t.size_bytes() / if split { 4 } else { 1 };
    let (xb, yb) = (block(&x, true), block(&y, y_split));
    let at = xb.div_ceil(ALIGN) * ALIGN;
    let meta = Meta {
        graph: "collective".into(),
        target: "x86-64".into(),
        features: vec![],
        mesh: mesh.clone(),
        flops: 0,
        inputs: vec![IoSpec::with_layout("x", &x, vec![Some(0), None])],
        outputs: vec![IoSpec::with_layout("y", &y, vec![y_split.then_some(0), None])],
        degraded: Default::default(),
        model_axes: Vec::new(),
        hosts: Vec::new(),
        symbolic: None,
    };
    let c = Collective { op, id: 0, groups: vec![vec![0, 1, 2, 3]], dtype: "f32".into(), shape: vec![rows, 4] };
    let programs = (0..4)
        .map(|device| Program {
            device,
            arena_bytes: at + yb.div_ceil(ALIGN) * ALIGN,
            buffers: vec![
                Buffer { name: "x".into(), bytes: xb, storage: Storage::Arena { offset: 0 }, mask: None },
                Buffer { name: "y".into(), bytes: yb, storage: Storage::Arena { offset: at }, mask: None },
            ],
            kernels: vec![],
            steps: vec![Step {
                node: "y".into(),
                exec: Exec::Collective(c.clone()),
                buffers: vec![1, 0],
                why: None,
                scaling: None,
            }],
            inputs: vec![0],
            outputs: vec![1],
            streams: Default::default(),
        })
        .collect();
    (meta, programs)
}

#[test]
fn every_collective_across_hosts_equals_the_in_process_one_whatever_the_grouping() {
    // Small operands, and operands of several pieces of the reduction chain, the last one
    // partial (the chain's pieces are 2^18 elements).
    for rows in [4, 131076] {
        collectives_across_hosts(rows);
    }
}

fn collectives_across_hosts(rows: usize) {
    let ops = [
        (CollectiveOp::AllReduce { reduce: Reduce::Sum }, vec![rows, 4], false),
        (CollectiveOp::AllReduce { reduce: Reduce::Mean }, vec![rows, 4], false),
        (CollectiveOp::AllReduce { reduce: Reduce::Max }, vec![rows, 4], false),
        (CollectiveOp::ReduceScatter { axis: 0, reduce: Reduce::Sum }, vec![rows, 4], true),
        (CollectiveOp::ReduceScatter { axis: 0, reduce: Reduce::Mean }, vec![rows, 4], true),
        (CollectiveOp::AllGather { axis: 0 }, vec![4 * rows, 4], false),
        (CollectiveOp::AllToAll { split_axis: 0, concat_axis: 1 }, vec![rows, 16], true),
    ];
    // Values whose sums round differently in another order.
    let values: Vec<f32> =
        (0..16 * rows).map(|i| 1.0 / (i as f32 + 0.37) * if i % 3 == 0 { -1e4 } else { 1.0 }).collect();
    let inputs = HashMap::from([("x".to_string(), Tensor::f32(vec![4 * rows, 4], values))]);
    let load = |(meta, programs): (Meta, Vec<Program>)| Loaded::in_memory(meta, programs, Box::new(()), &[]).unwrap();
    for (op, y_shape, y_split) in ops {
        let want = load(one_collective(op.clone(), rows, &y_shape, y_split)).run(&inputs).unwrap();
        // Contiguous, and interleaved (the reduction chain goes host 0, 1, 0, 1).
        for hosts in [vec![vec![0, 1], vec![2, 3]], vec![vec![0, 2], vec![1, 3]], vec![vec![0], vec![1, 2], vec![3]]] {
            let transports = Threads::joined(hosts.len());
            let got: Vec<_> = std::thread::scope(|s| {
                let runs: Vec<_> = (transports.into_iter())
                    .map(|t| {
                        let (mut meta, programs) = one_collective(op.clone(), rows, &y_shape, y_split);
                        meta.hosts = hosts.clone();
                        let inputs = &inputs;
                        s.spawn(move || {
                            let mut l = load((meta, programs));
                            l.set_transport(t).unwrap();
                            l.run(inputs).unwrap()
                        })
                    })
                    .collect();
                runs.into_iter().map(|r| r.join().unwrap()).collect()
            });
            identical(&got[0], &want).unwrap_or_else(|e| panic!("{op:?} over {hosts:?}: {e}"));
        }
    }
}

/// The decode step of testdata/decoder, its heads (and caches) split over two hosts of one
/// device: `Session::generate` on each host (host 0 sampling, its ids broadcast) gives the
/// numpy reference's greedy ids on every host, and `Session::state` afterwards gathers on
/// host 0 the caches an in-process run of the same artifact leaves, bit for bit; host 1
/// gets none.
#[test]
fn a_decoder_over_two_hosts_generates_and_gathers_its_state_on_host_0() {
    use meshc_runtime::api::{GenerateOptions, Model, Sampling, Session};
    let dir = scratch("hosts-generate");
    let spec = dir.join("heads-hosts.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("testdata/decoder/layouts/heads-2.json").unwrap()).unwrap();
    v["hosts"] = serde_json::json!({"axis": "model"});
    std::fs::write(&spec, v.to_string()).unwrap();
    let art = dir.join("decoder.mshc");
    compile(Path::new("testdata/decoder/graph.json"), &spec, &art);
    let prompt = crate::generate::rows("testdata/decoder/generate/prompt.npy");
    let want = crate::generate::rows("testdata/decoder/generate/greedy.npy");
    let options =
        GenerateOptions { max_new_tokens: 14, context: 16, sampling: Sampling::Greedy, seed: 0, stop: Vec::new() };
    let model = Model::open(&art).unwrap();
    let here = Session::new(&model).unwrap();
    assert_eq!(here.generate(&prompt, &options).unwrap().tokens, want);
    let state = here.state().unwrap();
    let got: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = Threads::joined(2)
            .into_iter()
            .map(|t| {
                let (model, prompt, options) = (&model, &prompt, &options);
                s.spawn(move || {
                    let mut session = Session::new(model).unwrap();
                    session.set_transport(t).unwrap();
                    let ids = session.generate(prompt, options).unwrap().tokens;
                    (ids, session.state().unwrap())
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(got[0].0, want);
    assert_eq!(got[1].0, want, "host 1 records host 0's picks");
    assert_eq!(got[0].1.keys().collect::<Vec<_>>(), ["k_cache", "v_cache"]);
    for (name, t) in &state {
        assert_eq!(got[0].1[name].to_le_bytes(), t.to_le_bytes(), "{name}");
    }
    assert!(got[1].1.is_empty());
}
