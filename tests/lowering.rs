//! The lowering pass on its own: every testdata graph, under random legal layouts of random
//! tensors on several meshes, lowered and run by the reference execution of per-device
//! programs (`mesh_interp`), must equal the single-device interpreter.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use meshc::layout::Seed;
use meshc::mesh::{Layout, Mesh, Topology};
use meshc::passes::layout::{propagate, Source};
use meshc::passes::lower::lower;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};
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

fn meshes() -> Vec<Mesh> {
    let m = |shape: &[usize], topology| Mesh {
        shape: shape.to_vec(),
        axes: (0..shape.len()).map(|i| ["a", "b", "c"][i].to_string()).collect(),
        topology,
    };
    vec![
        m(&[2], Topology::Mesh),
        m(&[4], Topology::Torus),
        m(&[2, 2], Topology::Mesh),
        m(&[2, 1, 2], Topology::Torus),
        m(&[2, 4], Topology::Mesh),
        m(&[2, 2, 2], Topology::Torus),
    ]
}

/// A legal layout for `shape` drawn from `pick` (one number per dim).
fn layout_from(mesh: &Mesh, shape: &[usize], picks: &[u8]) -> Layout {
    let mut layout = vec![None; shape.len()];
    for (d, &p) in picks.iter().enumerate().take(shape.len()) {
        let a = p as usize % (mesh.shape.len() + 1);
        if a < mesh.shape.len() && shape[d].is_multiple_of(mesh.shape[a]) && !layout.contains(&Some(a)) {
            layout[d] = Some(a);
        }
    }
    layout
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_layouts_lower_to_the_single_device_result(
        graph in 0usize..16, mesh in 0usize..6, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 64), density in 1usize..4
    ) {
        let graphs = common::testdata_graphs();
        let dir = graphs[graph % graphs.len()].parent().unwrap().to_path_buf();
        let c = case(&dir);
        let mesh = &meshes()[mesh];
        let names: Vec<&String> = c.g.inputs.iter().map(|i| &i.name).chain(c.g.params.iter().map(|p| &p.name)).chain(c.g.nodes.iter().map(|n| &n.name)).collect();
        let mut seeds = BTreeMap::new();
        for (k, name) in names.iter().enumerate() {
            if (k * 7 + density) % (density + 1) == 0 {
                let l = layout_from(mesh, &c.info.types[*name].shape, &picks[k % picks.len()]);
                seeds.insert(name.to_string(), Seed { layout: l, source: Source::Spec });
            }
        }
        check(&c, mesh, seeds).map_err(TestCaseError::fail)?;
    }
}
