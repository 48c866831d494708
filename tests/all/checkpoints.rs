//! Checkpoints as users bring them: a sharded Hugging Face checkpoint (an index whose
//! `weight_map` names the shard of each tensor) compiles to the same artifact, byte for
//! byte, as the single file it was split from.

use std::path::Path;

use crate::common::{meshc, scratch};

/// A `.safetensors` file of `tensors` (name, dtype, shape, little-endian bytes), written the
/// way the format lays it out: u64 header length, JSON header, data.
fn safetensors(tensors: &[(String, serde_json::Value, &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, info, bytes) in tensors {
        let mut info = info.clone();
        info["data_offsets"] = serde_json::json!([data.len(), data.len() + bytes.len()]);
        header.insert(name.clone(), info);
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

#[test]
fn a_sharded_checkpoint_gives_the_artifact_of_the_single_file() {
    let src = Path::new("testdata/transformer");
    let dir = scratch("sharded");
    std::fs::create_dir(dir.join("weights")).unwrap();
    for f in std::fs::read_dir(src.join("weights")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join("weights").join(f.file_name().unwrap())).unwrap();
    }
    // Split the single file's tensors over three shards, in turn.
    let file = std::fs::read(src.join("weights/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let mut shards: Vec<Vec<(String, serde_json::Value, &[u8])>> = vec![Vec::new(); 3];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, info)) in header.iter().filter(|(k, _)| *k != "__metadata__").enumerate() {
        let off = &info["data_offsets"];
        let bytes = &file[8 + n + off[0].as_u64().unwrap() as usize..8 + n + off[1].as_u64().unwrap() as usize];
        let info = serde_json::json!({"dtype": info["dtype"], "shape": info["shape"]});
        shards[i % 3].push((name.clone(), info, bytes));
        weight_map.insert(name.clone(), format!("model-{:05}-of-00003.safetensors", i % 3 + 1).into());
    }
    assert!(shards.iter().all(|s| !s.is_empty()), "the testdata checkpoint has at least three tensors");
    for (i, s) in shards.iter().enumerate() {
        std::fs::write(dir.join(format!("weights/model-{:05}-of-00003.safetensors", i + 1)), safetensors(s)).unwrap();
    }
    let index = serde_json::json!({"metadata": {"total_size": file.len() - 8 - n}, "weight_map": weight_map});
    std::fs::write(dir.join("weights/model.safetensors.index.json"), index.to_string()).unwrap();
    let graph = std::fs::read_to_string(src.join("graph.json")).unwrap();
    std::fs::write(dir.join("single.json"), &graph).unwrap();
    let sharded = graph.replace("weights/model.safetensors\"", "weights/model.safetensors.index.json\"");
    assert_ne!(sharded, graph);
    std::fs::write(dir.join("sharded.json"), sharded).unwrap();

    for layout in [None, Some("testdata/transformer/layouts/mp-2x4.json")] {
        let mut artifacts = Vec::new();
        for g in ["single", "sharded"] {
            let (graph, out) = (dir.join(format!("{g}.json")), dir.join(format!("{g}.mshc")));
            let mut args = vec!["compile", graph.to_str().unwrap(), "-o", out.to_str().unwrap()];
            args.extend(layout.iter().flat_map(|l| ["--layout", l]));
            let run = meshc(&args);
            assert_eq!(run.status, Some(0), "{g} {layout:?}: {}", run.stderr);
            artifacts.push(std::fs::read(&out).unwrap());
        }
        assert!(artifacts[0] == artifacts[1], "{layout:?}: the sharded checkpoint gave another artifact");
    }
    // The depfile names the index and every shard it read.
    let (graph, out) = (dir.join("sharded.json"), dir.join("sharded.mshc"));
    let dep = dir.join("sharded.d");
    let run = meshc(&["compile", graph.to_str().unwrap(), "-o", out.to_str().unwrap(), "-MF", dep.to_str().unwrap()]);
    assert_eq!(run.status, Some(0), "{}", run.stderr);
    let deps = std::fs::read_to_string(&dep).unwrap();
    for f in ["model.safetensors.index.json", "model-00001-of-00003", "model-00002-of-00003", "model-00003-of-00003"] {
        assert!(deps.contains(f), "{f} not in the depfile:\n{deps}");
    }
}
