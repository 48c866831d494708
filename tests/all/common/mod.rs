//! Shared helpers of the integration tests: running the real binary, finding testdata
//! graphs, comparing tensors with the stated tolerance, golden files, and random graphs,
//! meshes and layouts for the property tests.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use meshc::layout::Seed;
use meshc_ir::verify::Info;
use meshc_ir::Graph;
use meshc_runtime::format::mesh::{Layout, Mesh, Topology};

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn meshc(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_meshc")).args(args).output().expect("meshc runs");
    Run {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every `testdata/<name>/graph.json`, sorted.
pub fn testdata_graphs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("testdata")
        .expect("testdata exists")
        .map(|e| e.expect("readable").path().join("graph.json"))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no testdata graphs found");
    v
}

/// Whether expected outputs are rewritten rather than checked (`make golden`: MESHC_BLESS=1).
pub fn blessing() -> bool {
    std::env::var_os("MESHC_BLESS").is_some()
}

/// Compares `actual` with golden/`name`; with MESHC_BLESS=1 rewrites the file instead.
/// The error shows a line diff.
pub fn golden(name: &str, actual: &str) -> Result<(), String> {
    let path = Path::new("golden").join(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return Ok(());
    }
    let expected = std::fs::read_to_string(&path)
        .map_err(|_| format!("{} is missing; run `make golden` and review it", path.display()))?;
    same_text(&path, 0, &expected, actual)
}

/// Whether `actual` is the `expected` text pinned in `path` after its first `skip` lines;
/// the error shows a line diff, numbered as the lines of `path`.
pub fn same_text(path: &Path, skip: usize, expected: &str, actual: &str) -> Result<(), String> {
    if expected == actual {
        return Ok(());
    }
    let mut diff = format!("{} differs (run `make golden` if the change is intended):\n", path.display());
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        match (e.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    diff.push_str(&format!("  -{:>4}: {x}\n", skip + i + 1));
                }
                if let Some(y) = y {
                    diff.push_str(&format!("  +{:>4}: {y}\n", skip + i + 1));
                }
            }
        }
    }
    Err(diff)
}

/// Compares two tensors under the tolerance of `Tensor::closeness`; the error names the
/// first offending element and the worst error.
pub fn assert_close(what: &str, got: &meshc_ir::Tensor, want: &meshc_ir::Tensor) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: got {}, want {}", got.ty(), want.ty()));
    }
    let c = got.closeness(want);
    match c.first_bad {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {} but should be {} (worst abs error {:e} at {})",
            got.data.to_f64()[i],
            want.data.to_f64()[i],
            c.max_abs_err,
            c.worst
        )),
    }
}

/// A fresh scratch directory for one test, removed (with everything in it) when the test
/// drops it, passed or failed.
pub fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("meshc-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--dim NAME=N` for every line of an ONNX model's dims.txt, and `--input-shape NAME=AxB` for
/// every line of its input_shapes.txt (the models whose dims `--dim` cannot bind).
pub fn dim_args(model: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(model.with_file_name("dims.txt")).unwrap();
    let shapes = std::fs::read_to_string(model.with_file_name("input_shapes.txt")).unwrap_or_default();
    let dims = text.lines().map(|l| ("--dim", l));
    dims.chain(shapes.lines().map(|l| ("--input-shape", l))).flat_map(|(f, l)| [f.to_string(), l.to_string()]).collect()
}

/// `--input NAME=FILE` arguments for every `.npy` in `<graph dir>/inputs`.
pub fn input_args(graph: &Path) -> Vec<String> {
    let mut args = Vec::new();
    let dir = graph.parent().unwrap().join("inputs");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    files.sort();
    for f in files {
        args.push("--input".to_string());
        args.push(format!("{}={}", f.file_stem().unwrap().to_string_lossy(), f.display()));
    }
    args
}

/// Checks every `<graph dir>/expected/NAME.npy` against `out_dir/NAME.npy`.
pub fn compare_expected(graph: &Path, out_dir: &Path) -> Result<usize, String> {
    let dir = graph.parent().unwrap().join("expected");
    let mut n = 0;
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.map(|e| e.unwrap().path()).collect();
    files.sort();
    for want_path in files {
        let name = want_path.file_name().unwrap();
        let want = meshc_ir::Tensor::read_npy(&want_path).map_err(|e| e.to_string())?;
        let got = meshc_ir::Tensor::read_npy(&out_dir.join(name)).map_err(|e| e.to_string())?;
        assert_close(&format!("{} output {}", graph.display(), name.to_string_lossy()), &got, &want)?;
        n += 1;
    }
    Ok(n)
}

/// The graph's inputs from `<graph dir>/inputs/<name>.npy`.
pub fn testdata_inputs(graph: &Path, g: &Graph) -> anyhow::Result<std::collections::HashMap<String, meshc_ir::Tensor>> {
    let dir = graph.parent().unwrap().join("inputs");
    g.inputs
        .iter()
        .map(|i| Ok((i.name.clone(), meshc_ir::Tensor::read_npy(&dir.join(format!("{}.npy", i.name)))?)))
        .collect()
}

/// Compares `results` with every `<graph dir>/expected/<output>.npy`; no output may be
/// missing or extra.
pub fn matches_expected(graph: &Path, results: &BTreeMap<String, meshc_ir::Tensor>) -> Result<(), String> {
    let dir = graph.parent().unwrap().join("expected");
    let mut want: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().to_string())
        .collect();
    want.sort();
    let got: Vec<String> = results.keys().cloned().collect();
    if got != want {
        return Err(format!("outputs {got:?}, expected files for {want:?}"));
    }
    for (name, t) in results {
        let expected = meshc_ir::Tensor::read_npy(&dir.join(format!("{name}.npy"))).map_err(|e| e.to_string())?;
        assert_close(&format!("output {name}"), t, &expected)?;
    }
    Ok(())
}

/// One testdata graph under one of its layout specs.
pub struct LayoutCase {
    pub graph: PathBuf,
    pub spec: PathBuf,
    /// `<graph>-<layout>`, e.g. `mlp-mp-2x4`: names its golden files.
    pub label: String,
}

/// Every layout spec `testdata/<graph>/layouts/<layout>.json` with its graph's
/// `graph.json`, sorted by graph then spec.
pub fn layout_cases() -> Vec<LayoutCase> {
    let mut v = Vec::new();
    for graph in testdata_graphs() {
        let dir = graph.parent().unwrap();
        let Ok(entries) = std::fs::read_dir(dir.join("layouts")) else { continue };
        let mut specs: Vec<PathBuf> = entries
            .map(|e| e.expect("readable").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        specs.sort();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        v.extend(specs.into_iter().map(|spec| {
            let label = format!("{name}-{}", spec.file_stem().unwrap().to_string_lossy());
            LayoutCase { graph: graph.clone(), spec, label }
        }));
    }
    v
}

/// The meshes the property tests draw from: 1-D to 3-D, mesh and torus.
pub fn meshes() -> Vec<Mesh> {
    let m = |shape: &[usize], topology| Mesh {
        shape: shape.to_vec(),
        axes: (0..shape.len()).map(|i| ["a", "b", "c"][i].to_string()).collect(),
        topology,
    };
    vec![
        m(&[2], Topology::Mesh),
        m(&[4], Topology::Torus),
        m(&[2, 2], Topology::Mesh),
        m(&[2, 1, 2], Topology::Torus),
        m(&[2, 4], Topology::Mesh),
        m(&[2, 2, 2], Topology::Torus),
        m(&[8], Topology::Mesh),
    ]
}

/// A legal layout for `shape` drawn from `pick` (one number per dim): each dim unsplit, split
/// over a mesh axis, or over a sub-axis (the major or minor factor of an axis whose size is
/// a product, so one axis's factors may land on two dims).
pub fn layout_from(mesh: &Mesh, shape: &[usize], picks: &[u8]) -> Layout {
    let mut entries: Vec<usize> = (0..mesh.shape.len()).collect();
    for (a, &n) in mesh.shape.iter().enumerate() {
        for f in (2..n).filter(|f| n.is_multiple_of(*f)) {
            entries.extend([mesh.part(a, 1, f), mesh.part(a, f, n / f)]);
        }
    }
    let mut layout = vec![None; shape.len()];
    for (d, &p) in picks.iter().enumerate().take(shape.len()) {
        let Some(&a) = entries.get(p as usize % (entries.len() + 1)) else { continue };
        let free = !layout.iter().flatten().any(|&b| mesh.overlaps(a, b));
        if free && shape[d].is_multiple_of(mesh.shards(a)) {
            layout[d] = Some(a);
        }
    }
    layout
}

/// Layouts for some of `g`'s tensors (about one in `density + 1`), drawn from `picks`.
pub fn random_seeds(g: &Graph, info: &Info, mesh: &Mesh, picks: &[Vec<u8>], density: usize) -> BTreeMap<String, Seed> {
    let names = g.inputs.iter().map(|i| &i.name).chain(g.params.iter().map(|p| &p.name));
    let names: Vec<&String> = names.chain(g.nodes.iter().map(|n| &n.name)).collect();
    let mut seeds = BTreeMap::new();
    for (k, name) in names.iter().enumerate() {
        if (k * 7 + density).is_multiple_of(density + 1) {
            let layout = layout_from(mesh, &info.types[*name].shape, &picks[k % picks.len()]);
            seeds.insert(name.to_string(), Seed::spec(layout));
        }
    }
    seeds
}

/// A random small graph in the text format: a [B,D] input, then ops chosen by `ops` on
/// earlier f32 results (matmuls and layer norms bring their own params).
pub fn random_graph(b: usize, d: usize, ops: &[(u8, u8, u8)]) -> String {
    let mut lines = vec![format!("input x: f32[{b},{d}]")];
    let mut tensors: Vec<(String, Vec<usize>)> = vec![("x".into(), vec![b, d])];
    for (k, &(op, pick, arg)) in ops.iter().enumerate() {
        let (src, shape) = tensors[pick as usize % tensors.len()].clone();
        let name = format!("t{k}");
        let (r, c) = (shape[0], shape[1]);
        let axis = arg as usize % 2;
        let (line, out) = match op % 11 {
            0 => (format!("{name} = tanh({src})"), shape.clone()),
            1 => {
                let same: Vec<&(String, Vec<usize>)> = tensors.iter().filter(|t| t.1 == shape).collect();
                let other = &same[arg as usize % same.len()].0;
                (format!("{name} = add({src}, {other})"), shape.clone())
            }
            2 => {
                let n = [4, 8][arg as usize % 2];
                lines.push(format!("param w{k}: f32[{c},{n}] = init normal{{seed = {k}, std = 0.3}}"));
                (format!("{name} = matmul({src}, w{k})"), vec![r, n])
            }
            3 => (format!("{name} = reduce_sum({src}) {{axes = [{axis}], keepdims = true}}"), {
                let mut s = shape.clone();
                s[axis] = 1;
                s
            }),
            4 => (format!("{name} = softmax({src}) {{axis = {axis}}}"), shape.clone()),
            5 => {
                // A (nearly) constant row — a softmax summed over its axis is all ones — makes
                // layer_norm scale rounding by 1/sqrt(eps); an offset of spread 1 keeps every
                // row's variance away from 0, so any two summation orders agree.
                lines.push(format!("param o{k}: f32[{c}] = init normal{{seed = {}, std = 1.0}}", k + 200));
                lines.push(format!("param g{k}: f32[{c}] = init normal{{seed = {k}, mean = 1.0, std = 0.1}}"));
                lines.push(format!("param b{k}: f32[{c}] = init normal{{seed = {}, std = 0.1}}", k + 100));
                lines.push(format!("{name}.in = add({src}, o{k})"));
                (format!("{name} = layer_norm({name}.in, g{k}, b{k}) {{axis = -1}}"), shape.clone())
            }
            6 => (format!("{name} = transpose({src}) {{perm = [1, 0]}}"), vec![c, r]),
            7 if r * c % 2 == 0 => {
                (format!("{name} = reshape({src}) {{shape = [{}, 2]}}", r * c / 2), vec![r * c / 2, 2])
            }
            8 => (format!("{name} = concat({src}, {src}) {{axis = {axis}}}"), {
                let mut s = shape.clone();
                s[axis] *= 2;
                s
            }),
            9 if shape[axis] >= 2 => {
                (format!("{name} = slice({src}) {{starts = [0], ends = [{}], axes = [{axis}]}}", shape[axis] / 2), {
                    let mut s = shape.clone();
                    s[axis] /= 2;
                    s
                })
            }
            10 => (format!("{name} = reduce_max({src}) {{axes = [{axis}], keepdims = true}}"), {
                let mut s = shape.clone();
                s[axis] = 1;
                s
            }),
            _ => (format!("{name} = relu({src})"), shape.clone()),
        };
        lines.push(line);
        tensors.push((name, out));
    }
    let last = &tensors.last().expect("x at least").0;
    format!("graph random {{\n  {}\n  output {last}\n}}\n", lines.join("\n  "))
}

/// Seeded values of every input and param of `g` (params from their `init`, inputs random
/// from `seed`: f32 in [-1, 1), u8 and i8 over their whole range), and the params alone.
pub fn seeded_values(
    g: &Graph,
    seed: u64,
) -> (std::collections::HashMap<String, meshc_ir::Tensor>, std::collections::HashMap<String, meshc_ir::Tensor>) {
    let mut all = meshc_ir::params::load_all(g, Path::new(".")).unwrap();
    let params = all.clone();
    for (k, i) in g.inputs.iter().enumerate() {
        let data = meshc_runtime::kernels::matmul_shape::testing::random(seed + k as u64, i.ty.numel());
        let bytes = || data.iter().map(|v| (v * 1e4) as i64 as u8);
        let data = match i.ty.dtype {
            meshc_ir::DType::F32 => meshc_ir::Data::F32(data),
            meshc_ir::DType::U8 => meshc_ir::Data::U8(bytes().collect()),
            meshc_ir::DType::I8 => meshc_ir::Data::I8(bytes().map(|b| b as i8).collect()),
            t => panic!("input '{}': no seeded {t} values", i.name),
        };
        all.insert(i.name.clone(), meshc_ir::Tensor::new(i.ty.shape.clone(), data));
    }
    (all, params.into_iter().collect())
}

/// The bytes of the weights section of the artifact at `path`, as `meshc inspect` lists it.
pub fn weights_bytes(path: &str) -> usize {
    let inspect = meshc(&["inspect", path]);
    (inspect.stdout.lines())
        .find_map(|l| {
            let words: Vec<&str> = l.strip_prefix("  weights")?.split_whitespace().collect();
            words.iter().position(|&w| w == "size").and_then(|i| words.get(i + 1)?.parse().ok())
        })
        .unwrap_or_else(|| panic!("no weights section in {}", inspect.stdout))
}
