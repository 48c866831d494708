//! Artifacts with intact checksums that the runner must still refuse, with a clear one-line
//! error before anything runs: code needing a CPU feature this machine lacks (never
//! SIGILL), and programs whose numbers point outside what they describe (never a panic).

use crate::common::{golden, meshc, scratch};
use meshc_runtime::format::program::Exec;
use std::path::Path;

fn compiled_mlp() -> meshc::compile::Compiled {
    let path = Path::new("testdata/mlp/graph.json");
    let (g, info) = meshc_ir::load::load(path).unwrap();
    let params = meshc_ir::params::load_all(&g, path.parent().unwrap()).unwrap();
    // Without epilogues its relu stays a generated kernel, which a breaker below breaks.
    let opts = meshc::compile::Options { emit: meshc::compile::Emit::Artifact, epilogues: false, ..Default::default() };
    meshc::compile::compile(&g, &info, &params, &opts).unwrap()
}

#[test]
fn missing_cpu_feature_is_refused() {
    let mut c = compiled_mlp();
    // No CPU has this feature; a real mismatch (e.g. avx2 code on an SSE-only machine) takes
    // the same path.
    c.meta.features.push("avx10.9".into());
    let dir = scratch("features");
    let art = dir.join("future.mshc");
    meshc::artifact::write_artifact(&c, &art, None).unwrap();
    let r = meshc(&["run", art.to_str().unwrap(), "--input", "x=testdata/mlp/inputs/x.npy"]);
    assert_eq!(r.status, Some(1), "{r:?}");
    let msg = r.stderr.replace(&art.display().to_string(), "future.mshc");
    golden("cli/run-cpu-features.txt", &msg).unwrap();
}

#[test]
fn out_of_range_numbers_in_a_program_are_refused() {
    let dir = scratch("bad-program");
    type Breaker = fn(&mut meshc::compile::Compiled);
    let breakers: [(&str, Breaker); 5] = [
        ("buffer number", |c| c.programs[0].steps[0].buffers[0] = 999),
        // A library call's result that is also its operand (copies that overlap).
        ("result operand", |c| {
            let st =
                c.programs[0].steps.iter_mut().find(|s| matches!(s.exec, Exec::Library(_))).expect("a library step");
            st.buffers[0] = st.buffers[1];
        }),
        ("output list", |c| c.programs[0].outputs.clear()),
        ("kernel offset", |c| c.programs[0].kernels[0].offset = usize::MAX),
        ("buffer size", |c| {
            let b = c.programs[0].inputs[0];
            c.programs[0].buffers[b].bytes = 3;
        }),
    ];
    for (what, breaker) in breakers {
        let mut c = compiled_mlp();
        breaker(&mut c);
        let art = dir.join("bad.mshc");
        meshc::artifact::write_artifact(&c, &art, None).unwrap();
        let r = meshc(&["run", art.to_str().unwrap(), "--input", "x=testdata/mlp/inputs/x.npy"]);
        assert_eq!(r.status, Some(1), "{what}: {r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{what}: {r:?}");
    }
}

/// A kernel over symbolic rows reads an operand that repeats over them at row `(r / stride)
/// mod period`, both size-table entries: a program naming an entry past the table, or one
/// that may exceed the rows, is refused at load, and one that is 0 at a call that runs rows
/// stops that call, never dividing by zero.
#[test]
fn repeats_a_kernel_divides_by_are_checked() {
    use meshc_ir::sym::{Expr, Symbol, Symbols};
    use meshc_ir::Tensor;
    use meshc_runtime::format::symbolic::Scaling;
    let dir = scratch("bad-repeats");
    let graph = dir.join("g.txt");
    let src = "graph g {
  input x: f32[3,4,6,6] dims(batch, _, seq, seq)
  input c: f32[6,1] dims(seq, _)
  w = add(x, c)
  output w
}";
    std::fs::write(&graph, src).unwrap();
    // Written at the upper bounds, as `meshc compile --dim` writes a graph before compiling.
    let (g, info) = meshc_ir::load::load(&graph).unwrap();
    let symbol = |name: &str, hi| (name.to_string(), Symbol { name: name.into(), lo: 1, hi, multiple_of: 1 });
    let symbols: Symbols = [symbol("batch", 3), symbol("seq", 6)].into();
    let opts = meshc::compile::Options { emit: meshc::compile::Emit::Artifact, symbols, ..Default::default() };
    let params = std::collections::HashMap::<String, Tensor>::new();
    let compile = || meshc::compile::compile(&g, &info, &params, &opts).unwrap();
    let (x, c) = (dir.join("x.npy"), dir.join("c.npy"));
    Tensor::f32(vec![1, 4, 1, 1], vec![1.0; 4]).write_npy(&x).unwrap();
    Tensor::f32(vec![1, 1], vec![2.0]).write_npy(&c).unwrap();
    let run = |c_: &meshc::compile::Compiled, name: &str| {
        let art = dir.join(format!("{name}.mshc"));
        meshc::artifact::write_artifact(c_, &art, None).unwrap();
        let args = ["run", art.to_str().unwrap(), "--input", &format!("x={}", x.display())];
        meshc(&[&args[..], &["--input", &format!("c={}", c.display())]].concat())
    };
    let r = run(&compile(), "good");
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    // Makes the repeating operand's period the table entry `e` (in place of the one it
    // reads, which the table has room for), or an entry past the table.
    let period_at = |c_: &mut meshc::compile::Compiled, e: Option<Expr>| {
        let st = c_.programs[0].steps.iter_mut().find(|s| matches!(&s.scaling, Some(Scaling::Rows { .. })));
        let Some(Scaling::Rows { repeats, .. }) = &mut st.expect("a scaled kernel").scaling else { unreachable!() };
        let r = repeats.iter_mut().flatten().next().expect("a repeating operand");
        assert!(r.stride.is_some(), "the column repeats every seq rows");
        let sizes = &mut c_.meta.symbolic.as_mut().unwrap().sizes;
        match e {
            Some(e) => sizes[r.period] = e,
            None => r.period = sizes.len() + 10,
        }
    };
    let seq = || Expr::sym("seq");
    let cases: [(&str, Option<Expr>, &str); 3] = [
        ("past-table", None, "of a table of"),
        ("above-rows", Some(seq().mul(&Expr::constant(1000))), "may exceed"),
        ("zero", Some(seq().sub(&Expr::constant(1))), "malformed"),
    ];
    for (name, e, says) in cases {
        let mut c_ = compile();
        period_at(&mut c_, e);
        let r = run(&c_, name);
        assert_eq!(r.status, Some(1), "{name}: {r:?}");
        assert_eq!(r.stderr.lines().count(), 1, "{name}: {r:?}");
        assert!(r.stderr.contains(says), "{name}: {}", r.stderr);
    }
}
