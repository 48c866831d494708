//! Fused attention (src/passes/attention.rs, runtime/src/kernels/attention.rs): that the compiled
//! step computes what the interpreter does on the unfused graph over random shapes (batch
//! dims broadcasting every way, masks of every broadcast shape holding −∞ and −1e9, whole
//! rows of them included, scales multiplied either side or divided, or none), which chains
//! the pass takes and which it leaves, that the testdata transformer gets one fused step a
//! device on one device and under layouts splitting the heads, with the expected outputs on
//! both GEMM paths, and that the dump parses back and interprets alike.

use std::collections::HashMap;

use meshc::compile::{Compiled, Gemm, Options};
use meshc::driver;
use meshc::pipeline::Dumps;
use meshc_ir::{interp, text, verify, Tensor};
use meshc_runtime::format::program::{Attention, Exec, Library};
use meshc_runtime::kernels::matmul_shape::testing::random;
use proptest::prelude::*;

/// The fused attention steps of each device.
fn fused(c: &Compiled) -> Vec<usize> {
    let fused = |p: &meshc_runtime::format::program::Program| {
        p.steps.iter().filter(|st| matches!(st.exec, Exec::Library(Library::Attention(Attention { .. })))).count()
    };
    c.programs.iter().map(fused).collect()
}

/// Compiles `g` (with `values` holding its params and inputs) on `spec`, if any, runs it
/// and compares every output with the interpreter's; returns the fused steps per device.
fn check(
    g: &meshc_ir::Graph,
    values: &HashMap<String, Tensor>,
    spec: Option<&meshc::layout::Spec>,
    opts: &Options,
    what: &str,
) -> Vec<usize> {
    let info = verify::verify(g).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = interp::run(g, &info.order, &info.types, values.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let params: HashMap<String, Tensor> = g.params.iter().map(|p| (p.name.clone(), values[&p.name].clone())).collect();
    let c = driver::Job::new(g, &info, &params, opts)
        .spec(spec)
        .build(&Dumps::default())
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    let steps = fused(&c);
    let inputs: HashMap<String, Tensor> = g.inputs.iter().map(|i| (i.name.clone(), values[&i.name].clone())).collect();
    let got = c.load().unwrap().run(&inputs).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    for o in &g.outputs {
        crate::common::assert_close(&format!("{what}: {}", o.name), &got[&o.name], &want[&o.name]).unwrap();
    }
    steps
}

/// `full` with each dim kept or made 1 by the bits of `picks`, after dropping
/// `drop` leading dims.
fn variant(full: &[usize], drop: usize, picks: u32) -> Vec<usize> {
    let drop = drop.min(full.len());
    full[drop..].iter().enumerate().map(|(i, &d)| if picks >> i & 1 == 1 { d } else { 1 }).collect()
}

fn dims(s: &[usize]) -> String {
    s.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// One random attention: its graph and the values of its params and inputs.
#[derive(Debug, Clone)]
struct Case {
    batch: Vec<usize>,
    /// T, S, D, Dv.
    sizes: (usize, usize, usize, usize),
    /// Per operand q, kt, v, mask: leading dims dropped and which dims are kept whole.
    shapes: [(usize, u32); 4],
    /// none, mul (scores on the left), mul (on the right), div.
    scale: u8,
    /// none, add (scores on the left), add (on the right).
    mask: u8,
    /// Mask entries: random, some −∞, some −1e9, a whole row −∞, a whole row −1e9.
    special: u8,
    seed: u64,
}

impl Case {
    fn shape(&self, k: usize, tail: [usize; 2]) -> Vec<usize> {
        let (drop, picks) = self.shapes[k];
        [variant(&self.batch, drop, picks), tail.to_vec()].concat()
    }

    fn graph(&self) -> (meshc_ir::Graph, HashMap<String, Tensor>) {
        let (t, s, d, dv) = self.sizes;
        let (q, kt, v) = (self.shape(0, [t, d]), self.shape(1, [d, s]), self.shape(2, [s, dv]));
        let mut src = format!(
            "graph attn {{\n  input q: f32[{}]\n  input kt: f32[{}]\n  input v: f32[{}]\n",
            dims(&q),
            dims(&kt),
            dims(&v)
        );
        let (drop, picks) = self.shapes[3];
        let scores: Vec<usize> = {
            let (qb, kb) = (&q[..q.len() - 2], &kt[..kt.len() - 2]);
            let rank = qb.len().max(kb.len());
            let at = |b: &[usize], i: usize| (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
            (0..rank).map(|i| at(qb, i).max(at(kb, i))).chain([t, s]).collect()
        };
        // A mask over the scores: any of their dims (its last two included) may broadcast.
        let mask = variant(&scores, drop, picks);
        src += "  param scale: f32[] = value 0.37\n";
        if self.mask > 0 {
            src += &format!("  input mask: f32[{}]\n", dims(&mask));
        }
        src += "  sc = matmul(q, kt)\n";
        let mut cur = "sc";
        let scaled = match self.scale {
            1 => Some("mul(sc, scale)"),
            2 => Some("mul(scale, sc)"),
            3 => Some("div(sc, scale)"),
            _ => None,
        };
        if let Some(e) = scaled {
            src += &format!("  scaled = {e}\n");
            cur = "scaled";
        }
        match self.mask {
            1 => src += &format!("  masked = add({cur}, mask)\n"),
            2 => src += &format!("  masked = add(mask, {cur})\n"),
            _ => {}
        }
        if self.mask > 0 {
            cur = "masked";
        }
        src += &format!("  p = softmax({cur}) {{axis = -1}}\n  y = matmul(p, v)\n  output y\n}}\n");
        let g = text::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let mut values = HashMap::new();
        for (k, (name, shape)) in [("q", &q), ("kt", &kt), ("v", &v)].into_iter().enumerate() {
            let n = shape.iter().product();
            values.insert(name.to_string(), Tensor::f32(shape.clone(), random(self.seed + k as u64, n)));
        }
        values.insert("scale".to_string(), Tensor::f32(vec![], vec![0.37]));
        if self.mask > 0 {
            let n: usize = mask.iter().product();
            let row = *mask.last().unwrap_or(&1);
            let mut m = random(self.seed + 7, n);
            let picks = random(self.seed + 8, n);
            for (i, x) in m.iter_mut().enumerate() {
                let first_row = i < row;
                *x = match self.special {
                    1 if picks[i] > 0.5 => f32::NEG_INFINITY,
                    2 if picks[i] > 0.3 => -1e9,
                    3 if first_row => f32::NEG_INFINITY,
                    4 if first_row => -1e9,
                    _ => *x,
                };
            }
            values.insert("mask".to_string(), Tensor::f32(mask, m));
        }
        (g, values)
    }
}

fn any_case() -> impl Strategy<Value = Case> {
    let size = prop_oneof![1usize..=8, 1usize..=300];
    (
        prop::collection::vec(1usize..=3, 0..=2),
        (size.clone(), size, 1usize..=80, 1usize..=80),
        prop::array::uniform4((0usize..=2, any::<u32>())),
        (0u8..=3, 0u8..=2, 0u8..=4, any::<u64>()),
    )
        .prop_map(|(batch, sizes, shapes, (scale, mask, special, seed))| Case {
            batch,
            sizes,
            shapes,
            scale,
            mask,
            special,
            seed,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every random attention fuses into one step that computes what the interpreter does,
    /// whichever GEMM the rest would take.
    #[test]
    fn fused_attention_computes_what_the_interpreter_does(case in any_case()) {
        let (g, values) = case.graph();
        for gemm in [Gemm::Library, Gemm::Cranelift] {
            let steps = check(&g, &values, None, &Options { gemm, ..Options::default() }, &format!("{case:?} {gemm:?}"));
            prop_assert_eq!(steps, vec![1], "{:?}", case);
        }
    }
}

/// The kernel's edges: rows of all −∞ (NaN, as the interpreter's softmax gives), all
/// −1e9 (uniform), one key, one query, a block of rows and a tile of columns plus one.
#[test]
fn edge_shapes_and_masked_rows() {
    let cases = [(1, 1, 1, 1), (33, 17, 3, 65), (1, 300, 80, 1), (300, 1, 1, 80), (64, 64, 32, 32)];
    for (k, sizes) in cases.into_iter().enumerate() {
        for special in 0..=4 {
            let case = Case {
                batch: vec![2, 3],
                sizes,
                shapes: [(0, 3), (0, 2), (1, 1), (0, 0b1001)],
                scale: 3,
                mask: 1,
                special,
                seed: k as u64,
            };
            let (g, values) = case.graph();
            assert_eq!(check(&g, &values, None, &Options::default(), &format!("{case:?}")), vec![1]);
        }
    }
}

/// The chain stays unfused where a value in it escapes (a second use, an output), the
/// softmax is over another axis, the scale is not one number, the mask would grow the
/// scores, or the keys are more than a block holds; with `Options::attention` off.
#[test]
fn chains_stay_apart_where_they_must() {
    let head = "graph a {\n  input q: f32[2,5,8]\n  input kt: f32[2,8,6]\n  input v: f32[2,6,4]\n  input mask: f32[2,1,6]\n  input wide: f32[3,2,5,6]\n  input vec: f32[6]\n  param scale: f32[] = value 0.5\n  sc = matmul(q, kt)\n";
    let cases = [
        ("  p = softmax(sc)\n  y = matmul(p, v)\n  output y\n", 1),
        ("  m = add(sc, mask)\n  p = softmax(m)\n  y = matmul(p, v)\n  output y\n", 1),
        ("  p = softmax(sc)\n  y = matmul(p, v)\n  output y\n  output p\n", 0),
        ("  p = softmax(sc)\n  y = matmul(p, v)\n  z = add(p, p)\n  output y\n  output z\n", 0),
        ("  s = mul(sc, scale)\n  p = softmax(s)\n  y = matmul(p, v)\n  output y\n  output sc\n", 0),
        ("  p = softmax(sc) {axis = 1}\n  y = matmul(p, v)\n  output y\n", 0),
        ("  s = mul(sc, vec)\n  p = softmax(s)\n  y = matmul(p, v)\n  output y\n", 0),
        ("  m = add(sc, wide)\n  p = softmax(m)\n  y = matmul(p, v)\n  output y\n", 0),
        ("  m = sub(sc, mask)\n  p = softmax(m)\n  y = matmul(p, v)\n  output y\n", 0),
        ("  m = add(mask, scale)\n  s = add(sc, m)\n  p = softmax(s)\n  y = matmul(p, v)\n  output y\n", 1),
    ];
    for (body, want) in cases {
        let src = format!("{head}{body}}}\n");
        let g = text::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let (values, _) = crate::common::seeded_values(&g, 5);
        for (attention, want) in [(true, want), (false, 0)] {
            let opts = Options { attention, ..Options::default() };
            assert_eq!(check(&g, &values, None, &opts, body), vec![want], "{body} attention {attention}");
        }
    }
    // More keys than `MAX_KEYS`: the generic path.
    let keys = meshc_runtime::kernels::attention::MAX_KEYS + 1;
    let src = format!("graph long {{\n  input q: f32[2,4]\n  input kt: f32[4,{keys}]\n  input v: f32[{keys},3]\n  p = softmax(matmul(q, kt))\n  y = matmul(p, v)\n  output y\n}}\n");
    let src = src.replace("softmax(matmul(q, kt))", "softmax(s)").replace("  p =", "  s = matmul(q, kt)\n  p =");
    let g = text::parse(&src).unwrap();
    let (values, _) = crate::common::seeded_values(&g, 6);
    assert_eq!(check(&g, &values, None, &Options::default(), "long"), vec![0]);
}

/// The testdata transformer: one fused step on one device and on each device of the
/// layouts that keep a head's contraction on one device, on both GEMM paths, with the
/// expected outputs.
#[test]
fn the_transformer_fuses_on_one_device_and_under_layouts() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/transformer/graph.json");
    let (g, info) = meshc_ir::load::load(&path).unwrap();
    let params = meshc_ir::params::load_all(&g, path.parent().unwrap()).unwrap();
    let inputs = crate::common::testdata_inputs(&path, &g).unwrap();
    let layouts = path.parent().unwrap().join("layouts");
    for (spec, want) in
        [(None, vec![1]), (Some("dp-2"), vec![1; 2]), (Some("mp-4"), vec![1; 4]), (Some("dp-2x4"), vec![1; 8])]
    {
        let spec = spec.map(|s| meshc::layout::load(&layouts.join(format!("{s}.json"))).unwrap());
        for gemm in [Gemm::Library, Gemm::Cranelift] {
            let opts = Options { gemm, ..Options::default() };
            let c = driver::Job::new(&g, &info, &params, &opts).spec(spec.as_ref()).build(&Dumps::default()).unwrap();
            assert_eq!(fused(&c), want, "{:?} {gemm:?}", spec.as_ref().map(|s| &s.file));
            let got = c.load().unwrap().run(&inputs).unwrap();
            crate::common::matches_expected(&path, &got.into_iter().collect()).unwrap();
        }
    }
}

/// `--dump-after attention` shows the fused chain as one `attention` node; the dump
/// parses, prints back the same, verifies and interprets to the unfused graph's values,
/// and compile refuses it as input.
#[test]
fn the_dump_round_trips_and_interprets_alike() {
    let case = Case {
        batch: vec![2, 3],
        sizes: (9, 11, 5, 7),
        shapes: [(0, 3), (0, 3), (0, 3), (0, 0b1001)],
        scale: 3,
        mask: 1,
        special: 1,
        seed: 4,
    };
    let (g, values) = case.graph();
    let info = verify::verify(&g).unwrap();
    let dir = crate::common::scratch("attention-dump");
    let dumps = Dumps::new(vec!["attention".into()], Some(dir.to_path_buf()), Default::default()).unwrap();
    let params: HashMap<String, Tensor> = [("scale".to_string(), values["scale"].clone())].into();
    driver::Job::new(&g, &info, &params, &Options::default()).build(&dumps).unwrap();
    let dump = std::fs::read_to_string(dumps.file("attention").unwrap()).unwrap();
    let body = dump.strip_prefix("# device 0\n").expect("one device");
    assert!(body.contains("y = attention(q, kt, v, scale, mask) {scores = \"div,add\"}"), "{body}");
    let fused = text::parse(body).unwrap();
    assert_eq!(text::print(&fused), body, "the text form round-trips");
    let finfo = verify::verify(&fused).unwrap();
    let want = interp::run(&g, &info.order, &info.types, values.clone()).unwrap();
    let got = interp::run(&fused, &finfo.order, &finfo.types, values).unwrap();
    crate::common::assert_close("fused graph, interpreted", &got["y"], &want["y"]).unwrap();
    let e = driver::Job::new(&fused, &finfo, &params, &Options::default()).build(&Dumps::default()).err().unwrap();
    assert!(format!("{e:#}").contains("node 'y': compile makes attention nodes itself"), "{e:#}");
}

/// The verifier checks an attention node: one operand per scores step, matrices, a scale
/// of one element, a mask that does not grow the scores.
#[test]
fn the_verifier_checks_attention() {
    let head = "graph bad {\n  input q: f32[4,8]\n  input kt: f32[8,6]\n  input v: f32[6,3]\n  input s: f32[]\n  input two: f32[6]\n  input wide: f32[2,4,6]\n  input vec: f32[8]\n";
    for (node, want) in [
        ("y = attention(q, kt, v) {scores = \"div\"}", "0 operands after q, kt and v, its scores take 1"),
        ("y = attention(q, kt, v, s) {scores = \"exp\"}", "attribute 'scores'"),
        ("y = attention(q, kt, v, two) {scores = \"mul\"}", "one element"),
        ("y = attention(q, kt, v, wide) {scores = \"add\"}", "does not broadcast"),
        ("y = attention(vec, kt, v)", "rank >= 2"),
        ("y = attention(q, v, v)", "contracting dims differ"),
    ] {
        let src = format!("{head}  {node}\n  output y\n}}\n");
        let e =
            text::parse(&src).map_err(|e| e.to_string()).and_then(|g| verify::verify(&g).map_err(|e| e.to_string()));
        let e = e.err().unwrap_or_else(|| panic!("{node}: verified"));
        assert!(e.contains(want), "{node}: {e}");
    }
}
