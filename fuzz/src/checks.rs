//! What each fuzz target (fuzz_targets/) checks of one input: that meshc's reader of that
//! kind of file returns a value or an error of one line, and never panics, aborts or hangs
//! (libFuzzer reports those itself; `make fuzz-files` bounds the time per input). A panic
//! here is the finding. The inputs libFuzzer found are kept under testdata/fuzz-regressions/
//! TARGET/, and `make test` replays them through these same functions (tests/all/
//! fuzz_files.rs includes this file).

use std::collections::BTreeMap;
use std::path::PathBuf;

use meshc_ir::error::{escape_controls, shorten_quoted};
use meshc_ir::{verify, Tensor};

/// The check of one input.
pub type Check = fn(&[u8]);

/// Every target by name (the directories of testdata/fuzz-regressions/).
pub const TARGETS: [(&str, Check); 7] = [
    ("onnx_import", onnx_import),
    ("safetensors", safetensors),
    ("checkpoint_index", checkpoint_index),
    ("npy", npy),
    ("text_graph", text_graph),
    ("json_graph", json_graph),
    ("artifact", artifact),
];

/// The longest error line accepted, in characters: quoted names are cut at 80 characters and
/// whole messages at 900, so a longer line escaped the cut.
const MAX_ERROR: usize = 1024;

/// Panics unless `msg`, an error about the file `input`, is one line where meshc prints
/// it. Quoted parts (in single quotes, or double quotes for JSON keys) are names from the
/// file, which may hold anything: the command line escapes their control characters
/// (`escape_controls`), and they must be short. Outside quotes the text is meshc's own and
/// must have no line break at all. A file holding a single quote can name things with
/// quotes of their own, which pair the message's quotes wrongly: where a line break lies
/// cannot be told then, and only the length is checked (the printed line is one line all
/// the same, every control character escaped).
fn one_line(what: &str, msg: &str, input: &[u8]) {
    if !input.contains(&b'\'') {
        let ours: String = msg.split('\'').step_by(2).flat_map(|p| p.split('"').step_by(2)).collect();
        assert!(!ours.contains(['\n', '\r']), "{what}: an error of more than one line: {msg:?}");
    }
    let printed = shorten_quoted(&escape_controls(msg, false));
    let chars = printed.chars().count();
    assert!(
        chars <= MAX_ERROR,
        "{what}: an error of {chars} characters: {:?}",
        printed.chars().take(200).collect::<String>()
    );
}

/// A directory of this process (and target) under the temporary directory, made once and
/// emptied of the files a target writes before each input.
fn scratch(target: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meshc-fuzz-{}-{target}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Removes the scratch directories of this process (the fuzz targets leave theirs: libFuzzer
/// ends the process with `exit`).
pub fn remove_scratch() {
    for (target, _) in TARGETS {
        let _ = std::fs::remove_dir_all(scratch(target));
    }
}

/// `data` as `name` in the target's scratch directory.
fn write(target: &str, name: &str, data: &[u8]) -> PathBuf {
    let path = scratch(target).join(name);
    std::fs::write(&path, data).expect("writing the input");
    path
}

/// An ONNX model's bytes imported (decoded, converted, verified), external data read from
/// an empty directory.
pub fn onnx_import(data: &[u8]) {
    let dir = scratch("onnx_import");
    if let Err(e) =
        meshc_onnx::import_bytes(data, "fuzz.onnx", &dir, &BTreeMap::new(), &BTreeMap::new(), &BTreeMap::new(), false)
    {
        one_line("onnx_import", &e.to_string(), data);
    }
}

/// Up to 8 tensor names a safetensors header or checkpoint index lists under `field` (the
/// whole object when `None`), and one it does not.
fn keys(json: &[u8], field: Option<&str>) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    let obj = field.map_or(Some(&v), |f| v.get(f)).and_then(|o| o.as_object());
    let mut keys: Vec<String> = obj.into_iter().flat_map(|o| o.keys()).take(8).cloned().collect();
    keys.push("no such tensor".into());
    keys
}

/// Every tensor of `file` (in the target's scratch directory) that `keys` name, through
/// the reader compile uses (`WeightFiles`): a view whose bytes read back in full, or an
/// error of one line.
fn read_weights(target: &str, file: &str, keys: &[String], input: &[u8]) {
    let mut files = meshc_ir::weights::WeightFiles::new(&scratch(target));
    for k in keys {
        let read = files.view(file, Some(k)).and_then(|v| Ok((v.ty.size_bytes(), v.bytes()?)));
        match read {
            Ok((size, bytes)) => assert_eq!(bytes.len(), size, "{target}: tensor '{k}' read short"),
            Err(e) => one_line(target, &e.to_string(), input),
        }
    }
}

/// A `.safetensors` file's bytes: the header parsed, each tensor it names read.
pub fn safetensors(data: &[u8]) {
    write("safetensors", "w.safetensors", data);
    let header = data.get(..8).map_or(0, |n| u64::from_le_bytes(n.try_into().expect("8 bytes")));
    let json = usize::try_from(header).ok().and_then(|h| data.get(8..8usize.checked_add(h)?)).unwrap_or_default();
    read_weights("safetensors", "w.safetensors", &keys(json, None), data);
}

/// A checkpoint index's bytes (`m.index.json`, beside a valid shard `a.safetensors` holding
/// `x` and `y`): each tensor its weight map names read through the shard it names.
pub fn checkpoint_index(data: &[u8]) {
    const SHARD: &[u8] = b"\x40\x00\x00\x00\x00\x00\x00\x00\
        {\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"y\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[4,8]}}\
        \x00\x00\x80\x3f\x07\x00\x00\x00";
    write("checkpoint_index", "a.safetensors", SHARD);
    write("checkpoint_index", "m.index.json", data);
    read_weights("checkpoint_index", "m.index.json", &keys(data, Some("weight_map")), data);
}

/// A `.npy` file's bytes through each of meshc's readers: `--input`'s and `--const`'s
/// (`Tensor::read_npy`, from the file), the one of bytes in memory (`from_npy_bytes`: the
/// C ABI, standard input), and compile's for a param (`WeightFiles`, header first). The
/// first two must agree exactly; compile's, which reads the data later, must give the same
/// type and bytes wherever they accept the file.
pub fn npy(data: &[u8]) {
    let path = write("npy", "x.npy", data);
    let from_file = Tensor::read_npy(&path);
    let from_bytes = Tensor::from_npy_bytes(data);
    let mut files = meshc_ir::weights::WeightFiles::new(&scratch("npy"));
    let param = files.view("x.npy", None).and_then(|v| Ok((v.ty.clone(), v.bytes()?)));
    for e in [from_file.as_ref().err(), from_bytes.as_ref().err(), param.as_ref().err()].into_iter().flatten() {
        one_line("npy", &e.to_string(), data);
    }
    match (&from_file, &from_bytes) {
        (Ok(a), Ok(b)) => assert_eq!(a.to_le_bytes(), b.to_le_bytes(), "npy: the file and bytes readers differ"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("npy: one reader accepts what the other refuses: file {:?}, bytes {:?}", a.is_ok(), b.is_ok()),
    }
    if let Ok(t) = &from_file {
        let (ty, bytes) = param.expect("compile's reader accepts what --input's does");
        assert_eq!((ty, bytes), (t.ty(), t.to_le_bytes()), "npy: compile's reader differs from --input's");
    }
}

/// A graph's source parsed and, when it parses, verified: what `meshc check` does.
fn graph(what: &str, data: &[u8], parse: fn(&str) -> meshc_ir::Result<meshc_ir::Graph>) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Err(e) = parse(src).and_then(|g| verify::verify(&g)) {
        one_line(what, &e.to_string(), data);
    }
}

/// A graph in the text format.
pub fn text_graph(data: &[u8]) {
    graph("text_graph", data, meshc_ir::text::parse);
}

/// A graph in the JSON format (`meshc-graph/1`).
pub fn json_graph(data: &[u8]) {
    graph("json_graph", data, meshc_ir::json::parse);
}

/// An artifact's bytes opened as `meshc run` and the C ABI open one (every checksum, the
/// metadata, the programs checked against it, the code mapped): once as given, where the
/// checksums refuse nearly every change, and once with every checksum recomputed, so that
/// the checks behind them are what gets fuzzed. Nothing is run.
pub fn artifact(data: &[u8]) {
    let mut resealed = data.to_vec();
    reseal(&mut resealed);
    for bytes in [data, &resealed[..]] {
        match meshc_runtime::api::model::Model::from_bytes(bytes) {
            Ok(m) => drop(m.load()),
            Err(e) => one_line("artifact", &e.to_string(), bytes),
        }
    }
}

/// Recomputes the checksums of an artifact's sections (those inside the file), its section
/// table and its header (docs/artifact.md gives the layout).
fn reseal(b: &mut [u8]) {
    const HEADER: usize = 64;
    const ENTRY: usize = 32;
    if b.len() < HEADER {
        return;
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let count = (u32_at(b, 16) as usize).min((b.len() - HEADER) / ENTRY);
    for e in (0..count).map(|i| HEADER + ENTRY * i) {
        let (offset, size) = (u64_at(b, e + 8), u64_at(b, e + 16));
        let range =
            offset.checked_add(size).filter(|&end| end <= b.len() as u64).map(|end| offset as usize..end as usize);
        if let Some(r) = range {
            let crc = crc32fast::hash(&b[r]);
            b[e + 28..e + 32].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&b[HEADER..HEADER + ENTRY * count]);
    b[20..24].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
}
