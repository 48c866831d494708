//! The lowering pass under random legal layouts of random tensors on several meshes: every
//! testdata graph, lowered and run by the reference execution of per-device programs
//! (`mesh_interp`), and random small graphs, lowered, compiled and run by the multi-device
//! runner as well, must equal the single-device interpreter.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use meshc::layout::Seed;
use meshc::passes::layout::propagate;
use meshc::passes::lower::lower;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};
use meshc_runtime::format::mesh::Mesh;
use proptest::prelude::*;

struct Case {
    g: Graph,
    info: Info,
    params: HashMap<String, Tensor>,
    inputs: HashMap<String, Tensor>,
    want: BTreeMap<String, Tensor>,
}

fn case(dir: &Path) -> Case {
    let path = dir.join("graph.json");
    let (g, info) = meshc_ir::load::load(&path).unwrap();
    let params = meshc_ir::params::load_all(&g, dir).unwrap();
    let inputs: HashMap<String, Tensor> = g
        .inputs
        .iter()
        .map(|i| (i.name.clone(), Tensor::read_npy(&dir.join("inputs").join(format!("{}.npy", i.name))).unwrap()))
        .collect();
    let mut values = params.clone();
    values.extend(inputs.clone());
    let want = meshc_ir::interp::run(&g, &info.order, &info.types, values).unwrap().into_iter().collect();
    Case { g, info, params, inputs, want }
}

fn check(c: &Case, mesh: &Mesh, seeds: BTreeMap<String, Seed>) -> Result<(), String> {
    let described: Vec<String> = seeds.iter().map(|(t, s)| format!("{t}{}", mesh.layout_string(&s.layout))).collect();
    let layouts = propagate(&c.g, &c.info, mesh, seeds);
    let lowered = lower(&c.g, &c.info, &layouts).map_err(|e| format!("{e:#}"))?;
    let got = meshc::mesh_interp::run(&lowered, &c.params, &c.inputs)
        .map_err(|e| format!("{}: {e:#}", described.join(" ")))?;
    for (name, want) in &c.want {
        let closeness = got[name].closeness(want);
        if got[name].ty() != want.ty() || closeness.first_bad.is_some() {
            return Err(format!("{}: output '{name}': {closeness:?} on mesh {:?}", described.join(" "), mesh.shape));
        }
    }
    Ok(())
}

fn random_case(src: &str) -> Case {
    let g = meshc_ir::text::parse(src).unwrap();
    let info = meshc_ir::verify::verify(&g).unwrap();
    let params = meshc_ir::params::load_all(&g, Path::new(".")).unwrap();
    let x = &info.types["x"];
    let v: Vec<f32> = (0..x.numel()).map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0).collect();
    let inputs = HashMap::from([("x".to_string(), Tensor::new(x.shape.clone(), meshc_ir::Data::F32(v)))]);
    let mut values = params.clone();
    values.extend(inputs.clone());
    let want = meshc_ir::interp::run(&g, &info.order, &info.types, values).unwrap().into_iter().collect();
    Case { g, info, params, inputs, want }
}

/// Compiles the lowering and runs it on the multi-device runner.
fn check_compiled(c: &Case, mesh: &Mesh, seeds: BTreeMap<String, Seed>) -> Result<(), String> {
    let layouts = propagate(&c.g, &c.info, mesh, seeds);
    let lowered = lower(&c.g, &c.info, &layouts).map_err(|e| format!("{e:#}"))?;
    let compiled =
        meshc::compile::compile_lowered(&c.g, &c.info, &lowered, &c.params, &Default::default(), &Default::default())
            .map_err(|e| format!("{e:#}"))?;
    let loaded = compiled.load().map_err(|e| format!("{e:#}"))?;
    let got = loaded.run(&c.inputs).map_err(|e| format!("{e:#}"))?;
    for (name, want) in &c.want {
        let closeness = got[name].closeness(want);
        if got[name].ty() != want.ty() || closeness.first_bad.is_some() {
            return Err(format!("compiled: output '{name}': {closeness:?} on mesh {:?}", mesh.shape));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_graphs_lower_and_run_like_one_device(
        b in 0usize..2, d in 0usize..2, ops in proptest::collection::vec((0u8..12, 0u8..16, 0u8..4), 2..8),
        mesh in 0usize..7, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 16), density in 1usize..4
    ) {
        let src = crate::common::random_graph([4, 8][b], [4, 8][d], &ops);
        let c = random_case(&src);
        let mesh = &crate::common::meshes()[mesh];
        let seeds = crate::common::random_seeds(&c.g, &c.info, mesh, &picks, density);
        check(&c, mesh, seeds.clone()).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
        check_compiled(&c, mesh, seeds).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_layouts_lower_to_the_single_device_result(
        graph in 0usize..16, mesh in 0usize..7, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 64), density in 1usize..4
    ) {
        let graphs = crate::common::testdata_graphs();
        let dir = graphs[graph % graphs.len()].parent().unwrap().to_path_buf();
        let c = case(&dir);
        let mesh = &crate::common::meshes()[mesh];
        check(&c, mesh, crate::common::random_seeds(&c.g, &c.info, mesh, &picks, density)).map_err(TestCaseError::fail)?;
    }
}

/// scatter_elements under every mesh and many layouts of its operands: a split off the axis
/// stays local, any other is gathered, and both the lowering and the compiled run match.
#[test]
fn scatter_elements_lowers_and_runs_like_one_device() {
    for (axis, reduction) in [(1, "add"), (0, "none"), (-1, "max")] {
        let src = format!(
            "graph sc {{\n  input x: f32[4,8]\n  param i: i64[4,3] = value [[0,3,-1],[1,1,2],[3,-4,0],[2,2,2]]\n  \
             param u: f32[4,3] = init normal{{seed = 3, std = 1.0}}\n  \
             y = scatter_elements(x, i, u) {{axis = {axis}, reduction = \"{reduction}\"}}\n  output y\n}}\n"
        );
        let c = random_case(&src);
        for (m, mesh) in crate::common::meshes().iter().enumerate() {
            for k in 0..8u8 {
                let picks: Vec<Vec<u8>> = (0..16).map(|j| vec![k, (k + j as u8) % 8, m as u8, j as u8 % 8]).collect();
                let seeds = crate::common::random_seeds(&c.g, &c.info, mesh, &picks, 1 + k as usize % 3);
                check(&c, mesh, seeds.clone()).unwrap_or_else(|e| panic!("{e}\n{src}"));
                check_compiled(&c, mesh, seeds).unwrap_or_else(|e| panic!("{e}\n{src}"));
            }
        }
    }
}
