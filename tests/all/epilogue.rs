//! Matmul epilogues (src/passes/epilogue.rs, runtime/src/kernels/epilogue.rs): which chains the pass
//! folds into a library matmul, that the fused programs compute what the interpreter does on
//! the unfused graph over shapes, operand kinds and both GEMM paths (the weight in panels, the
//! small-M and general GEMMs of the library, a half weight, and the generated kernel, which
//! takes none), under mesh layouts (never across a collective), and that the dump parses
//! back, verifies and interprets to the same values.

use std::collections::HashMap;

use meshc::compile::{Gemm, Options};
use meshc::driver;
use meshc::pipeline::Dumps;
use meshc_ir::{interp, text, verify, DType, Tensor, TensorType};
use meshc_runtime::format::epilogue::Step;
use meshc_runtime::format::program::{Exec, IntMatmul, Library, Matmul};
use meshc_runtime::kernels::library::prefer_library;

/// The epilogues of the library matmuls of every device, by step names.
fn epilogues(c: &meshc::compile::Compiled) -> Vec<Vec<&'static str>> {
    let steps = c.programs.iter().flat_map(|p| &p.steps);
    steps
        .filter_map(|st| match &st.exec {
            Exec::Library(
                Library::Matmul(Matmul { epilogue, .. }) | Library::IntMatmul(IntMatmul { epilogue, .. }),
            ) => Some(epilogue.iter().map(Step::name).collect()),
            _ => None,
        })
        .collect()
}

/// Compiles `src` (on the layout `spec`, if any) and runs it on seeded inputs against the
/// interpreter; returns the compiled program's epilogues.
fn check(src: &str, spec: Option<&str>, gemm: Gemm, what: &str) -> Vec<Vec<&'static str>> {
    let g = text::parse(src).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
    let info = verify::verify(&g).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
    let (all, params) = crate::common::seeded_values(&g, 7);
    let want = interp::run(&g, &info.order, &info.types, all.clone()).unwrap();
    let spec = spec.map(|s| meshc::layout::parse(s, "spec.json").unwrap());
    let opts = Options { gemm, ..Options::default() };
    let c = driver::Job::new(&g, &info, &params, &opts)
        .spec(spec.as_ref())
        .build(&Dumps::default())
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let eps = epilogues(&c);
    let inputs: HashMap<String, Tensor> = g.inputs.iter().map(|i| (i.name.clone(), all[&i.name].clone())).collect();
    let got = c.load().unwrap().run(&inputs).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    for o in &g.outputs {
        crate::common::assert_close(&format!("{what}: {}", o.name), &got[&o.name], &want[&o.name]).unwrap();
    }
    eps
}

/// One matmul `x @ w` and a chain of `steps` after it, as a graph: `bias` is a `[n]` param,
/// `res` an input of the result's shape, `rowmask` an input broadcast over the rows,
/// `scale` a scalar param; `gelu_erf_ops` and `gelu_tanh_ops` are GELU as exporters write
/// it, in arithmetic (the gelu pass makes one `gelu` of each); `silu` and `silu_left` are
/// `mul(x, sigmoid(x))`, either operand first. `w` is a param (`"param"`), an input (`"input"`) or a bf16 param
/// read through a cast (`"bf16"`).
fn chain(batch: &[usize], (m, k, n): (usize, usize, usize), w: &str, steps: &[&str]) -> String {
    let dims = |d: &[usize]| d.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let out = dims(&[batch, &[m, n]].concat());
    let mut t = format!("graph chain {{\n  input x: f32[{}]\n", dims(&[batch, &[m, k]].concat()));
    t += &match w {
        "input" => format!("  input w: f32[{k},{n}]\n"),
        "bf16" => {
            format!("  param wh: bf16[{k},{n}] = init normal{{seed = 2, std = 0.3}}\n  w = cast(wh) {{to = \"f32\"}}\n")
        }
        _ => format!("  param w: f32[{k},{n}] = init normal{{seed = 2, std = 0.3}}\n"),
    };
    t += &format!("  param bias: f32[{n}] = init normal{{seed = 3, std = 1}}\n  param scale: f32[] = value 0.37\n");
    t += "  param half: f32[] = value 0.5\n  param one: f32[] = value 1.0\n  param sqrt2: f32[] = value 1.4142135\n";
    t += "  param three: f32[] = value 3.0\n  param c1: f32[] = value 0.044715\n  param c2: f32[] = value 0.7978846\n";
    t += &format!("  input res: f32[{out}]\n  input rowmask: f32[{}]\n", dims(&[batch, &[1, n]].concat()));
    t += "  y0 = matmul(x, w)\n";
    for (i, s) in steps.iter().enumerate() {
        let (x, y) = (format!("y{i}"), format!("y{}", i + 1));
        t += &match *s {
            "bias" => format!("  {y} = add({x}, bias)\n"),
            "bias_left" => format!("  {y} = add(bias, {x})\n"),
            "res" => format!("  {y} = add(res, {x})\n"),
            "rowmask" => format!("  {y} = add({x}, rowmask)\n"),
            "scale" => format!("  {y} = mul({x}, scale)\n"),
            "div" => format!("  {y} = div({x}, scale)\n"),
            "relu" => format!("  {y} = relu({x})\n"),
            "gelu" => format!("  {y} = gelu({x})\n"),
            "gelu_tanh" => format!("  {y} = gelu({x}) {{approximate = \"tanh\"}}\n"),
            "silu" => format!("  {y}s = sigmoid({x})\n  {y} = mul({x}, {y}s)\n"),
            "silu_left" => format!("  {y}s = sigmoid({x})\n  {y} = mul({y}s, {x})\n"),
            "gelu_erf_ops" => format!(
                "  {y}d = div({x}, sqrt2)\n  {y}e = erf({y}d)\n  {y}a = add({y}e, one)\n  {y}m = mul({x}, {y}a)\n  {y} = mul({y}m, half)\n"
            ),
            "gelu_tanh_ops" => format!(
                "  {y}h = mul({x}, half)\n  {y}p = pow({x}, three)\n  {y}c = mul({y}p, c1)\n  {y}s = add({x}, {y}c)\n  {y}k = mul({y}s, c2)\n  {y}t = tanh({y}k)\n  {y}a = add({y}t, one)\n  {y} = mul({y}h, {y}a)\n"
            ),
            other => format!("  {y} = {other}({x}, scale)\n"),
        };
    }
    t + &format!("  output y{}\n}}\n", steps.len())
}

/// The step names the pass makes of a chain's steps.
fn names(steps: &[&str]) -> Vec<&'static str> {
    let name = |s: &str| match s {
        "bias" | "bias_left" | "res" | "rowmask" => "add",
        "scale" => "mul",
        "div" => "div",
        "relu" => "relu",
        "gelu" | "gelu_erf_ops" => "gelu",
        "silu" | "silu_left" => "silu",
        _ => "gelu_tanh",
    };
    steps.iter().map(|s| name(s)).collect()
}

/// Shapes of every GEMM path (few rows: the panels and the small-M GEMM; many: the general
/// one; partial strips, batches) × weights as params, inputs and half params × chains of
/// every step kind, on the library, the default choice and the generated kernel.
#[test]
fn fused_chains_compute_what_the_interpreter_does() {
    let chains: [&[&str]; 10] = [
        &["bias", "gelu"],
        &["bias", "gelu_erf_ops"],
        &["gelu_tanh_ops", "res"],
        &["bias_left", "gelu_tanh", "res"],
        &["scale", "rowmask"],
        &["div", "relu"],
        &["bias", "relu", "scale", "res", "gelu"],
        &["res"],
        &["bias", "silu"],
        &["scale", "silu_left", "res", "silu"],
    ];
    type Shape = (&'static [usize], (usize, usize, usize));
    let shapes: [Shape; 6] = [
        (&[], (5, 7, 33)),
        (&[2], (13, 40, 96)),
        (&[], (64, 33, 65)),
        (&[], (150, 20, 40)),
        (&[3], (70, 16, 100)),
        (&[2], (1, 9, 31)),
    ];
    for (case, (batch, mkn)) in shapes.into_iter().enumerate() {
        for (c, steps) in chains.iter().enumerate() {
            // Every weight kind meets every shape over the chains.
            let w = ["param", "input", "bf16"][(case + c) % 3];
            let src = chain(batch, mkn, w, steps);
            for gemm in [Gemm::Library, Gemm::Auto, Gemm::Cranelift] {
                let what = format!("{batch:?} {mkn:?}, w {w}, {steps:?}, {gemm:?}");
                let eps = check(&src, None, gemm, &what);
                let x = TensorType::new(DType::F32, [batch, &[mkn.0, mkn.1][..]].concat());
                let library = match gemm {
                    Gemm::Cranelift => false,
                    Gemm::Library => true,
                    Gemm::Auto => prefer_library(&x, &TensorType::new(DType::F32, vec![mkn.1, mkn.2])),
                };
                let fused = library && mkn.2 >= meshc::passes::epilogue::MIN_COLUMNS;
                let want: Vec<Vec<&str>> = match (library, fused) {
                    (true, true) => vec![names(steps)],
                    (true, false) => vec![vec![]],
                    _ => vec![],
                };
                assert_eq!(eps, want, "{what}");
            }
        }
    }
}

/// An i32 product's dequantization (to f32, the activation's scale per row, the weight's
/// per column, a bias, GELU) joins the integer GEMM, on both of its splits (by strips up to
/// 64 rows, by rows above) and over batches, and computes what the interpreter does.
#[test]
fn integer_products_take_their_dequantization() {
    type Shape = (&'static [usize], (usize, usize, usize));
    let shapes: [Shape; 4] = [(&[], (5, 7, 33)), (&[2], (13, 40, 96)), (&[], (150, 20, 40)), (&[3], (70, 16, 100))];
    for (batch, (m, k, n)) in shapes {
        let dims = |d: &[usize]| d.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let (x, xs) = (dims(&[batch, &[m, k]].concat()), dims(&[batch, &[m, 1]].concat()));
        let src = format!(
            "graph q {{
  input x: f32[{x}]
  input xs: f32[{xs}]
  param wf: f32[{k},{n}] = init normal{{seed = 2, std = 1}}
  param ws: f32[{n}] = init normal{{seed = 3, std = 0.01}}
  param b: f32[{n}] = init normal{{seed = 4, std = 1}}
  param s: f32[] = value 60.0
  xm = mul(x, s)
  xr = round(xm)
  xi = cast(xr) {{to = \"i32\"}}
  wm = mul(wf, s)
  wr = round(wm)
  wi = cast(wr) {{to = \"i32\"}}
  h = matmul(xi, wi)
  f = cast(h) {{to = \"f32\"}}
  y1 = mul(f, xs)
  y2 = mul(y1, ws)
  y3 = add(y2, b)
  y = gelu(y3)
  output y
}}
"
        );
        let what = format!("{batch:?} {:?}", (m, k, n));
        let eps = check(&src, None, Gemm::Auto, &what);
        assert_eq!(eps, [["to_f32", "mul", "mul", "add", "gelu"]], "{what}");
    }
}

/// An integer product of an 8-bit activation less its zero point (onnxruntime's dynamic
/// quantization: u8 and a run-time zero point; i8 and a constant one) reads the bytes
/// (`passes::zero_point`), on both splits of the GEMM, over batches and on two devices
/// splitting the weight's columns, and computes what the interpreter does.
#[test]
fn centred_bytes_are_read_as_they_are() {
    type Case = (&'static str, &'static [usize], (usize, usize, usize), Option<&'static str>);
    let spec = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["m"]}, "layouts": {"w": [null, "m"], "y": [null, "m"]}}"#;
    let cases: [Case; 5] = [
        ("u8", &[], (5, 7, 33), None),
        ("i8", &[2], (13, 40, 96), None),
        ("u8", &[], (150, 20, 40), None),
        ("i8", &[3], (70, 16, 100), None),
        ("u8", &[], (9, 24, 64), Some(spec)),
    ];
    for (t, batch, (m, k, n), spec) in cases {
        let dims = |d: &[usize]| d.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let x = dims(&[batch, &[m, k]].concat());
        let src = format!(
            "graph q {{
  input x: {t}[{x}]
  input zu: {t}[]
  param w: f32[{k},{n}] = init normal{{seed = 2, std = 40}}
  param s: f32[] = value 0.01
  z = cast(zu) {{to = \"i32\"}}
  c = cast(x) {{to = \"i32\"}}
  a = sub(c, z)
  w8 = cast(w) {{to = \"i8\"}}
  wi = cast(w8) {{to = \"i32\"}}
  h = matmul(a, wi)
  f = cast(h) {{to = \"f32\"}}
  y = mul(f, s)
  output y
}}
"
        );
        let what = format!("{t} {batch:?} {:?} {}", (m, k, n), if spec.is_some() { "on 2 devices" } else { "" });
        let g = text::parse(&src).unwrap();
        let info = verify::verify(&g).unwrap();
        let (_, params) = crate::common::seeded_values(&g, 7);
        let spec_parsed = spec.map(|s| meshc::layout::parse(s, "spec.json").unwrap());
        let c = driver::Job::new(&g, &info, &params, &Options::default())
            .spec(spec_parsed.as_ref())
            .build(&Dumps::default())
            .unwrap_or_else(|e| panic!("{what}: {e:#}"));
        let bytes = c
            .programs
            .iter()
            .flat_map(|p| &p.steps)
            .filter(|st| matches!(&st.exec, Exec::Library(Library::IntMatmul(IntMatmul { a_bytes: Some(_), .. }))));
        assert_eq!(bytes.count(), c.programs.len(), "{what}: every device's product reads bytes");
        let eps = check(&src, spec, Gemm::Auto, &what);
        assert!(eps.iter().all(|e| e == &["to_f32", "mul"]), "{what}: {eps:?}");
    }
}

/// An empty product viewed through a reshape keeps its chain out of the epilogue (every
/// dim boundary of an empty shape has the same product, 0) and still compiles.
#[test]
fn an_empty_product_through_a_reshape_compiles() {
    let src = "graph empty {\n  input x: f32[0,16]\n  param w: f32[16,40] = init normal{seed = 1, std = 0.3}\n  param pc: f32[5,1] = init normal{seed = 2, std = 1}\n  h = matmul(x, w)\n  r = reshape(h) {shape = [0, 5, 8]}\n  y = add(r, pc)\n  output y\n}\n";
    assert_eq!(check(src, None, Gemm::Library, "empty"), vec![Vec::<&str>::new()]);
}

/// A chain stops where its value has another use, is an output, meets an op the GEMM does
/// not apply (sub) or a node another chain took; a step whose operand would grow the result
/// is not taken.
#[test]
fn chains_stop_where_the_value_escapes() {
    let base = "graph stops {\n  input x: f32[4,16]\n  param w: f32[16,40] = init normal{seed = 1, std = 0.3}\n  param b: f32[40] = init normal{seed = 2, std = 1}\n  input wide: f32[3,4,40]\n  param rows: f32[4,1,1] = init normal{seed = 3, std = 1}\n  param half: f32[2,1,1] = init normal{seed = 4, std = 1}\n";
    let cases: [(&str, Vec<Vec<&str>>); 10] = [
        (
            "  h = matmul(x, w)\n  a = add(h, b)\n  y = relu(a)\n  z = mul(a, a)\n  output y\n  output z\n",
            vec![vec!["add"]],
        ),
        ("  h = matmul(x, w)\n  a = add(h, b)\n  y = relu(a)\n  output a\n  output y\n", vec![vec!["add"]]),
        ("  h = matmul(x, w)\n  a = sub(h, b)\n  y = relu(a)\n  output y\n", vec![vec![]]),
        ("  h = matmul(x, w)\n  y = add(h, wide)\n  output y\n", vec![vec![]]),
        // SiLU takes its sigmoid and mul only when they alone read the value, and the
        // sigmoid is read by the mul alone and no output.
        ("  h = matmul(x, w)\n  a = add(h, b)\n  s = sigmoid(a)\n  y = mul(a, s)\n  output y\n", vec![vec!["add", "silu"]]),
        (
            "  h = matmul(x, w)\n  a = add(h, b)\n  s = sigmoid(a)\n  y = mul(a, s)\n  output s\n  output y\n",
            vec![vec!["add"]],
        ),
        ("  h = matmul(x, w)\n  a = add(h, b)\n  s = sigmoid(a)\n  y = mul(b, s)\n  z = add(a, y)\n  output z\n", vec![vec!["add"]]),
        // Through a reshape, as after a conv's GEMM: a per-row bias of the reshaped value
        // is one of the product's rows; one along a dim that splits the product's rows
        // stops the chain.
        (
            "  h = matmul(x, w)\n  r = reshape(h) {shape = [4, 5, 8]}\n  a = add(r, rows)\n  s = sigmoid(a)\n  y = mul(a, s)\n  output y\n",
            vec![vec!["add", "silu"]],
        ),
        ("  h = matmul(x, w)\n  r = reshape(h) {shape = [2, 2, 5, 8]}\n  y = add(r, half)\n  output y\n", vec![vec![]]),
        // Both matmuls are followed by `s`: the first takes it (and runs where `y` was, after
        // the second), the second stays plain.
        (
            "  h = matmul(x, w)\n  g = matmul(x, w)\n  s = add(h, g)\n  y = relu(s)\n  output y\n",
            vec![vec![], vec!["add", "relu"]],
        ),
    ];
    for (body, want) in cases {
        let src = format!("{base}{body}}}\n");
        assert_eq!(check(&src, None, Gemm::Library, body), want, "{body}");
    }
}

/// A two-layer MLP split over a 2-device mesh. Megatron-style (the first weight's columns,
/// the second's rows): the first matmul is local and takes its (split) bias and GELU; the
/// second's partial sums meet in an all_reduce, so its bias and residual stay after it.
/// Split by rows of x: both matmuls are local and take their chains.
#[test]
fn fusion_under_layouts_stops_at_collectives() {
    let src = "graph mlp {
  input x: f32[8,64]
  param w1: f32[64,96] = init normal{seed = 1, std = 0.2}
  param b1: f32[96] = init normal{seed = 2, std = 1}
  param w2: f32[96,64] = init normal{seed = 3, std = 0.2}
  param b2: f32[64] = init normal{seed = 4, std = 1}
  h = matmul(x, w1)
  hb = add(h, b1)
  a = gelu(hb)
  o = matmul(a, w2)
  ob = add(o, b2)
  y = add(x, ob)
  output y
}
";
    let spec = |layouts: &str| {
        format!(r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [2], "axes": ["m"]}}, "layouts": {{{layouts}}}}}"#)
    };
    let megatron = spec(r#""w1": [null, "m"], "w2": ["m", null], "y": [null, null]"#);
    let eps = check(src, Some(&megatron), Gemm::Library, "megatron");
    assert_eq!(eps, vec![vec!["add", "gelu"], vec![], vec!["add", "gelu"], vec![]], "megatron");
    let rows = spec(r#""x": ["m", null], "y": ["m", null]"#);
    let eps = check(src, Some(&rows), Gemm::Library, "rows");
    let both = vec!["add", "gelu"];
    assert_eq!(eps, vec![both.clone(), vec!["add", "add"], both, vec!["add", "add"]], "rows");
}

/// `--dump-after epilogue` shows each fused chain as one matmul with its epilogue; the dump
/// parses, prints back the same, verifies and interprets to the unfused graph's values.
#[test]
fn the_dump_round_trips_and_interprets_alike() {
    let src = chain(&[2], (13, 40, 96), "param", &["bias", "gelu_tanh", "scale", "res"]);
    let g = text::parse(&src).unwrap();
    let info = verify::verify(&g).unwrap();
    let (all, params) = crate::common::seeded_values(&g, 3);
    let dir = crate::common::scratch("epilogue-dump");
    let dumps = Dumps::new(vec!["epilogue".into()], Some(dir.to_path_buf()), Default::default()).unwrap();
    driver::Job::new(&g, &info, &params, &Options::default()).build(&dumps).unwrap();
    let dump = std::fs::read_to_string(dumps.file("epilogue").unwrap()).unwrap();
    let body = dump.strip_prefix("# device 0\n").expect("one device");
    assert!(body.contains("y4 = matmul(x, w, bias, scale, res) {epilogue = \"add,gelu_tanh,mul,add\"}"), "{body}");
    let fused = text::parse(body).unwrap();
    assert_eq!(text::print(&fused), body, "the text form round-trips");
    let finfo = verify::verify(&fused).unwrap();
    let want = interp::run(&g, &info.order, &info.types, all.clone()).unwrap();
    let got = interp::run(&fused, &finfo.order, &finfo.types, all).unwrap();
    crate::common::assert_close("fused graph, interpreted", &got["y4"], &want["y4"]).unwrap();
    // And compile refuses it as input: placement and lowering know matmuls of two operands.
    let e = driver::Job::new(&fused, &finfo, &params, &Options::default()).build(&Dumps::default()).err().unwrap();
    assert!(format!("{e:#}").contains("node 'y4': compile makes matmul epilogues itself"), "{e:#}");
}

/// The verifier checks an epilogue: known steps, one operand per binary step, operands that
/// broadcast to the result without growing it, matrices on both sides.
#[test]
fn the_verifier_checks_epilogues() {
    let head = "graph bad {\n  input x: f32[4,16]\n  input w: f32[16,8]\n  input b: f32[8]\n  input wide: f32[2,4,8]\n  input v: f32[16]\n  input xi: i32[4,16]\n  input wi: i32[16,8]\n  input xu: u8[4,16]\n  input z: i32[]\n  input zs: i32[2]\n";
    for (node, want) in [
        ("y = matmul(x, w, b) {epilogue = \"add,cube\"}", "unknown epilogue step 'cube'"),
        ("y = matmul(x, w) {epilogue = \"add\"}", "0 operands after a and b, its epilogue takes 1"),
        ("y = matmul(x, w, b) {epilogue = \"relu\"}", "1 operands after a and b, its epilogue takes 0"),
        ("y = matmul(x, w, wide) {epilogue = \"add\"}", "does not broadcast to the result"),
        ("y = matmul(v, w, b) {epilogue = \"add\"}", "product of matrices"),
        ("y = matmul(x, w) {epilogue = \"to_f32\"}", "an epilogue of an f32 product has no to_f32"),
        ("y = matmul(xi, wi, b) {epilogue = \"add\"}", "an epilogue of an i32 product starts with to_f32"),
        ("y = matmul(xi, wi) {epilogue = \"to_f32,relu,to_f32\"}", "starts with to_f32, and has it once"),
        // An 8-bit a less its zero point: one i32 element after b, then the epilogue's.
        ("y = matmul(xu, wi) {a_zero_point = true}", "takes the zero point after a and b"),
        ("y = matmul(xi, wi, z) {a_zero_point = true}", "lhs (with a_zero_point)"),
        ("y = matmul(xu, wi, zs) {a_zero_point = true}", "the zero point of a matmul's a is one element"),
        ("y = matmul(xu, wi, b) {a_zero_point = true}", "the zero point"),
        ("y = matmul(xu, w, z) {a_zero_point = true}", "rhs"),
        ("y = matmul(xu, wi, z, b) {a_zero_point = true, epilogue = \"add\"}", "starts with to_f32"),
    ] {
        let src = format!("{head}  {node}\n  output y\n}}\n");
        let e =
            text::parse(&src).map_err(|e| e.to_string()).and_then(|g| verify::verify(&g).map_err(|e| e.to_string()));
        let e = e.err().unwrap_or_else(|| panic!("{node}: verified"));
        assert!(e.contains(want), "{node}: {e}");
    }
}
