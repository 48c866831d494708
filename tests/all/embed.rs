//! The embedding API (runtime/src/api, docs/embedding.md) on real compiled artifacts: every
//! testdata graph through `Session::run` and `run_into` against numpy's outputs, on one
//! device and split over a mesh; a session shared by threads calling at once; a training
//! artifact stepped with its state on the devices; and every kind of wrong tensor refused
//! with its one line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use meshc_ir::{DType, Tensor};
use meshc_runtime::api::{Error, Model, Session, TensorView, TensorViewMut};
use meshc_runtime::tools::steps::State;

use crate::common::{matches_expected, meshc, scratch, testdata_graphs};

/// `graph` compiled to `dir/name.mshc` with `extra` arguments.
fn compile(graph: &Path, dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let art = dir.join(format!("{name}.mshc"));
    let mut args = vec!["compile", graph.to_str().unwrap(), "-o", art.to_str().unwrap()];
    args.extend(extra);
    let c = meshc(&args);
    assert_eq!(c.status, Some(0), "{c:?}");
    art
}

/// Every `<graph dir>/inputs/NAME.npy`, by name.
fn inputs(graph: &Path) -> BTreeMap<String, Tensor> {
    let dir = graph.parent().unwrap().join("inputs");
    let files = std::fs::read_dir(&dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_else(|_| vec![]);
    files.iter().map(|f| (f.file_stem().unwrap().to_string_lossy().into(), Tensor::read_npy(f).unwrap())).collect()
}

fn views(inputs: &BTreeMap<String, Tensor>) -> Vec<(&str, TensorView<'_>)> {
    inputs.iter().map(|(n, t)| (n.as_str(), TensorView::of(t))).collect()
}

/// `run`, and `run_into` zero-filled tensors of the outputs' types, on `session`.
fn both_ways(model: &Model, session: &Session, inputs: &BTreeMap<String, Tensor>) -> [BTreeMap<String, Tensor>; 2] {
    let owned = session.run(&views(inputs)).unwrap();
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>, DType)> = (model.outputs().iter())
        .map(|o| {
            let bytes = o.shape.iter().product::<usize>() * o.dtype.size_bytes();
            (o.name.clone(), o.shape.clone(), vec![0xAB; bytes], o.dtype)
        })
        .collect();
    let mut outs: Vec<(&str, TensorViewMut)> =
        (bufs.iter_mut()).map(|(n, s, b, d)| (n.as_str(), TensorViewMut::from_bytes(*d, s, b).unwrap())).collect();
    session.run_into(&views(inputs), &mut outs).unwrap();
    let into = (bufs.iter())
        .map(|(n, s, b, d)| (n.clone(), Tensor::from_le_bytes(&meshc_ir::TensorType::new(*d, s.clone()), b)))
        .collect();
    [owned, into]
}

#[test]
fn every_testdata_artifact_runs_through_the_api_as_numpy_computed_it() {
    let dir = scratch("embed-testdata");
    let mut failures = Vec::new();
    let mut cases: Vec<(PathBuf, String, Vec<&str>)> =
        testdata_graphs().into_iter().map(|g| (g.clone(), "one".to_string(), vec![])).collect();
    // The mesh paths: inputs cut into blocks, outputs gathered from them.
    for (graph, layout) in [("mlp", "mp-2x4"), ("mlp", "dp-2"), ("transformer", "mp-2x4")] {
        let g = PathBuf::from(format!("testdata/{graph}/graph.json"));
        let spec = format!("testdata/{graph}/layouts/{layout}.json");
        cases.push((g, layout.to_string(), vec!["--layout", Box::leak(spec.into_boxed_str())]));
    }
    for (g, label, extra) in cases {
        let name = format!("{}-{label}", g.parent().unwrap().file_name().unwrap().to_string_lossy());
        let art = compile(&g, &dir, &name, &extra);
        let model = Model::open(&art).unwrap();
        let session = Session::new(&model).unwrap();
        let inputs = inputs(&g);
        // Twice: the second call reuses the arenas and device threads of the first.
        for call in 0..2 {
            for (way, results) in ["run", "run_into"].iter().zip(both_ways(&model, &session, &inputs)) {
                if let Err(e) = matches_expected(&g, &results) {
                    failures.push(format!("{name} {way} call {call}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn metadata_describes_inputs_outputs_and_mesh() {
    let dir = scratch("embed-meta");
    let g = Path::new("testdata/mlp/graph.json");
    let art = compile(g, &dir, "mlp", &["--layout", "testdata/mlp/layouts/mp-2x4.json"]);
    let model = Model::open(&art).unwrap();
    let x = &model.inputs()[0];
    let want = Tensor::read_npy(Path::new("testdata/mlp/inputs/x.npy")).unwrap();
    assert_eq!((x.name.as_str(), x.dtype, &x.shape), ("x", DType::F32, &want.shape));
    assert_eq!(model.outputs()[0].name, "y");
    assert_eq!(model.mesh().shape, vec![2, 4]);
    assert!(model.state_names().is_empty());
    // The same bytes from memory: an in-memory file, errors naming it <bytes>.
    let bytes = std::fs::read(&art).unwrap();
    let m2 = Model::from_bytes(&bytes).unwrap();
    assert_eq!(m2.inputs(), model.inputs());
    let e = Model::from_bytes(&bytes[..100]).err().unwrap().to_string();
    assert!(e.starts_with("<bytes>: "), "{e}");
    let e = Model::open(dir.join("none.mshc")).err().unwrap().to_string();
    assert!(e.contains("none.mshc: No such file"), "{e}");
    fn shareable<T: Send + Sync>() {}
    shareable::<Model>();
    shareable::<Session>();
}

#[test]
fn threads_calling_one_session_at_once_each_get_their_own_results() {
    let dir = scratch("embed-threads");
    let g = Path::new("testdata/mlp/graph.json");
    for (label, extra) in [("one", vec![]), ("mesh", vec!["--layout", "testdata/mlp/layouts/mp-2x4.json"])] {
        let art = compile(g, &dir, label, &extra);
        let model = Model::open(&art).unwrap();
        let session = Session::new(&model).unwrap();
        let x = Tensor::read_npy(Path::new("testdata/mlp/inputs/x.npy")).unwrap();
        // Per thread its own input (x scaled) and, computed alone first, its own answer.
        let scaled: Vec<Tensor> = (0..4)
            .map(|k| Tensor::f32(x.shape.clone(), x.as_f32().unwrap().iter().map(|v| v * (k as f32 + 1.0)).collect()))
            .collect();
        let alone: Vec<Tensor> =
            scaled.iter().map(|t| session.run(&[("x", TensorView::of(t))]).unwrap()["y"].clone()).collect();
        std::thread::scope(|s| {
            for (t, want) in scaled.iter().zip(&alone) {
                let session = &session;
                s.spawn(move || {
                    let mut y = vec![0f32; want.numel()];
                    for _ in 0..25 {
                        let mut out = [("y", TensorViewMut::new(&mut y, &want.shape).unwrap())];
                        session.run_into(&[("x", TensorView::of(t))], &mut out).unwrap();
                        assert_eq!(y, want.as_f32().unwrap(), "{label}");
                    }
                });
            }
        });
        // Two sessions of one model run side by side, sharing the mapping.
        let other = Session::new(&model).unwrap();
        assert_eq!(other.run(&[("x", TensorView::of(&x))]).unwrap()["y"], alone[0]);
    }
}

#[test]
fn wrong_tensors_are_refused_with_the_runners_one_line() {
    let dir = scratch("embed-bad");
    let art = compile(Path::new("testdata/mlp/graph.json"), &dir, "mlp", &[]);
    let model = Model::open(&art).unwrap();
    let session = Session::new(&model).unwrap();
    let x = Tensor::read_npy(Path::new("testdata/mlp/inputs/x.npy")).unwrap();
    let ty = x.ty();
    let shape = x.shape.clone();
    let ints = vec![0i32; x.numel()];
    let short = [shape[0] + 1, shape[1]];
    let wide = vec![0f32; short.iter().product()];
    let err = |inputs: &[(&str, TensorView)]| session.run(inputs).err().map(|e| e.to_string());
    assert_eq!(
        err(&[("X", TensorView::of(&x))]).unwrap(),
        "the graph has no input 'X' (did you mean 'x'?) (its inputs: x)"
    );
    assert_eq!(err(&[]).unwrap(), format!("missing input 'x' ({ty})"));
    let as_ints = TensorView::new(&ints, &shape).unwrap();
    let i32_ty = meshc_ir::TensorType::new(DType::I32, shape.clone());
    assert_eq!(err(&[("x", as_ints)]).unwrap(), format!("input 'x' is {i32_ty}, the graph expects {ty}"));
    let e = err(&[("x", TensorView::new(&wide, &short).unwrap())]).unwrap();
    assert_eq!(
        e,
        format!("input 'x' is {}, the graph expects {ty}", meshc_ir::TensorType::new(DType::F32, short.to_vec()))
    );
    assert_eq!(err(&[("x", TensorView::of(&x)), ("x", TensorView::of(&x))]).unwrap(), "input 'x' is given twice");
    // A typed error, not only a text.
    assert!(matches!(session.run(&[]), Err(Error::Mismatch(_))));
    // A view that does not hold its shape, and output buffers that do not fit.
    let e = TensorView::new(&wide, &shape).err().unwrap().to_string();
    assert!(e.ends_with("bytes)") && e.starts_with(&format!("{} bytes of data for a {ty}", wide.len() * 4)), "{e}");
    let mut y = vec![0f32; 3];
    let mut out = [("z", TensorViewMut::new(&mut y, &[3]).unwrap())];
    let e = session.run_into(&[("x", TensorView::of(&x))], &mut out).err().unwrap().to_string();
    assert_eq!(e, "the graph has no output 'z' (its outputs: y)");
    let mut out = [("y", TensorViewMut::new(&mut y, &[3]).unwrap())];
    let e = session.run_into(&[("x", TensorView::of(&x))], &mut out).err().unwrap().to_string();
    assert!(e.starts_with("output 'y' is f32[") && e.ends_with(", its buffer is f32[3]"), "{e}");
    // The session still runs after every refusal.
    assert!(matches_expected(
        Path::new("testdata/mlp/graph.json"),
        &session.run(&[("x", TensorView::of(&x))]).unwrap()
    )
    .is_ok());
}

#[test]
fn a_training_artifact_steps_with_its_state_on_the_devices() {
    let dir = scratch("embed-train");
    let g = Path::new("testdata/train/classifier.json");
    let want = Tensor::read_npy(Path::new("testdata/train/expected/sgd.npy")).unwrap().data.to_f64();
    for (label, extra) in [("one", vec![]), ("mesh", vec!["--layout", "testdata/train/layouts/mp-2x4.json"])] {
        let mut args = vec!["--loss", "loss", "--optimizer", "sgd:0.1"];
        args.extend(extra);
        let art = compile(g, &dir, label, &args);
        let model = Model::open(&art).unwrap();
        let session = Session::new(&model).unwrap();
        assert!(matches!(session.step(&[]), Err(Error::State(_))));
        let init = State::initial(session.loaded(), art.to_str().unwrap()).unwrap().unwrap();
        assert_eq!(model.state_names().len(), init.tensors.len());
        session.set_state(&init.tensors).unwrap();
        let data: Vec<(String, Tensor)> = ["x", "labels"]
            .iter()
            .map(|n| (n.to_string(), Tensor::read_npy(Path::new(&format!("testdata/train/data/{n}.npy"))).unwrap()))
            .collect();
        for (step, want) in want.iter().enumerate().take(5) {
            // Step `step`'s batch: the stacked data's slice along its first axis.
            let batch: Vec<(String, Tensor)> = (data.iter())
                .map(|(n, t)| {
                    let ty = meshc_ir::TensorType::new(t.dtype(), t.shape[1..].to_vec());
                    let bytes = t.to_le_bytes();
                    let at = step * ty.size_bytes();
                    (n.clone(), Tensor::from_le_bytes(&ty, &bytes[at..at + ty.size_bytes()]))
                })
                .collect();
            let views: Vec<(&str, TensorView)> = batch.iter().map(|(n, t)| (n.as_str(), TensorView::of(t))).collect();
            let out = session.step(&views).unwrap();
            let loss = out["loss"].data.to_f64()[0];
            assert!(
                (loss - want).abs() <= 1e-4 * want.abs(),
                "{label}: step {} loss {loss}, reference {want}",
                step + 1
            );
        }
        // The state read back has moved from the initial one, and writing it back resumes.
        let now = session.state().unwrap();
        assert_ne!(now, init.tensors);
        session.set_state(&now).unwrap();
        assert_eq!(session.state().unwrap(), now);
    }
}

/// A decoder step (testdata/decoder: the new token's keys and values written into the
/// caches at `pos`) stepped through twelve positions with the caches kept on the devices
/// as state, on one device and with the heads split over two: each step's outputs, and
/// the caches at the end, are what the interpreter gives stepping the same graph with the
/// caches passed in and out.
#[test]
fn a_decoder_keeps_its_kv_cache_on_the_devices_between_steps() {
    let dir = scratch("embed-decoder");
    let g = Path::new("testdata/decoder/graph.json");
    let (graph, info) = meshc_ir::load::load(g).unwrap();
    let params = meshc_ir::params::load_all(&graph, g.parent().unwrap()).unwrap();
    let ids_at =
        |pos: usize| Tensor::new(vec![2, 1], meshc_ir::Data::I64(vec![(pos * 7 % 40) as i64, (pos * 11 % 40) as i64]));
    let zeros = Tensor::f32(vec![2, 4, 16, 8], vec![0.0; 2 * 4 * 16 * 8]);
    for (label, extra) in [("one", vec![]), ("heads-2", vec!["--layout", "testdata/decoder/layouts/heads-2.json"])] {
        let art = compile(g, &dir, label, &extra);
        let model = Model::open(&art).unwrap();
        assert_eq!(model.state_names(), ["k_cache", "v_cache"]);
        let session = Session::new(&model).unwrap();
        let mut caches: BTreeMap<String, Tensor> =
            ["k_cache", "v_cache"].iter().map(|n| (n.to_string(), zeros.clone())).collect();
        session.set_state(&caches).unwrap();
        for pos in 0..12 {
            let (ids, p) = (ids_at(pos), Tensor::new(vec![1], meshc_ir::Data::I64(vec![pos as i64])));
            let got = session.step(&[("ids", TensorView::of(&ids)), ("pos", TensorView::of(&p))]).unwrap();
            let mut values = params.clone();
            values.extend(caches.clone());
            values.insert("ids".into(), ids);
            values.insert("pos".into(), p);
            let want = meshc_ir::interp::run(&graph, &info.order, &info.types, values).unwrap();
            crate::common::assert_close(&format!("{label} pos {pos}"), &got["logits"], &want["logits"]).unwrap();
            for n in ["k_cache", "v_cache"] {
                caches.insert(n.to_string(), want[&format!("next.{n}")].clone());
            }
        }
        for (name, t) in session.state().unwrap() {
            crate::common::assert_close(&format!("{label} {name}"), &t, &caches[&name]).unwrap();
        }
    }
}

/// The names a graph gives its dims reach `TensorInfo::dims` through the artifact: an
/// input's as written, an output's as inference carries them (or as the node declares
/// them), one entry per dimension with `None` where nothing names it.
#[test]
fn dim_names_reach_the_models_metadata() {
    let dir = scratch("embed-dims");
    let graph = dir.join("g.txt");
    let text = "graph g {
  input x: f32[8,32] dims(batch, _)
  param w: f32[32,4] dims(_, classes) = init zeros
  y = matmul(x, w)
  u: f32[8,32] dims(_, _) = relu(x)
  r = relu(w)
  output y, u, r
}
";
    std::fs::write(&graph, text).unwrap();
    let model = Model::open(compile(&graph, &dir, "g", &[])).unwrap();
    let dims = |infos: &[meshc_runtime::api::TensorInfo]| -> Vec<(String, Vec<Option<String>>)> {
        infos.iter().map(|t| (t.name.clone(), t.dims.clone())).collect()
    };
    let s = |n: &str| Some(n.to_string());
    assert_eq!(dims(model.inputs()), [("x".to_string(), vec![s("batch"), None])]);
    assert_eq!(
        dims(model.outputs()),
        [
            ("y".to_string(), vec![s("batch"), s("classes")]),
            ("u".to_string(), vec![None, None]),
            ("r".to_string(), vec![None, s("classes")]),
        ]
    );
}
