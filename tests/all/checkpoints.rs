//! Checkpoints as users bring them: a sharded Hugging Face checkpoint (an index whose
//! `weight_map` names the shard of each tensor) compiles to the same artifact, byte for
//! byte, as the single file it was split from.

use std::path::Path;

use crate::common::{meshc, scratch};

/// A `.safetensors` file of `tensors` (name, dtype, shape, little-endian bytes), written the
/// way the format lays it out: u64 header length, JSON header, data.
fn safetensors(tensors: &[(String, serde_json::Value, &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, info, bytes) in tensors {
        let mut info = info.clone();
        info["data_offsets"] = serde_json::json!([data.len(), data.len() + bytes.len()]);
        header.insert(name.clone(), info);
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

#[test]
fn a_sharded_checkpoint_gives_the_artifact_of_the_single_file() {
    let src = Path::new("testdata/transformer");
    let dir = scratch("sharded");
    std::fs::create_dir(dir.join("weights")).unwrap();
    for f in std::fs::read_dir(src.join("weights")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join("weights").join(f.file_name().unwrap())).unwrap();
    }
    // Split the single file's tensors over three shards, in turn.
    let file = std::fs::read(src.join("weights/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let mut shards: Vec<Vec<(String, serde_json::Value, &[u8])>> = vec![Vec::new(); 3];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, info)) in header.iter().filter(|(k, _)| *k != "__metadata__").enumerate() {
        let off = &info["data_offsets"];
        let bytes = &file[8 + n + off[0].as_u64().unwrap() as usize..8 + n + off[1].as_u64().unwrap() as usize];
        let info = serde_json::json!({"dtype": info["dtype"], "shape": info["shape"]});
        shards[i % 3].push((name.clone(), info, bytes));
        weight_map.insert(name.clone(), format!("model-{:05}-of-00003.safetensors", i % 3 + 1).into());
    }
    assert!(shards.iter().all(|s| !s.is_empty()), "the testdata checkpoint has at least three tensors");
    for (i, s) in shards.iter().enumerate() {
        std::fs::write(dir.join(format!("weights/model-{:05}-of-00003.safetensors", i + 1)), safetensors(s)).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": file.len() - 8 - n}, "weight_map": weight_map});
    std::fs::write(dir.join("weights/model.safetensors.index.json"), index.to_string()).unwrap();
    let graph = std::fs::read_to_string(src.join("graph.json")).unwrap();
    std::fs::write(dir.join("single.json"), &graph).unwrap();
    let sharded = graph.replace("weights/model.safetensors\"", "weights/model.safetensors.index.json\"");
    assert_ne!(sharded, graph);
    std::fs::write(dir.join("sharded.json"), sharded).unwrap();

    for layout in [None, Some("testdata/transformer/layouts/mp-2x4.json")] {
        let mut artifacts = Vec::new();
        for g in ["single", "sharded"] {
            let (graph, out) = (dir.join(format!("{g}.json")), dir.join(format!("{g}.mshc")));
            let mut args = vec!["compile", graph.to_str().unwrap(), "-o", out.to_str().unwrap()];
            args.extend(layout.iter().flat_map(|l| ["--layout", l]));
            let run = meshc(&args);
            assert_eq!(run.status, Some(0), "{g} {layout:?}: {}", run.stderr);
            artifacts.push(std::fs::read(&out).unwrap());
        }
        assert!(artifacts[0] == artifacts[1], "{layout:?}: the sharded checkpoint gave another artifact");
    }
    // The depfile names the index and every shard it read.
    let (graph, out) = (dir.join("sharded.json"), dir.join("sharded.mshc"));
    let dep = dir.join("sharded.d");
    let run = meshc(&["compile", graph.to_str().unwrap(), "-o", out.to_str().unwrap(), "-MF", dep.to_str().unwrap()]);
    assert_eq!(run.status, Some(0), "{}", run.stderr);
    let deps = std::fs::read_to_string(&dep).unwrap();
    for f in ["model.safetensors.index.json", "model-00001-of-00003", "model-00002-of-00003", "model-00003-of-00003"] {
        assert!(deps.contains(f), "{f} not in the depfile:\n{deps}");
    }
}

/// An MLP whose weights are stored as bf16 and f16 (a safetensors checkpoint) and whose
/// input is f16 (.npy), each cast to f32 where it is used.
const HALF_MLP: &str = "graph half_mlp {
  input x: f16[8,16] dims(batch, embed)
  param w1: bf16[16,32] dims(embed, hidden) = file(\"halves.safetensors\", key = \"w1\")
  param b1: f16[32] dims(hidden) = file(\"halves.safetensors\", key = \"b1\")
  param w2: bf16[32,16] dims(hidden, embed) = file(\"halves.safetensors\", key = \"w2\")
  xf = cast(x) {to = \"f32\"}
  w1f = cast(w1) {to = \"f32\"}
  b1f = cast(b1) {to = \"f32\"}
  w2f = cast(w2) {to = \"f32\"}
  h = matmul(xf, w1f)
  hb = add(h, b1f)
  a = gelu(hb)
  y = matmul(a, w2f)
  output y
}
";

/// Half-precision weights and inputs: every compiled path (both GEMMs, one device and a
/// 2x4 mesh) gives the interpreter's result, which is the f32 graph's on the same (rounded)
/// values.
#[test]
fn half_precision_weights_and_inputs_run_as_their_f32_values() {
    use meshc_ir::{Data, Tensor, TensorType};
    let dir = scratch("halves");
    let values = |n: usize, seed: u32| -> Vec<f64> {
        (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f64 / 1000.0 - 1.0).collect()
    };
    let half = |dtype: DType, shape: Vec<usize>, seed: u32| {
        let n = shape.iter().product();
        Tensor::new(shape, Data::from_f64(dtype, values(n, seed)))
    };
    use meshc_ir::DType;
    let (w1, b1, w2) =
        (half(DType::BF16, vec![16, 32], 1), half(DType::F16, vec![32], 2), half(DType::BF16, vec![32, 16], 3));
    let entry = |t: &Tensor, name: &str| {
        let dtype = if t.dtype() == DType::BF16 { "BF16" } else { "F16" };
        (name.to_string(), serde_json::json!({"dtype": dtype, "shape": t.shape}), t.to_le_bytes())
    };
    let entries = [entry(&w1, "w1"), entry(&b1, "b1"), entry(&w2, "w2")];
    let views: Vec<(String, serde_json::Value, &[u8])> =
        entries.iter().map(|(n, i, b)| (n.clone(), i.clone(), b.as_slice())).collect();
    std::fs::write(dir.join("halves.safetensors"), safetensors(&views)).unwrap();
    std::fs::write(dir.join("g.txt"), HALF_MLP).unwrap();
    half(DType::F16, vec![8, 16], 4).write_npy(&dir.join("x.npy")).unwrap();
    // The same graph in f32, on the rounded values.
    let widen = |t: &Tensor| Tensor::new(t.shape.clone(), Data::from_f64(DType::F32, t.data.to_f64()));
    for (name, t) in [("w1", &w1), ("b1", &b1), ("w2", &w2)] {
        widen(t).write_npy(&dir.join(format!("{name}.npy"))).unwrap();
    }
    widen(&half(DType::F16, vec![8, 16], 4)).write_npy(&dir.join("x32.npy")).unwrap();
    let f32_graph = HALF_MLP
        .replace("f16[8,16]", "f32[8,16]")
        .replace("bf16[", "f32[")
        .replace("f16[32]", "f32[32]")
        .replace("file(\"halves.safetensors\", key = \"w1\")", "file(\"w1.npy\")")
        .replace("file(\"halves.safetensors\", key = \"b1\")", "file(\"b1.npy\")")
        .replace("file(\"halves.safetensors\", key = \"w2\")", "file(\"w2.npy\")");
    std::fs::write(dir.join("g32.txt"), f32_graph).unwrap();
    std::fs::write(
        dir.join("mp.json"),
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [2, 4], "axes": ["data", "model"]}, "rules": {"batch": "data", "hidden": "model"}}"#,
    )
    .unwrap();

    let path = |f: &str| dir.join(f).display().to_string();
    let result = |args: &[&str], out: &str| -> Tensor {
        let o = path(out);
        let mut all: Vec<&str> = args.to_vec();
        let o_arg = format!("y={o}");
        all.extend(["--output", &o_arg]);
        let run = meshc(&all);
        assert_eq!(run.status, Some(0), "{args:?}: {}", run.stderr);
        Tensor::read_npy(std::path::Path::new(&o)).unwrap()
    };
    let (g, g32, x, x32, mp) = (
        path("g.txt"),
        path("g32.txt"),
        format!("x={}", path("x.npy")),
        format!("x={}", path("x32.npy")),
        path("mp.json"),
    );
    let want = result(&["interp", &g32, "--input", &x32], "want.npy");
    assert_eq!(want.ty(), TensorType::new(DType::F32, vec![8, 16]));
    let interp = result(&["interp", &g, "--input", &x], "interp.npy");
    assert_eq!(interp, want, "the interpreter computes on the widened values");
    for gemm in ["cranelift", "library"] {
        for layout in [None, Some(mp.as_str())] {
            for weights in ["keep", "f32"] {
                let mut args =
                    vec!["run", g.as_str(), "--input", x.as_str(), "--gemm", gemm, "--weights-dtype", weights];
                args.extend(layout.iter().flat_map(|l| ["--layout", *l]));
                let got = result(&args, "got.npy");
                crate::common::assert_close(&format!("{gemm} {layout:?} {weights}"), &got, &want).unwrap();
            }
        }
    }
    // Kept half, the matmul weights take half the bytes of the artifact's f32 ones.
    let weights_bytes = |weights: &str| {
        let art = path(&format!("{weights}.mshc"));
        let run = meshc(&["compile", &g, "-o", &art, "--weights-dtype", weights]);
        assert_eq!(run.status, Some(0), "{}", run.stderr);
        crate::common::weights_bytes(&art)
    };
    let (kept, wide) = (weights_bytes("keep"), weights_bytes("f32"));
    assert!(kept < wide * 3 / 5, "kept halves: {kept} bytes of weights, f32: {wide}");
}

/// `--weights-dtype bf16` rounds an f32 model's matmul weights: half the weight bytes,
/// outputs within bf16's rounding of the f32 ones, and the rounding error reported.
#[test]
fn f32_weights_converted_to_bf16_run_within_its_rounding() {
    use meshc_ir::Tensor;
    let dir = scratch("to-bf16");
    let graph = "testdata/mlp/graph.json";
    let inputs = crate::common::input_args(std::path::Path::new(graph));
    let run = |weights: &str, layout: &[&str]| -> Tensor {
        let out = dir.join(format!("{weights}{}.npy", layout.len())).display().to_string();
        let mut args = vec!["run", graph, "--weights-dtype", weights, "--output"];
        let o = format!("y={out}");
        args.push(&o);
        args.extend(inputs.iter().map(String::as_str));
        args.extend(layout);
        let r = meshc(&args);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        Tensor::read_npy(std::path::Path::new(&out)).unwrap()
    };
    let wide = run("f32", &[]);
    let w = wide.data.to_f64();
    let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
    // On one device and with each device's slice of the weights converted.
    for layout in [&[][..], &["--layout", "testdata/mlp/layouts/mp-2x4.json"]] {
        let h = run("bf16", layout).data.to_f64();
        let diff = w.iter().zip(&h).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        assert!(diff > 0.0 && diff < 1e-2 * norm, "{layout:?}: relative L2 difference {} of bf16 weights", diff / norm);
    }
    let dump = meshc(&[
        "compile",
        graph,
        "--weights-dtype",
        "bf16",
        "--dump-after",
        "fold",
        "-o",
        &dir.join("a.mshc").display().to_string(),
    ]);
    assert!(dump.stdout.contains("stored as bf16 (max abs rounding error"), "{}", dump.stdout);
    // The verify dump lists each converted weight with its largest rounding error, before
    // any pass: here w1's, computed from the file's values.
    let w1 = Tensor::read_npy(std::path::Path::new("testdata/mlp/weights/w1.npy")).unwrap();
    let half = meshc_ir::Data::from_f64(meshc_ir::DType::BF16, w1.data.iter_f64());
    let err = w1.data.iter_f64().zip(half.iter_f64()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let out = dir.join("v.mshc").display().to_string();
    let verify = meshc(&["compile", graph, "--weights-dtype", "bf16", "--dump-after", "verify", "-o", &out]);
    let want = format!("# w1: f32 -> bf16 (--weights-dtype), max abs rounding error {err:.3e}");
    assert!(err > 0.0 && verify.stdout.contains(&want), "no '{want}' in\n{}", verify.stdout);
}
