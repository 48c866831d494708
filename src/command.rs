//! The `compile` command as a library: its options (the flags `meshc compile`, `check`,
//! `run GRAPH` and `explain` share, as clap structs) and the steps from a graph file or ONNX
//! model to an artifact. The command line (src/main.rs) and the Python package's
//! `meshc.compile` both call these, so the same flags give the same artifact and errors.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use meshc_ir::weights::WeightFiles;
use meshc_ir::{load, params, verify::Info, Graph, Tensor};
use meshc_onnx::decoder::Entry;
use meshc_runtime::tools::cli::name_eq_file;
use meshc_runtime::tools::inspect::flops_skipped;
use meshc_runtime::tools::output::{check_output_name, Outputs};
use meshc_runtime::tools::steps::State;

use crate::pipeline::{Dumps, Instrument};
use crate::{artifact, compile, driver};

#[derive(clap::Args)]
pub struct CodegenArgs {
    /// A layout spec (meshc-layout/1): the mesh and how tensors are split over it.
    #[arg(long, value_name = "SPEC")]
    pub layout: Option<PathBuf>,
    /// native (this CPU's features), x86-64-v2 or x86-64-v3.
    #[arg(long, default_value = "native")]
    pub target: String,
    /// Which implementation serves matmuls (auto: the faster for each shape).
    #[arg(long, value_enum, default_value = "auto")]
    pub gemm: GemmArg,
    /// Run each device's steps on one stream (no communication stream, no events).
    #[arg(long, conflicts_with = "compute_streams")]
    pub single_stream: bool,
    /// Compute streams per device, for independent branches (beside the communication stream).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub compute_streams: u16,
    /// Which collectives run on the communication stream: those with compute to overlap, or all.
    #[arg(long, value_enum, default_value = "auto", conflicts_with = "single_stream")]
    pub comm_stream: CommArg,
    /// How matmul weights are stored: keep (f16/bf16 stay half), f32, f32 weights rounded
    /// to bf16/f16 (half the bytes), or quantized to int8 per column with the activations
    /// quantized per row as it runs (a quarter); the rounding error of each weight shows in
    /// --dump-after verify. Inference only: a training artifact keeps its params in f32.
    #[arg(long, value_enum, default_value = "keep", conflicts_with = "loss")]
    pub weights_dtype: WeightsArg,
    #[command(flatten)]
    pub onnx: OnnxArgs,
    #[command(flatten)]
    pub train: crate::train::TrainArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WeightsArg {
    Keep,
    F32,
    Bf16,
    F16,
    Int8,
}

/// What importing an ONNX model needs (every command that takes a graph takes a `.onnx`).
#[derive(clap::Args, Clone, Default)]
pub struct OnnxArgs {
    /// Bind the dim NAME (repeatable): NAME=N gives an ONNX model's symbolic dim, or a
    /// graph's input dims named NAME, the size N; NAME=LO..HI[:multiple_of=K] keeps a graph's
    /// dim symbolic within bounds (`check`, `interp`; docs/dynamic-shapes.md). Either replaces
    /// the bounds a graph declares for NAME (`dim NAME = LO..HI`).
    #[arg(long = "dim", value_name = "NAME=N|NAME=LO..HI")]
    pub dims: Vec<String>,
    /// Fix every dim of input NAME, in order, dims separated by `x` (repeatable): for an
    /// ONNX input whose dims have no size and no name (-1, as Paddle2ONNX writes), or share a
    /// name; it must agree with the model's sizes and the `--dim`s of its named dims. On a
    /// graph file, it binds the input's named dims like `--dim` (docs/onnx.md).
    #[arg(long = "input-shape", value_name = "NAME=1x3x48x192")]
    pub input_shapes: Vec<String>,
    /// Fix the ONNX model's input NAME to the value in FILE.npy: it folds at import like an
    /// initializer (an input giving a shape, pads or scales must be known then; repeatable).
    #[arg(long = "const", value_name = "NAME=FILE.npy")]
    pub consts: Vec<String>,
    /// Import a decoder exported with its KV cache as inputs and outputs
    /// (`past_key_values.N.key`, `present.N.key`) as a decode step whose cache holds C
    /// positions (docs/generation.md); `generate` sets it from --context.
    #[arg(long = "decode-context", value_name = "C")]
    pub decode_context: Option<usize>,
    /// The batch of that decode step (default 1); `generate` sets it from the prompt.
    #[arg(long = "decode-batch", value_name = "B", requires = "decode_context")]
    pub decode_batch: Option<usize>,
    /// With --decode-context: import instead the prefill of a P-id prompt, run in one call
    /// (`generate --prefill`).
    #[arg(long = "decode-prefill", value_name = "P", requires = "decode_context")]
    pub decode_prefill: Option<usize>,
}

impl OnnxArgs {
    /// The model at `path` imported at the `--dim` sizes; with ranges, at their examples
    /// and read over them, checked against an import at other sizes
    /// (`meshc_onnx::symbolic`).
    pub fn import(&self, path: &Path) -> Result<(meshc_onnx::Imported, Option<meshc_ir::sym::SymInfo>)> {
        let (dims, symbols) = self.examples()?;
        let shapes = meshc_onnx::parse_input_shapes(&self.input_shapes)?;
        let consts = meshc_onnx::parse_consts(&self.consts)?;
        if let Some(context) = self.decode_context {
            let cache = meshc_onnx::decoder::Cache { context, batch: self.decode_batch.unwrap_or(1) };
            let entry = self.decode_prefill.map_or(Entry::Decode, |prompt| Entry::Prefill { prompt });
            if symbols.is_some() || !shapes.is_empty() {
                bail!(
                    "{}: a decoder's sizes come from the prompt and --context; give no --input-shape or ranged --dim",
                    path.display()
                );
            }
            return Ok((meshc_onnx::import_decoder(path, cache, entry, &dims, &consts)?, None));
        }
        match symbols {
            Some(symbols) => {
                let (imp, si) = meshc_onnx::symbolic::import(path, &dims, &symbols, &shapes, &consts)?;
                Ok((imp, Some(si)))
            }
            None => Ok((meshc_onnx::import(path, &dims, &shapes, &consts, false)?, None)),
        }
    }

    /// The size each `--dim` imports at, and the ranged ones as symbols (None: all values).
    /// A range imports at an example size: the smallest allowed value from 3 up that no
    /// other symbol takes, odd where the divisor allows, so that it is unlikely to meet a
    /// static dim (mostly even) and a reshape can tell them apart.
    pub fn examples(&self) -> Result<(BTreeMap<String, usize>, Option<meshc_ir::sym::Symbols>)> {
        if !self.dims.iter().any(|d| d.contains("..")) {
            return Ok((meshc_onnx::parse_dims(&self.dims)?, None));
        }
        let symbols = meshc_ir::sym::parse_symbols(&self.dims).map_err(anyhow::Error::msg)?;
        let mut dims = BTreeMap::new();
        for s in symbols.values() {
            let taken = |v: i64| dims.values().any(|&u| u == v as usize);
            let ok = |v: &i64| s.refuse(*v).is_none() && !taken(*v);
            let from = s.lo.max(3);
            let odd = (from..=s.hi.min(from + 4096)).filter(|v| v % 2 == 1).find(&ok);
            let v = odd.or_else(|| (from..=s.hi.min(from + 4096)).find(&ok)).or_else(|| (s.lo..=s.hi).find(&ok));
            let v = v.with_context(|| format!("--dim {s}: no example size left for it"))?;
            dims.insert(s.name.clone(), v as usize);
        }
        Ok((dims, Some(symbols)))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CommArg {
    Auto,
    Always,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum GemmArg {
    Auto,
    Cranelift,
    Library,
}

impl CodegenArgs {
    /// The first option given that differs from its default (`run ARTIFACT` refuses them
    /// rather than ignore them).
    pub fn given(&self) -> Option<&'static str> {
        [
            (self.layout.is_some(), "--layout"),
            (self.target != "native", "--target"),
            (!matches!(self.gemm, GemmArg::Auto), "--gemm"),
            (self.single_stream, "--single-stream"),
            (self.compute_streams != 1, "--compute-streams"),
            (self.comm_stream != CommArg::Auto, "--comm-stream"),
            (self.weights_dtype != WeightsArg::Keep, "--weights-dtype"),
            (!self.onnx.dims.is_empty(), "--dim"),
            (!self.onnx.input_shapes.is_empty(), "--input-shape"),
            (self.train.loss.is_some(), "--loss"),
            (!self.onnx.consts.is_empty(), "--const"),
            (self.onnx.decode_context.is_some(), "--decode-context"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The defaults of every option but the spec `layout` and the ONNX import `onnx`.
    pub fn defaults(layout: Option<PathBuf>, onnx: OnnxArgs) -> CodegenArgs {
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            args: CodegenArgs,
        }
        // Parsed from no flags, so the defaults are clap's, as `compile` has them.
        let args = Defaults::parse_from(["meshc"]).args;
        CodegenArgs { layout, onnx, ..args }
    }

    pub fn options(&self) -> compile::Options {
        let gemm = match self.gemm {
            GemmArg::Auto => compile::Gemm::Auto,
            GemmArg::Cranelift => compile::Gemm::Cranelift,
            GemmArg::Library => compile::Gemm::Library,
        };
        let streams = crate::passes::streams::Config {
            single: self.single_stream,
            compute_streams: self.compute_streams.into(),
            comm_always: self.comm_stream == CommArg::Always,
        };
        use crate::passes::fold::WeightsDtype;
        let weights = match self.weights_dtype {
            WeightsArg::Keep => WeightsDtype::Keep,
            WeightsArg::F32 => WeightsDtype::F32,
            WeightsArg::Bf16 => WeightsDtype::BF16,
            WeightsArg::F16 => WeightsDtype::F16,
            WeightsArg::Int8 => WeightsDtype::Int8,
        };
        compile::Options { target: self.target.clone(), gemm, streams, weights, ..Default::default() }
    }
}

pub fn base_dir(graph: &Path) -> &Path {
    graph.parent().unwrap_or(Path::new("."))
}

/// The params of `g` as `check` and `compile` read them: an imported model's values, or
/// the graph's weight files opened and checked against the declarations (their data left
/// in the files); a warning for each that holds NaN.
pub fn graph_params<'a>(
    g: &Graph,
    imported: Option<&'a HashMap<String, Tensor>>,
    files: &'a mut WeightFiles,
    graph: &Path,
) -> Result<params::Params<'a>> {
    let in_graph = |e: meshc_ir::Error| e.in_file(graph.display().to_string());
    let params = match imported {
        Some(p) => params::Params::from(p),
        None => {
            params::open_files(g, files).map_err(in_graph)?;
            params::Params::lazy(g, &*files).map_err(in_graph)?
        }
    };
    warn_nan_params(g, &params, graph)?;
    Ok(params)
}

/// A warning line on stderr for each float param holding NaN (`params::nan_warnings`):
/// `check`, `interp`, `compile` and `run` of a graph say the same.
pub fn warn_nan_params(g: &Graph, params: &params::Params, graph: &Path) -> Result<()> {
    for w in params::nan_warnings(g, params).map_err(|e| e.in_file(graph.display().to_string()))? {
        eprintln!("warning: {}: {}", graph.display(), meshc_ir::error::shorten(&w));
    }
    Ok(())
}

/// A graph as the commands take it: a graph file, whose params are read from their
/// sources, or an ONNX model imported in memory, with its params' values; with ranged
/// `--dim`s or ranges the graph declares, the graph as written and its symbolic shapes
/// (`check` and `interp` only).
pub struct GraphIn {
    pub graph: Graph,
    pub info: Info,
    pub imported: Option<HashMap<String, Tensor>>,
    pub sym: Option<meshc_ir::sym::SymInfo>,
}

/// The graph at `path` for a command that needs every size (`--dim NAME=N` writes a graph at
/// that size; a range is refused, saying how to give a value).
pub fn load_graph(path: &Path, onnx: &OnnxArgs) -> Result<GraphIn> {
    let gi = load_graph_sym(path, onnx)?;
    if let Some(si) = &gi.sym {
        let s = si.symbols.values().find(|s| !s.is_fixed()).expect("a ranged symbol");
        let given = onnx.dims.iter().any(|d| d.split_once('=').is_some_and(|(n, _)| n.trim() == s.name));
        let from = match given {
            true => format!("--dim {s}"),
            false => {
                format!("{}: dim {} = {} (declared in the graph)", path.display(), s.name, meshc_ir::sym::Bounds(s))
            }
        };
        bail!(
            "{from}: the compiled path needs a value for now (give --dim {}=N; the graph is written at {}={}); `check` and `interp` take a range (docs/dynamic-shapes.md)",
            s.name,
            s.name,
            si.example[&s.name]
        );
    }
    Ok(gi)
}

/// The graph at `path` for `compile` and `run`: with symbolic dims (ranged `--dim`s, or
/// ranges the graph declares), written at their upper bounds and returned with them, for
/// one artifact that runs at every size within them (`crate::sizes`).
fn load_graph_bounded(path: &Path, args: &CodegenArgs) -> Result<(GraphIn, meshc_ir::sym::Symbols)> {
    let gi = load_graph_sym(path, &args.onnx)?;
    let Some(si) = &gi.sym else { return Ok((gi, Default::default())) };
    if let Some(layout) = &args.layout {
        bail!(
            "{}: symbolic dims compile for one device for now, not for the mesh of {}; give each a size (--dim NAME=N)",
            path.display(),
            layout.display()
        );
    }
    // A symbol a check holds to one size (a param sized to it) cannot range: say which
    // node pins it and how to give it that size, before the bounds fail the check.
    for c in &si.checks {
        let meshc_ir::sym::infer::CheckKind::Eq(a, b) = &c.kind else { continue };
        let (Some(name), Some(v)) = (a.as_sym(), b.as_const()) else { continue };
        if si.symbols.get(name).is_some_and(|s| !s.is_fixed()) {
            bail!(
                "{}: {name} is pinned to {v} by node '{}' (it needs {name} == {v}: a constant sized to it), so it cannot range over {}; give it that size (--dim {name}={v}) or leave it out of the ranges (docs/dynamic-shapes.md)",
                path.display(),
                c.node,
                meshc_ir::sym::Bounds(&si.symbols[name])
            );
        }
    }
    let hi: meshc_ir::sym::Binding =
        si.symbols.values().map(|s| (s.name.clone(), s.hi / s.multiple_of * s.multiple_of)).collect();
    let in_file = |e: String| anyhow::anyhow!("{}: at the upper bounds: {e}", path.display());
    let graph = specialised(&gi.graph, si, &hi).map_err(in_file)?;
    let info = meshc_ir::verify::verify(&graph).map_err(|e| e.in_file(path.display().to_string()))?;
    // A symbol given one size is no symbol: the graph is written at it.
    let symbols = si.symbols.iter().filter(|(_, s)| !s.is_fixed()).map(|(n, s)| (n.clone(), s.clone())).collect();
    Ok((GraphIn { graph, info, imported: gi.imported, sym: None }, symbols))
}

/// `dims` with what `shapes` (`--input-shape`s of a graph file) say: a graph's dims are
/// concrete, and a dim name stands for one size across the graph, so an input's shape binds
/// each of its named dims as `--dim NAME=N` would (agreeing with the `--dim`s and the other
/// input shapes), and must keep each unnamed dim at the graph's size.
fn input_shape_dims(g: &Graph, dims: &[String], shapes: &BTreeMap<String, Vec<usize>>) -> Result<Vec<String>, String> {
    let mut out = dims.to_vec();
    let mut by: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    for (name, shape) in shapes {
        let given = shape.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
        let flag = format!("--input-shape {name}={given}");
        let Some(i) = g.inputs.iter().find(|i| i.name == *name) else {
            let hint = meshc_ir::suggest::did_you_mean(name, g.inputs.iter().map(|i| i.name.as_str()));
            return Err(format!("--input-shape {name}: the graph has no input '{name}'{hint}"));
        };
        if shape.len() != i.ty.shape.len() {
            return Err(format!("{flag}: the input is {}, of rank {}, not {}", i.ty, i.ty.shape.len(), shape.len()));
        }
        for (k, &n) in shape.iter().enumerate() {
            let Some(dim) = i.dims.as_ref().and_then(|d| d[k].as_deref()) else {
                if n != i.ty.shape[k] {
                    return Err(format!(
                        "{flag}: axis {k} has no dim name in the graph, so its size {} is fixed, not {n}",
                        i.ty.shape[k]
                    ));
                }
                continue;
            };
            if let Some((_, v)) = dims.iter().filter_map(|d| d.split_once('=')).find(|(d, _)| *d == dim) {
                // (A range `1..64` keeps the dim symbolic, which a fixed shape contradicts.)
                if v.trim().parse::<usize>() != Ok(n) {
                    return Err(format!("{flag}: axis {k} is dim '{dim}', which --dim {dim}={v} makes {v}, not {n}"));
                }
                continue;
            }
            match by.get(dim) {
                Some((m, other)) if *m != n => {
                    return Err(format!("{flag}: axis {k} is dim '{dim}', which {other} makes {m}, not {n}"));
                }
                Some(_) => {}
                None => {
                    by.insert(dim, (n, flag.clone()));
                    out.push(format!("{dim}={n}"));
                }
            }
        }
    }
    Ok(out)
}

/// The graph at `path`, with `--dim` ranges and the ranges the graph declares kept as
/// symbols (a `--dim` replaces the graph's bounds of its name).
pub fn load_graph_sym(path: &Path, onnx: &OnnxArgs) -> Result<GraphIn> {
    if meshc_onnx::is_onnx(path) {
        let (imp, sym) = onnx.import(path)?;
        return Ok(GraphIn { graph: imp.graph, info: imp.info, imported: Some(imp.params), sym });
    }
    if !onnx.consts.is_empty() {
        bail!("{}: --const fixes inputs of an ONNX model; this is a graph", path.display());
    }
    if onnx.decode_context.is_some() {
        bail!("{}: --decode-context imports an ONNX decoder as a decode step; this is a graph", path.display());
    }
    let (graph, info) = load::load(path)?;
    let in_file = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let dims =
        input_shape_dims(&graph, &onnx.dims, &meshc_onnx::parse_input_shapes(&onnx.input_shapes)?).map_err(in_file)?;
    if dims.is_empty() && graph.symbols.is_empty() {
        return Ok(GraphIn { graph, info, imported: None, sym: None });
    }
    // The bounds the graph declares, each replaced by a `--dim` of the same name.
    let mut symbols = graph.symbols.clone();
    symbols.extend(meshc_ir::sym::parse_symbols(&dims).map_err(anyhow::Error::msg)?);
    let si = meshc_ir::sym::infer_graph(&graph, &info, &symbols).map_err(in_file)?;
    if symbols.values().any(|s| !s.is_fixed()) {
        return Ok(GraphIn { graph, info, imported: None, sym: Some(si) });
    }
    // Every symbol has a value: the graph written at it, checked like one read from a file.
    let at: meshc_ir::sym::Binding = symbols.values().map(|s| (s.name.clone(), s.lo)).collect();
    let graph = specialised(&graph, &si, &at).map_err(in_file)?;
    let info = meshc_ir::verify::verify(&graph).map_err(|e| e.in_file(path.display().to_string()))?;
    Ok(GraphIn { graph, info, imported: None, sym: None })
}

/// `g` at the binding `at`, after the checks its symbols' bounds and the graph need.
fn specialised(g: &Graph, si: &meshc_ir::sym::SymInfo, at: &meshc_ir::sym::Binding) -> Result<Graph, String> {
    for s in si.symbols.values() {
        if let Some(why) = s.refuse(at[&s.name]) {
            return Err(format!("{}: {} is {why}", s.name, at[&s.name]));
        }
    }
    if let Some(c) = si.checks.iter().find(|c| c.kind.holds(at) == Some(false)) {
        return Err(format!("the sizes fail the check {c}"));
    }
    meshc_ir::sym::specialise(g, si, at)
}

/// The pilot pass's flags (docs/design.md §4.3): masks computed on pilot inputs prune the graph, and
/// the artifact's matmuls skip the pruned blocks (`--dump-after pilot` shows them).
#[derive(clap::Args, Clone)]
pub struct PilotArgs {
    /// Run the pilot pass on this input value, NAME=FILE.npy (every graph input once per
    /// pilot run; repeat the whole set for several runs); its masks prune the graph.
    #[arg(long = "pilot-input", id = "pilot_inputs", value_name = "NAME=FILE.npy")]
    pub inputs: Vec<String>,
    /// Keep this fraction (0 < F <= 1) of each prunable weight's blocks, highest priority first.
    #[arg(long = "pilot-keep", value_name = "F", conflicts_with = "threshold")]
    pub keep: Option<f64>,
    /// Instead keep the blocks whose priority exceeds T times the weight's largest.
    #[arg(long = "pilot-threshold", value_name = "T")]
    pub threshold: Option<f64>,
    /// The simplified graph: bits:N (mantissa bits kept), exponent (sign and power of two),
    /// or downsample:AXIS:F (pilot inputs averaged over F along AXIS).
    #[arg(long = "pilot-simplify", value_name = "HOW", default_value = "bits:7")]
    pub simplify: String,
    /// Output columns per block (default: 4 micro-panels of the matmul kernel).
    #[arg(long = "pilot-block", value_name = "N", default_value_t = crate::passes::pilot::DEFAULT_BLOCK)]
    pub block: usize,
}

impl PilotArgs {
    /// The pass's configuration, or None without `--pilot-input`.
    pub fn config(&self, g: &Graph) -> Result<Option<crate::passes::pilot::Config>> {
        use crate::passes::pilot::{Config, Select, Simplify};
        if self.inputs.is_empty() {
            if self.keep.is_some() || self.threshold.is_some() {
                bail!("--pilot-keep/--pilot-threshold need pilot inputs (--pilot-input NAME=FILE.npy)");
            }
            return Ok(None);
        }
        let mut values: BTreeMap<&str, Vec<Tensor>> = BTreeMap::new();
        for arg in &self.inputs {
            let (name, file) = name_eq_file(arg, "--pilot-input")?;
            let Some(input) = g.inputs.iter().find(|i| i.name == name) else {
                bail!("--pilot-input {name}: the graph has no input '{name}'");
            };
            let t = Tensor::read_npy(Path::new(file)).with_context(|| format!("--pilot-input {name}"))?;
            if t.ty() != input.ty {
                bail!("--pilot-input {name}: {file} holds {}, the graph expects {}", t.ty(), input.ty);
            }
            values.entry(input.name.as_str()).or_default().push(t);
        }
        let runs = values.values().map(Vec::len).max().unwrap_or(0);
        if let Some(i) = g.inputs.iter().find(|i| values.get(i.name.as_str()).map_or(0, Vec::len) != runs) {
            bail!("--pilot-input {}: every graph input needs one value per pilot run ({runs} runs)", i.name);
        }
        let select = match (self.keep, self.threshold) {
            (Some(f), _) if !(f > 0.0 && f <= 1.0) => bail!("--pilot-keep {f}: expected 0 < F <= 1"),
            (_, Some(t)) if !(0.0..=1.0).contains(&t) => bail!("--pilot-threshold {t}: expected 0 <= T <= 1"),
            (_, Some(t)) => Select::Threshold(t),
            (f, None) => Select::Keep(f.unwrap_or(1.0)),
        };
        let runs = (0..runs).map(|r| values.iter().map(|(n, v)| (n.to_string(), v[r].clone())).collect()).collect();
        Ok(Some(Config { runs, simplify: Simplify::parse(&self.simplify)?, block: self.block, select }))
    }
}

/// Compiles the graph at `path` as `args` say, watched as `inst` asks: the result (None when
/// it stops after a pass), the files it is built from, and a training step's initial state.
pub fn compile_graph(
    path: &Path,
    args: &CodegenArgs,
    emit: compile::Emit,
    inst: &Instrument,
    pilot: Option<&PilotArgs>,
) -> Result<(Option<compile::Compiled>, Vec<PathBuf>, Option<State>)> {
    let (GraphIn { graph: g, info, imported, .. }, symbols) = load_graph_bounded(path, args)?;
    let mut files = WeightFiles::new(base_dir(path));
    let in_graph = |e: meshc_ir::Error| e.in_file(path.display().to_string());
    let step = crate::train::step(&g, &info, &args.train, |p| match imported.as_ref().and_then(|m| m.get(&p.name)) {
        Some(t) => Ok(t.clone()),
        None => Ok(params::load_param(p, &mut files).map_err(in_graph)?),
    })
    .with_context(|| path.display().to_string())?;
    let (g, info, init) = match step {
        Some(s) => (s.graph, s.info, Some(s.init)),
        None => (g, info, None),
    };
    // An artifact's outputs become file names (`run --output-dir`): refused here already.
    for o in &g.outputs {
        check_output_name(&o.name).with_context(|| path.display().to_string())?;
    }
    let mut spec = args.layout.as_deref().map(crate::layout::load).transpose()?;
    // Refused here rather than when the artifact first runs: its state stays in one process.
    if let (Some(_), Some(s)) = (&init, spec.as_ref().filter(|s| !s.hosts.is_empty())) {
        bail!(
            "{}: hosts: a training step (--loss) runs in one process; training over several hosts is not supported",
            s.file
        );
    }
    if let (true, Some(init)) = (args.train.zero, &init) {
        let spec =
            spec.as_mut().context("--zero shards the optimizer state over the data-parallel axes of a --layout")?;
        crate::train::zero(spec, &g, &info, init).with_context(|| path.display().to_string())?;
    }
    // File-backed weights stay in their files until code generation reads each
    // into the weights section.
    let params = graph_params(&g, imported.as_ref(), &mut files, path)?;
    let pilot = pilot.map(|p| p.config(&g)).transpose()?.flatten();
    if !symbols.is_empty() && (pilot.is_some() || init.is_some()) {
        bail!(
            "{}: symbolic dims do not take --pilot-input or --loss yet; give each a size (--dim NAME=N)",
            path.display()
        );
    }
    let opts = compile::Options { emit, symbols, ..args.options() };
    let compiled = driver::Job::new(&g, &info, params, &opts)
        .spec(spec.as_ref())
        .pilot(pilot.as_ref())
        .run(inst)
        .with_context(|| path.display().to_string())?;
    // Everything the artifact holds has been copied out of the weight files by now.
    files.check_unchanged()?;
    if let Some(report) = inst.report() {
        eprint!("{report}");
    }
    let mut deps = vec![path.to_path_buf()];
    deps.extend(args.layout.clone());
    deps.extend(files.paths().iter().cloned());
    Ok((compiled, deps, init))
}

/// Compiles the graph at `path` to run in this process.
pub fn compile_in_memory(
    path: &Path,
    args: &CodegenArgs,
    pilot: Option<&PilotArgs>,
) -> Result<(compile::Compiled, Option<State>)> {
    let dumps = Dumps::default();
    let (c, _, init) = compile_graph(path, args, compile::Emit::Memory, &Instrument::dumps(&dumps), pilot)?;
    Ok((c.expect("only --stop-after stops the pipeline"), init))
}

/// `compile GRAPH -o OUT`: the artifact (and its depfile), unless `inst` stops the
/// pipeline after a pass (clap requires `out` otherwise).
pub fn compile_cmd(
    path: &Path,
    out: Option<&Path>,
    args: &CodegenArgs,
    depfile: Option<&Path>,
    inst: &Instrument,
    pilot: &PilotArgs,
    signer: Option<ed25519_dalek::SigningKey>,
) -> Result<()> {
    let (compiled, deps, init) = compile_graph(path, args, compile::Emit::Artifact, inst, Some(pilot))?;
    let (Some(compiled), Some(out)) = (compiled, out) else { return Ok(()) };
    if let Some(report) = flops_skipped(&compiled.programs, compiled.meta.flops) {
        eprintln!("{report}");
    }
    // The artifact and its depfile appear together or not at all.
    let mut files = Outputs::new();
    artifact::stage_artifact(&compiled, &mut files, out, signer, init.map(|i| i.to_section()).transpose()?)?;
    if let Some(d) = depfile {
        let text = artifact::depfile(out, &deps);
        files.write_bytes(d, text.as_bytes())?;
    }
    files.commit()
}
