//! The lowering pass under random legal layouts of random tensors on several meshes: every
//! testdata graph, lowered and run by the reference execution of per-device programs
//! (`mesh_interp`), and random small graphs, lowered, compiled and run by the multi-device
//! runner as well, must equal the single-device interpreter.

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

fn random_seeds(c: &Case, mesh: &Mesh, picks: &[Vec<u8>], density: usize) -> BTreeMap<String, Seed> {
    let names = c.g.inputs.iter().map(|i| &i.name).chain(c.g.params.iter().map(|p| &p.name));
    let names: Vec<&String> = names.chain(c.g.nodes.iter().map(|n| &n.name)).collect();
    let mut seeds = BTreeMap::new();
    for (k, name) in names.iter().enumerate() {
        if (k * 7 + density).is_multiple_of(density + 1) {
            let layout = layout_from(mesh, &c.info.types[*name].shape, &picks[k % picks.len()]);
            seeds.insert(name.to_string(), Seed { layout, source: Source::Spec });
        }
    }
    seeds
}

/// A random small graph in the text format: a [B,D] input, then ops chosen by `ops` on
/// earlier f32 results (matmuls and layer norms bring their own params).
fn random_graph(b: usize, d: usize, ops: &[(u8, u8, u8)]) -> String {
    let mut lines = vec![format!("input x: f32[{b},{d}]")];
    let mut tensors: Vec<(String, Vec<usize>)> = vec![("x".into(), vec![b, d])];
    for (k, &(op, pick, arg)) in ops.iter().enumerate() {
        let (src, shape) = tensors[pick as usize % tensors.len()].clone();
        let name = format!("t{k}");
        let (r, c) = (shape[0], shape[1]);
        let axis = arg as usize % 2;
        let (line, out) = match op % 11 {
            0 => (format!("{name} = tanh({src})"), shape.clone()),
            1 => {
                let same: Vec<&(String, Vec<usize>)> = tensors.iter().filter(|t| t.1 == shape).collect();
                let other = &same[arg as usize % same.len()].0;
                (format!("{name} = add({src}, {other})"), shape.clone())
            }
            2 => {
                let n = [4, 8][arg as usize % 2];
                lines.push(format!("param w{k}: f32[{c},{n}] = init normal{{seed = {k}, std = 0.3}}"));
                (format!("{name} = matmul({src}, w{k})"), vec![r, n])
            }
            3 => (format!("{name} = reduce_sum({src}) {{axes = [{axis}], keepdims = true}}"), {
                let mut s = shape.clone();
                s[axis] = 1;
                s
            }),
            4 => (format!("{name} = softmax({src}) {{axis = {axis}}}"), shape.clone()),
            5 => {
                lines.push(format!("param g{k}: f32[{c}] = init normal{{seed = {k}, mean = 1.0, std = 0.1}}"));
                lines.push(format!("param b{k}: f32[{c}] = init normal{{seed = {}, std = 0.1}}", k + 100));
                (format!("{name} = layer_norm({src}, g{k}, b{k}) {{axis = -1}}"), shape.clone())
            }
            6 => (format!("{name} = transpose({src}) {{perm = [1, 0]}}"), vec![c, r]),
            7 if r * c % 2 == 0 => {
                (format!("{name} = reshape({src}) {{shape = [{}, 2]}}", r * c / 2), vec![r * c / 2, 2])
            }
            8 => (format!("{name} = concat({src}, {src}) {{axis = {axis}}}"), {
                let mut s = shape.clone();
                s[axis] *= 2;
                s
            }),
            9 if shape[axis] >= 2 => {
                (format!("{name} = slice({src}) {{starts = [0], ends = [{}], axes = [{axis}]}}", shape[axis] / 2), {
                    let mut s = shape.clone();
                    s[axis] /= 2;
                    s
                })
            }
            10 => (format!("{name} = reduce_max({src}) {{axes = [{axis}], keepdims = true}}"), {
                let mut s = shape.clone();
                s[axis] = 1;
                s
            }),
            _ => (format!("{name} = relu({src})"), shape.clone()),
        };
        lines.push(line);
        tensors.push((name, out));
    }
    let last = &tensors.last().expect("x at least").0;
    format!("graph random {{\n  {}\n  output {last}\n}}\n", lines.join("\n  "))
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
        meshc::compile::compile_lowered(&c.g, &c.info, &lowered, &c.params, &meshc::compile::Options::default())
            .map_err(|e| format!("{e:#}"))?;
    let weights = meshc::runner::AlignedBuf::from_bytes(&compiled.weights).unwrap();
    let code = meshc::runner::Code::Copied(meshc::codegen::ExecCode::new(&compiled.code).unwrap());
    let loaded = meshc::runner::Loaded::new(compiled.meta, compiled.programs, code, weights.as_slice())
        .map_err(|e| format!("{e:#}"))?;
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
        mesh in 0usize..6, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 16), density in 1usize..4
    ) {
        let src = random_graph([4, 8][b], [4, 8][d], &ops);
        let c = random_case(&src);
        let mesh = &meshes()[mesh];
        let seeds = random_seeds(&c, mesh, &picks, density);
        check(&c, mesh, seeds.clone()).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
        check_compiled(&c, mesh, seeds).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    }
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
        check(&c, mesh, random_seeds(&c, mesh, &picks, density)).map_err(TestCaseError::fail)?;
    }
}
