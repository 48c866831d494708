//! `cargo bench --bench xla_bytes`: the bytes of communication of meshc's plans beside XLA's
//! (GSPMD's) for the same programs under the same shardings, in the cases of
//! tools/xla_cases.txt: the MLP and the transformer block of testdata on the 2×4 Megatron
//! layout (`mp-2x4`) and on a 4-way `model` axis (`mp-4`); and the block on 8-way model
//! parallel (`mp-8`) and on the 2×4 torus spec that splits `probs` and `h2` (`torus-2x4`),
//! where the two plans differ.
//!
//! meshc's bytes are counted here from its lowered programs. XLA's come from
//! tools/xla_collective_bytes.py, which compiles each case with `jax.jit` over 8 host
//! devices, checks JAX's outputs against testdata's expected/, and counts the collectives of
//! XLA's optimized HLO; it also counts meshc's from `--dump-after lower`, and that count must
//! equal this one (the two readings of one convention checked against each other). It runs
//! when a Python with jax is found — `MESHC_JAX_PYTHON`, else `target/jax-venv/bin/python`
//! (`python3 -m venv target/jax-venv && target/jax-venv/bin/pip install jax numpy`) — and
//! the bench prints "XLA: not measured" otherwise.
//!
//! Convention (the script's doc says it in full): the bytes each member of a group of n
//! devices sends by the standard algorithms, from the per-device result R — all_reduce
//! 2(n-1)/n·R, all_gather (n-1)/n·R, reduce_scatter (n-1)·R, all_to_all (n-1)/n·R, a send R —
//! summed over every member. It is not the fabric's count (`meshc explain`), which adds
//! the bytes forwarded over a mesh without wrap-around.
//!
//! Like with like: the script gives XLA the shardings `meshc check` says the spec fixes —
//! inputs and params by `in_shardings`, outputs by `out_shardings`, other tensors by
//! `with_sharding_constraint` — and leaves every other tensor, outputs included, to XLA's
//! propagation (`out_shardings` entry `None`: unspecified, not replicated — jax keeps a free
//! output sharded when its propagation says so), as meshc leaves them to its own. Neither
//! side counts the copy of the outputs to the host, which is no mesh link.
//!
//! One run (jax 0.10.2, XLA's CPU backend):
//!
//! ```text
//! graph        layout      meshc B      XLA B  meshc/XLA  meshc's collectives
//! mlp          mp-2x4        24576      24576       1.00  y 24576
//! mlp          mp-4          24576      24576       1.00  y 24576
//! transformer  mp-2x4        24576      24576       1.00  f2 12288, o 12288
//! transformer  mp-4          18432      24576       0.75  f2 6144, o 12288
//! transformer  mp-8          47104      61440       0.77  f2 14336, o 28672, scores 4096
//! transformer  torus-2x4      25344      30720       0.82  f2 12288, h2.all_gather 6144, h2.all_reduce 384, h2.all_reduce2 384, probs.all_gather 6144
//! ```
//!
//! On `mp-*` both run the Megatron plan: the partial sums of each row-split matmul (y of the
//! MLP; o and f2 of the block) are combined once. XLA all-reduces them all. meshc
//! reduce-scatters f2 of the block on `mp-4` and `mp-8` (half the bytes on a ring): only
//! elementwise ops (the bias and residual adds) lead from it to y, an output the spec leaves
//! free, so they run on blocks of seq and y is returned split (docs/layout.md). Where the
//! spec pins the output — mlp's `mp-4` gives y `[-, -]`, the `batch` rule of `mp-2x4` and
//! `torus-2x4` pins f2, f2_b and y — XLA is given the same sharding and both all-reduce
//! (`meshc explain` names the entries to drop). On `mp-8` both split the 32-wide qkv 8 ways
//! as 4 heads x 2 halves of head_dim (meshc's sub-axes `model:(1)4`, `model:(4)2`, kept
//! through the reshape to heads) and all-reduce the partial scores over pairs (4 KiB);
//! before meshc kept splits through reshapes it gathered q, k and v instead (100,352 B,
//! 1.63x). On `torus-2x4` XLA computes the last residual add in h2's split layout and
//! all-gathers y at the end; meshc all-gathers h2 once (ff1 needs it whole) and reduces only
//! layer_norm's statistics across the split.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use meshc::attribution;
use meshc_ir::verify::verify;
use meshc_ir::Op;

/// The cases of tools/xla_cases.txt (which the script reads too): (graph, layout).
fn cases() -> Vec<(String, String)> {
    let text = std::fs::read_to_string("tools/xla_cases.txt").unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (g, layout) = l.split_once(' ').unwrap();
            (g.to_string(), layout.trim().to_string())
        })
        .collect()
}

/// Bytes one member of an n-device group sends for one execution of `op`, whose result
/// on each device is `result` bytes.
fn bytes_sent(op: Op, n: u64, result: u64) -> u64 {
    match op {
        Op::AllReduce => 2 * (n - 1) * result / n,
        Op::AllGather | Op::AllToAll => (n - 1) * result / n,
        Op::ReduceScatter => (n - 1) * result,
        _ => result,
    }
}

/// meshc's bytes for `graph` under `layout`, by the convention, summed over every device's
/// program: {collective name: bytes}.
fn meshc_bytes(graph: &str, layout: &str) -> BTreeMap<String, u64> {
    let dir = Path::new("testdata").join(graph);
    let (g, info) = meshc_ir::load::load(&dir.join("graph.json")).unwrap();
    let spec = meshc::layout::load(&dir.join("layouts").join(format!("{layout}.json"))).unwrap();
    let (lowered, _) = meshc::driver::lower_spec(&g, &info, &spec).unwrap();
    let mut out = BTreeMap::new();
    for (d, dev) in lowered.devices.iter().enumerate() {
        let types = verify(dev).unwrap().types;
        for n in dev.nodes.iter().filter(|n| n.op.is_communication() && n.op != Op::Recv) {
            let (bytes, group) = if n.op == Op::Send {
                (types[&n.inputs[0]].size_bytes() as u64, 1)
            } else {
                let c = attribution::collective(n, &types[&n.inputs[0]]).unwrap();
                let group = c.groups.iter().find(|g| g.contains(&d)).unwrap().len() as u64;
                (types[&n.name].size_bytes() as u64, group)
            };
            *out.entry(n.name.clone()).or_default() += bytes_sent(n.op, group, bytes);
        }
    }
    out
}

/// A Python that imports jax, when there is one.
fn jax_python() -> Option<PathBuf> {
    let p = std::env::var_os("MESHC_JAX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/jax-venv/bin/python"));
    let ok = Command::new(&p).args(["-c", "import jax"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(p)
}

/// XLA's and the script's meshc bytes per case, by running the script.
fn xla_bytes(python: &Path, n: usize) -> Vec<(u64, u64)> {
    let json = std::env::temp_dir().join(format!("meshc-xla-bytes-{}.json", std::process::id()));
    let mut cmd = Command::new(python);
    cmd.arg("tools/xla_collective_bytes.py").args(["--meshc", env!("CARGO_BIN_EXE_meshc"), "--json"]).arg(&json);
    let out = cmd.output().unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "tools/xla_collective_bytes.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let v: Vec<(u64, u64)> = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["xla_bytes"].as_u64().unwrap(), c["meshc_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(v.len(), n, "the script compared {} cases, not those of tools/xla_cases.txt", v.len());
    v
}

fn main() {
    let cases = cases();
    let meshc: Vec<BTreeMap<String, u64>> = cases.iter().map(|(g, l)| meshc_bytes(g, l)).collect();
    let xla = match jax_python() {
        Some(p) => Some(xla_bytes(&p, cases.len())),
        None => {
            println!("XLA: not measured (no Python with jax: set MESHC_JAX_PYTHON or make target/jax-venv)");
            None
        }
    };
    println!(
        "{:<12} {:<8} {:>10} {:>10} {:>10}  meshc's collectives",
        "graph", "layout", "meshc B", "XLA B", "meshc/XLA"
    );
    for (i, (g, l)) in cases.iter().enumerate() {
        let m: u64 = meshc[i].values().sum();
        let steps: Vec<String> = meshc[i].iter().map(|(n, b)| format!("{n} {b}")).collect();
        let (x, ratio) = match &xla {
            Some(v) => {
                assert_eq!(v[i].1, m, "{g} under {l}: the script counts {} bytes of meshc's, this bench {m}", v[i].1);
                (v[i].0.to_string(), if v[i].0 > 0 { format!("{:.2}", m as f64 / v[i].0 as f64) } else { "-".into() })
            }
            None => ("-".into(), "-".into()),
        };
        println!("{g:<12} {l:<8} {m:>10} {x:>10} {ratio:>10}  {}", steps.join(", "));
    }
}
