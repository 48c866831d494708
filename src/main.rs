//! The `meshc` command line: argument parsing and one function per subcommand. Every user
//! error leaves as one line on stderr with exit status 1.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use meshc_ir::{json, load, params, text, verify::Info, Graph, Tensor};

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
    Check { graph: PathBuf },
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
        /// An input value: NAME=FILE.npy (repeat for each input).
        #[arg(long = "input", value_name = "NAME=FILE.npy")]
        inputs: Vec<String>,
        /// Write one output: NAME=FILE.npy (repeatable).
        #[arg(long = "output", value_name = "NAME=FILE.npy", conflicts_with = "output_dir")]
        outputs: Vec<String>,
        /// Write every output to DIR/NAME.npy.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
        Cmd::Check { graph } => check(&graph),
        Cmd::Fmt { graph, to, o } => fmt(&graph, to, o.as_deref()),
        Cmd::Interp { graph, inputs, outputs, output_dir } => interp(&graph, &inputs, &outputs, output_dir.as_deref()),
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

fn check(path: &Path) -> Result<()> {
    let (g, info) = load::load(path)?;
    let params = load_params(&g, path)?;
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

/// Reads the `--input` values and checks them against the graph's inputs: every input
/// given once, nothing else, each with the declared dtype and shape.
fn read_inputs(g: &Graph, args: &[String]) -> Result<HashMap<String, Tensor>> {
    let mut values = HashMap::new();
    for arg in args {
        let (name, file) = name_eq_file(arg, "--input")?;
        let Some(input) = g.inputs.iter().find(|i| i.name == name) else {
            let names: Vec<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
            bail!("--input {name}: the graph has no input '{name}' (its inputs: {})", names.join(", "));
        };
        let t = Tensor::read_npy(Path::new(file)).with_context(|| format!("--input {name}"))?;
        if t.ty() != input.ty {
            bail!("--input {name}: {file} holds {}, the graph expects {}", t.ty(), input.ty);
        }
        if values.insert(name.to_string(), t).is_some() {
            bail!("--input {name} is given twice");
        }
    }
    if let Some(missing) = g.inputs.iter().find(|i| !values.contains_key(&i.name)) {
        bail!("missing --input {}=FILE.npy (the graph's input '{}' is {})", missing.name, missing.name, missing.ty);
    }
    Ok(values)
}

fn interp(path: &Path, inputs: &[String], outputs: &[String], output_dir: Option<&Path>) -> Result<()> {
    let (g, info): (Graph, Info) = load::load(path)?;
    let mut values = read_inputs(&g, inputs)?;
    values.extend(load_params(&g, path)?);
    let mut wanted = Vec::new();
    for arg in outputs {
        let (name, file) = name_eq_file(arg, "--output")?;
        if !g.outputs.iter().any(|o| o.name == name) {
            bail!(
                "--output {name}: the graph has no output '{name}' (its outputs: {})",
                g.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
            );
        }
        wanted.push((name.to_string(), PathBuf::from(file)));
    }
    let results = meshc_ir::interp::run(&g, &info.order, &info.types, values)
        .map_err(|e| e.in_file(path.display().to_string()))?;
    if let Some(dir) = output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create directory", dir.display()))?;
        wanted = results.keys().map(|k| (k.clone(), dir.join(format!("{k}.npy")))).collect();
    }
    for (name, file) in &wanted {
        results[name].write_npy(file)?;
    }
    if wanted.is_empty() {
        for (name, t) in &results {
            println!("{name}: {}", summary(t));
        }
    }
    Ok(())
}

/// A one-line look at a tensor: type and its first values.
fn summary(t: &Tensor) -> String {
    let v = t.data.to_f64();
    let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    format!("{} [{}{}]", t.ty(), head.join(", "), if v.len() > 6 { ", ..." } else { "" })
}
