//! `--isa`: on every vector ISA of the runtime's kernels this CPU has, models whose steps
//! take the library GEMMs (panels, small-M), the integer GEMM, their epilogues, fused
//! attention and the all-reduces' folds give the expected outputs; an ISA the CPU lacks is
//! refused in one line.

use std::path::Path;

use meshc_runtime::api::Isa;

use crate::common::{dim_args, input_args, meshc, scratch};

/// The ONNX test models (expected outputs from onnxruntime) and the layouts they run under;
/// `quantized` takes the integer GEMM (its VNNI, AVX2 and portable paths).
const CASES: [(&str, Option<&str>); 5] = [
    ("encoder", None),
    ("encoder", Some("mp-2x2.json")),
    ("gpt2_block", None),
    ("resnet_block", None),
    ("quantized", None),
];

#[test]
fn every_isa_the_cpu_has_computes_the_expected_outputs() {
    for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
        for (model, layout) in CASES {
            let dir = Path::new("testdata/onnx").join(model);
            let path = dir.join("model.onnx");
            let expected = dir.join("expected");
            let mut args: Vec<String> =
                ["run", &path.display().to_string(), "--isa", isa.name()].map(String::from).into();
            args.extend(dim_args(&path));
            args.extend(input_args(&path));
            if let Some(l) = layout {
                args.extend(["--layout".to_string(), dir.join("layouts").join(l).display().to_string()]);
            }
            let out = scratch(&format!("isa-{}-{model}-{}", isa.name(), layout.unwrap_or("one")));
            args.extend(["--check-against".into(), expected.display().to_string(), "--output-dir".into()]);
            args.push(out.join("out").display().to_string());
            let r = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(r.status, Some(0), "--isa {} {model} {layout:?}: {}", isa.name(), r.stderr);
        }
    }
}

#[test]
fn isas_the_cpu_lacks_and_unknown_ones_are_refused_in_one_line() {
    let path = "testdata/onnx/mlp/model.onnx";
    let mut lacking: Vec<String> =
        Isa::ALL.into_iter().filter(|&i| i > Isa::detected()).map(|i| i.name().to_string()).collect();
    lacking.push("sse9".into());
    for isa in lacking {
        let mut args: Vec<String> = ["run", path, "--isa", &isa].map(String::from).into();
        args.extend(dim_args(Path::new(path)));
        args.extend(input_args(Path::new(path)));
        let r = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(r.status, Some(1), "--isa {isa}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        let want = if isa == "sse9" { "unknown ISA 'sse9'" } else { "this CPU cannot run" };
        assert!(r.stderr.contains("--isa") && r.stderr.contains(want), "{}", r.stderr);
    }
}
