//! The reference interpreter against numpy: every testdata graph, run through the real
//! binary (`meshc interp`), must reproduce the expected outputs tools/gen_testdata.py
//! computed in float64, within the tolerance of testdata/README.md.

use crate::common::{compare_expected, input_args, meshc, scratch, testdata_graphs};

#[test]
fn interp_matches_numpy_on_every_testdata_graph() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for g in testdata_graphs() {
        let name = g.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        let out = scratch(&format!("interp-{name}"));
        let mut args = vec!["interp".to_string(), g.display().to_string()];
        args.extend(input_args(&g));
        args.extend(["--output-dir".to_string(), out.display().to_string()]);
        let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        if run.status != Some(0) {
            failures.push(format!("{name}: {run:?}"));
            continue;
        }
        match compare_expected(&g, &out) {
            Ok(0) => failures.push(format!("{name}: no expected outputs")),
            Ok(n) => checked += n,
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked >= 5, "only {checked} outputs compared");
}
