//! The generate command shared by `meshc generate` and `meshc-run generate`: a decode-step
//! artifact (`crate::api::generate`) run on the prompts of an `.npy`, the new ids printed
//! one line per sequence or written as an `.npy`, the rate on stderr.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use meshc_ir::{Data, Tensor};

use crate::api::generate::{check_decode_step, GenerateOptions, Sampling};
use crate::api::model::Model;
use crate::api::session::Session;
use crate::comm::transport::Transport;
use crate::tools::cli::TransportKind;
use crate::tools::output::Outputs;

/// The flags of a generation.
#[derive(clap::Args, Clone, Debug)]
pub struct GenerateArgs {
    /// The prompts: int64 (or int32) token ids, [batch, prompt_len].
    #[arg(long, value_name = "IDS.npy")]
    pub prompt: PathBuf,
    /// How many tokens to generate after each prompt.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: usize,
    /// The positions a sequence may take, its prompt included (at most the model's).
    #[arg(long, value_name = "C")]
    pub context: usize,
    /// How each token is picked: greedy, temperature:T, top-k:K or top-p:P.
    #[arg(long, value_name = "HOW", default_value = "greedy", value_parser = |s: &str| s.parse::<Sampling>())]
    pub sample: Sampling,
    /// The seed of the sampling's random draws (the same seed, the same tokens).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Token ids that end a sequence, which keeps the stop id as its last.
    #[arg(long, value_name = "ID", num_args = 1..)]
    pub stop: Vec<i64>,
    /// Write the new ids as int64 [batch, N] .npy (-1 after a sequence's stop) instead of
    /// printing them, one line per sequence.
    #[arg(long, value_name = "OUT.npy")]
    pub output: Option<PathBuf>,
    /// Run the prompt in one call of this prefill artifact, which gives the caches' first
    /// positions (an ONNX decoder's is compiled with it: docs/generation.md).
    #[arg(long, value_name = "PREFILL.mshc")]
    pub prefill: Option<PathBuf>,
    /// How the hosts of an artifact compiled with "hosts" are joined: `in-process` (this
    /// process runs every device; the default) or `mpi` (under `mpirun -n HOSTS`, each rank
    /// runs its host's devices; rank 0 samples, prints the ids and writes --output; needs a
    /// meshc built with `--features mpi`).
    #[arg(long, value_enum, default_value_t = TransportKind::InProcess)]
    pub transport: TransportKind,
}

/// Where the artifact comes from: its file, or the bytes a compiler made in memory.
pub enum Source<'a> {
    File(&'a Path),
    Bytes { bytes: &'a [u8], name: &'a str },
}

/// The rows of token ids in the `.npy` at `prompt`: int64 or int32 `[batch, prompt_len]`.
pub fn read_prompt(prompt: &Path) -> Result<Vec<Vec<i64>>> {
    let ids = Tensor::read_npy(prompt).with_context(|| format!("--prompt {}", prompt.display()))?;
    match (&ids.data, ids.shape.as_slice()) {
        (Data::I64(_) | Data::I32(_), &[_, len]) => {
            Ok(ids.data.to_f64().chunks(len.max(1)).map(|r| r.iter().map(|&v| v as i64).collect()).collect())
        }
        _ => {
            bail!("--prompt {}: {} where token ids are int64 or int32 [batch, prompt_len]", prompt.display(), ids.ty())
        }
    }
}

impl Source<'_> {
    fn open(&self) -> Result<(Model, String)> {
        match self {
            Source::File(path) => Ok((Model::open(path)?, path.display().to_string())),
            Source::Bytes { bytes, name } => {
                Ok((Model::from_bytes(bytes).with_context(|| name.to_string())?, name.to_string()))
            }
        }
    }
}

/// Runs the generation `args` describe on the decode-step artifact `source`, with the
/// prompt run by `prefill` when given (else by `--prefill`'s artifact, if any).
pub fn generate(source: Source<'_>, prefill: Option<Source<'_>>, args: &GenerateArgs) -> Result<()> {
    match args.transport {
        TransportKind::InProcess => generate_here(source, prefill, args, None),
        TransportKind::Mpi => generate_mpi(source, prefill, args),
    }
}

/// `generate --transport mpi`: this process is one rank, running its host's devices. An
/// error on any rank is reported there and aborts the whole job (exit 1 from mpirun).
#[cfg(feature = "mpi")]
fn generate_mpi(source: Source<'_>, prefill: Option<Source<'_>>, args: &GenerateArgs) -> Result<()> {
    let (mpi, transport) = crate::comm::mpi::init()?;
    let transport: Arc<dyn Transport> = Arc::new(transport);
    let result = generate_here(source, prefill, args, Some(transport.clone()));
    let result = result.with_context(|| format!("host {}", transport.rank()));
    if let Err(e) = &result {
        super::cli::report(e);
        transport.abort();
    }
    // MPI_Finalize, once every device thread is parked.
    drop(mpi);
    result
}

#[cfg(not(feature = "mpi"))]
fn generate_mpi(_: Source<'_>, _: Option<Source<'_>>, _: &GenerateArgs) -> Result<()> {
    bail!(super::cli::NO_MPI)
}

/// The generation in this process: every device, or under `transport` this host's.
fn generate_here(
    source: Source<'_>,
    prefill: Option<Source<'_>>,
    args: &GenerateArgs,
    transport: Option<Arc<dyn Transport>>,
) -> Result<()> {
    let (model, file) = source.open()?;
    let mut session = Session::new(&model).with_context(|| file.clone())?;
    check_decode_step(&session).with_context(|| file.clone())?;
    let prefill = prefill.or(args.prefill.as_deref().map(Source::File)).map(|p| p.open()).transpose()?;
    let mut prefill = match &prefill {
        Some((model, name)) => Some((Session::new(model).with_context(|| name.clone())?, name)),
        None => None,
    };
    let rows = read_prompt(&args.prompt)?;
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        context: args.context,
        sampling: args.sample,
        seed: args.seed,
        stop: args.stop.clone(),
    };
    if let Some(t) = &transport {
        session.set_transport(t.clone()).with_context(|| file.clone())?;
        if let Some((p, name)) = &mut prefill {
            p.set_transport(t.clone()).with_context(|| name.to_string())?;
        }
        let parts = agreement(&session, prefill.as_ref().map(|p| &p.0), &rows, args);
        // Ranks may have compiled the model in memory first, some slower than others.
        session.loaded().agree(|| parts, std::time::Duration::from_secs(60))?;
    }
    let start = std::time::Instant::now();
    let generated = match &prefill {
        Some((p, name)) => {
            session.generate_with_prefill(p, &rows, &options).with_context(|| format!("{file} with {name}"))?
        }
        None => session.generate(&rows, &options).with_context(|| file.clone())?,
    };
    // Under hosts, host 0 has the ids (every host has the same: they were broadcast) and
    // reports them; the others ran along.
    if session.loaded().host() != 0 {
        return Ok(());
    }
    let secs = start.elapsed().as_secs_f64();
    let count: usize = generated.tokens.iter().map(Vec::len).sum();
    eprintln!(
        "{count} new tokens in {:.1} ms ({:.1} tokens/s; the prompt's {} included)",
        secs * 1e3,
        count as f64 / secs,
        if prefill.is_some() { "prefill" } else { "steps" }
    );
    match &args.output {
        Some(o) => {
            let mut out = Outputs::new();
            out.write_bytes(o, &generated.to_tensor().to_npy_bytes())?;
            out.commit()
        }
        None => {
            let lines: Vec<String> =
                (generated.tokens.iter()).map(|t| t.iter().map(i64::to_string).collect::<Vec<_>>().join(" ")).collect();
            super::cli::print(&(lines.join("\n") + "\n"));
            Ok(())
        }
    }
}

/// What the hosts of a generation must agree on before its first step (each part said of
/// a host that differs, as `crate::tools::cli::agreement`'s): the artifacts, the options
/// that decide the ids and the number of steps, and the prompt. A host given other stop
/// ids would stop after another step than host 0 and leave it waiting.
fn agreement(
    session: &Session,
    prefill: Option<&Session>,
    prompt: &[Vec<i64>],
    args: &GenerateArgs,
) -> Vec<(&'static str, [u8; 32])> {
    use sha2::{Digest, Sha256};
    let prefill = prefill.map(|p| p.loaded().digest()).unwrap_or_default();
    let options = (args.max_new_tokens, args.context, format!("{:?}", args.sample), args.seed, &args.stop);
    vec![
        ("runs another artifact", session.loaded().digest()),
        ("runs another prefill", prefill),
        (
            "was given other options (--max-new-tokens, --context, --sample, --seed, --stop)",
            Sha256::digest(format!("{options:?}")).into(),
        ),
        ("was given another prompt", Sha256::digest(format!("{prompt:?}")).into()),
    ]
}
