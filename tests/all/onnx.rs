//! The ONNX frontend end to end through the real binary: every model of testdata/onnx/
//! imported to JSON and text and run from those files, interpreted, and run from the `.onnx`
//! directly on one device, compiled to an artifact, and under each of its layouts — always
//! against onnxruntime's outputs. The bad ONNX files are in testdata/bad/ (golden.rs).

use std::path::{Path, PathBuf};

use crate::common::{compare_expected, dim_args, golden, input_args, meshc, scratch};
use meshc_ir::Tensor;

fn models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("testdata/onnx")
        .expect("testdata/onnx exists")
        .map(|e| e.unwrap().path().join("model.onnx"))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    assert!(v.len() >= 3, "expected the models of tools/gen_onnx_testdata.py, found {v:?}");
    v
}

/// Runs meshc with `args`, then checks its output dir against the model's expected outputs.
fn outputs_match(model: &Path, args: &[String], out: &Path) -> Result<(), String> {
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out_arg = out.display().to_string();
    args.extend(["--output-dir", &out_arg]);
    let run = meshc(&args);
    if run.status != Some(0) {
        return Err(format!("meshc {}: {run:?}", args.join(" ")));
    }
    compare_expected(model, out).map(drop)
}

#[test]
fn models_import_to_json_and_text_and_run_from_those_files() {
    let tmp = scratch("onnx-import");
    for model in models() {
        let name = model.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        for ext in ["json", "txt"] {
            let graph = tmp.join(format!("{name}.{ext}"));
            let mut args =
                vec!["import".to_string(), model.display().to_string(), "-o".into(), graph.display().to_string()];
            args.extend(dim_args(&model));
            let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(run.status, Some(0), "{run:?}");
            // The weights (when the model has any) are beside the graph, never inline lists;
            // scalars may be inline (the graph's size says nothing: an unrolled LSTM is long).
            let text = std::fs::read_to_string(&graph).unwrap();
            let weights = tmp.join(format!("{name}.safetensors")).is_file();
            let params = meshc_ir::load::parse_file(&graph).unwrap().params;
            let inline: Vec<&str> = params
                .iter()
                .filter(|p| matches!(p.data, meshc_ir::ParamData::Value(meshc_ir::Attr::List(_))))
                .map(|p| p.name.as_str())
                .collect();
            assert!(
                text.contains(&format!("{name}.safetensors")) == weights && inline.is_empty(),
                "{name}: {inline:?}"
            );
            let cmd = if ext == "json" { "run" } else { "interp" };
            let mut args = vec![cmd.to_string(), graph.display().to_string()];
            args.extend(input_args(&model));
            outputs_match(&model, &args, &tmp.join(format!("out-{name}-{ext}"))).unwrap();
        }
    }
}

#[test]
fn models_interp_compile_and_run_from_the_onnx_file_on_one_device_and_under_layouts() {
    let tmp = scratch("onnx-run");
    for model in models() {
        let name = model.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        let (path, dims, inputs) = (model.display().to_string(), dim_args(&model), input_args(&model));
        let with = |cmd: &[&str]| [cmd.iter().map(|s| s.to_string()).collect(), dims.clone(), inputs.clone()].concat();
        outputs_match(&model, &with(&["interp", &path]), &tmp.join(format!("{name}-interp"))).unwrap();
        outputs_match(&model, &with(&["run", &path]), &tmp.join(format!("{name}-run"))).unwrap();
        let art = tmp.join(format!("{name}.mshc")).display().to_string();
        let run = meshc(
            &[&["compile", &path, "-o", &art][..], &dims.iter().map(String::as_str).collect::<Vec<_>>()].concat(),
        );
        assert_eq!(run.status, Some(0), "{run:?}");
        let mut args = vec!["run".to_string(), art.clone()];
        args.extend(inputs.clone());
        outputs_match(&model, &args, &tmp.join(format!("{name}-artifact"))).unwrap();
        let mut layouts: Vec<PathBuf> =
            std::fs::read_dir(model.with_file_name("layouts")).unwrap().map(|e| e.unwrap().path()).collect();
        layouts.sort();
        assert!(!layouts.is_empty(), "{name} has no layouts");
        for l in layouts {
            let out = tmp.join(format!("{name}-{}", l.file_stem().unwrap().to_string_lossy()));
            outputs_match(&model, &with(&["run", &path, "--layout", &l.display().to_string()]), &out).unwrap();
        }
    }
}

#[test]
fn integer_products_compiled_are_the_interpreters_bit_for_bit() {
    // MatMulInteger (u8 × i8 with per-column zero points, i8 × i8) and QLinearMatMul: the
    // integer GEMM on every ISA the CPU has (VNNI, AVX2, portable) gives the interpreter's
    // i32 and u8 outputs exactly.
    let model = Path::new("testdata/onnx/integer_products/model.onnx");
    let tmp = scratch("onnx-integer-products");
    let run = |cmd: &[&str], out: &Path| {
        let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        args.extend(dim_args(model));
        args.extend(input_args(model));
        args.extend(["--output-dir".to_string(), out.display().to_string()]);
        let r = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(r.status, Some(0), "{r:?}");
    };
    let path = model.display().to_string();
    run(&["interp", &path], &tmp.join("interp"));
    let isas = meshc_runtime::api::Isa::ALL.into_iter().filter(|&i| i <= meshc_runtime::api::Isa::detected());
    for isa in isas {
        let out = tmp.join(isa.name());
        run(&["run", &path, "--isa", isa.name()], &out);
        for name in ["y_u8s8", "y_s8s8", "y_qlinear"] {
            let file = format!("{name}.npy");
            let (got, want) = (
                Tensor::read_npy(&out.join(&file)).unwrap(),
                Tensor::read_npy(&tmp.join("interp").join(&file)).unwrap(),
            );
            assert!(got == want, "{name} on {}: {got:?} against {want:?}", isa.name());
        }
    }
}

#[test]
fn imported_graphs_keep_onnx_names_fold_shapes_and_name_dims() {
    let run = meshc(&["check", "testdata/onnx/encoder/model.onnx", "--dim", "batch=2", "--dim", "seq=5"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    // Shape/Gather/Unsqueeze/Concat folded away: no node of those kinds is left, only data.
    assert!(!run.stdout.contains("gather") && !run.stdout.contains("concat"), "{}", run.stdout);
    let tmp = scratch("onnx-names");
    let graph = tmp.join("encoder.txt").display().to_string();
    let run =
        meshc(&["import", "testdata/onnx/encoder/model.onnx", "-o", &graph, "--dim", "batch=2", "--dim", "seq=5"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let text = std::fs::read_to_string(&graph).unwrap();
    for want in [
        "input hidden_states: f32[2,5,32] dims(batch, seq, hidden)",
        "param encoder.layer.0.attention.self.query.weight_t: f32[32,32] dims(hidden, heads) = file(\"encoder.safetensors\"",
        // Intermediate tensors are named after their ONNX nodes (`//attention.self.query/MatMul`).
        "attention.self.query_MatMul = matmul(hidden_states, encoder.layer.0.attention.self.query.weight_t)",
        "q_Reshape: ? dims(batch, seq, heads, head_dim) = reshape(query)",
        "last_hidden_state = layer_norm(",
    ] {
        assert!(text.contains(want), "no '{want}' in\n{text}");
    }
}

/// `import --list` prints every input and weight with its dims, named by the role the ops
/// give them (docs/onnx.md): the model width `hidden`, attention's `heads`, the MLP's `ffn`,
/// the same in every layer; conv out channels `channels`. Pinned in golden/onnx/.
#[test]
fn import_list_names_weight_dims_by_their_role() {
    let mut failures = Vec::new();
    for name in ["encoder", "gpt2_block", "resnet_block"] {
        let model = PathBuf::from(format!("testdata/onnx/{name}/model.onnx"));
        let args =
            [vec!["import".to_string(), "--list".into(), model.display().to_string()], dim_args(&model)].concat();
        let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(run.status, Some(0), "{run:?}");
        failures.extend(golden(&format!("onnx/{name}-list.txt"), &run.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    let run = meshc(&["import", "--list", "testdata/onnx/encoder/model.onnx", "--dim", "batch=2", "--dim", "seq=5"]);
    for want in [
        "input hidden_states: f32[2,5,32] dims(batch, seq, hidden)\n",
        "param encoder.layer.0.attention.self.key.weight_t: f32[32,32] dims(hidden, heads)\n",
        "param encoder.layer.0.attention.self.key.bias: f32[32] dims(heads)\n",
        "param encoder.layer.0.attention.output.dense.weight_t: f32[32,32] dims(heads, hidden)\n",
        "param encoder.layer.0.intermediate.dense.weight_t: f32[32,64] dims(hidden, ffn)\n",
        "param encoder.layer.0.output.dense.weight_t: f32[64,32] dims(ffn, hidden)\n",
        "param encoder.layer.0.output.LayerNorm.weight: f32[32] dims(hidden)\n",
    ] {
        assert!(run.stdout.contains(want), "no '{want}' in\n{}", run.stdout);
    }
    // Scalars written inline are no weights.
    assert!(!run.stdout.contains("param scale"), "{}", run.stdout);
    let both = meshc(&["import", "--list", "testdata/onnx/encoder/model.onnx", "-o", "x.json"]);
    assert!(both.status == Some(1) && both.stderr.contains("cannot be used with"), "{both:?}");
}

/// The issue's promise: one `rules` line shards the imported BERT block Megatron-style —
/// q/k/v and the FFN's first weight split by columns, the output projections by rows,
/// attention split by heads — so the only collectives are the two all-reduces after the
/// row-split projections, almost nothing runs replicated, the artifact is the one of the
/// spec that lays out every weight by name, and the result is onnxruntime's. The same
/// rules do it for the GPT-2 block, whose fused q/k/v projection the importer splits.
/// An ONNX model's `dim_param`s (`batch`, `seq`) name its inputs' dims in the artifact, and
/// its output's through inference; `inspect` prints them beside each shape, `--json` keeps
/// them in `meta`.
#[test]
fn an_onnx_models_dim_params_name_the_artifacts_dims() {
    let tmp = scratch("onnx-dim-names");
    let art = tmp.join("encoder.mshc").display().to_string();
    let model = "testdata/onnx/encoder/model.onnx";
    let run = meshc(&["compile", model, "--dim", "batch=2", "--dim", "seq=5", "-o", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let inspect = meshc(&["inspect", &art]);
    for want in [
        "input  hidden_states: f32[2, 5, 32] dims(batch, seq, hidden)\n",
        "input  attention_mask: i64[2, 5] dims(batch, seq)\n",
        "output last_hidden_state: f32[2, 5, 32] dims(batch, seq, hidden)\n",
    ] {
        assert!(inspect.stdout.contains(want), "no '{want}' in\n{}", inspect.stdout);
    }
    let json: serde_json::Value = serde_json::from_str(&meshc(&["inspect", &art, "--json"]).stdout).unwrap();
    assert_eq!(json["meta"]["inputs"][1]["dims"], serde_json::json!(["batch", "seq"]));
}

#[test]
fn imported_transformers_shard_megatron_style_by_one_rules_line() {
    let tmp = scratch("onnx-megatron");
    let spec = "testdata/onnx/encoder/layouts/megatron-rules.json";
    let text = std::fs::read_to_string(spec).unwrap();
    assert!(text.contains(r#""rules": {"batch": "data", "heads": "model", "ffn": "model"}"#), "{text}");
    assert!(!text.contains("layouts"), "{text}");
    let models = [
        (
            "encoder",
            ["batch=2", "seq=5"],
            vec![
                "layout encoder.layer.0.attention.self.query.weight_t [-, model] (rule)",
                "layout encoder.layer.0.attention.output.dense.weight_t [model, -] (rule)",
                "layout encoder.layer.0.intermediate.dense.weight_t [-, model] (rule)",
                "layout encoder.layer.0.output.dense.weight_t [model, -] (rule)",
                "layout scores [data, model, -, -] (rule)",
            ],
            [("all_reduce", "attention.output.dense_MatMul"), ("all_reduce", "output.dense_MatMul")],
        ),
        (
            "gpt2_block",
            ["batch=2", "seq=6"],
            vec![
                "layout h.0.attn.c_attn.weight.0 [-, model] (rule)",
                "layout h.0.attn.c_attn.weight.2 [-, model] (rule)",
                "layout h.0.attn.c_attn.bias.1 [model] (rule)",
                "layout h.0.attn.c_proj.weight [model, -] (rule)",
                "layout h.0.mlp.c_fc.weight [-, model] (rule)",
            ],
            [("all_reduce", "attn.c_proj_MatMul"), ("all_reduce", "mlp.c_proj_MatMul")],
        ),
    ];
    for (name, [b, s], layouts, collectives) in models {
        let model = format!("testdata/onnx/{name}/model.onnx");
        let graph = tmp.join(format!("{name}.json")).display().to_string();
        let dims = ["--dim", b, "--dim", s];
        let run = meshc(&[&["import", &model, "-o", &graph][..], &dims].concat());
        assert_eq!(run.status, Some(0), "{run:?}");
        let check = meshc(&["check", &graph, "--layout", spec]);
        for want in layouts {
            assert!(check.stdout.contains(want), "{name}: no '{want}' in\n{}", check.stdout);
        }
        let explain = meshc(&["explain", &graph, "--layout", spec, "--json"]);
        assert_eq!(explain.status, Some(0), "{explain:?}");
        let report: serde_json::Value = serde_json::from_str(&explain.stdout).unwrap();
        let steps: Vec<(&str, &str)> = report["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["step"].as_str().unwrap(), e["tensor"].as_str().unwrap()))
            .collect();
        assert_eq!(steps, collectives, "{name}: {}", explain.stdout);
        let share = report["replicated_flops"].as_f64().unwrap() / report["flops"].as_f64().unwrap();
        assert!(share < 0.05, "{name}: {share} of the FLOPs replicated: {}", explain.stdout);
        let art = tmp.join(format!("{name}.mshc")).display().to_string();
        let run = meshc(&["compile", &graph, "--layout", spec, "-o", &art]);
        assert_eq!(run.status, Some(0), "{run:?}");
        // The plan of the spec that lays out each weight by name, byte for byte.
        let named = tmp.join(format!("{name}-named.mshc")).display().to_string();
        let by_name = format!("testdata/onnx/{name}/layouts/mp-2x2.json");
        let run = meshc(&["compile", &graph, "--layout", &by_name, "-o", &named]);
        assert_eq!(run.status, Some(0), "{run:?}");
        assert!(
            std::fs::read(&art).unwrap() == std::fs::read(&named).unwrap(),
            "{name}: the rules gave another artifact"
        );
        let mut args = vec!["run".to_string(), art];
        args.extend(input_args(Path::new(&model)));
        args.extend(["--check-against".into(), format!("testdata/onnx/{name}/expected")]);
        let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(run.status, Some(0), "{run:?}");
    }
}

/// The weights torch.onnx's folding names `onnx::MatMul_N` (`val_N` from the torch.export
/// exporter) are named after the node that reads them and its input (the layout of testdata/onnx/torch_names selects them so); one
/// whose new name another initializer has keeps its own.
#[test]
fn weights_torch_named_by_number_are_named_after_their_reader() {
    let tmp = scratch("onnx-torch-names");
    let graph = tmp.join("names.txt").display().to_string();
    let run = meshc(&["import", "testdata/onnx/torch_names/model.onnx", "-o", &graph, "--dim", "batch=4"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let text = std::fs::read_to_string(&graph).unwrap();
    for want in [
        "param encoder.layer.0.attention.self.query.MatMul.B: f32[8,16]",
        "param encoder.layer.0.attention.self.query.bias: f32[16]",
        "param encoder.layer.0.output.dense.MatMul.B: f32[16,8]",
        "param onnx__MatMul_9: f32[8,8]",
        "param extra.MatMul.B: f32[8,8]",
        "param encoder.layer.0.intermediate.dense.MatMul.B: f32[8,8]",
    ] {
        assert!(text.contains(want), "no '{want}' in\n{text}");
    }
}

/// f16 and bf16 initializers stay half: params of their own type in the weights file (read
/// through a cast), and half-size weights in the artifact.
#[test]
fn half_initializers_stay_half_in_the_weights_file_and_the_artifact() {
    let tmp = scratch("onnx-half");
    let model = "testdata/onnx/half_weights/model.onnx";
    let graph = tmp.join("half.txt").display().to_string();
    let run = meshc(&["import", model, "-o", &graph, "--dim", "batch=4"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let text = std::fs::read_to_string(&graph).unwrap();
    for want in ["param fc1.weight: f16[16,32]", "param fc1.bias: f16[32]", "param fc2.weight: bf16[32,8]"] {
        assert!(text.contains(want), "no '{want}' in\n{text}");
    }
    let weights = std::fs::read(tmp.join("half.safetensors")).unwrap();
    assert!(weights.len() < 2 * (16 * 32 + 32 + 32 * 8) + 1024, "{} bytes of weights", weights.len());
    let art = tmp.join("half.mshc").display().to_string();
    let run = meshc(&["compile", model, "--dim", "batch=4", "-o", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    // The two half weights (16·32 + 32·8 halves) and the bias, which a fold widened: less
    // than the 3,200 bytes of f32 weights.
    let weights = crate::common::weights_bytes(&art);
    assert_eq!(weights, 2 * (16 * 32 + 32 * 8) + 4 * 32, "{}", meshc(&["inspect", &art]).stdout);
}

/// The GPT-2 block's causal mask (Range and Less on the sequence length) folds at import
/// into a constant bool matrix that one `where` applies to the scores.
#[test]
fn a_causal_mask_folds_into_a_constant_for_where() {
    let tmp = scratch("onnx-causal");
    let graph = tmp.join("gpt2.txt").display().to_string();
    let model = "testdata/onnx/gpt2_block/model.onnx";
    let run = meshc(&["import", model, "-o", &graph, "--dim", "batch=2", "--dim", "seq=6"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let text = std::fs::read_to_string(&graph).unwrap();
    assert!(text.contains("param attn_Where.0: bool[6,6] dims(seq, seq) = file("), "{text}");
    assert!(text.contains(" = where(attn_Where.0, mask_value, attn_Div)"), "{text}");
    assert!(!text.contains("range(") && !text.contains("less("), "the mask was not folded:\n{text}");
}

/// The importer writes each BatchNormalization as a per-channel mul and add; compile folds
/// the pair into the conv before it: new weights and biases, computed by the fold pass.
#[test]
fn batch_norms_fold_into_their_convs() {
    let tmp = scratch("onnx-bn-fold");
    let art = tmp.join("resnet.mshc").display().to_string();
    let model = "testdata/onnx/resnet_block/model.onnx";
    let run = meshc(&["compile", model, "--dim", "batch=2", "-o", &art, "--dump-after", "fold"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let dump = run.stdout;
    for conv in ["conv1", "layer1.0.conv1", "layer1.0.conv2"] {
        let want = format!("{conv}_Conv.bn_weight = mul({conv}.weight, ");
        assert!(dump.contains(&want), "no '{want}' in\n{dump}");
    }
    let run = meshc(&["compile", model, "--dim", "batch=2", "-o", &art, "--dump-after", "fuse"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(!run.stdout.contains("scaled"), "a batch norm's mul was left:\n{}", run.stdout);
}

/// MobileNet's depthwise convs (their batch norms folded in) run on the depthwise kernel,
/// not through im2col: the only gather left is the average pool's.
#[test]
fn depthwise_convs_have_their_own_kernel() {
    let tmp = scratch("onnx-depthwise");
    let art = tmp.join("mobilenet.mshc").display().to_string();
    let run = meshc(&["compile", "testdata/onnx/mobilenet_block/model.onnx", "--dim", "batch=2", "-o", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let run = meshc(&["inspect", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    for b in [1, 2] {
        let want = format!(" conv_features_{b}_bn_1_bn_BatchNormalization ");
        assert!(run.stdout.contains(&want), "no kernel '{want}' in\n{}", run.stdout);
    }
    let gathers: Vec<&str> = run.stdout.lines().filter(|l| l.contains(" gather_")).collect();
    assert_eq!(gathers.len(), 1, "{gathers:?}");
    assert!(gathers[0].contains("gather_y_cols"), "{gathers:?}");
}

/// `--const` fixes an input that must be known at import time; it must name an input and
/// agree with its dtype.
#[test]
fn consts_fix_inputs_at_import() {
    let tmp = scratch("onnx-const");
    let x = tmp.join("x.npy");
    Tensor::f32(vec![4, 16], vec![0.5; 64]).write_npy(&x).unwrap();
    let model = "testdata/onnx/mlp/model.onnx";
    let run = meshc(&["check", model, "--const", &format!("x={}", x.display())]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(!run.stdout.contains("input x"), "x is still an input:\n{}", run.stdout);
    let run = meshc(&["check", model, "--dim", "batch=4", "--const", &format!("nope={}", x.display())]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.contains("--const nope: the model has no input 'nope'"), "{}", run.stderr);
    let i = tmp.join("i.npy");
    Tensor::new(vec![4, 16], meshc_ir::Data::I64(vec![1; 64])).write_npy(&i).unwrap();
    let run = meshc(&["check", model, "--dim", "batch=4", "--const", &format!("x={}", i.display())]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.contains("--const x: the value is i64, the input f32"), "{}", run.stderr);
}

#[test]
fn dims_must_be_bound_and_must_name_a_dim() {
    let model = "testdata/onnx/mlp/model.onnx";
    let run = meshc(&["check", model, "--dim", "batch=4", "--dim", "seq=3"]);
    assert_eq!(run.status, Some(1));
    assert_eq!(run.stderr.trim(), format!("error: {model}: --dim seq: the model's inputs have no symbolic dim 'seq'"));
    let run = meshc(&["check", model, "--dim", "batch"]);
    assert_eq!((run.status, run.stderr.trim()), (Some(1), "error: --dim batch: expected NAME=N"), "{run:?}");
    // On a graph, --dim writes the input dims of that name at that size
    // (docs/dynamic-shapes.md), and must name one too.
    let run = meshc(&["check", "testdata/mlp/graph.json", "--dim", "batch=4"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(run.stdout.contains("input  x: f32[4,64]"), "{run:?}");
    let run = meshc(&["check", "testdata/mlp/graph.json", "--dim", "seq=4"]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.contains("--dim seq: no input has a dim named 'seq'"), "{run:?}");
}

/// `--input-shape` binds the dims ONNX leaves without a size or a name (unsized_dims'
/// -1 and unnamed dims; the runs against onnxruntime are the model loops above, through
/// input_shapes.txt), and gives one name's dims different sizes (shared_dim_name's `?`),
/// which then names nothing. It keeps the dim names of an input whose names are its own.
#[test]
fn input_shapes_fix_dims_dim_cannot_bind() {
    let shared = "testdata/onnx/shared_dim_name/model.onnx";
    let run = meshc(&["import", "--list", shared, "--input-shape", "input=1x64", "--input-shape", "state=2x1x8"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(
        run.stdout.contains("input input: f32[1,64] dims(_, _)\ninput state: f32[2,1,8] dims(_, _, _)\n"),
        "{run:?}"
    );
    let run = meshc(&["import", "--list", "testdata/onnx/mlp/model.onnx", "--input-shape", "x=3x16"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(run.stdout.contains("input x: f32[3,16] dims(batch, _)\n"), "{run:?}");
    // A --dim of the same size as the input shape's agrees with it.
    let run = meshc(&["check", "testdata/onnx/mlp/model.onnx", "--input-shape", "x=3x16", "--dim", "batch=3"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    // On a graph file it binds the input's named dims as --dim does: the same graph.
    let by_dim = meshc(&["check", "testdata/mlp/graph.json", "--dim", "batch=8"]);
    let by_shape = meshc(&["check", "testdata/mlp/graph.json", "--input-shape", "x=8x64"]);
    assert_eq!(by_dim.status, Some(0), "{by_dim:?}");
    assert!(by_dim.stdout.contains("input  x: f32[8,64]"), "{by_dim:?}");
    assert_eq!((by_shape.status, &by_shape.stdout), (Some(0), &by_dim.stdout), "{by_shape:?}");
}

/// Every misuse of `--input-shape` is one line, exit 1 (pinned in golden/cli/).
#[test]
fn input_shape_errors() {
    let paddle = "testdata/onnx/unsized_dims/model.onnx";
    let shared = "testdata/onnx/shared_dim_name/model.onnx";
    let mlp = "testdata/onnx/mlp/model.onnx";
    let is = "--input-shape";
    let tmp = scratch("onnx-input-shape-artifact");
    let art = tmp.join("mlp.mshc").display().to_string();
    let compiled = meshc(&["compile", mlp, "--dim", "batch=4", "-o", &art]);
    assert_eq!(compiled.status, Some(0), "{compiled:?}");
    crate::cli::all_user_errors(&[
        ("input-shape-missing", &["check", paddle]),
        ("input-shape-rank", &["interp", paddle, is, "x=1x3x6"]),
        ("input-shape-fixed-dim", &["compile", paddle, is, "x=1x4x6x10", "-o", "/nonexistent/x.mshc"]),
        ("input-shape-twice", &["run", paddle, is, "x=1x3x6x10", is, "x=1x3x6x10"]),
        ("input-shape-unknown-input", &["import", shared, is, "stat=2x1x8", "--list"]),
        ("input-shape-not-a-size", &["check", paddle, is, "x=1,3,6,10"]),
        ("input-shape-no-equals", &["check", paddle, is, "1x3x6x10"]),
        ("input-shape-disagrees-with-dim", &["check", mlp, is, "x=3x16", "--dim", "batch=4"]),
        // One `?` for unrelated dims: an input without its own --input-shape still needs it bound,
        // and no --dim ?=N agrees with both.
        ("input-shape-shared-name-unbound", &["check", shared, is, "input=1x64"]),
        ("input-shape-shared-name-dim", &["check", shared, is, "input=1x64", "--dim", "?=1"]),
        ("input-shape-const", &["check", mlp, is, "x=4x16", "--const", "x=testdata/onnx/mlp/inputs/x.npy"]),
        (
            "input-shape-initializer",
            &["check", "testdata/onnx/input_default/model.onnx", "--dim", "batch=2", is, "scale=4"],
        ),
        ("input-shape-graph-unknown-input", &["check", "testdata/mlp/graph.json", is, "X=8x64"]),
        ("input-shape-graph-rank", &["check", "testdata/mlp/graph.json", is, "x=8"]),
        // cnn's si is f32[4,3] dims(batch, _): its second dim is no symbol to bind.
        ("input-shape-graph-unnamed", &["check", "testdata/cnn/graph.json", is, "si=4x5"]),
        ("input-shape-graph-dim", &["check", "testdata/mlp/graph.json", is, "x=8x64", "--dim", "batch=4"]),
    ]);
    // An artifact is compiled already: its path is this run's scratch dir, so not pinned.
    let run = meshc(&["run", &art, is, "x=4x16"]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(
        run.stderr
            .ends_with("mlp.mshc: --input-shape applies when a graph is compiled; this artifact is already compiled\n"),
        "{run:?}"
    );
}

#[test]
fn an_import_that_fails_writes_nothing() {
    let tmp = scratch("onnx-nothing");
    let graph = tmp.join("g.json");
    let run = meshc(&["import", "testdata/onnx/mlp/model.onnx", "-o", &graph.display().to_string()]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert_eq!(std::fs::read_dir(&*tmp).unwrap().count(), 0, "files left behind");
}

/// Two imports writing one graph name at once: each replaces the graph and its weights file
/// together (their renames hold a lock on the directory), so the pair left is always one
/// model's, never one's graph with the other's weights; and no temporary is left behind.
#[test]
fn concurrent_imports_to_one_name_leave_one_models_graph_and_weights() {
    let tmp = scratch("onnx-concurrent");
    let graph = tmp.join("same.json").display().to_string();
    let import = |model: &str| {
        let mut args: Vec<String> =
            vec!["import".into(), format!("testdata/onnx/{model}/model.onnx"), "-o".into(), graph.clone()];
        args.extend(dim_args(Path::new(&format!("testdata/onnx/{model}/model.onnx"))));
        std::process::Command::new(env!("CARGO_BIN_EXE_meshc")).args(&args).spawn().expect("meshc starts")
    };
    for round in 0..25 {
        let (mut a, mut b) = (import("mlp"), import("resnet_block"));
        assert!(a.wait().unwrap().success() && b.wait().unwrap().success(), "round {round}");
        let check = meshc(&["check", &graph]);
        assert_eq!(check.status, Some(0), "round {round}: graph and weights of different models: {check:?}");
    }
    let mut left: Vec<String> =
        std::fs::read_dir(&*tmp).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["same.json", "same.safetensors"]);
}

/// A Megatron-style spec written with glob patterns shards the imported encoder exactly as
/// the spec that names every weight: the same artifact, byte for byte.
#[test]
fn layout_patterns_shard_an_imported_model_as_exact_names_do() {
    let tmp = scratch("onnx-patterns");
    let model = "testdata/onnx/encoder/model.onnx";
    let mut artifacts = Vec::new();
    for spec in ["mp-2x2", "mp-2x2-patterns"] {
        let art = tmp.join(format!("{spec}.mshc")).display().to_string();
        let layout = format!("testdata/onnx/encoder/layouts/{spec}.json");
        let run = meshc(&["compile", model, "--dim", "batch=2", "--dim", "seq=5", "--layout", &layout, "-o", &art]);
        assert_eq!(run.status, Some(0), "{run:?}");
        artifacts.push(std::fs::read(&art).unwrap());
    }
    assert!(artifacts[0] == artifacts[1], "the patterns gave another artifact");
}

/// A model whose initializers live in a `.onnx.data` file beside it (as `onnx.save_model`
/// with `save_as_external_data` writes it) runs as the model holding them does; a missing
/// or short data file and a location outside the model's directory are one-line errors.
#[test]
fn external_data_initializers_are_read_from_the_file_beside_the_model() {
    use meshc_onnx::proto::{tensor_proto::DataLocation, Message, ModelProto, StringStringEntryProto};
    let tmp = scratch("onnx-external");
    let original = Path::new("testdata/onnx/mlp/model.onnx");
    let external = |location: &str| {
        let mut m = ModelProto::decode(&std::fs::read(original).unwrap()[..]).unwrap();
        let mut data = Vec::new();
        for t in &mut m.graph.as_mut().unwrap().initializer {
            let raw = t.raw_data.take().unwrap_or_else(|| t.float_data.drain(..).flat_map(f32::to_le_bytes).collect());
            let entry = |k: &str, v: String| StringStringEntryProto { key: Some(k.into()), value: Some(v) };
            t.external_data = vec![
                entry("location", location.into()),
                entry("offset", data.len().to_string()),
                entry("length", raw.len().to_string()),
            ];
            t.data_location = Some(DataLocation::External as i32);
            data.extend(raw);
        }
        std::fs::write(tmp.join("model.onnx"), m.encode_to_vec()).unwrap();
        data
    };
    let data = external("model.onnx.data");
    std::fs::write(tmp.join("model.onnx.data"), &data).unwrap();
    let model = tmp.join("model.onnx").display().to_string();
    let mut args = vec!["run".to_string(), model.clone()];
    args.extend(dim_args(original));
    args.extend(input_args(original));
    outputs_match(original, &args, &tmp.join("out")).unwrap();

    let refused = |want: &str| {
        let mut args = vec!["check", model.as_str()];
        let dims = dim_args(original);
        args.extend(dims.iter().map(String::as_str));
        let run = meshc(&args);
        assert_eq!(run.status, Some(1), "{run:?}");
        assert!(run.stderr.lines().count() == 1 && run.stderr.contains(want), "want '{want}' in {}", run.stderr);
    };
    std::fs::write(tmp.join("model.onnx.data"), &data[..data.len() - 1]).unwrap();
    refused("is past the end of 'model.onnx.data'");
    std::fs::remove_file(tmp.join("model.onnx.data")).unwrap();
    refused("cannot read external data file");
    external("../model.onnx.data");
    refused("external data location '../model.onnx.data' is not a relative path inside the model's directory");
    external("/etc/passwd");
    refused("external data location '/etc/passwd' is not a relative path inside the model's directory");
    // A directory link inside the model's directory that leads out of it is refused, as
    // onnxruntime refuses it; one that stays inside is followed, as onnxruntime follows it.
    std::os::unix::fs::symlink("/", tmp.join("rootlink")).unwrap();
    external("rootlink/etc/passwd");
    refused(
        "external data location 'rootlink/etc/passwd' leads out of the model's directory through a symbolic link \
         (to '/etc/passwd')",
    );
    std::fs::create_dir(tmp.join("data")).unwrap();
    std::os::unix::fs::symlink("data", tmp.join("datalink")).unwrap();
    std::fs::write(tmp.join("data/model.onnx.data"), external("datalink/model.onnx.data")).unwrap();
    outputs_match(original, &args, &tmp.join("out-link")).unwrap();
}

/// The models onnxruntime runs in little memory (testdata/onnx/bounded: a CumSum of 100,000
/// elements, pools of kernel 2^31 over 4 elements, einsums of 30 and 60 operands) run
/// interpreted and compiled under a budget of 64 MiB: no table grows as n², as a kernel or
/// as 2^letters, and none of them takes long.
#[test]
fn bounded_models_run_under_a_small_memory_budget() {
    let tmp = scratch("onnx-bounded");
    let model = Path::new("testdata/onnx/bounded/model.onnx");
    for cmd in ["interp", "run"] {
        let start = std::time::Instant::now();
        let mut args = vec![cmd.to_string(), model.display().to_string(), "--max-memory".into(), "64M".into()];
        args.extend(input_args(model));
        outputs_match(model, &args, &tmp.join(cmd)).unwrap();
        assert!(start.elapsed().as_secs() < 60, "{cmd} took {:?}", start.elapsed());
    }
}

/// An input with an initializer of its name (its default, in ONNX's IR) is that constant
/// when the model is imported, as onnxruntime uses the default when the input is not fed
/// (testdata/onnx/input_default runs so with the others); `--const` gives it another value.
#[test]
fn an_initializer_is_its_inputs_default_and_const_overrides_it() {
    let tmp = scratch("onnx-input-default");
    let model = "testdata/onnx/input_default/model.onnx";
    let run = meshc(&["check", model, "--dim", "batch=2"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(!run.stdout.contains("input  scale"), "the defaulted input is still an input:\n{}", run.stdout);
    let ones = tmp.join("ones.npy");
    Tensor::f32(vec![4], vec![1.0; 4]).write_npy(&ones).unwrap();
    let out = tmp.join("out");
    let x = "testdata/onnx/input_default/inputs/x.npy";
    let scale = format!("scale={}", ones.display());
    let args = ["interp", model, "--dim", "batch=2", "--input", &format!("x={x}"), "--const", &scale];
    let run = meshc(&[&args[..], &["--output-dir", &out.display().to_string()]].concat());
    assert_eq!(run.status, Some(0), "{run:?}");
    let (y, x) = (Tensor::read_npy(&out.join("y.npy")).unwrap(), Tensor::read_npy(Path::new(x)).unwrap());
    assert_eq!(y.data, x.data, "x times a scale of ones is x");
}

/// Every output keeps its ONNX name, so `--output-dir` writes the files onnxruntime's
/// outputs are named by: an Identity of another output (once a panic), the graph input
/// itself (once `x_2`), no-op Identity, Cast and Expand of the input and of an initializer
/// (once named after the initializer). testdata/onnx/outputs also runs with the others.
#[test]
fn outputs_keep_their_onnx_names() {
    let run = meshc(&["check", "testdata/onnx/outputs/model.onnx", "--dim", "batch=2"]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let outputs: Vec<&str> =
        run.stdout.lines().filter_map(|l| l.strip_prefix("output ")?.trim().split(':').next()).collect();
    assert_eq!(outputs, ["y", "z", "x", "x_id", "x_cast", "x_expand", "w_id", "w_cast", "w_expand"], "{}", run.stdout);
}
