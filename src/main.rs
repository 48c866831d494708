//! The `meshc` command line: argument parsing and one function per subcommand. Every user
//! error leaves as one line on stderr with exit status 1.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use meshc::command::{
    base_dir, compile_cmd, compile_graph, compile_in_memory, graph_params, load_graph, load_graph_sym, warn_nan_params,
    CodegenArgs, GraphIn, OnnxArgs, PilotArgs,
};
use meshc::pipeline::{Dumps, Format as DumpFormat, Instrument};
use meshc::{compile, driver};
use meshc_ir::weights::WeightFiles;
use meshc_ir::{json, load, params, text, verify::Info, Graph, Tensor, TensorType};
use meshc_runtime::exec::loader::load_artifact;
use meshc_runtime::exec::runner::Loaded;
use meshc_runtime::format::artifact::{Artifact, Verify};
use meshc_runtime::format::signature;
use meshc_runtime::tools::cli::{self, is_artifact, read_inputs, Io, RunArgs};
use meshc_runtime::tools::generate::{GenerateArgs, Source};
use meshc_runtime::tools::output::Outputs;
use meshc_runtime::tools::steps::{State, StepArgs};

#[derive(Parser)]
#[command(
    name = "meshc",
    version,
    about = "Ahead-of-time compiler for tensor graphs spread over a mesh of devices",
    arg_required_else_help = false
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Parse and verify a graph (and load its params), then print a summary.
    Check {
        /// A graph file, or an ONNX model (imported in memory).
        graph: PathBuf,
        /// Also validate a layout spec against the graph and print the layouts it fixes.
        #[arg(long, value_name = "SPEC")]
        layout: Option<PathBuf>,
        #[command(flatten)]
        onnx: OnnxArgs,
        /// Instead of the summary, run the passes up to PASS (with the default code generation
        /// options and the --layout given) and print the IR after it.
        #[arg(long, value_name = "PASS")]
        stop_after: Option<String>,
        /// Print the wall time of every pass run on stderr.
        #[arg(long, requires = "stop_after")]
        time_passes: bool,
        /// Print the summary (and the layouts) as JSON.
        #[arg(long, conflicts_with = "stop_after")]
        json: bool,
        #[command(flatten)]
        memory: Memory,
    },
    /// Import an ONNX model as a graph file, its weights in a safetensors file beside it.
    Import {
        /// The ONNX model (.onnx; external data beside it is read too).
        model: PathBuf,
        /// The graph to write: GRAPH.json (meshc-graph/1) or GRAPH.txt (text format).
        #[arg(short, value_name = "GRAPH", required_unless_present = "list")]
        o: Option<PathBuf>,
        /// Write nothing: print the inputs and every weight with its type and dim names, one
        /// a line (what a layout spec's rules and layouts name).
        #[arg(long, conflicts_with_all = ["o", "weights"])]
        list: bool,
        /// Where the weights go (default: GRAPH with the extension .safetensors).
        #[arg(long, value_name = "OUT.safetensors")]
        weights: Option<PathBuf>,
        #[command(flatten)]
        onnx: OnnxArgs,
        #[command(flatten)]
        memory: Memory,
    },
    /// Convert a graph between the JSON and text formats.
    Fmt {
        /// The graph file to convert (.json or .txt).
        graph: PathBuf,
        /// The format to write.
        #[arg(long, value_enum)]
        to: Format,
        /// Write here instead of stdout (`-o -` is stdout too).
        #[arg(short)]
        o: Option<PathBuf>,
    },
    /// Run a graph on the reference interpreter.
    Interp {
        /// A graph file, or an ONNX model (imported in memory).
        graph: PathBuf,
        #[command(flatten)]
        io: Io,
        #[command(flatten)]
        onnx: OnnxArgs,
        #[command(flatten)]
        memory: Memory,
    },
    /// Compile a graph into one mmap-loadable artifact.
    Compile {
        /// A graph file, or an ONNX model (imported in memory).
        graph: PathBuf,
        /// The artifact to write (all or nothing: through a temporary file renamed into place).
        #[arg(short, value_name = "OUT.mshc", required_unless_present = "stop_after")]
        o: Option<PathBuf>,
        #[command(flatten)]
        codegen: CodegenArgs,
        /// Also write a make-style depfile listing every file the artifact is built from.
        #[arg(long = "MF", value_name = "DEPFILE", conflicts_with = "stop_after")]
        depfile: Option<PathBuf>,
        /// Print the IR after a pass (verify, pilot, place, layout, lower, sendrecv, expand, quantize, fold, gelu,
        /// attention, epilogue, zero_point, reduce_split, fuse, codegen, streams, buffers, or all); may be repeated.
        #[arg(long, value_name = "PASS", value_delimiter = ',')]
        dump_after: Vec<String>,
        /// Write the dumps to DIR/NN-PASS.txt (.dot) instead of stdout.
        #[arg(long, value_name = "DIR")]
        dump_dir: Option<PathBuf>,
        /// The form of the dumps: text, or Graphviz dot (place, lower, sendrecv, streams).
        #[arg(long, value_name = "FORMAT", default_value = "text")]
        dump_format: DumpFormat,
        /// Stop after this pass and print (or --dump-dir) the IR after it; no artifact is written.
        #[arg(long, value_name = "PASS")]
        stop_after: Option<String>,
        /// Print the wall time of every pass on stderr, the slowest first.
        #[arg(long)]
        time_passes: bool,
        /// Sign the artifact with this secret key (from `meshc keygen`): `run
        /// --require-signature` then accepts it.
        #[arg(long, value_name = "KEY", conflicts_with = "stop_after")]
        sign: Option<PathBuf>,
        #[command(flatten)]
        pilot: PilotArgs,
        #[command(flatten)]
        memory: Memory,
    },
    /// Run an artifact (or compile a graph in memory and run it).
    Run {
        /// An artifact (.mshc) or a graph file.
        program: PathBuf,
        #[command(flatten)]
        io: Io,
        // Boxed, as the run options make this by far the largest command.
        #[command(flatten)]
        run: Box<RunArgs>,
        #[command(flatten)]
        steps: Box<StepArgs>,
        /// Also run the unpruned graph on the same inputs and print the pruned run's error
        /// (max abs, relative L2, argmax agreement of classifier-like outputs). For a graph
        /// compiled with --pilot-*, no value is needed; for a pruned artifact, give the
        /// unpruned artifact or graph: --compare-unpruned=FILE.
        #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "")]
        compare_unpruned: Option<String>,
        /// Live conditioning (GRAPH only): the pilot pass runs on this run's own inputs, so
        /// the masks fit the input at hand (the graph is compiled for it, in memory).
        #[arg(long, conflicts_with = "pilot_inputs")]
        conditional: bool,
        #[command(flatten)]
        codegen: CodegenArgs,
        #[command(flatten)]
        pilot: PilotArgs,
        #[command(flatten)]
        memory: Memory,
    },
    /// Generate tokens with a decode-step model: the prompt fed one position a step, then
    /// each sampled token, the KV caches kept on the devices (docs/generation.md).
    Generate {
        /// A decode-step artifact (.mshc) or graph (compiled in memory).
        model: PathBuf,
        #[command(flatten)]
        args: GenerateArgs,
        #[command(flatten)]
        codegen: CodegenArgs,
        #[command(flatten)]
        memory: Memory,
    },
    /// Describe an artifact: sections, inputs/outputs, kernels, buffers, steps.
    Inspect {
        /// The artifact (.mshc) to describe.
        artifact: PathBuf,
        /// Print the artifact as JSON: sections, signature, metadata and programs.
        #[arg(long)]
        json: bool,
    },
    /// Explain a sharding plan: every communication step with its reason and bytes, the
    /// traffic per device and per link, the estimated time, and the FLOPs per device.
    Explain {
        /// The graph file (or ONNX model) whose plan to explain.
        graph: PathBuf,
        /// The layout spec (meshc-layout/1) to explain.
        #[arg(long, value_name = "SPEC")]
        layout: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        onnx: OnnxArgs,
    },
    /// Append the gradient of a scalar loss with respect to params (outputs `grad.P`).
    Grad {
        /// The graph file holding the loss.
        graph: PathBuf,
        /// The scalar f32 output to differentiate, or a built-in loss of an output
        /// (mse:Y, l1:Y, bce_with_logits:Y, cross_entropy:Y; docs/training.md).
        #[arg(long, value_name = "NAME|KIND:OUTPUT")]
        loss: String,
        /// The params to differentiate: names or globs (`*`, `?`), comma-separated
        /// (default: every f32 param).
        #[arg(long, value_name = "P,...", value_delimiter = ',')]
        wrt: Vec<String>,
        /// The graph to write: OUT.json (meshc-graph/1) or OUT.txt (text format).
        #[arg(short, value_name = "OUT")]
        o: PathBuf,
    },
    /// Make a new Ed25519 key pair for signing artifacts: KEY (secret, mode 0600) and KEY.pub.
    Keygen {
        /// Where the secret key goes (KEY.pub beside it).
        #[arg(short, value_name = "KEY")]
        o: PathBuf,
    },
    /// Print a completion script for a shell: `meshc completions bash > ~/.local/share/bash-completion/completions/meshc`.
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
}

/// The allocation budget (`meshc_ir::budget`) of the commands that read graphs and models.
#[derive(clap::Args, Clone, Default)]
struct Memory {
    /// The most memory any one allocation sized by an input file may take (a tensor the
    /// interpreter computes, an index table, a window's taps): 8G, 512M, or bytes
    /// (default: half the memory available at start).
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = max_memory)]
    max_memory: Option<u64>,
}

fn max_memory(s: &str) -> std::result::Result<u64, String> {
    meshc_ir::budget::parse_size(s).ok_or_else(|| format!("'{s}' is not a size (8G, 512M, or bytes)"))
}

impl Cmd {
    /// The `--max-memory` of the commands that take it.
    fn memory(&self) -> Option<&Memory> {
        match self {
            Cmd::Check { memory, .. }
            | Cmd::Import { memory, .. }
            | Cmd::Interp { memory, .. }
            | Cmd::Compile { memory, .. }
            | Cmd::Run { memory, .. }
            | Cmd::Generate { memory, .. } => Some(memory),
            Cmd::Fmt { .. }
            | Cmd::Inspect { .. }
            | Cmd::Explain { .. }
            | Cmd::Grad { .. }
            | Cmd::Keygen { .. }
            | Cmd::Completions { .. } => None,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn main() -> ExitCode {
    meshc_runtime::tools::output::init();
    // `-MF DEPFILE` is the compiler-driver spelling build systems know (gcc, clang); clap
    // has no two-letter short flags, so it is read as `--MF`.
    let args = std::env::args_os().map(|a| if a == "-MF" { "--MF".into() } else { a });
    let cli: Cli = match cli::parse(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Some(bytes) = cli.cmd.memory().and_then(|m| m.max_memory) {
        meshc_ir::budget::set_limit(bytes);
    }
    let result = match cli.cmd {
        Cmd::Check { graph, layout, onnx, stop_after: Some(pass), time_passes, .. } => {
            check_until(&graph, CodegenArgs::defaults(layout, onnx), &pass, time_passes)
        }
        Cmd::Check { graph, layout, onnx, json, .. } => check(&graph, layout.as_deref(), &onnx, json),
        // clap requires -o unless --list, and refuses both.
        Cmd::Import { model, o, weights, onnx, .. } => match o {
            Some(o) => to_file(&o, "an import writes a graph and its weights file")
                .and_then(|()| import(&model, Some(&o), weights.as_deref(), &onnx)),
            None => import(&model, None, None, &onnx),
        },
        Cmd::Fmt { graph, to, o } => fmt(&graph, to, o.as_deref()),
        Cmd::Interp { graph, io, onnx, .. } => interp(&graph, &io, &onnx),
        Cmd::Compile {
            graph,
            o,
            codegen,
            depfile,
            dump_after,
            dump_dir,
            dump_format,
            stop_after,
            time_passes,
            sign,
            pilot,
            ..
        } => Dumps::new(dump_after, dump_dir, dump_format).and_then(|dumps| {
            let inst = Instrument::new(&dumps, stop_after.as_deref(), time_passes)?;
            let signer = sign.as_deref().map(signature::read_signing_key).transpose()?;
            o.as_deref().map_or(Ok(()), |o| to_file(o, "an artifact is mapped from its file"))?;
            compile_cmd(&graph, o.as_deref(), &codegen, depfile.as_deref(), &inst, &pilot, signer)
        }),
        Cmd::Keygen { o } => to_file(&o, "a key pair is two files").and_then(|()| keygen(&o)),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "meshc", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Grad { graph, loss, wrt, o } => to_file(&o, "the graph's format is chosen by its extension")
            .and_then(|()| meshc::train::grad_cmd(&graph, &loss, &wrt, &o)),
        Cmd::Run { program, steps, codegen, run: run_args, .. } if steps.steps.is_some() => {
            train_run(&program, &steps, &codegen, &run_args)
        }
        Cmd::Run { program, io, run: run_args, compare_unpruned, conditional, codegen, mut pilot, .. } => {
            if conditional {
                pilot.inputs = io.inputs.clone();
            }
            unpruned_reference(&program, compare_unpruned.as_deref(), &pilot).and_then(|reference| {
                run(&program, &io, &run_args, &codegen, &pilot)?;
                match reference {
                    Some(r) => compare_with_unpruned(&program, &r, &io, &codegen, &pilot),
                    None => Ok(()),
                }
            })
        }
        Cmd::Generate { model, args, codegen, .. } => generate(&model, &args, codegen),
        Cmd::Inspect { artifact, json } => cli::inspect(&artifact, json),
        Cmd::Explain { graph, layout, json, onnx } => explain(&graph, &layout, json, &onnx),
    };
    cli::exit(result)
}

fn explain(path: &Path, layout: &Path, json: bool, onnx: &OnnxArgs) -> Result<()> {
    let GraphIn { graph: g, info, .. } = load_graph(path, onnx)?;
    let spec = meshc::layout::load(layout)?;
    let report = meshc::explain::explain(&g, &info, &spec).with_context(|| path.display().to_string())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        cli::print(&report.text());
    }
    Ok(())
}

/// Every param of `g`, and the weight files they were read from (opened once each).
fn load_params(g: &Graph, graph: &Path) -> Result<(HashMap<String, Tensor>, WeightFiles)> {
    let mut files = WeightFiles::new(base_dir(graph));
    let params = params::load_all_from(g, &mut files).map_err(|e| e.in_file(graph.display().to_string()))?;
    warn_nan_params(g, &params::Params::from(&params), graph)?;
    Ok((params, files))
}

/// `import MODEL -o GRAPH [--weights W]`.
/// Imports `model` and writes it to `out`, or lists its inputs and weights without it.
fn import(model: &Path, out: Option<&Path>, weights: Option<&Path>, onnx: &OnnxArgs) -> Result<()> {
    if !meshc_onnx::is_onnx(model) {
        bail!("{}: import reads an ONNX model (.onnx)", model.display());
    }
    // A graph whose shapes cannot be read over the symbols is refused here.
    let (mut imp, sym) = onnx.import(model)?;
    if let Some(si) = sym {
        let at: Vec<String> = si.symbols.keys().map(|n| format!("{n}={}", si.example[n])).collect();
        // The ranges go into the graph, so reading it back is symbolic without them; a
        // `--dim NAME=N` is a size the graph is simply written at.
        imp.graph.symbols = si.symbols.into_iter().filter(|(_, s)| !s.is_fixed()).collect();
        let declared: Vec<String> = imp.graph.symbols.values().map(ToString::to_string).collect();
        eprintln!(
            "note: written at {}; the graph declares {}, so its named dims stay symbolic (docs/dynamic-shapes.md)",
            at.join(", "),
            declared.join(", ")
        );
    }
    match out {
        Some(out) => meshc_onnx::write(&imp, out, weights),
        None => {
            print!("{}", meshc_onnx::list(&imp));
            Ok(())
        }
    }
}

/// What `check` found: the summary it prints, or with `--json` writes as JSON.
#[derive(serde::Serialize)]
struct CheckReport {
    graph: String,
    inputs: Vec<TensorLine>,
    outputs: Vec<TensorLine>,
    params: usize,
    param_bytes: usize,
    nodes: usize,
    ops: BTreeMap<&'static str, usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mesh: Option<MeshLine>,
    /// Without a placement: every tensor's layout.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    layouts: Vec<LayoutLine>,
    /// With a placement: per stage, its devices and its tensors' layouts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stages: Vec<StageLine>,
    /// With ranged `--dim`s: the symbols, with the graph's own size of each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    symbols: Vec<SymbolLine>,
    /// Every input's and node's shape over the symbols, in graph order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    symbolic_shapes: Vec<SymShapeLine>,
    /// What a call's sizes must meet beyond the bounds (empty: the bounds prove every shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_checks: Option<Vec<CheckLine>>,
}

#[derive(serde::Serialize)]
struct SymbolLine {
    name: String,
    lo: i64,
    hi: i64,
    multiple_of: i64,
    example: i64,
}

#[derive(serde::Serialize)]
struct SymShapeLine {
    tensor: String,
    dtype: String,
    shape: Vec<String>,
}

#[derive(serde::Serialize)]
struct CheckLine {
    check: String,
    node: String,
}

#[derive(serde::Serialize)]
struct TensorLine {
    name: String,
    #[serde(skip)]
    ty: TensorType,
    dtype: String,
    shape: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dims: Option<meshc_ir::graph::Dims>,
    /// With ranged `--dim`s: the shape over the symbols.
    #[serde(skip_serializing_if = "Option::is_none")]
    symbolic: Option<Vec<String>>,
}

#[derive(serde::Serialize)]
struct MeshLine {
    topology: &'static str,
    shape: Vec<usize>,
    axes: Vec<String>,
    devices: usize,
}

#[derive(serde::Serialize)]
struct LayoutLine {
    tensor: String,
    layout: String,
    origin: String,
}

#[derive(serde::Serialize)]
struct StageLine {
    devices: Vec<usize>,
    slice: String,
    nodes: usize,
    layouts: Vec<LayoutLine>,
}

fn check(path: &Path, layout: Option<&Path>, onnx: &OnnxArgs, as_json: bool) -> Result<()> {
    let GraphIn { graph: g, info, imported, sym } = load_graph_sym(path, onnx)?;
    if let (Some(_), Some(l)) = (&sym, layout) {
        bail!(
            "{}: layouts over ranged dims are a later stage; give each --dim a value (docs/dynamic-shapes.md)",
            l.display()
        );
    }
    let mut files = WeightFiles::new(base_dir(path));
    graph_params(&g, imported.as_ref(), &mut files, path)?;
    let tensor = |name: &str, ty: &TensorType, dims: Option<&meshc_ir::graph::Dims>| TensorLine {
        name: name.to_string(),
        ty: ty.clone(),
        dtype: ty.dtype.to_string(),
        shape: ty.shape.clone(),
        dims: dims.cloned(),
        symbolic: None,
    };
    let mut report = CheckReport {
        graph: g.name.clone(),
        inputs: g.inputs.iter().map(|i| tensor(&i.name, &i.ty, i.dims.as_ref())).collect(),
        outputs: g.outputs.iter().map(|o| tensor(&o.name, &info.types[&o.name], info.dims.get(&o.name))).collect(),
        params: g.params.len(),
        param_bytes: g.params.iter().map(|p| p.ty.size_bytes()).sum(),
        nodes: g.nodes.len(),
        ops: BTreeMap::new(),
        mesh: None,
        layouts: Vec::new(),
        stages: Vec::new(),
        symbols: Vec::new(),
        symbolic_shapes: Vec::new(),
        runtime_checks: None,
    };
    if let Some(si) = &sym {
        symbolic_report(&mut report, &g, &info, si);
    }
    for n in &g.nodes {
        *report.ops.entry(n.op.name()).or_default() += 1;
    }
    // Everything is checked before anything is printed: a bad spec leaves stdout empty.
    if let Some(p) = layout {
        let spec = meshc::layout::load(p)?;
        // With a placement, layouts are per stage, over each stage's sub-mesh.
        match meshc::passes::place::place(&g, &info, &spec)? {
            None => {
                let layouts = meshc::passes::layout::propagate(&g, &info, &spec.mesh, spec.seed_layouts(&g, &info)?);
                report.layouts = layout_lines(&g, &info, &layouts);
            }
            Some(placement) => {
                let (pg, pi) = placement.unrolled.as_ref().map_or((&g, &info), |(g, i)| (g, i));
                for (s, st) in placement.stages.iter().enumerate() {
                    let (sg, si) = placement.stage_graph(pg, pi, s)?;
                    let layouts = meshc::passes::layout::propagate(&sg, &si, &st.mesh.mesh, st.seeds(&sg, &si)?);
                    report.stages.push(StageLine {
                        devices: st.mesh.devices.clone(),
                        slice: st.slice.to_string(),
                        nodes: sg.nodes.len(),
                        layouts: layout_lines(&sg, &si, &layouts),
                    });
                }
            }
        }
        let m = &spec.mesh;
        report.mesh = Some(MeshLine {
            topology: m.topology.name(),
            shape: m.shape.clone(),
            axes: m.axes.clone(),
            devices: m.devices(),
        });
    }
    match as_json {
        true => println!("{}", serde_json::to_string_pretty(&report)?),
        false => cli::print(&check_text(&report)),
    }
    Ok(())
}

/// `check`'s symbols, the shapes over them and the run-time checks.
fn symbolic_report(report: &mut CheckReport, g: &Graph, info: &Info, si: &meshc_ir::sym::SymInfo) {
    report.symbols = si
        .symbols
        .values()
        .map(|s| SymbolLine {
            name: s.name.clone(),
            lo: s.lo,
            hi: s.hi,
            multiple_of: s.multiple_of,
            example: si.example[&s.name],
        })
        .collect();
    let shape = |t: &str| si.shapes[t].iter().map(|e| e.to_string()).collect::<Vec<String>>();
    for t in report.inputs.iter_mut().chain(report.outputs.iter_mut()) {
        t.symbolic = Some(shape(&t.name));
    }
    let names = g.inputs.iter().map(|i| &i.name).chain(info.order.iter().map(|&k| &g.nodes[k].name));
    report.symbolic_shapes = names
        .map(|n| SymShapeLine { tensor: n.clone(), dtype: info.types[n].dtype.to_string(), shape: shape(n) })
        .collect();
    report.runtime_checks =
        Some(si.checks.iter().map(|c| CheckLine { check: c.kind.to_string(), node: c.node.clone() }).collect());
}

/// `check`'s summary as text: one line per fact, one per tensor layout.
fn check_text(r: &CheckReport) -> String {
    let plural = |k: usize| if k == 1 { "" } else { "s" };
    let mut out = format!(
        "graph '{}': {} inputs, {} params ({} bytes), {} nodes, {} outputs\n",
        r.graph,
        r.inputs.len(),
        r.params,
        r.param_bytes,
        r.nodes,
        r.outputs.len()
    );
    let ops: Vec<String> = r.ops.iter().map(|(op, k)| format!("{op}×{k}")).collect();
    out += &format!("ops: {}\n", ops.join(", "));
    let ty = |t: &TensorLine| match &t.symbolic {
        Some(s) => format!("{}[{}]", t.dtype, s.join(", ")),
        None => t.ty.to_string(),
    };
    for i in &r.inputs {
        out += &format!("input  {}: {}\n", i.name, ty(i));
    }
    for o in &r.outputs {
        out += &format!("output {}: {}\n", o.name, ty(o));
    }
    for s in &r.symbols {
        let every = if s.multiple_of > 1 { format!(", multiples of {}", s.multiple_of) } else { String::new() };
        out += &format!("symbol {}: {}..{}{every} (the graph's size: {})\n", s.name, s.lo, s.hi, s.example);
    }
    for t in &r.symbolic_shapes {
        out += &format!("shape  {} {}[{}]\n", t.tensor, t.dtype, t.shape.join(", "));
    }
    match r.runtime_checks.as_deref() {
        Some([]) => out += "run-time checks: none (the bounds prove every shape)\n",
        Some(checks) => {
            for c in checks {
                out += &format!("run-time check: {} (node '{}')\n", c.check, c.node);
            }
        }
        None => {}
    }
    let Some(m) = &r.mesh else { return out };
    let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
    out += &format!(
        "mesh {} [{}] axes [{}] ({} device{})\n",
        m.topology,
        shape.join("x"),
        m.axes.join(", "),
        m.devices,
        plural(m.devices)
    );
    let line = |l: &LayoutLine, indent: &str| format!("{indent}layout {} {} ({})\n", l.tensor, l.layout, l.origin);
    for l in &r.layouts {
        out += &line(l, "");
    }
    for (s, st) in r.stages.iter().enumerate() {
        let devices: Vec<String> = st.devices.iter().map(usize::to_string).collect();
        out += &format!(
            "stage {s}: devices [{}] (slice {}), {} node{}\n",
            devices.join(","),
            st.slice,
            st.nodes,
            plural(st.nodes)
        );
        for l in &st.layouts {
            out += &line(l, "  ");
        }
    }
    out
}

/// `check`'s layout of every tensor of `g` (inputs, params, then nodes in order), and where
/// that came from.
fn layout_lines(g: &Graph, info: &Info, l: &meshc::passes::layout::Layouts) -> Vec<LayoutLine> {
    let names = g.inputs.iter().map(|i| &i.name).chain(g.params.iter().map(|p| &p.name));
    let names = names.chain(info.order.iter().map(|&k| &g.nodes[k].name));
    names
        .map(|n| LayoutLine { tensor: n.clone(), layout: l.mesh.layout_string(&l.of[n]), origin: l.origin(n) })
        .collect()
}

/// Refuses `-o -` (standard output) where the result must be a file, saying why.
fn to_file(o: &Path, why: &str) -> Result<()> {
    match o == Path::new("-") {
        true => bail!("-o -: standard output cannot take this ({why}); give a file name"),
        false => Ok(()),
    }
}

fn fmt(path: &Path, to: Format, out: Option<&Path>) -> Result<()> {
    let (g, _) = load::load(path)?;
    let s = match to {
        Format::Text => text::print(&g),
        Format::Json => json::print(&g),
    };
    // `-o -` is standard output too, through `Outputs` like any file.
    match out {
        Some(o) => {
            let mut out = Outputs::new();
            out.write_bytes(o, s.as_bytes())?;
            out.commit()
        }
        None => {
            print!("{s}");
            Ok(())
        }
    }
}

fn graph_inputs(g: &Graph) -> Vec<(String, TensorType)> {
    g.inputs.iter().map(|i| (i.name.clone(), i.ty.clone())).collect()
}

fn interp(path: &Path, io: &Io, onnx: &OnnxArgs) -> Result<()> {
    let GraphIn { graph: g, info, imported, sym } = load_graph_sym(path, onnx)?;
    let (g, info) = match &sym {
        Some(si) => bind_inputs(&g, si, &io.inputs)?,
        None => (g, info),
    };
    let mut values = read_inputs(&graph_inputs(&g), &io.inputs, false)?;
    values.extend(match imported {
        Some(p) => {
            warn_nan_params(&g, &params::Params::from(&p), path)?;
            p
        }
        None => load_params(&g, path)?.0,
    });
    let names: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let wanted = io.wanted(&names)?;
    let results = meshc_ir::interp::run(&g, &info.order, &info.types, values)
        .map_err(|e| e.in_file(path.display().to_string()))?;
    let mut out = Outputs::new();
    io.write(&mut out, wanted, &results)?;
    out.commit()
}

/// The graph at the sizes of the `--input` values: the symbols bound from their shapes and
/// checked (one line naming the input, the symbol and the bound), the graph written at them.
fn bind_inputs(g: &Graph, si: &meshc_ir::sym::SymInfo, inputs: &[String]) -> Result<(Graph, Info)> {
    let mut shapes: HashMap<String, Vec<usize>> = HashMap::new();
    for arg in inputs {
        let (name, file) = meshc_runtime::tools::cli::name_eq_file(arg, "--input")?;
        if g.inputs.iter().any(|i| i.name == name) {
            let t = Tensor::read_npy(Path::new(file)).with_context(|| format!("--input {name}"))?;
            shapes.insert(name.to_string(), t.shape);
        }
    }
    if let Some(i) = g.inputs.iter().find(|i| !shapes.contains_key(&i.name)) {
        let shape = meshc_ir::sym::infer::show(&si.shapes[&i.name]);
        bail!("missing --input {}=FILE.npy (the graph's input '{}' is {}{shape})", i.name, i.name, i.ty.dtype);
    }
    let at = meshc_ir::sym::bind(g, si, |n| shapes.get(n).map(Vec::as_slice)).map_err(anyhow::Error::msg)?;
    let g = meshc_ir::sym::specialise(g, si, &at).map_err(anyhow::Error::msg)?;
    let info = meshc_ir::verify::verify(&g)?;
    Ok((g, info))
}

/// `check --stop-after PASS`: the passes up to PASS compiled as `args` say, the IR after it
/// printed instead of the summary.
fn check_until(path: &Path, args: CodegenArgs, pass: &str, time: bool) -> Result<()> {
    let dumps = Dumps::default();
    let inst = Instrument::new(&dumps, Some(pass), time)?;
    compile_graph(path, &args, compile::Emit::Artifact, &inst, None).map(|_| ())
}

/// `keygen -o KEY`: the secret key to KEY (readable by its owner only) and the public key
/// to KEY.pub, refusing to replace an existing key.
fn keygen(out: &Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let public = PathBuf::from(format!("{}.pub", out.display()));
    let (secret_text, public_text) = signature::generate()?;
    for (path, text, mode) in [(out, &secret_text, 0o600), (public.as_path(), &public_text, 0o644)] {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .with_context(|| format!("{}: cannot write key (an existing key is never replaced)", path.display()))?;
    }
    eprintln!("wrote {} (secret: keep it private) and {}", out.display(), public.display());
    Ok(())
}

fn run(path: &Path, io: &Io, run_args: &RunArgs, args: &CodegenArgs, pilot: &PilotArgs) -> Result<()> {
    let file = path.display().to_string();
    if !is_artifact(path) && run_args.require_signature.is_some() {
        bail!("{file}: --require-signature: only artifacts are signed; this is a graph");
    }
    if is_artifact(path) && !pilot.inputs.is_empty() {
        bail!("{file}: --pilot-input and --conditional prune a graph as it is compiled; this is an artifact");
    }
    let mut loaded = if is_artifact(path) {
        if let Some(flag) = args.given() {
            bail!("{file}: {flag} applies when a graph is compiled; this artifact is already compiled");
        }
        cli::open(path, run_args)?
    } else {
        let (c, _) = compile_in_memory(path, args, Some(pilot))?;
        c.load().with_context(|| file.clone())?
    };
    cli::run(&mut loaded, io, run_args)
}

/// `generate MODEL --prompt IDS.npy ...` on an artifact, or on a graph compiled in memory.
fn generate(path: &Path, args: &GenerateArgs, mut codegen: CodegenArgs) -> Result<()> {
    let file = path.display().to_string();
    if is_artifact(path) {
        if let Some(flag) = codegen.given() {
            bail!("{file}: {flag} applies when a graph is compiled; this artifact is already compiled");
        }
        return meshc_runtime::tools::generate::generate(Source::File(path), None, args);
    }
    let compiled = |codegen: &CodegenArgs| -> Result<Vec<u8>> {
        let dumps = Dumps::default();
        let (c, _, _) = compile_graph(path, codegen, compile::Emit::Artifact, &Instrument::dumps(&dumps), None)?;
        meshc::artifact::artifact_bytes(&c.expect("only --stop-after stops the pipeline"))
    };
    if !meshc_onnx::is_onnx(path) {
        let bytes = compiled(&codegen)?;
        return meshc_runtime::tools::generate::generate(Source::Bytes { bytes: &bytes, name: &file }, None, args);
    }
    if codegen.onnx.decode_context.is_some() || args.prefill.is_some() {
        bail!("{file}: generate makes an ONNX decoder's decode step and prefill from --context and the prompt; give no --decode-context or --prefill");
    }
    // The decode step and the prefill of this prompt's length, both from the one file.
    let prompt = meshc_runtime::tools::generate::read_prompt(&args.prompt)?;
    codegen.onnx.decode_context = Some(args.context);
    codegen.onnx.decode_batch = Some(prompt.len());
    let step = compiled(&codegen)?;
    codegen.onnx.decode_prefill = Some(prompt.first().map_or(0, Vec::len));
    let prefill = compiled(&codegen)?;
    let name = format!("{file} (its prefill)");
    meshc_runtime::tools::generate::generate(
        Source::Bytes { bytes: &step, name: &file },
        Some(Source::Bytes { bytes: &prefill, name: &name }),
        args,
    )
}

/// The unpruned program `--compare-unpruned` names (empty: `path` compiled without the
/// pilot pass), checked before anything runs.
fn unpruned_reference(path: &Path, compare: Option<&str>, pilot: &PilotArgs) -> Result<Option<PathBuf>> {
    match compare {
        None => Ok(None),
        Some("") if is_artifact(path) => {
            bail!(
                "--compare-unpruned: {} is an artifact; name the unpruned one (--compare-unpruned=FILE)",
                path.display()
            )
        }
        Some("") if pilot.inputs.is_empty() => {
            bail!("--compare-unpruned: nothing is pruned without the pilot pass (--pilot-input NAME=FILE.npy)")
        }
        Some("") => Ok(Some(path.to_path_buf())),
        Some(file) if !Path::new(file).is_file() => bail!("--compare-unpruned {file}: no such file"),
        Some(file) => Ok(Some(PathBuf::from(file))),
    }
}

/// Runs `path` (pruned) and the unpruned `reference` on the inputs of `io`, and prints the
/// error of the one against the other.
fn compare_with_unpruned(path: &Path, reference: &Path, io: &Io, args: &CodegenArgs, pilot: &PilotArgs) -> Result<()> {
    let no_pilot = PilotArgs { inputs: Vec::new(), keep: None, threshold: None, ..pilot.clone() };
    let results = |p: &Path, pilot: &PilotArgs| -> Result<BTreeMap<String, Tensor>> {
        let name = p.display().to_string();
        let with = |loaded: &Loaded| -> Result<BTreeMap<String, Tensor>> {
            loaded.run(&read_inputs(&cli::expected_inputs(loaded), &io.inputs, loaded.meta.symbolic.is_some())?)
        };
        if is_artifact(p) {
            let art = Artifact::open_with(p, Verify::All)?;
            with(&load_artifact(art, &name)?)
        } else {
            let (c, _) = compile_in_memory(p, args, Some(pilot))?;
            with(&c.load().with_context(|| name.clone())?)
        }
    };
    let pruned = results(path, pilot)?;
    let unpruned =
        results(reference, &no_pilot).with_context(|| format!("--compare-unpruned {}", reference.display()))?;
    cli::print(
        &driver::compare(&pruned, &unpruned).with_context(|| format!("--compare-unpruned {}", reference.display()))?,
    );
    Ok(())
}

/// `run PROGRAM --steps N`: a training artifact from its initial state (its state
/// section) or a graph compiled in memory with --loss and --optimizer, or either from
/// `--resume CKPT`.
fn train_run(path: &Path, steps: &StepArgs, args: &CodegenArgs, run_args: &RunArgs) -> Result<()> {
    let file = path.display().to_string();
    let (mut loaded, init) = if is_artifact(path) {
        if let Some(flag) = args.given() {
            bail!("{file}: {flag} applies when a graph is compiled; this artifact is already compiled");
        }
        let loaded = cli::open(path, run_args)?;
        let init = State::initial(&loaded, &file)?;
        if init.is_none() {
            bail!("{file}: not a training artifact (it holds no initial state; compile with --loss NAME --optimizer SPEC)");
        }
        (loaded, init)
    } else {
        if args.train.loss.is_none() {
            bail!("{file}: --steps trains a graph compiled with --loss NAME --optimizer SPEC");
        }
        let (c, init) = compile_in_memory(path, args, None)?;
        (c.load().with_context(|| file.clone())?, init)
    };
    // --degrade, --timeout and --threads apply to every step.
    cli::configure(&mut loaded, run_args)?;
    let state = match &steps.resume {
        Some(ckpt) => State::read(ckpt)?,
        None => init.context("the program has no initial state")?,
    };
    let ckpt = steps.checkpoint.clone().unwrap_or_else(|| meshc::train::checkpoint_path(path));
    meshc_runtime::tools::steps::train(&loaded, state, steps, &ckpt).with_context(|| file.clone())?;
    if steps.checkpoint.is_none() {
        eprintln!("checkpoint: {} (no --checkpoint given)", ckpt.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every argument of every command says what it is for in `--help`.
    #[test]
    fn every_argument_has_help() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for cmd in cli.get_subcommands() {
            for arg in cmd.get_arguments().filter(|a| !matches!(a.get_id().as_str(), "help" | "version")) {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("meshc {} {}", cmd.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "arguments without help: {}", missing.join(", "));
    }
}
