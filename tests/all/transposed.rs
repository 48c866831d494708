//! Transposes the library GEMM reads through strides (`Library::Matmul`'s `transposed`):
//! which ones compile folds (a swap of the last two dims read only as a library matmul's
//! `a` or `b`), which it keeps, and runs that reproduce the interpreter.

use std::collections::HashMap;

use meshc::compile::{Gemm, Options};
use meshc::driver;
use meshc::pipeline::Dumps;
use meshc_ir::{interp, text, verify, Tensor};
use meshc_runtime::format::program::{Exec, Library, Matmul, Transposed};

/// `xt` feeds two matmuls as `a`, `wt` one as `b`, `bt` a batched one whose `b` is shared
/// (so `a`'s matrices cannot fold into one tall GEMM); `rt` is also added to a tensor and
/// `ot` is an output, so both stay; `pt` swaps the first two of three dims, not the last two.
const GRAPH: &str = "graph transposed {
  input x: f32[64,48]
  input d: f32[64,40]
  input w: f32[48,40]
  input b3: f32[2,3,30,20]
  input w2: f32[30,16]
  input r: f32[48,64]
  input p: f32[40,64,5]
  xt = transpose(x)
  g1 = matmul(xt, d)
  g3 = matmul(xt, x)
  wt = transpose(w)
  g2 = matmul(d, wt)
  bt = transpose(b3) {perm = [0, 1, 3, 2]}
  g4 = matmul(bt, w2)
  rt = transpose(r)
  s = add(rt, x)
  g5 = matmul(rt, xt)
  ot = transpose(d)
  g6 = matmul(ot, d)
  pt = transpose(p) {perm = [1, 0, 2]}
  g7 = matmul(d, pt)
  output g1
  output g2
  output g3
  output g4
  output s
  output g5
  output ot
  output g6
  output g7
}";

#[test]
fn transposes_before_library_matmuls_become_strides_and_run_as_the_interpreter() {
    let g = text::parse(GRAPH).unwrap();
    let info = verify::verify(&g).unwrap();
    let mut all = HashMap::new();
    for (k, i) in g.inputs.iter().enumerate() {
        let data = meshc_runtime::kernels::matmul_shape::testing::random(40 + k as u64, i.ty.numel());
        all.insert(i.name.clone(), Tensor::f32(i.ty.shape.clone(), data));
    }
    let want = interp::run(&g, &info.order, &info.types, all.clone()).unwrap();
    for gemm in [Gemm::Library, Gemm::Auto] {
        let opts = Options { gemm, ..Options::default() };
        let c = driver::Job::new(&g, &info, &HashMap::new(), &opts).build(&Dumps::default()).unwrap();
        let p = &c.programs[0];
        let nodes: Vec<&str> = p.steps.iter().map(|s| s.node.as_str()).collect();
        if matches!(gemm, Gemm::Library) {
            for gone in ["xt", "wt", "bt"] {
                assert!(!nodes.contains(&gone), "{gone} should be read through strides: {nodes:?}");
            }
            for kept in ["rt", "ot", "pt"] {
                assert!(nodes.contains(&kept), "{kept} should stay a copy: {nodes:?}");
            }
            let flags: HashMap<&str, Transposed> = p
                .steps
                .iter()
                .filter_map(|s| match &s.exec {
                    Exec::Library(Library::Matmul(Matmul { transposed, .. })) => Some((s.node.as_str(), *transposed)),
                    _ => None,
                })
                .collect();
            let t = |a, b| Transposed { a, b };
            let expect = [
                ("g1", t(true, false)),
                ("g3", t(true, false)),
                ("g2", t(false, true)),
                ("g4", t(true, false)),
                ("g5", t(false, true)),
                ("g6", t(false, false)),
                ("g7", t(false, false)),
            ];
            for (node, want) in expect {
                assert_eq!(flags.get(node), Some(&want), "{node}");
            }
        }
        let got = c.load().unwrap().run(&all).unwrap();
        for o in &g.outputs {
            crate::common::assert_close(&format!("{gemm:?}: {}", o.name), &got[&o.name], &want[&o.name]).unwrap();
        }
    }
}
