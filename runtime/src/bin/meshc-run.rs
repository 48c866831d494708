//! `meshc-run`: runs and inspects compiled artifacts with the runtime alone — no compiler,
//! no Cranelift. `meshc run ARTIFACT` and `meshc inspect` do the same through the compiler's
//! binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use meshc_runtime::tools::cli::{self, Io, RunArgs};
use meshc_runtime::tools::generate::{generate, GenerateArgs, Source};

#[derive(Parser)]
#[command(name = "meshc-run", version, about = "Run a meshc artifact (no compiler needed)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per process: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run an artifact.
    Run {
        /// An artifact (.mshc).
        artifact: PathBuf,
        #[command(flatten)]
        io: Io,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Generate tokens with a decode-step artifact (docs/generation.md).
    Generate {
        /// A decode-step artifact (.mshc).
        artifact: PathBuf,
        #[command(flatten)]
        args: GenerateArgs,
    },
    /// Describe an artifact: sections, inputs/outputs, kernels, buffers, steps.
    Inspect {
        /// The artifact (.mshc) to describe.
        artifact: PathBuf,
        /// Print the artifact as JSON: sections, signature, metadata and programs.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    meshc_runtime::tools::output::init();
    let cli: Cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let not_artifact = |artifact: &PathBuf| {
        Err(anyhow::anyhow!("{}: not a meshc artifact (meshc-run runs compiled artifacts only)", artifact.display()))
    };
    cli::exit(match cli.cmd {
        Cmd::Run { artifact, .. } | Cmd::Generate { artifact, .. } if !cli::is_artifact(&artifact) => {
            not_artifact(&artifact)
        }
        Cmd::Run { artifact, io, run } => {
            cli::open(&artifact, &run).and_then(|mut loaded| cli::run(&mut loaded, &io, &run))
        }
        Cmd::Generate { artifact, args } => generate(Source::File(&artifact), None, &args),
        Cmd::Inspect { artifact, json } => cli::inspect(&artifact, json),
    })
}
