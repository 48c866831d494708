//! Signed artifacts through the real binary: `keygen`, `compile --sign`, `inspect` naming
//! the signer, and `run --require-signature` refusing unsigned, foreign-signed and
//! modified artifacts (checksums recomputed, so only the signature can tell) before any
//! code runs.

use crate::common::{meshc, scratch};
use meshc_runtime::format::artifact::{Artifact, SectionKind, Writer};

const MLP: &str = "testdata/mlp/graph.json";
const MLP_X: &str = "x=testdata/mlp/inputs/x.npy";
const GELU: &str = "testdata/gelu_mlp/graph.json";
const GELU_X: &str = "x=testdata/gelu_mlp/inputs/x.npy";

#[test]
fn signed_artifacts_run_only_with_their_key() {
    let dir = scratch("signing");
    let p = |name: &str| dir.join(name).display().to_string();
    for key in ["k", "other"] {
        let run = meshc(&["keygen", "-o", &p(key)]);
        assert_eq!(run.status, Some(0), "{run:?}");
    }
    let again = meshc(&["keygen", "-o", &p("k")]);
    assert_eq!(again.status, Some(1), "an existing key is never replaced: {again:?}");

    for (art, extra) in [("signed.mshc", vec!["--sign", "k"]), ("plain.mshc", vec![])] {
        let mut args = vec!["compile", MLP, "-o"];
        let out = p(art);
        args.push(&out);
        let key = p("k");
        args.extend(extra.iter().map(|a| if *a == "k" { key.as_str() } else { a }));
        let run = meshc(&args);
        assert_eq!(run.status, Some(0), "{run:?}");
    }
    // Ed25519 signatures are deterministic: the same inputs and key give the same bytes.
    let again = meshc(&["compile", MLP, "-o", &p("again.mshc"), "--sign", &p("k")]);
    assert_eq!(again.status, Some(0), "{again:?}");
    assert_eq!(std::fs::read(p("signed.mshc")).unwrap(), std::fs::read(p("again.mshc")).unwrap());

    let public = std::fs::read_to_string(p("k.pub")).unwrap();
    let hex = public.split_whitespace().nth(1).unwrap().to_string();
    let inspect = meshc(&["inspect", &p("signed.mshc")]);
    assert!(inspect.stdout.contains(&format!("signed by ed25519 key {hex} (valid)")), "{inspect:?}");

    let run = |art: &str, key: &str| meshc(&["run", &p(art), "--input", MLP_X, "--require-signature", &p(key)]);
    let ok = run("signed.mshc", "k.pub");
    assert_eq!(ok.status, Some(0), "{ok:?}");
    let refused = |r: crate::common::Run, want: &str| {
        assert_eq!(r.status, Some(1), "{r:?}");
        assert!(r.stderr.contains(want) && r.stdout.is_empty(), "want {want:?}: {r:?}");
    };
    refused(run("plain.mshc", "k.pub"), "not signed (--require-signature)");
    refused(run("signed.mshc", "other.pub"), &format!("signed by {hex}, not by the required key"));
    refused(run("signed.mshc", "k"), "not a key file");

    // The same sections with one weight byte changed and the old signature: the container's
    // checksums are all recomputed, so the artifact opens; only the signature catches it.
    let art = Artifact::open(std::path::Path::new(&p("signed.mshc"))).unwrap();
    let mut weights = art.section(SectionKind::Weights).unwrap().to_vec();
    weights[0] ^= 1;
    let mut w = Writer::new();
    for kind in [SectionKind::Meta, SectionKind::Program, SectionKind::Code, SectionKind::Signature] {
        let align = art.sections().iter().find(|s| s.kind == kind).unwrap().align as usize;
        w.add_section(kind, align, art.section(kind).unwrap()).unwrap();
    }
    w.add_section(SectionKind::Weights, 64, weights).unwrap();
    std::fs::write(p("tampered.mshc"), w.to_bytes().unwrap()).unwrap();
    refused(run("tampered.mshc", "k.pub"), "the signature does not match its contents");
    let inspect = meshc(&["inspect", &p("tampered.mshc")]);
    assert!(inspect.stdout.contains("(DOES NOT MATCH the contents)"), "{inspect:?}");

    let graph = meshc(&["run", MLP, "--input", MLP_X, "--require-signature", &p("k.pub")]);
    refused(graph, "only artifacts are signed");
}

/// The code that runs is the code the signature vouched for: an in-place write of `int3`
/// over the whole code section of the file a signed run has open (`dd conv=notrunc`,
/// `rsync --inplace`) never reaches the code it runs, which was read and checked when the
/// file was opened and runs from memory of its own.
#[test]
fn code_written_over_a_running_artifact_never_runs() {
    use std::io::{Seek, Write};
    let dir = scratch("signing-in-place");
    let p = |name: &str| dir.join(name).display().to_string();
    assert_eq!(meshc(&["keygen", "-o", &p("k")]).status, Some(0));
    // gelu_mlp has generated kernels (mlp has none: its matmuls are library calls).
    let run = meshc(&["compile", GELU, "-o", &p("a.mshc"), "--sign", &p("k")]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let code = Artifact::open(std::path::Path::new(&p("a.mshc"))).unwrap();
    let code = code.sections().iter().find(|s| s.kind == SectionKind::Code).unwrap().clone();
    assert!(code.size > 0);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(["run", &p("a.mshc"), "--input", GELU_X, "--require-signature", &p("k.pub"), "--bench", "100000000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Well into its runs (a load takes milliseconds), the code section becomes traps.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "the run ended before the write");
    let mut f = std::fs::OpenOptions::new().write(true).open(p("a.mshc")).unwrap();
    f.seek(std::io::SeekFrom::Start(code.offset)).unwrap();
    f.write_all(&vec![0xcc; code.size as usize]).unwrap();
    f.sync_all().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let ended = child.try_wait().unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(ended.is_none(), "the run ended after the write: {ended:?} {}", String::from_utf8_lossy(&out.stderr));
    // The file now fails its checksum: a new run refuses it.
    let again = meshc(&["run", &p("a.mshc"), "--input", GELU_X, "--require-signature", &p("k.pub")]);
    assert_eq!(again.status, Some(1), "{again:?}");
}
