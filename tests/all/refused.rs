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
