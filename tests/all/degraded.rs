//! The fault-tolerant all-reduce (`meshc_runtime::comm::degraded`, docs/design.md §6.2): the method's figures with their
//! sums and their schedules pinned in golden/degraded/, random degradations of 1–3-D meshes
//! and tori, over the whole mesh and over random groups (every healthy contribution exactly
//! once, or an error naming an unreachable device), and the max link bytes against the
//! fault-free run. Then through the real binary: the data-parallel training step
//! (testdata/dp_train) compiled for a degraded torus, or re-planned with `run --degrade`,
//! updates from the healthy replicas only; a failed device carries nothing; a layout that
//! splits params cannot lose a device; `--degrade-strict`; a device that stops answering
//! (`--fail-device`) is named within the timeout; bad devices and links are one-line errors.

use std::collections::BTreeSet;
use std::path::Path;

use crate::common::{golden, input_args, meshc};
use meshc_runtime::comm::degraded::{execute, plan, plan_group, Topo};
use meshc_runtime::format::degradation::Degradation;
use meshc_runtime::format::mesh::{Mesh, Topology};

fn run(layout: &str, extra: &[&str]) -> crate::common::Run {
    run_graph("mlp", layout, extra)
}

fn run_graph(name: &str, layout: &str, extra: &[&str]) -> crate::common::Run {
    let graph = format!("testdata/{name}/graph.json");
    let graph = Path::new(&graph);
    let mut args = vec!["run".to_string(), graph.display().to_string(), "--layout".into(), layout.into()];
    args.extend(input_args(graph));
    args.extend(extra.iter().map(|s| s.to_string()));
    meshc(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn a_failed_device_carries_nothing_and_the_busiest_link_is_compared_with_the_fault_free_run() {
    let layout = "testdata/dp_train/layouts/torus-4x4.json";
    let free = dp_train(&["run", "testdata/dp_train/graph.json", "--layout", layout, "--link-stats"]);
    assert!(free.stdout.ends_with("max link bytes 3076\n"), "{free:?}");
    let r = dp_train(&["run", "testdata/dp_train/graph.json", "--layout", layout, "--link-stats", "--degrade", "1,1"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let links: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("link ")).collect();
    assert!(!links.is_empty() && links.iter().all(|l| !l.contains("(1,1)")), "{r:?}");
    assert!(r.stdout.contains("\nfault-free max link bytes 3076 (degraded/fault-free "), "{r:?}");
    // Device (1,1)'s replica is left out of the update.
    let w1 = |r: &crate::common::Run| r.stdout.lines().find(|l| l.starts_with("w1_new: ")).map(str::to_string);
    assert_ne!(w1(&r), w1(&free));
}

#[test]
fn a_layout_that_splits_params_cannot_lose_a_device() {
    let dir = crate::common::scratch("degraded-model-shards");
    let spec = dir.join("mp-4-degraded.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [4], "axes": ["model"]},
            "layouts": {"w1": [null, "model"], "w2": ["model", null]}, "degraded": {"nodes": [[3]]}}"#,
    )
    .unwrap();
    let out = dir.join("x.mshc");
    let r =
        meshc(&["compile", "testdata/mlp/graph.json", "--layout", spec.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert!(
        r.stderr.ends_with("mp-4-degraded.json: degraded device (3) would take its shard of param 'w1' (split over mesh axis 'model') with it: only data-parallel layouts (params replicated) can lose a device\n"),
        "{r:?}"
    );
    // A failed link leaves its ends computing: allowed.
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [2, 4], "axes": ["data", "model"]},
            "layouts": {"w1": [null, "model"], "w2": ["model", null]}, "degraded": {"links": [[[0, 0], [1, 0]]]}}"#,
    )
    .unwrap();
    let r =
        meshc(&["compile", "testdata/mlp/graph.json", "--layout", spec.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.status, Some(0), "{r:?}");
}

#[test]
fn degraded_runs_fail_with_one_line_naming_the_device() {
    let model = "cannot be left out: it holds a shard of a param or of optimizer state (split over mesh axis 'model': model parallel, or --zero) that the others cannot do without; only layouts that replicate both can lose a device";
    let cases = [
        ("mp-4", vec!["--degrade", "3"], format!("error: --degrade: device (3) {model}")),
        (
            "stages-2x4",
            vec!["--degrade", "0,2"],
            "error: --degrade: device (0,2) would break the pipeline: a graph placed in stages (send/recv between devices) cannot lose a device".into(),
        ),
        ("torus-2x4", vec!["--degrade", "1,2"], format!("error: --degrade: device (1,2) {model}")),
        (
            "transformer:mp-4",
            vec!["--degrade-link", "0:1", "--degrade-strict"],
            format!("error: --degrade: device (0) {model}"),
        ),
        ("mp-4", vec!["--degrade", "4"], "error: --degrade: device '4' is not in the [4] mesh".into()),
        (
            "mp-4",
            vec!["--degrade-link", "0:2"],
            "error: --degrade: degraded link 0-2: the devices are not neighbours in the [4] mesh".into(),
        ),
        // In one dimension a failed link fails both ends, and then the ends of the row.
        ("mp-4", vec!["--degrade-link", "1:2"], "every device of the [4] mesh is degraded".into()),
    ];
    for (layout, args, want) in cases {
        let (graph, layout) = layout.split_once(':').unwrap_or(("mlp", layout));
        let r = run_graph(graph, &format!("testdata/{graph}/layouts/{layout}.json"), &args);
        assert_eq!(r.status, Some(1), "{r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
        assert!(r.stderr.contains(&want), "{want}: {r:?}");
    }
}

/// A node of the seed's 4×4 figures: rows a–d (axis 0), columns 1–4 (axis 1).
fn node(name: &str) -> usize {
    let b = name.as_bytes();
    (b[0] - b'a') as usize * 4 + (b[1] - b'1') as usize
}

fn nodes(names: &[&str]) -> Vec<usize> {
    names.iter().map(|n| node(n)).collect()
}

/// A small deterministic generator (xorshift), so the property tests replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Plans and runs the all-reduce of integer-valued vectors (exact in f64) that differ per
/// device and element, so a missing or twice-counted contribution changes the result;
/// checks every healthy device ends with the sum over all healthy devices and nothing
/// touches an unhealthy link (`execute` refuses those). Returns the max link bytes.
fn check(topo: &Topo, len: usize, seed: u64) -> u64 {
    let n = topo.mesh.devices();
    let schedule = plan(topo, len).unwrap();
    let mut rng = Rng(seed | 1);
    let mut data: Vec<Vec<f64>> = (0..n).map(|_| (0..len).map(|_| rng.below(1 << 20) as f64).collect()).collect();
    let healthy: Vec<usize> = (0..n).filter(|&d| topo.healthy(d)).collect();
    assert_eq!(schedule.members, healthy);
    let want: Vec<f64> = (0..len).map(|e| healthy.iter().map(|&d| data[d][e]).sum()).collect();
    let bytes = execute(topo, &schedule, &mut data).unwrap();
    for &d in &healthy {
        assert_eq!(data[d], want, "device {} of {:?}", topo.mesh.coords_string(d), topo.mesh.shape);
    }
    for (&(u, v), _) in bytes.iter().filter(|(_, &b)| b > 0) {
        assert!(topo.healthy(u) && topo.healthy(v) && topo.link_ok(u, v));
    }
    bytes.values().copied().max().unwrap_or(0)
}

/// Pins the schedule of a 16-element all-reduce in golden/degraded/NAME.txt.
fn pin(name: &str, t: &Topo) {
    golden(&format!("degraded/{name}.txt"), &plan(t, 16).unwrap().describe(&t.mesh)).unwrap();
}

fn figure(topology: Topology, failed: &[&str], links: &[(&str, &str)], rows_only: &[&str]) -> Topo {
    let deg = Degradation {
        nodes: nodes(failed),
        links: links.iter().map(|&(a, b)| (node(a), node(b))).collect(),
        along: rows_only.iter().map(|n| (node(n), 1)).collect(),
    };
    Topo::new(&Mesh::numbered(&[4, 4], topology), &deg, false).unwrap()
}

fn healthy_count(t: &Topo) -> usize {
    (0..16).filter(|&d| t.healthy(d)).count()
}

#[test]
fn figure_4() {
    let t = figure(Topology::Mesh, &["b3"], &[("c3", "c4"), ("c3", "d3")], &[]);
    // c3 lost a link along each dimension: fully degraded. c4 along rows only, d3 along
    // columns only; both still contribute.
    assert!(!t.healthy(node("c3")) && t.healthy(node("c4")) && t.healthy(node("d3")));
    assert!(t.degraded_along(node("c4"), 1) && !t.degraded_along(node("c4"), 0));
    assert!(t.degraded_along(node("d3"), 0) && !t.degraded_along(node("d3"), 1));
    assert_eq!(healthy_count(&t), 14);
    check(&t, 37, 4);
    pin("fig4", &t);
}

#[test]
fn figure_5a() {
    let t = figure(Topology::Mesh, &[], &[], &["b2", "b3", "c2", "c3"]);
    assert_eq!(healthy_count(&t), 16);
    check(&t, 37, 5);
    pin("fig5a", &t);
}

#[test]
fn figure_5b() {
    let t = figure(Topology::Mesh, &["a1", "a2", "b1", "b2"], &[], &[]);
    assert_eq!(healthy_count(&t), 12);
    check(&t, 37, 6);
    pin("fig5b", &t);
}

#[test]
fn figure_5c() {
    // The seed forwards only b1, d1, a3, b3, d3, a4, b4 to row c: a2 and d2 must count too.
    let t = figure(Topology::Mesh, &["a1", "b2", "d4"], &[], &[]);
    assert_eq!(healthy_count(&t), 13);
    check(&t, 37, 7);
    pin("fig5c", &t);
}

#[test]
fn figure_6() {
    let t = figure(Topology::Mesh, &["b2", "a3", "b3"], &[], &[]);
    // a2's only neighbour along the columns is b2: it is degraded along them, not failed.
    assert!(t.degraded_along(node("a2"), 0) && t.healthy(node("a2")));
    assert_eq!(healthy_count(&t), 13);
    check(&t, 37, 8);
    pin("fig6", &t);
}

#[test]
fn figure_7() {
    let t = figure(Topology::Torus, &["a1", "a2", "b1", "b2"], &[], &[]);
    assert_eq!(healthy_count(&t), 12);
    check(&t, 37, 9);
    pin("fig7", &t);
}

#[test]
fn fault_free_matches_a_plain_all_reduce() {
    for topology in [Topology::Mesh, Topology::Torus] {
        for shape in [vec![1], vec![5], vec![4, 4], vec![2, 3, 2]] {
            let t = Topo::new(&Mesh::numbered(&shape, topology), &Degradation::default(), false).unwrap();
            check(&t, 29, 10);
        }
    }
}

#[test]
fn strict_treats_partial_as_full() {
    let deg = Degradation { links: vec![(node("c3"), node("c4"))], ..Default::default() };
    let t = Topo::new(&Mesh::numbered(&[4, 4], Topology::Mesh), &deg, true).unwrap();
    assert_eq!(healthy_count(&t), 14);
    check(&t, 16, 11);
}

#[test]
fn an_unreachable_node_is_named() {
    // a3, b2 and c1 cut the corner a1, a2, b1 off the other ten healthy nodes.
    let t = figure(Topology::Mesh, &["a3", "b2", "c1"], &[], &[]);
    assert!(t.healthy(node("a1")) && t.healthy(node("a2")) && t.healthy(node("b1")));
    let e = plan(&t, 8).unwrap_err().to_string();
    assert_eq!(e, "healthy device (0,0), (0,1), (1,0) cannot reach the others over healthy links");
    // Two halves of equal size: the one without device 0 is named.
    let deg = Degradation { nodes: vec![2], ..Default::default() };
    let t = Topo::new(&Mesh::numbered(&[5], Topology::Mesh), &deg, false).unwrap();
    let e = plan(&t, 8).unwrap_err().to_string();
    assert_eq!(e, "healthy device (3), (4) cannot reach the others over healthy links");
    // On a torus the wrap link joins them.
    let t = Topo::new(&Mesh::numbered(&[5], Topology::Torus), &deg, false).unwrap();
    check(&t, 8, 12);
}

#[test]
fn degradations_from_the_command_line() {
    let m = Mesh::numbered(&[4, 4], Topology::Torus);
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let d = Degradation::from_args(&m, &args(&["1,2", "3, 0"]), &args(&["0,0:0,3"])).unwrap();
    assert_eq!(d, Degradation { nodes: vec![6, 12], links: vec![(0, 3)], along: vec![] });
    for (devices, links, want) in [
        (&["1,x"][..], &[][..], "device '1,x': expected coordinates such as 1,2"),
        (&["1"], &[], "device '1' is not in the [4, 4] mesh"),
        (&["4,0"], &[], "device '4,0' is not in the [4, 4] mesh"),
        (&[], &["0,0-0,1"], "link '0,0-0,1': expected two devices such as 0,0:0,1"),
    ] {
        assert_eq!(Degradation::from_args(&m, &args(devices), &args(links)).unwrap_err().to_string(), want);
    }
}

#[test]
fn bad_degradations_are_refused() {
    let m = Mesh::numbered(&[4, 4], Topology::Mesh);
    let cases = [
        (
            Degradation { links: vec![(0, 5)], ..Default::default() },
            "degraded link 0-5: the devices are not neighbours in the [4, 4] mesh",
        ),
        (Degradation { nodes: vec![16], ..Default::default() }, "degraded device 16 is not in the [4, 4] mesh"),
        (
            Degradation { along: vec![(1, 2)], ..Default::default() },
            "device 1 degraded along dimension 2: not in the [4, 4] mesh",
        ),
    ];
    for (deg, want) in cases {
        assert_eq!(Topo::new(&m, &deg, false).unwrap_err().to_string(), want);
    }
}

/// The healthy devices that reach `from` over healthy links (an independent search).
fn reach(t: &Topo, from: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::from([from]);
    let mut stack = vec![from];
    while let Some(u) = stack.pop() {
        for v in 0..t.mesh.devices() {
            if t.link_ok(u, v) && seen.insert(v) {
                stack.push(v);
            }
        }
    }
    seen
}

#[test]
fn random_degradations_count_every_healthy_contribution_once() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let (mut planned, mut refused) = (0, 0);
    for case in 0..400 {
        let dims = 1 + rng.below(3);
        let shape: Vec<usize> = (0..dims).map(|_| 1 + rng.below(5)).collect();
        let topology = if rng.below(2) == 0 { Topology::Mesh } else { Topology::Torus };
        let m = Mesh::numbered(&shape, topology);
        let n = m.devices();
        let free = Topo::new(&m, &Degradation::default(), false).unwrap();
        let mut deg = Degradation::default();
        for _ in 0..rng.below(n / 3 + 1) {
            deg.nodes.push(rng.below(n));
        }
        for _ in 0..rng.below(n / 3 + 1) {
            let u = rng.below(n);
            let a = rng.below(dims);
            if let Some(&v) = free.neighbours(u, a).first() {
                deg.links.push((u, v));
            }
        }
        let t = Topo::new(&m, &deg, rng.below(4) == 0).unwrap();
        let healthy: Vec<usize> = (0..n).filter(|&d| t.healthy(d)).collect();
        match plan(&t, 1 + rng.below(40)) {
            Ok(_) => {
                check(&t, 1 + rng.below(40), case);
                planned += 1;
                // Every healthy device is reachable from every other.
                if let Some(&h) = healthy.first() {
                    assert_eq!(reach(&t, h), healthy.iter().copied().collect());
                }
            }
            Err(e) if healthy.is_empty() => {
                assert_eq!(e.to_string(), format!("every device of the {shape:?} mesh is degraded"));
            }
            Err(e) => {
                refused += 1;
                let msg = e.to_string();
                // It names healthy devices that some other healthy device cannot reach.
                let named: Vec<usize> =
                    healthy.iter().copied().filter(|&d| msg.contains(&m.coords_string(d))).collect();
                assert!(!named.is_empty(), "{msg}");
                for d in named {
                    assert!(reach(&t, d).len() < healthy.len(), "{msg}");
                }
            }
        }
    }
    assert!(planned > 200 && refused > 5, "planned {planned}, refused {refused}");
}

/// Like `check`, for the all-reduce over one group (devices outside it may forward): the
/// healthy members end with the sum of their vectors, each once; everyone else keeps its
/// own; a reduce-scatter over the plan carries no more than the all-reduce on any link.
fn check_group(t: &Topo, group: &[usize], len: usize, seed: u64) -> Result<(), String> {
    let n = t.mesh.devices();
    let schedule = plan_group(t, group, len).map_err(|e| e.to_string())?;
    let members: Vec<usize> = group.iter().copied().filter(|&d| t.healthy(d)).collect();
    assert_eq!(schedule.members, members);
    let mut rng = Rng(seed | 1);
    let mut data: Vec<Vec<f64>> = (0..n).map(|_| (0..len).map(|_| rng.below(1 << 20) as f64).collect()).collect();
    let before = data.clone();
    let want: Vec<f64> = (0..len).map(|e| members.iter().map(|&d| data[d][e]).sum()).collect();
    let bytes = execute(t, &schedule, &mut data).unwrap();
    for d in 0..n {
        let expect = if members.contains(&d) { &want } else { &before[d] };
        assert_eq!(&data[d], expect, "device {} of {group:?} in {:?}", t.mesh.coords_string(d), t.mesh.shape);
    }
    for (&(u, v), &b) in &bytes {
        assert!(b == 0 || t.healthy(u) && t.healthy(v) && t.link_ok(u, v));
    }
    let keep = |i: usize| std::iter::once(len * i / members.len()..len * (i + 1) / members.len()).collect();
    let keeps = members.iter().enumerate().map(|(i, &d)| (d, keep(i))).collect();
    for (link, b) in schedule.scatter_link_bytes(4, &keeps) {
        assert!(b <= bytes[&link], "reduce-scatter over {link:?}");
    }
    Ok(())
}

#[test]
fn random_sub_group_reductions_count_every_healthy_member_once() {
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let (mut planned, mut refused) = (0, 0);
    for case in 0..150 {
        let dims = 1 + rng.below(3);
        let shape: Vec<usize> = (0..dims).map(|_| 1 + rng.below(4)).collect();
        let topology = if rng.below(2) == 0 { Topology::Mesh } else { Topology::Torus };
        let m = Mesh::numbered(&shape, topology);
        let n = m.devices();
        let free = Topo::new(&m, &Degradation::default(), false).unwrap();
        let mut deg = Degradation::default();
        for _ in 0..rng.below(n / 4 + 1) {
            deg.nodes.push(rng.below(n));
        }
        for _ in 0..rng.below(n / 4 + 1) {
            let u = rng.below(n);
            if let Some(&v) = free.neighbours(u, rng.below(dims)).first() {
                deg.links.push((u, v));
            }
        }
        let t = Topo::new(&m, &deg, false).unwrap();
        // Groups along a random set of axes (as lowering makes them), or an arbitrary set.
        let axes: Vec<usize> = (0..dims).filter(|_| rng.below(2) == 0).collect();
        let mut groups = m.groups(&axes);
        if rng.below(4) == 0 {
            groups = vec![(0..n).filter(|_| rng.below(2) == 0).collect()];
        }
        for g in groups.iter().filter(|g| g.iter().any(|&d| t.healthy(d))) {
            match check_group(&t, g, 1 + rng.below(30), case) {
                Ok(()) => planned += 1,
                Err(e) => {
                    refused += 1;
                    let named: Vec<usize> = g.iter().copied().filter(|&d| e.contains(&m.coords_string(d))).collect();
                    assert!(!named.is_empty(), "{e}");
                    // Each named member cannot reach some other healthy member.
                    let members: BTreeSet<usize> = g.iter().copied().filter(|&d| t.healthy(d)).collect();
                    for d in named {
                        assert!(!members.is_subset(&reach(&t, d)), "{e}");
                    }
                }
            }
        }
    }
    assert!(planned > 200 && refused > 0, "planned {planned}, refused {refused}");
}

/// Max link bytes of a 16 MiB f32 all-reduce on a 4×4 grid, fault-free and degraded, as
/// (failed nodes, mesh bytes, torus bytes): the forwarding spreads over the receivers
/// next to each forwarding node, so one failure on a torus costs no extra peak load.
#[test]
fn max_link_bytes_against_the_fault_free_run() {
    let len = 4 << 20;
    let cases: [(&[&str], u64, u64); 7] = [
        (&[], 25165824, 12582912),
        (&["b2"], 27962024, 12582912),
        (&["b2", "c3"], 29360128, 16777216),
        (&["b2", "b3", "c2", "c3"], 29360128, 16777216),
        (&["b3"], 27962028, 12582912),
        (&["a1", "a2", "b1", "b2"], 25165824, 16777216),
        (&["b2", "a3", "b3"], 33554432, 16777216),
    ];
    for (failed, mesh_max, torus_max) in cases {
        for (topology, want) in [(Topology::Mesh, mesh_max), (Topology::Torus, torus_max)] {
            let t = figure(topology, failed, &[], &[]);
            let got = plan(&t, len).unwrap().link_bytes(4).values().copied().max().unwrap();
            assert_eq!(got, want, "{topology:?} with {failed:?} failed");
        }
    }
}

#[test]
fn a_device_that_stops_answering_is_detected_and_named() {
    let start = std::time::Instant::now();
    let r = run("testdata/mlp/layouts/mp-2x4.json", &["--fail-device", "1,2@0", "--timeout", "0.2"]);
    assert_eq!(r.status, Some(1), "{r:?}");
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    assert!(
        r.stderr.starts_with("error: device (1,2) stopped answering: no sign of life for 200 ms while device (1,"),
        "{r:?}"
    );
    // Not a timing test: a guard against a hang (detection takes ~0.2 s).
    assert!(start.elapsed().as_secs() < 20);
    for (arg, want) in [
        ("1,2@1", "error: --fail-device: device 6 (1,2) runs 1 collective(s), none numbered 1"),
        ("1,2", "error: --fail-device '1,2': expected DEVICE@STEP such as 1,2@0"),
        ("2,0@0", "error: --fail-device: device '2,0' is not in the [2, 4] mesh"),
    ] {
        let r = run("testdata/mlp/layouts/mp-2x4.json", &["--fail-device", arg]);
        assert_eq!((r.status, r.stderr.trim_end()), (Some(1), want), "{r:?}");
    }
    let (graph, layout) = ("testdata/dp_train/graph.json", "testdata/dp_train/layouts/torus-4x4.json");
    let r = dp_train(&["run", graph, "--layout", layout, "--degrade", "1,2", "--fail-device", "1,2@0"]);
    assert_eq!(r.stderr, "error: --fail-device: device 6 (1,2) is degraded: it runs nothing\n", "{r:?}");
}

#[test]
fn strict_makes_the_ends_of_a_failed_link_carry_nothing() {
    let layout = "testdata/dp_train/layouts/torus-4x4.json";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "testdata/dp_train/graph.json", "--layout", layout, "--link-stats"];
        args.extend(extra);
        dp_train(&args)
    };
    // The ends of a failed link still compute and forward along the other dimension.
    let loose = run(&["--degrade-link", "0,0:0,1"]);
    assert_eq!(loose.status, Some(0), "{loose:?}");
    assert!(loose.stdout.contains("link (0,0) -> ") && loose.stdout.contains("link (0,1) -> "), "{loose:?}");
    let strict = run(&["--degrade-link", "0,0:0,1", "--degrade-strict"]);
    assert_eq!(strict.status, Some(0), "{strict:?}");
    let links: Vec<&str> = strict.stdout.lines().filter(|l| l.starts_with("link ")).collect();
    assert!(!links.is_empty() && links.iter().all(|l| !l.contains("(0,0)") && !l.contains("(0,1)")), "{strict:?}");
}

fn dp_train(args: &[&str]) -> crate::common::Run {
    let d = "testdata/dp_train";
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    if args[0] == "run" {
        all.extend(["--input".into(), format!("x={d}/inputs/x.npy"), "--input".into(), format!("t={d}/inputs/t.npy")]);
    }
    meshc(&all.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The data-parallel training step (tools/gen_dp_train.py) on a 4x4 torus: the compiled
/// degradation of its layout gives the update from the healthy replicas' gradients only
/// (numpy's expected-degraded/, unlike the fault-free expected/), and so does the
/// fault-free artifact re-planned at run time; the lowered programs and schedules are pinned.
#[test]
fn a_training_step_on_a_degraded_torus_updates_from_the_healthy_replicas_only() {
    let d = "testdata/dp_train";
    let dir = crate::common::scratch("degraded-dp-train");
    let (free, degraded) = (dir.join("free.mshc"), dir.join("degraded.mshc"));
    let (free, degraded) = (free.to_str().unwrap(), degraded.to_str().unwrap());
    let c = dp_train(&[
        "compile",
        &format!("{d}/graph.json"),
        "--layout",
        &format!("{d}/layouts/torus-4x4.json"),
        "-o",
        free,
    ]);
    assert_eq!(c.status, Some(0), "{c:?}");
    let c = dp_train(&[
        "compile",
        &format!("{d}/graph.json"),
        "--layout",
        &format!("{d}/degraded/torus-4x4.json"),
        "-o",
        degraded,
        "--dump-after",
        "lower",
    ]);
    assert_eq!(c.status, Some(0), "{c:?}");
    golden("degraded/dp_train-lower.txt", &c.stdout).unwrap();
    // The degraded devices' programs are empty: no code, buffers or arena.
    let i = meshc(&["inspect", degraded]);
    assert!(i.stdout.contains("\ndegraded devices [(1,2) (2,1) (3,3)] links [(0,0)-(0,1)]\n"), "{i:?}");
    assert!(i.stdout.contains("\ndevice 6: arena 0 bytes, 0 buffers, 0 kernels, 0 steps\n"), "{i:?}");
    let want = |dir: &str| format!("{d}/{dir}");
    let runs = [
        (free, vec![], "expected", true),
        (degraded, vec![], "expected-degraded", true),
        (degraded, vec![], "expected", false),
        (
            free,
            vec!["--degrade", "1,2", "--degrade", "2,1", "--degrade", "3,3", "--degrade-link", "0,0:0,1"],
            "expected-degraded",
            true,
        ),
    ];
    for (art, extra, expected, ok) in runs {
        let mut args = vec!["run", art, "--check-against"];
        let e = want(expected);
        args.push(&e);
        args.extend(extra);
        let r = dp_train(&args);
        assert_eq!(r.status, Some(if ok { 0 } else { 1 }), "{art} against {expected}: {r:?}");
    }
}

/// Output blocks of a failed device come from a healthy replica, or read as NaN when no
/// healthy device holds them (its data-parallel shard was dropped).
#[test]
fn output_blocks_of_a_failed_device_come_from_a_replica_or_read_nan() {
    let dir = crate::common::scratch("degraded-outputs");
    let spec = dir.join("dp-4.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [4], "axes": ["data"]}, "rules": {"batch": "data"}}"#,
    )
    .unwrap();
    let want = meshc_ir::Tensor::read_npy(Path::new("testdata/mlp/expected/y.npy")).unwrap();
    let want = want.as_f32().unwrap();
    // y is [16, 64]: device 3 of 4 held rows 12..16, and no one else did.
    for (layout, device, lost_rows) in
        [(spec.to_str().unwrap(), "3", 12..16), ("testdata/mlp/layouts/dp-2x4.json", "1,2", 0..0)]
    {
        let out = dir.join(format!("out-{device}"));
        let r = run(layout, &["--degrade", device, "--output-dir", out.to_str().unwrap()]);
        assert_eq!(r.status, Some(0), "{r:?}");
        let y = meshc_ir::Tensor::read_npy(&out.join("y.npy")).unwrap();
        for (i, (got, want)) in y.as_f32().unwrap().iter().zip(want).enumerate() {
            if lost_rows.contains(&(i / 64)) {
                assert!(got.is_nan(), "{layout}: element {i}");
            } else {
                assert!((got - want).abs() <= 1e-5 + 1e-4 * want.abs(), "{layout}: element {i}: {got} vs {want}");
            }
        }
    }
}

/// `--replan-on-failure`: the silent device is found, degraded, and the step runs again
/// without it — the update from the remaining healthy replicas.
#[test]
fn a_silent_device_is_replanned_around_and_the_step_run_again() {
    let d = "testdata/dp_train";
    let (graph, layout, want) =
        (format!("{d}/graph.json"), format!("{d}/layouts/torus-4x4.json"), format!("{d}/expected-degraded"));
    let mut args = vec!["run", &graph, "--layout", &layout, "--check-against", &want, "--timeout", "0.2"];
    // expected-degraded leaves out (1,2), (2,1), (3,3) and the link (0,0)-(0,1): (3,3) fails mid-run.
    args.extend(["--degrade", "1,2", "--degrade", "2,1", "--degrade-link", "0,0:0,1", "--fail-device", "3,3@1"]);
    let r = dp_train(&args);
    assert_eq!(r.status, Some(1), "{r:?}");
    args.push("--replan-on-failure");
    let r = dp_train(&args);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stderr.starts_with("device (3,3) stopped answering: "), "{r:?}");
    assert!(r.stderr.ends_with(": re-planning without (3,3) and running again\n"), "{r:?}");
}

/// A failed link leaves both ends computing: a model-parallel layout still gives the exact
/// answer, its sub-group all_reduce re-planned at run time around the link (forwarded
/// through the other row, since both ends lose every link along the row).
#[test]
fn a_failed_link_reroutes_a_model_parallel_all_reduce_at_run_time() {
    let r = run(
        "testdata/mlp/layouts/mp-2x4.json",
        &["--degrade-link", "1,1:1,2", "--link-stats", "--check-against", "testdata/mlp/expected"],
    );
    assert_eq!(r.status, Some(0), "{r:?}");
    let links: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("link ")).collect();
    // Row 1's all_reduce crosses to row 0 and back.
    assert!(links.iter().any(|l| l.starts_with("link (1,1) -> (0,1) ")), "{r:?}");
    for l in links {
        let w: Vec<&str> = l.split(' ').collect();
        let along_row = w[1][1..2] == w[3][1..2];
        assert!(!(along_row && ["(1,1)", "(1,2)"].iter().any(|d| w[1] == *d || w[3] == *d)), "{l}: {r:?}");
    }
}

/// A graph placed in stages cannot lose a device (the pipeline would break), but a failed
/// link only re-plans its collectives: the answer stays exact. (The transformer's last stage,
/// devices (3,*), all-reduces over the model axis; with its only link failed, the pair goes
/// through stage 2's devices.)
#[test]
fn a_pipeline_keeps_its_devices_but_routes_around_a_failed_link() {
    let dir = crate::common::scratch("degraded-stages");
    let spec = dir.join("stages.json");
    let t = "testdata/transformer";
    let base = std::fs::read_to_string(format!("{t}/layouts/stages-4x2.json")).unwrap();
    let with =
        |degraded: &str| base.trim_end().trim_end_matches('}').to_string() + &format!(", \"degraded\": {degraded}}}");
    let out = dir.join("x.mshc");
    let graph = format!("{t}/graph.json");
    let compile = || meshc(&["compile", &graph, "--layout", spec.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    std::fs::write(&spec, with(r#"{"nodes": [[1, 1]]}"#)).unwrap();
    let r = compile();
    assert_eq!(r.status, Some(1), "{r:?}");
    assert!(r.stderr.ends_with("stages.json: degraded device (1,1) would break the pipeline: a graph placed in stages cannot lose a device (failed links are fine)\n"), "{r:?}");
    std::fs::write(&spec, with(r#"{"links": [[[3, 0], [3, 1]]]}"#)).unwrap();
    assert_eq!(compile().status, Some(0));
    let (ids, mask) = (format!("ids={t}/inputs/ids.npy"), format!("mask={t}/inputs/mask.npy"));
    let want = format!("{t}/expected");
    let art = out.to_str().unwrap();
    let r = meshc(&["run", art, "--input", &ids, "--input", &mask, "--check-against", &want, "--link-stats"]);
    assert_eq!(r.status, Some(0), "{r:?}");
    assert!(r.stdout.contains("link (3,0) -> (2,0) "), "{r:?}");
    assert!(!r.stdout.contains("link (3,0) -> (3,1) ") && !r.stdout.contains("link (3,1) -> (3,0) "), "{r:?}");
}
