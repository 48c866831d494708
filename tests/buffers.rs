//! The buffer-assignment pass: on random graphs (one device and random layouts over several
//! meshes) and on every testdata graph and layout, no two buffers live at the same step share
//! arena bytes except an elementwise result and the operand that dies at its step, and the
//! planned programs compute exactly what the naive layout computes. Plus the golden
//! `--dump-after buffers` of every testdata graph and of one layout.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use meshc::compile::{compile, compile_lowered, Compiled, Options};
use meshc::layout::Seed;
use meshc::mesh::Mesh;
use meshc::passes::buffers::{liveness, naive_bytes};
use meshc::passes::layout::propagate;
use meshc::passes::lower::lower;
use meshc::program::{Exec, Program, Storage, ALIGN};
use meshc::runner::{AlignedBuf, Code, Loaded};
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};
use proptest::prelude::*;

/// Checks the arena plan of one program; the error names the two buffers at fault.
fn check_plan(p: &Program) -> Result<(), String> {
    let live = liveness(p);
    let arena: Vec<(usize, usize, usize)> = (p.buffers.iter().enumerate())
        .filter_map(|(b, buf)| match buf.storage {
            Storage::Arena { offset } => Some((b, offset, buf.bytes)),
            Storage::Weights { .. } => None,
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
        let (lr, lo) = (live[r].unwrap(), live[o].unwrap());
        let s = &p.steps[lr.first];
        lo.last == lr.first
            && s.buffers[0] == r
            && s.buffers[1..].contains(&o)
            && matches!(s.exec, Exec::Kernel(_))
            && p.buffers[r].storage == p.buffers[o].storage
            && p.buffers[r].bytes == p.buffers[o].bytes
    };
    for (i, &(a, oa, na)) in arena.iter().enumerate() {
        for &(b, ob, nb) in &arena[i + 1..] {
            let overlap = oa < ob + nb && ob < oa + na;
            if overlap && live[a].unwrap().intersects(&live[b].unwrap()) && !in_place(a, b) && !in_place(b, a) {
                return Err(format!(
                    "device {}: b{a} '{}' {:?} at {oa} (+{na}) and b{b} '{}' {:?} at {ob} (+{nb}) overlap",
                    p.device, p.buffers[a].name, live[a], p.buffers[b].name, live[b]
                ));
            }
        }
    }
    Ok(())
}

fn run(c: Compiled, inputs: &HashMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>, String> {
    let weights = AlignedBuf::from_bytes(&c.weights).unwrap();
    let code = Code::Copied(meshc::codegen::ExecCode::new(&c.code).unwrap());
    let loaded = Loaded::new(c.meta, c.programs, code, weights.as_slice()).map_err(|e| format!("{e:#}"))?;
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
    let build = |plan_arena: bool| {
        let opts = Options { plan_arena, ..Options::default() };
        match &lowered {
            Some(l) => compile_lowered(g, info, l, params, &opts),
            None => compile(g, info, params, &opts),
        }
        .map_err(|e| format!("{e:#}"))
    };
    let (planned, naive) = (build(true)?, build(false)?);
    for p in &planned.programs {
        check_plan(p)?;
    }
    let sizes = (planned.programs[0].arena_bytes, naive.programs[0].arena_bytes);
    if sizes.1 != naive_bytes(&planned.programs[0]) || sizes.0 > sizes.1 {
        return Err(format!("arena {} bytes, naive {} bytes", sizes.0, sizes.1));
    }
    let (got, want) = (run(planned, inputs)?, run(naive, inputs)?);
    for (name, w) in &want {
        if got[name].ty() != w.ty() || got[name].to_le_bytes() != w.to_le_bytes() {
            return Err(format!("output '{name}' differs from the naive layout's"));
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
        mesh in 0usize..7, picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 24), density in 1usize..4
    ) {
        let src = common::random_graph([4, 8][b], [4, 8][d], &ops);
        let g = meshc_ir::text::parse(&src).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        let params = meshc_ir::params::load_all(&g, Path::new(".")).unwrap();
        let meshes = common::meshes();
        // The last draw is one device without a layout.
        let layouts = meshes.get(mesh).map(|m| (m, common::random_seeds(&g, &info, m, &picks, density)));
        check_graph(&g, &info, layouts, &params, &random_input(&g)).map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
    }
}

fn testdata_inputs(graph: &Path, g: &Graph) -> HashMap<String, Tensor> {
    let dir = graph.parent().unwrap().join("inputs");
    g.inputs.iter().map(|i| (i.name.clone(), Tensor::read_npy(&dir.join(format!("{}.npy", i.name))).unwrap())).collect()
}

#[test]
fn testdata_graphs_and_layouts_plan_sound_arenas_that_compute_the_same() {
    for graph in common::testdata_graphs() {
        let (g, info) = meshc_ir::load::load(&graph).unwrap();
        let params = meshc_ir::params::load_all(&g, graph.parent().unwrap()).unwrap();
        let inputs = testdata_inputs(&graph, &g);
        let (arena, naive) =
            check_graph(&g, &info, None, &params, &inputs).unwrap_or_else(|e| panic!("{}: {e}", graph.display()));
        if graph.parent().unwrap().ends_with("transformer") {
            assert!(arena * 10 <= naive * 4, "transformer: arena {arena} bytes is over 40% of naive {naive}");
        }
    }
    for case in common::layout_cases() {
        let (g, info) = meshc_ir::load::load(&case.graph).unwrap();
        let params = meshc_ir::params::load_all(&g, case.graph.parent().unwrap()).unwrap();
        let spec = meshc::layout::load(&case.spec).unwrap();
        let seeds = spec.seed_layouts(&g, &info).unwrap();
        check_graph(&g, &info, Some((&spec.mesh, seeds)), &params, &testdata_inputs(&case.graph, &g))
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
    }
}

#[test]
fn dumps_after_buffers_are_pinned() {
    let out = common::scratch("buffers-dump").join("graph.mshc");
    let mut failures = Vec::new();
    let mut dump = |label: &str, args: &[&str]| {
        let mut all = vec!["compile", args[0], "-o", out.to_str().unwrap(), "--dump-after", "buffers"];
        all.extend(&args[1..]);
        let r = common::meshc(&all);
        assert_eq!(r.status, Some(0), "{label}: {}", r.stderr);
        if let Err(e) = common::golden(&format!("buffers/{label}.txt"), &r.stdout) {
            failures.push(e);
        }
    };
    for graph in common::testdata_graphs() {
        let name = graph.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        dump(&name, &[graph.to_str().unwrap()]);
    }
    let case = common::layout_cases().into_iter().find(|c| c.label == "transformer-mp-2x4").expect("the layout");
    dump(&case.label, &[case.graph.to_str().unwrap(), "--layout", case.spec.to_str().unwrap()]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
