//! Weights stored in the GEMM's panels (runtime/src/kernels/panels.rs): which constants compile
//! packs (f32 weights only short library matmuls read, as their right operand), the packed
//! bytes, and runs that reproduce the interpreter.

use std::collections::HashMap;

use meshc::compile::{Gemm, Options};
use meshc::driver;
use meshc::pipeline::Dumps;
use meshc_ir::{interp, text, verify, Tensor};
use meshc_runtime::format::program::{Exec, Library, Matmul, Storage};

/// `w1` and `w2` serve only matmuls (`w2`, whose last strip is partial, two of them); `w3` is
/// also added to an input, so it stays row-major; `w4` is an output; `w5` is too narrow
/// (8 columns would take 32 in panels). With 2 × 13 rows of `x` every product is short
/// (at most `panels::SMALL_M` rows), so `w1` and `w2` go in panels; with 2 × 100 rows
/// their products are long and they stay row-major for the gemm crate.
fn graph(rows: usize) -> String {
    format!(
        "graph panels {{
  input x: f32[2,{rows},40]
  input t: f32[40,64]
  input r: f32[40,40]
  param w1: f32[40,64] = init normal{{seed = 1, std = 0.5}}
  param w2: f32[64,290] = init normal{{seed = 2, std = 0.5}}
  param w3: f32[40,40] = init normal{{seed = 3, std = 0.5}}
  param w4: f32[40,40] = init normal{{seed = 4, std = 0.5}}
  param w5: f32[40,8] = init normal{{seed = 5, std = 0.5}}
  h = matmul(x, w1)
  y = matmul(h, w2)
  v = matmul(t, w2)
  z = matmul(x, w3)
  u = add(r, w3)
  output z
  q = matmul(x, w4)
  e = matmul(x, w5)
  output y
  output v
  output u
  output q
  output w4
  output e
}}"
    )
}

#[test]
fn library_matmul_weights_are_stored_in_panels_and_run_as_the_interpreter() {
    for rows in [13, 100] {
        let g = text::parse(&graph(rows)).unwrap();
        let info = verify::verify(&g).unwrap();
        let (all, params) = crate::common::seeded_values(&g, 5);
        let want = interp::run(&g, &info.order, &info.types, all.clone()).unwrap();
        for gemm in [Gemm::Library, Gemm::Auto] {
            let opts = Options { gemm, ..Options::default() };
            let c = driver::Job::new(&g, &info, &params, &opts).build(&Dumps::default()).unwrap();
            let p = &c.programs[0];
            let mut panelled: Vec<&str> = Vec::new();
            for st in &p.steps {
                let Exec::Library(Library::Matmul(Matmul { b, panels, .. })) = &st.exec else { continue };
                let weight = &p.buffers[st.buffers[2]];
                let Storage::Weights { offset } = weight.storage else { continue };
                let want_panels = rows == 13 && matches!(weight.name.as_str(), "w1" | "w2");
                assert_eq!(*panels, want_panels, "rows {rows}, {gemm:?}: node '{}' reads '{}'", st.node, weight.name);
                if *panels {
                    let row_major = params[&weight.name].to_le_bytes();
                    let packed = meshc_runtime::kernels::panels::pack_bytes(&row_major, 1, b[0], b[1]);
                    assert_eq!(&c.weights[offset..offset + weight.bytes], &packed[..], "'{}'", weight.name);
                    panelled.push(&weight.name);
                }
            }
            panelled.sort();
            panelled.dedup();
            let packed: &[&str] = if rows == 13 { &["w1", "w2"] } else { &[] };
            assert_eq!(panelled, packed, "rows {rows}, {gemm:?}");
            let inputs: HashMap<String, Tensor> =
                g.inputs.iter().map(|i| (i.name.clone(), all[&i.name].clone())).collect();
            let got = c.load().unwrap().run(&inputs).unwrap();
            for o in &g.outputs {
                let what = format!("rows {rows}, {gemm:?}: {}", o.name);
                crate::common::assert_close(&what, &got[&o.name], &want[&o.name]).unwrap();
            }
        }
    }
}
