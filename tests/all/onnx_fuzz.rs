//! Mutation fuzzing of ONNX files: each model of testdata/onnx, decoded, changed in one
//! place a hostile or broken exporter could change (a node's op, inputs, attributes or
//! order, an initializer's dims, type or data, an input's type or dims, the opset), or its
//! bytes flipped or cut, is given to `meshc run` as a `.onnx`: it must run to the end or be
//! refused with one line and exit 1 — never a panic, an abort or a hang.
//! `MESHC_FUZZ_CASES=N` (`make fuzz`) scales the number of cases with the graph fuzzer's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshc_onnx::proto::{attribute_proto, tensor_shape_proto::dimension, type_proto, Message, ModelProto};
use proptest::prelude::*;

use crate::common::{dim_args, input_args, scratch};

fn models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("testdata/onnx")
        .unwrap()
        .map(|e| e.unwrap().path().join("model.onnx"))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Values that break assumptions: zero, one, negative, huge, the extremes.
const INTS: [i64; 8] = [0, 1, -1, 2, 7, 1 << 40, i64::MAX, i64::MIN];
/// Op types meshc maps, ones it refuses and ones no opset has.
const OPS: [&str; 12] =
    ["Add", "MatMul", "Reshape", "Gather", "Softmax", "Transpose", "Concat", "Slice", "Conv", "Loop", "NoSuchOp", ""];

/// Changes `m` in the place `pick` selects, as `how` says; false when there is no such place.
fn mutate(m: &mut ModelProto, what: u8, pick: usize, how: usize) -> bool {
    let int = INTS[how % INTS.len()];
    let g = m.graph.as_mut().expect("a graph");
    let n_nodes = g.node.len();
    match what % 10 {
        0 => g.node.get_mut(pick % n_nodes.max(1)).map(|n| n.op_type = Some(OPS[how % OPS.len()].into())).is_some(),
        1 => {
            let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).collect();
            let Some(n) = g.node.get_mut(pick % n_nodes.max(1)) else { return false };
            match how % 3 {
                0 if !n.input.is_empty() => drop(n.input.remove(how / 3 % n.input.len())),
                1 => n.input.push(names.get(how / 3 % names.len().max(1)).cloned().unwrap_or_default()),
                _ => n.input.push("nowhere".into()),
            }
            true
        }
        2 => {
            let Some(a) = g.node.iter_mut().flat_map(|n| n.attribute.iter_mut()).nth(pick % 64) else { return false };
            match (&mut a.ints[..], how % 3) {
                (ints, 0) if !ints.is_empty() => ints[how / 3 % ints.len()] = int,
                (_, 1) => a.ints.push(int),
                _ => {
                    a.i = Some(int);
                    a.r#type = Some(attribute_proto::AttributeType::Int as i32);
                }
            }
            true
        }
        3 if n_nodes > 1 => {
            g.node.swap(pick % n_nodes, how % n_nodes);
            pick % n_nodes != how % n_nodes
        }
        4 => {
            let k = pick % g.initializer.len().max(1);
            let Some(t) = g.initializer.get_mut(k) else { return false };
            match how % 4 {
                0 if !t.dims.is_empty() => {
                    let d = how / 4 % t.dims.len();
                    t.dims[d] = int
                }
                1 => t.dims.push(int.rem_euclid(4)),
                2 => t.data_type = Some((how / 4 % 26) as i32),
                _ => {
                    let raw = t.raw_data.get_or_insert_with(Vec::new);
                    raw.truncate(raw.len().saturating_sub(1 + how / 4 % 8));
                }
            }
            true
        }
        5 => {
            let k = pick % g.input.len().max(1);
            let Some(i) = g.input.get_mut(k) else { return false };
            let Some(type_proto::Value::TensorType(t)) = i.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
                return false;
            };
            match (t.shape.as_mut(), how % 3) {
                (Some(s), 0) if !s.dim.is_empty() => {
                    let k = how / 3 % s.dim.len();
                    s.dim[k].value = Some(dimension::Value::DimValue(int));
                }
                (Some(s), 1) => s.dim.clear(),
                _ => t.elem_type = Some((how / 3 % 26) as i32),
            }
            true
        }
        6 => {
            let Some(n) = g.node.get_mut(pick % n_nodes.max(1)) else { return false };
            n.output.iter_mut().for_each(|o| o.push_str(".renamed"));
            true
        }
        7 => {
            m.opset_import.iter_mut().for_each(|o| o.version = Some(int.rem_euclid(32)));
            true
        }
        8 => {
            let k = pick % g.output.len().max(1);
            let Some(o) = g.output.get_mut(k) else { return false };
            o.name = Some(["", "nowhere", "hidden_states"][how % 3].into());
            true
        }
        _ => {
            // A Constant node whose value is a dims-less or mismatched tensor.
            let Some(a) = g.node.iter_mut().flat_map(|n| n.attribute.iter_mut()).find(|a| a.t.is_some()) else {
                return false;
            };
            let t = a.t.as_mut().expect("a tensor");
            t.dims.push(int.rem_euclid(5));
            true
        }
    }
}

/// `meshc run` of `model` with the inputs of `original`, killed past a deadline: Ok when it
/// ran or refused in one line with exit 1, else what went wrong. Under a 256 MiB budget, as
/// the file fuzzers run: a flipped bit that pads a dim by 2^27 makes a valid model whose
/// 3.7 GB output the default budget (half the free memory) allows, and writing it takes
/// longer than the deadline on a loaded machine.
fn run(model: &Path, original: &Path, out: &Path) -> Result<(), String> {
    let mut args: Vec<String> =
        ["run", &model.display().to_string(), "--timeout", "5", "--max-memory", "256M"].map(String::from).into();
    args.extend(dim_args(original));
    args.extend(input_args(original));
    args.extend(["--output-dir".into(), out.display().to_string()]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            return Err("no answer in 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1) if stderr.lines().count() == 1 && !stderr.contains("panicked") => Ok(()),
        code => Err(format!("exit {code:?}: {stderr}")),
    }
}

fn cases() -> u32 {
    std::env::var("MESHC_FUZZ_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(64, |n| n / 10 + 1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_onnx_models_run_or_are_refused_in_one_line(
        base in 0usize..16, what in any::<u8>(), pick in any::<u16>(), how in any::<u16>(), bytes in any::<bool>()
    ) {
        let models = models();
        let original = &models[base % models.len()];
        let encoded = std::fs::read(original).unwrap();
        let mutated = if bytes {
            // Flip a byte, or cut the file short.
            let mut b = encoded.clone();
            let at = pick as usize % b.len();
            if how % 2 == 0 { b[at] ^= 1 << (how / 2 % 8) } else { b.truncate(at) }
            b
        } else {
            let mut m = ModelProto::decode(&encoded[..]).unwrap();
            prop_assume!(mutate(&mut m, what, pick as usize, how as usize));
            m.encode_to_vec()
        };
        let dir = scratch(&format!("onnx-mutate-{base}-{what}-{pick}-{how}-{bytes}"));
        let model = dir.join("model.onnx");
        std::fs::write(&model, &mutated).unwrap();
        if let Err(e) = run(&model, original, &dir.join("out")) {
            prop_assert!(false, "{} mutated ({}what {what}, pick {pick}, how {how}): {e}",
                original.display(), if bytes { "bytes, " } else { "" });
        }
    }
}
