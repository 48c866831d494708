//! The `meshc` command line: argument parsing and one function per subcommand. Every user
//! error leaves as one line on stderr with exit status 1.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use meshc::artifact::{self, Artifact, Verify};
use meshc::runner::{Code, Loaded};
use meshc::{codegen, compile, driver};
use meshc_ir::{json, load, params, text, verify::Info, Graph, Tensor, TensorType};

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
        graph: PathBuf,
        /// Also validate a layout spec against the graph and print the layouts it fixes.
        #[arg(long, value_name = "SPEC")]
        layout: Option<PathBuf>,
    },
    /// Convert a graph between the JSON and text formats.
    Fmt {
        graph: PathBuf,
        #[arg(long, value_enum)]
        to: Format,
        /// Write here instead of stdout.
        #[arg(short)]
        o: Option<PathBuf>,
    },
    /// Run a graph on the reference interpreter.
    Interp {
        graph: PathBuf,
        #[command(flatten)]
        io: Io,
    },
    /// Compile a graph into one mmap-loadable artifact.
    Compile {
        graph: PathBuf,
        #[arg(short, value_name = "OUT.mshc")]
        o: PathBuf,
        #[command(flatten)]
        codegen: CodegenArgs,
        /// Also write a make-style depfile listing every file the artifact is built from.
        #[arg(long = "MF", value_name = "DEPFILE")]
        depfile: Option<PathBuf>,
        /// Print the IR after a pass (verify, layout, lower, pilot, buffers, or all); may be repeated.
        #[arg(long, value_name = "PASS", value_delimiter = ',')]
        dump_after: Vec<String>,
        /// Write the dumps to DIR/NN-PASS.txt instead of stdout.
        #[arg(long, value_name = "DIR")]
        dump_dir: Option<PathBuf>,
        #[command(flatten)]
        pilot: PilotArgs,
    },
    /// Run an artifact (or compile a graph in memory and run it).
    Run {
        /// An artifact (.mshc) or a graph file.
        program: PathBuf,
        #[command(flatten)]
        io: Io,
        /// Run N more times and print min/median/max latency and GFLOP/s.
        #[arg(long, value_name = "N")]
        bench: Option<usize>,
        /// Skip the weights checksum when opening an artifact (load time independent of size).
        #[arg(long)]
        trust_weights: bool,
        /// Compare every output with DIR/NAME.npy (e.g. the interpreter's or numpy's) and fail
        /// unless |got - want| <= 1e-5 + 1e-4·|want| everywhere (non-f32 outputs: exactly).
        #[arg(long, value_name = "DIR")]
        check_against: Option<PathBuf>,
        /// Write a Chrome/Perfetto trace of the (first) run: a track per device, an event per
        /// step, and the waits inside collectives.
        #[arg(long, value_name = "FILE.json")]
        trace: Option<PathBuf>,
        /// After the run, print the bytes each mesh link carried, and the maximum.
        #[arg(long)]
        link_stats: bool,
        /// Treat a device as failed (coordinates, e.g. 1,2); may be repeated. All-reduces over
        /// the whole mesh route around it and leave out its operand.
        #[arg(long, value_name = "DEVICE")]
        degrade: Vec<String>,
        /// Treat the link between two neighbouring devices as failed (e.g. 0,0:0,1); may be
        /// repeated.
        #[arg(long, value_name = "A:B")]
        degrade_link: Vec<String>,
        /// Treat partially degraded devices (a failed link, or all neighbours along a
        /// dimension degraded) as failed.
        #[arg(long)]
        degrade_strict: bool,
        /// Make a device stop answering when it reaches its STEP-th collective (from 0), to
        /// test detection (e.g. 1,2@0).
        #[arg(long, value_name = "DEVICE@STEP")]
        fail_device: Option<String>,
        /// When a device is found silent, degrade it and run the whole graph again without
        /// it (data-parallel layouts).
        #[arg(long)]
        replan_on_failure: bool,
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
        /// How long a device waits for a peer — a recv for its send (or a send for its recv),
        /// a collective for a member that shows no sign of life — before the run fails
        /// instead of hanging; the error names the key or member and the devices.
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
        timeout: f64,
        /// The most cores a one-device run uses: its large elementwise and reduction kernels
        /// split into that many parts and its library GEMMs fork that many threads (default:
        /// every core; results are the same for any N). Mesh runs use one core per stream.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        threads: Option<u32>,
        #[command(flatten)]
        codegen: CodegenArgs,
        #[command(flatten)]
        pilot: PilotArgs,
    },
    /// Describe an artifact: sections, inputs/outputs, kernels, buffers, steps.
    Inspect { artifact: PathBuf },
}

#[derive(clap::Args)]
struct CodegenArgs {
    /// A layout spec (meshc-layout/1): the mesh and how tensors are split over it.
    #[arg(long, value_name = "SPEC")]
    layout: Option<PathBuf>,
    /// native (this CPU's features), x86-64-v2 or x86-64-v3.
    #[arg(long, default_value = "native")]
    target: String,
    /// Which implementation serves matmuls (auto: the faster for each shape).
    #[arg(long, value_enum, default_value = "auto")]
    gemm: GemmArg,
    /// Run each device's steps on one stream (no communication stream, no events).
    #[arg(long, conflicts_with = "compute_streams")]
    single_stream: bool,
    /// Compute streams per device, for independent branches (beside the communication stream).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    compute_streams: u16,
    /// Which collectives run on the communication stream: those with compute to overlap, or all.
    #[arg(long, value_enum, default_value = "auto", conflicts_with = "single_stream")]
    comm_stream: CommArg,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CommArg {
    Auto,
    Always,
}

#[derive(Clone, Copy, ValueEnum)]
enum GemmArg {
    Auto,
    Cranelift,
    Library,
}

impl CodegenArgs {
    fn options(&self) -> compile::Options {
        let gemm = match self.gemm {
            GemmArg::Auto => compile::Gemm::Auto,
            GemmArg::Cranelift => compile::Gemm::Cranelift,
            GemmArg::Library => compile::Gemm::Library,
        };
        let streams = meshc::passes::streams::Config {
            single: self.single_stream,
            compute_streams: self.compute_streams.into(),
            comm_always: self.comm_stream == CommArg::Always,
        };
        compile::Options { target: self.target.clone(), gemm, streams, ..Default::default() }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn main() -> ExitCode {
    // `-MF DEPFILE` is the compiler-driver spelling build systems know (gcc, clang); clap
    // has no two-letter short flags, so it is read as `--MF`.
    let args = std::env::args_os().map(|a| if a == "-MF" { "--MF".into() } else { a });
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let rendered = e.to_string();
            eprintln!(
                "{}",
                rendered.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect::<Vec<_>>().join(" ")
            );
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.cmd {
        Cmd::Check { graph, layout } => check(&graph, layout.as_deref()),
        Cmd::Fmt { graph, to, o } => fmt(&graph, to, o.as_deref()),
        Cmd::Interp { graph, io } => interp(&graph, &io),
        Cmd::Compile { graph, o, codegen, depfile, dump_after, dump_dir, pilot } => {
            driver::Dumps::new(dump_after, dump_dir)
                .and_then(|dumps| compile_cmd(&graph, &o, &codegen, depfile.as_deref(), &dumps, &pilot))
        }
        Cmd::Run {
            program,
            io,
            bench,
            trust_weights,
            check_against,
            trace,
            link_stats,
            degrade,
            degrade_link,
            degrade_strict,
            fail_device,
            replan_on_failure,
            compare_unpruned,
            conditional,
            timeout,
            threads,
            codegen,
            mut pilot,
        } => {
            if conditional {
                pilot.inputs = io.inputs.clone();
            }
            let opts = RunOpts {
                bench,
                trust_weights,
                check_against: check_against.as_deref(),
                trace: trace.as_deref(),
                link_stats,
                degrade: &degrade,
                degrade_link: &degrade_link,
                degrade_strict,
                fail_device: fail_device.as_deref(),
                replan_on_failure,
                timeout,
                threads,
            };
            unpruned_reference(&program, compare_unpruned.as_deref(), &pilot).and_then(|reference| {
                run(&program, &io, &opts, &codegen, &pilot)?;
                match reference {
                    Some(r) => compare_with_unpruned(&program, &r, &io, &codegen, &pilot),
                    None => Ok(()),
                }
            })
        }
        Cmd::Inspect { artifact } => inspect(&artifact),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // anyhow's alternate form joins the context chain on one line.
            eprintln!(
                "error: {}",
                format!("{e:#}")
                    .chars()
                    .flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] })
                    .collect::<String>()
            );
            ExitCode::FAILURE
        }
    }
}

fn base_dir(graph: &Path) -> &Path {
    graph.parent().unwrap_or(Path::new("."))
}

fn load_params(g: &Graph, graph: &Path) -> Result<HashMap<String, Tensor>> {
    Ok(params::load_all(g, base_dir(graph)).map_err(|e| e.in_file(graph.display().to_string()))?)
}

fn check(path: &Path, layout: Option<&Path>) -> Result<()> {
    let (g, info) = load::load(path)?;
    let params = load_params(&g, path)?;
    // Everything is checked before anything is printed: a bad spec leaves stdout empty.
    let layouts = layout
        .map(|p| -> Result<_> {
            let spec = meshc::layout::load(p)?;
            // With a placement, layouts are per stage, over each stage's sub-mesh.
            let Some(placement) = meshc::passes::place::place(&g, &info, &spec)? else {
                let seeds = spec.seed_layouts(&g, &info)?;
                return Ok((spec.mesh, seeds, Vec::new()));
            };
            let (pg, pi) = placement.unrolled.as_ref().map_or((&g, &info), |(g, i)| (g, i));
            let mut stages = Vec::new();
            for (s, st) in placement.stages.iter().enumerate() {
                let (sg, si) = placement.stage_graph(pg, pi, s)?;
                let seeds = st.seeds(&sg, &si)?;
                let devices: Vec<String> = st.mesh.devices.iter().map(usize::to_string).collect();
                let mut lines = vec![format!(
                    "stage {s}: devices [{}] (slice {}), {} node{}",
                    devices.join(","),
                    st.slice,
                    sg.nodes.len(),
                    if sg.nodes.len() == 1 { "" } else { "s" }
                )];
                let m = &st.mesh.mesh;
                lines.extend(
                    seeds
                        .iter()
                        .map(|(n, sd)| format!("  layout {n} {} ({})", m.layout_string(&sd.layout), sd.source.name())),
                );
                stages.extend(lines);
            }
            Ok((spec.mesh, BTreeMap::new(), stages))
        })
        .transpose()?;
    let param_bytes: usize = params.values().map(|t| t.ty().size_bytes()).sum();
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &g.nodes {
        *ops.entry(n.op.name()).or_default() += 1;
    }
    let ops: Vec<String> = ops.iter().map(|(op, k)| format!("{op}×{k}")).collect();
    println!(
        "graph '{}': {} inputs, {} params ({} bytes), {} nodes, {} outputs",
        g.name,
        g.inputs.len(),
        g.params.len(),
        param_bytes,
        g.nodes.len(),
        g.outputs.len()
    );
    println!("ops: {}", ops.join(", "));
    for i in &g.inputs {
        println!("input  {}: {}", i.name, i.ty);
    }
    for o in &g.outputs {
        println!("output {}: {}", o.name, info.types[&o.name]);
    }
    if let Some((m, seeds, stages)) = layouts {
        let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
        let devices = m.devices();
        println!(
            "mesh {} [{}] axes [{}] ({devices} device{})",
            m.topology.name(),
            shape.join("x"),
            m.axes.join(", "),
            if devices == 1 { "" } else { "s" }
        );
        for (name, seed) in &seeds {
            println!("layout {name} {} ({})", m.layout_string(&seed.layout), seed.source.name());
        }
        for line in stages {
            println!("{line}");
        }
    }
    Ok(())
}

fn fmt(path: &Path, to: Format, out: Option<&Path>) -> Result<()> {
    let (g, _) = load::load(path)?;
    let s = match to {
        Format::Text => text::print(&g),
        Format::Json => json::print(&g),
    };
    match out {
        Some(o) => std::fs::write(o, s).with_context(|| format!("{}: cannot write", o.display()))?,
        None => print!("{s}"),
    }
    Ok(())
}

/// Splits `NAME=FILE`.
fn name_eq_file<'a>(arg: &'a str, flag: &str) -> Result<(&'a str, &'a str)> {
    match arg.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n, f)),
        _ => bail!("{flag} '{arg}': expected NAME=FILE.npy"),
    }
}

/// Reads the `--input` values and checks them against the expected inputs: every input
/// given once, nothing else, each with the declared dtype and shape.
fn read_inputs(expected: &[(String, TensorType)], args: &[String]) -> Result<HashMap<String, Tensor>> {
    let mut values = HashMap::new();
    for arg in args {
        let (name, file) = name_eq_file(arg, "--input")?;
        let Some((_, ty)) = expected.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
            bail!("--input {name}: the graph has no input '{name}' (its inputs: {})", names.join(", "));
        };
        let t = Tensor::read_npy(Path::new(file)).with_context(|| format!("--input {name}"))?;
        if t.ty() != *ty {
            bail!("--input {name}: {file} holds {}, the graph expects {ty}", t.ty());
        }
        if values.insert(name.to_string(), t).is_some() {
            bail!("--input {name} is given twice");
        }
    }
    if let Some((name, ty)) = expected.iter().find(|(n, _)| !values.contains_key(n)) {
        bail!("missing --input {name}=FILE.npy (the graph's input '{name}' is {ty})");
    }
    Ok(values)
}

fn graph_inputs(g: &Graph) -> Vec<(String, TensorType)> {
    g.inputs.iter().map(|i| (i.name.clone(), i.ty.clone())).collect()
}

/// The `--input`/`--output`/`--output-dir` arguments of `interp` and `run`.
#[derive(clap::Args)]
struct Io {
    /// An input value: NAME=FILE.npy (repeat for each input).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Write one output: NAME=FILE.npy (repeatable).
    #[arg(long = "output", value_name = "NAME=FILE.npy", conflicts_with = "output_dir")]
    outputs: Vec<String>,
    /// Write every output to DIR/NAME.npy.
    #[arg(long)]
    output_dir: Option<PathBuf>,
}

impl Io {
    /// The `--output NAME=FILE` requests, checked against the output names.
    fn wanted(&self, names: &[&str]) -> Result<Vec<(String, PathBuf)>> {
        let mut wanted = Vec::new();
        for arg in &self.outputs {
            let (name, file) = name_eq_file(arg, "--output")?;
            if !names.contains(&name) {
                bail!("--output {name}: the graph has no output '{name}' (its outputs: {})", names.join(", "));
            }
            wanted.push((name.to_string(), PathBuf::from(file)));
        }
        Ok(wanted)
    }

    /// Writes the results as asked, or prints a summary of each when nothing was asked.
    fn write(&self, mut wanted: Vec<(String, PathBuf)>, results: &BTreeMap<String, Tensor>) -> Result<()> {
        if let Some(dir) = &self.output_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create directory", dir.display()))?;
            wanted = results.keys().map(|k| (k.clone(), dir.join(format!("{k}.npy")))).collect();
        }
        for (name, file) in &wanted {
            results[name].write_npy(file)?;
        }
        if wanted.is_empty() {
            for (name, t) in results {
                println!("{name}: {}", summary(t));
            }
        }
        Ok(())
    }
}

fn interp(path: &Path, io: &Io) -> Result<()> {
    let (g, info): (Graph, Info) = load::load(path)?;
    let mut values = read_inputs(&graph_inputs(&g), &io.inputs)?;
    values.extend(load_params(&g, path)?);
    let names: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let wanted = io.wanted(&names)?;
    let results = meshc_ir::interp::run(&g, &info.order, &info.types, values)
        .map_err(|e| e.in_file(path.display().to_string()))?;
    io.write(wanted, &results)
}

/// The pilot pass's flags (seed 003): masks computed on pilot inputs prune the graph, and
/// the artifact's matmuls skip the pruned blocks (`--dump-after pilot` shows them).
#[derive(clap::Args, Clone)]
struct PilotArgs {
    /// Run the pilot pass on this input value, NAME=FILE.npy (every graph input once per
    /// pilot run; repeat the whole set for several runs); its masks prune the graph.
    #[arg(long = "pilot-input", id = "pilot_inputs", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Keep this fraction (0 < F <= 1) of each prunable weight's blocks, highest priority first.
    #[arg(long = "pilot-keep", value_name = "F", conflicts_with = "threshold")]
    keep: Option<f64>,
    /// Instead keep the blocks whose priority exceeds T times the weight's largest.
    #[arg(long = "pilot-threshold", value_name = "T")]
    threshold: Option<f64>,
    /// The simplified graph: bits:N (mantissa bits kept), exponent (sign and power of two),
    /// or downsample:AXIS:F (pilot inputs averaged over F along AXIS).
    #[arg(long = "pilot-simplify", value_name = "HOW", default_value = "bits:7")]
    simplify: String,
    /// Output columns per block (default: 4 micro-panels of the matmul kernel).
    #[arg(long = "pilot-block", value_name = "N", default_value_t = meshc::passes::pilot::DEFAULT_BLOCK)]
    block: usize,
}

impl PilotArgs {
    /// The pass's configuration, or None without `--pilot-input`.
    fn config(&self, g: &Graph) -> Result<Option<meshc::passes::pilot::Config>> {
        use meshc::passes::pilot::{Config, Select, Simplify};
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

fn compile_graph(
    path: &Path,
    args: &CodegenArgs,
    dumps: &driver::Dumps,
    pilot: Option<&PilotArgs>,
) -> Result<(Graph, compile::Compiled)> {
    let (g, info) = load::load(path)?;
    let spec = args.layout.as_deref().map(meshc::layout::load).transpose()?;
    let params = load_params(&g, path)?;
    let pilot = pilot.map(|p| p.config(&g)).transpose()?.flatten();
    let compiled = driver::build(&g, &info, spec.as_ref(), &params, &args.options(), dumps, pilot.as_ref())
        .with_context(|| path.display().to_string())?;
    Ok((g, compiled))
}

fn compile_cmd(
    path: &Path,
    out: &Path,
    args: &CodegenArgs,
    depfile: Option<&Path>,
    dumps: &driver::Dumps,
    pilot: &PilotArgs,
) -> Result<()> {
    let (g, compiled) = compile_graph(path, args, dumps, Some(pilot))?;
    if let Some(report) = driver::flops_skipped(&compiled.programs, compiled.meta.flops) {
        eprintln!("{report}");
    }
    driver::write_artifact(&compiled, out)?;
    if let Some(d) = depfile {
        std::fs::write(d, driver::depfile(out, &driver::dependencies(path, &g, args.layout.as_deref())))
            .with_context(|| format!("{}: cannot write depfile", d.display()))?;
    }
    Ok(())
}

fn is_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == artifact::MAGIC
}

/// The options of `run` beyond inputs and outputs.
struct RunOpts<'a> {
    bench: Option<usize>,
    trust_weights: bool,
    check_against: Option<&'a Path>,
    trace: Option<&'a Path>,
    link_stats: bool,
    degrade: &'a [String],
    degrade_link: &'a [String],
    degrade_strict: bool,
    fail_device: Option<&'a str>,
    replan_on_failure: bool,
    timeout: f64,
    threads: Option<u32>,
}

fn run(path: &Path, io: &Io, opts: &RunOpts, args: &CodegenArgs, pilot: &PilotArgs) -> Result<()> {
    let file = path.display().to_string();
    if is_artifact(path) && !pilot.inputs.is_empty() {
        bail!("{file}: --pilot-input and --conditional prune a graph as it is compiled; this is an artifact");
    }
    if is_artifact(path) {
        let art = Artifact::open_with(path, if opts.trust_weights { Verify::SkipBulk } else { Verify::All })?;
        let mut loaded = driver::load_artifact(&art, &file)?;
        configure(&mut loaded, opts)?;
        run_replanning(&mut loaded, io, opts)
    } else {
        let (_, c) = compile_graph(path, args, &driver::Dumps::default(), Some(pilot))?;
        let code = Code::Copied(codegen::ExecCode::new(&c.code)?);
        let weights = meshc::runner::AlignedBuf::from_bytes(&c.weights)?;
        let mut loaded = Loaded::new(c.meta, c.programs, code, weights.as_slice()).with_context(|| file.clone())?;
        configure(&mut loaded, opts)?;
        run_replanning(&mut loaded, io, opts)
    }
}

/// `run_loaded`, and with `--replan-on-failure`, once more without the devices a failed run
/// found silent (they are degraded: the collectives are re-planned around them).
fn run_replanning(loaded: &mut Loaded, io: &Io, opts: &RunOpts) -> Result<()> {
    match run_loaded(loaded, io, opts) {
        Err(e) if opts.replan_on_failure && !loaded.failed_devices().is_empty() => {
            let dead = loaded.failed_devices();
            let names: Vec<String> =
                dead.iter().map(|&d| meshc::degraded::coords_string(&loaded.meta.mesh, d)).collect();
            eprintln!("{e:#}: re-planning without {} and running again", names.join(", "));
            let deg = meshc::degraded::Degradation { nodes: dead, ..Default::default() };
            loaded.degrade(&deg, opts.degrade_strict).context("--replan-on-failure")?;
            run_loaded(loaded, io, opts)
        }
        r => r,
    }
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
            let expected: Vec<(String, TensorType)> =
                loaded.meta.inputs.iter().filter_map(|s| Some((s.name.clone(), s.ty()?))).collect();
            loaded.run(&read_inputs(&expected, &io.inputs)?)
        };
        if is_artifact(p) {
            let art = Artifact::open_with(p, Verify::All)?;
            with(&driver::load_artifact(&art, &name)?)
        } else {
            let (_, c) = compile_graph(p, args, &driver::Dumps::default(), Some(pilot))?;
            let weights = meshc::runner::AlignedBuf::from_bytes(&c.weights)?;
            let code = Code::Copied(codegen::ExecCode::new(&c.code)?);
            with(&Loaded::new(c.meta, c.programs, code, weights.as_slice()).with_context(|| name.clone())?)
        }
    };
    let pruned = results(path, pilot)?;
    let unpruned =
        results(reference, &no_pilot).with_context(|| format!("--compare-unpruned {}", reference.display()))?;
    print!(
        "{}",
        driver::compare(&pruned, &unpruned).with_context(|| format!("--compare-unpruned {}", reference.display()))?
    );
    Ok(())
}

/// The run options that set up loaded programs before they run: `--degrade`,
/// `--degrade-link` and `--degrade-strict` re-plan the collectives; `--fail-device` and
/// `--timeout` inject and detect failures; `--threads` caps the cores of a one-device run.
fn configure(loaded: &mut Loaded, opts: &RunOpts) -> Result<()> {
    loaded.set_collective_timeout(timeout(opts)?);
    if let Some(n) = opts.threads {
        loaded.set_threads(n as usize);
    }
    if !opts.degrade.is_empty() || !opts.degrade_link.is_empty() || opts.degrade_strict {
        let deg = meshc::degraded::Degradation::from_args(&loaded.meta.mesh, opts.degrade, opts.degrade_link)
            .context("--degrade")?;
        loaded.degrade(&deg, opts.degrade_strict).context("--degrade")?;
    }
    if let Some(f) = opts.fail_device {
        let (device, step) = f
            .split_once('@')
            .and_then(|(d, s)| Some((d, s.trim().parse::<usize>().ok()?)))
            .ok_or_else(|| anyhow!("--fail-device '{f}': expected DEVICE@STEP such as 1,2@0"))?;
        let d = meshc::degraded::Degradation::from_args(&loaded.meta.mesh, &[device.to_string()], &[])
            .context("--fail-device")?;
        loaded.fail_device(d.nodes[0], step).context("--fail-device")?;
    }
    Ok(())
}

/// Compares each result with DIR/NAME.npy under the tolerance of `Tensor::closeness` and
/// prints the worst error per output.
fn check_against(results: &BTreeMap<String, Tensor>, dir: &Path) -> Result<()> {
    let mut failed = Vec::new();
    for (name, got) in results {
        let file = dir.join(format!("{name}.npy"));
        let want = Tensor::read_npy(&file)?;
        if want.ty() != got.ty() {
            bail!("--check-against: {} holds {}, output '{name}' is {}", file.display(), want.ty(), got.ty());
        }
        let c = got.closeness(&want);
        let ok = c.first_bad.is_none();
        println!(
            "check {name}: max abs error {:.3e} against {} ({})",
            c.max_abs_err,
            file.display(),
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failed.push(name.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("outputs {} differ from {} beyond 1e-5 + 1e-4·|want|", failed.join(", "), dir.display());
    }
    Ok(())
}

/// `--timeout`: one bound on every wait for a peer, transfers and collectives alike.
fn timeout(opts: &RunOpts) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(opts.timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| anyhow!("--timeout {}: expected a positive number of seconds", opts.timeout))
}

fn run_loaded(loaded: &Loaded, io: &Io, opts: &RunOpts) -> Result<()> {
    loaded.set_timeout(timeout(opts)?);
    let expected: Vec<(String, TensorType)> =
        loaded.meta.inputs.iter().filter_map(|s| Some((s.name.clone(), s.ty()?))).collect();
    let inputs = read_inputs(&expected, &io.inputs)?;
    let names: Vec<&str> = loaded.meta.outputs.iter().map(|o| o.name.as_str()).collect();
    let wanted = io.wanted(&names)?;
    let results = match opts.trace {
        None => loaded.run(&inputs)?,
        Some(file) => {
            let mut times = Vec::new();
            let results = loaded.run_timed(&inputs, &mut |t| times.push(t.clone()))?;
            std::fs::write(file, meshc::trace::chrome_trace(&loaded.meta, &loaded.programs, &times))
                .with_context(|| format!("{}: cannot write", file.display()))?;
            results
        }
    };
    let links = opts.link_stats.then(|| loaded.link_stats());
    if let Some(dir) = opts.check_against {
        check_against(&results, dir)?;
    }
    if let Some(n) = opts.bench {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            let t = std::time::Instant::now();
            loaded.run(&inputs)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        eprintln!(
            "bench: {} runs, latency min {:.3} ms, median {:.3} ms, max {:.3} ms, {:.2} GFLOP/s (median, {} FLOPs)",
            times.len(),
            times[0] * 1e3,
            med * 1e3,
            times[times.len() - 1] * 1e3,
            loaded.meta.flops as f64 / med / 1e9,
            loaded.meta.flops
        );
    }
    io.write(wanted, &results)?;
    if let Some(links) = links {
        print!("{}", links.report());
    }
    Ok(())
}

fn inspect(path: &Path) -> Result<()> {
    let art = Artifact::open_with(path, Verify::All)?;
    print!("{}", driver::inspect(&art, &path.display().to_string())?);
    Ok(())
}

/// A one-line look at a tensor: type and its first values.
fn summary(t: &Tensor) -> String {
    let v = t.data.to_f64();
    let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    format!("{} [{}{}]", t.ty(), head.join(", "), if v.len() > 6 { ", ..." } else { "" })
}
