//! capi/include/meshc.h is what cbindgen makes of capi/src/lib.rs now: a change to the C ABI
//! that is not in the checked-in header fails here (MESHC_BLESS=1 rewrites the header).

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut out = Vec::new();
    cbindgen::Builder::new().with_crate(dir).with_config(config).generate().unwrap().write(&mut out);
    let header = dir.join("include/meshc.h");
    if std::env::var_os("MESHC_BLESS").is_some() {
        std::fs::write(&header, &out).unwrap();
        return;
    }
    let have = std::fs::read(&header).unwrap_or_default();
    assert!(have == out, "{} is stale: run MESHC_BLESS=1 cargo test -p meshc-capi --test header", header.display());
}
