//! An artifact whose code needs a CPU feature this machine lacks is refused with a clear
//! one-line error before anything runs (never SIGILL).

mod common;

use common::{golden, meshc, scratch};
use std::path::Path;

#[test]
fn missing_cpu_feature_is_refused() {
    let path = Path::new("testdata/mlp/graph.json");
    let (g, info) = meshc_ir::load::load(path).unwrap();
    let params = meshc_ir::params::load_all(&g, path.parent().unwrap()).unwrap();
    let mut c = meshc::compile::compile(&g, &info, &params, &meshc::compile::Options::default()).unwrap();
    // No CPU has this feature; a real mismatch (e.g. avx2 code on an SSE-only machine) takes
    // the same path.
    c.meta.features.push("avx10.9".into());
    let dir = scratch("features");
    let art = dir.join("future.mshc");
    meshc::driver::write_artifact(&c, &art).unwrap();
    let r = meshc(&["run", art.to_str().unwrap(), "--input", "x=testdata/mlp/inputs/x.npy"]);
    assert_eq!(r.status, Some(1), "{r:?}");
    let msg = r.stderr.replace(&art.display().to_string(), "future.mshc");
    golden("cli/run-cpu-features.txt", &msg).unwrap();
}
