//! The command-line pieces of running an artifact, shared by `meshc-run` (the runtime's own
//! binary) and `meshc run`/`meshc inspect`: the input/output arguments, the run options
//! that apply to a loaded artifact, the run itself (bench, trace, link stats, checks), and
//! how an error leaves the process (one line, exit 1).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::error::escape_controls;
use meshc_ir::{Tensor, TensorType};

use crate::api::model::{Model, OpenOptions};
use crate::comm::error::RunError;
use crate::exec::mismatch::Mismatch;
use crate::exec::runner::Loaded;
use crate::format::artifact::{self, Artifact, Verify};
use crate::format::degradation::Degradation;
use crate::tools::output::{check_output_name, Outputs};

/// Parses the command line with clap, printing `--help`/`--version` to stdout (exit 0) and a
/// usage error as one line on stderr (exit 1).
pub fn parse<P: clap::Parser>(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<P, ExitCode> {
    match P::try_parse_from(args) {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            print!("{e}");
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            let rendered = e.to_string();
            eprintln!(
                "{}",
                rendered.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect::<Vec<_>>().join(" ")
            );
            Err(ExitCode::FAILURE)
        }
    }
}

/// The exit of a command: success, or its error on one line of stderr with status 1.
pub fn exit(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// An error as one line of stderr.
pub(crate) fn report(e: &anyhow::Error) {
    let line = format!("error: {}\n", crate::api::error::one_line(e));
    // One write, not eprintln!'s one per piece: mpirun forwards a rank's stderr as it comes
    // and prints its own abort notice meanwhile, which could land inside the line.
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
}

/// Prints `text` to stdout with its control characters escaped but line breaks: what the
/// commands print quotes names from files, which must not reach a terminal as escape
/// sequences.
pub fn print(text: &str) {
    print!("{}", escape_controls(text, true));
}

/// Splits `NAME=FILE`.
pub fn name_eq_file<'a>(arg: &'a str, flag: &str) -> Result<(&'a str, &'a str)> {
    match arg.split_once('=') {
        Some((n, f)) if !n.is_empty() && !f.is_empty() => Ok((n, f)),
        _ => bail!("{flag} '{arg}': expected NAME=FILE.npy"),
    }
}

/// Reads the `--input` values and checks them against the expected inputs: every input
/// given once, nothing else, each with the declared dtype and shape (with `sized`, the
/// declared rank: an artifact with symbolic dims checks the sizes when a run binds them).
pub fn read_inputs(expected: &[(String, TensorType)], args: &[String], sized: bool) -> Result<HashMap<String, Tensor>> {
    let mut values = HashMap::new();
    for arg in args {
        let (name, file) = name_eq_file(arg, "--input")?;
        let Some((_, ty)) = expected.iter().find(|(n, _)| n == name) else {
            let names = expected.iter().map(|(n, _)| n.as_str());
            bail!("--input {name}: {}", Mismatch::unknown(name, names, false));
        };
        let t = Tensor::read_npy(Path::new(file)).with_context(|| format!("--input {name}"))?;
        let fits = match sized {
            true => t.dtype() == ty.dtype && t.shape.len() == ty.rank(),
            false => t.ty() == *ty,
        };
        if !fits {
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

/// The `--input`/`--output`/`--output-dir` arguments of `interp` and `run`.
#[derive(clap::Args)]
pub struct Io {
    /// An input value: NAME=FILE.npy (repeat for each input).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    pub inputs: Vec<String>,
    /// Write one output: NAME=FILE.npy (repeatable).
    #[arg(long = "output", value_name = "NAME=FILE.npy", conflicts_with = "output_dir")]
    pub outputs: Vec<String>,
    /// Write every output to DIR/NAME.npy.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
}

impl Io {
    /// The `--output NAME=FILE` requests, checked against the output names.
    pub fn wanted(&self, names: &[&str]) -> Result<Vec<(String, PathBuf)>> {
        let mut wanted = Vec::new();
        for arg in &self.outputs {
            let (name, file) = name_eq_file(arg, "--output")?;
            if !names.contains(&name) {
                bail!("--output {name}: {}", Mismatch::unknown(name, names.iter().copied(), true));
            }
            wanted.push((name.to_string(), PathBuf::from(file)));
        }
        Ok(wanted)
    }

    /// Stages the results as asked in `out` (written when it commits), or prints a summary
    /// of each when nothing was asked. Output names become file names under
    /// `--output-dir`: a name that is not a plain file name is refused.
    pub fn write(
        &self,
        out: &mut Outputs,
        mut wanted: Vec<(String, PathBuf)>,
        results: &BTreeMap<String, Tensor>,
    ) -> Result<()> {
        if let Some(dir) = &self.output_dir {
            for name in results.keys() {
                check_output_name(name).context("--output-dir")?;
            }
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create directory", dir.display()))?;
            wanted = results.keys().map(|k| (k.clone(), dir.join(format!("{k}.npy")))).collect();
        }
        for (name, file) in &wanted {
            out.write_bytes(file, &results[name].to_npy_bytes())?;
        }
        if wanted.is_empty() {
            for (name, t) in results {
                print(&format!("{name}: {}\n", summary(t)));
            }
        }
        Ok(())
    }
}

/// The options of `run` that apply to a loaded program, whoever compiled it.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Run N more times and print min/median/max latency and GFLOP/s.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub bench: Option<u64>,
    /// Skip the weights checksum when opening an artifact (saves a pass over the weights; they are still read).
    #[arg(long)]
    pub trust_weights: bool,
    /// Compare every output with DIR/NAME.npy (e.g. the interpreter's or numpy's) and fail
    /// unless |got - want| <= 1e-5 + 1e-4·|want| everywhere (non-f32 outputs: exactly).
    #[arg(long, value_name = "DIR")]
    pub check_against: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace of the (first) run: a track per device, an event per
    /// step, and the waits inside collectives. Under `--transport mpi` each host writes its
    /// devices' trace, host h > 0 to FILE.host<h>.json.
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// After the run, print the bytes each mesh link carried, and the maximum.
    #[arg(long)]
    pub link_stats: bool,
    /// Treat a device as failed (coordinates, e.g. 1,2); may be repeated. All-reduces over
    /// the whole mesh route around it and leave out its operand.
    #[arg(long, value_name = "DEVICE")]
    pub degrade: Vec<String>,
    /// Treat every device of host H (the artifact's `hosts`) as failed; may be repeated.
    /// What `tools/mpirun-replan` adds when it restarts a job that lost host H.
    #[arg(long, value_name = "H")]
    pub degrade_host: Vec<usize>,
    /// Treat the link between two neighbouring devices as failed (e.g. 0,0:0,1); may be
    /// repeated.
    #[arg(long, value_name = "A:B")]
    pub degrade_link: Vec<String>,
    /// Treat partially degraded devices (a failed link, or all neighbours along a
    /// dimension degraded) as failed.
    #[arg(long)]
    pub degrade_strict: bool,
    /// Make a device stop answering when it reaches its STEP-th collective (from 0), to
    /// test detection (e.g. 1,2@0).
    #[arg(long, value_name = "DEVICE@STEP")]
    pub fail_device: Option<String>,
    /// Under `--transport mpi`, make host H stop (SIGSTOP, as a machine that hangs) before
    /// its RUN-th run (0: the first; `--bench` runs follow it), to test that the other
    /// hosts detect it and end the job (e.g. 0@2).
    #[arg(long, value_name = "HOST@RUN")]
    pub stop_host: Option<String>,
    /// When a device is found silent, degrade it and run the whole graph again without
    /// it (data-parallel layouts).
    #[arg(long)]
    pub replan_on_failure: bool,
    /// How long a device waits for a peer — a recv for its send (or a send for its recv),
    /// a collective for a member that shows no sign of life — before the run fails
    /// instead of hanging; the error names the key or member and the devices.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub timeout: f64,
    /// The most cores a one-device run uses: its large elementwise and reduction kernels
    /// split into that many parts and its library GEMMs fork that many threads (default:
    /// every core; results are the same for any N). Mesh runs use one core per stream.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// The vector ISA of the runtime's own kernels (library GEMMs, the integer GEMM, whose
    /// avx512 path is VNNI's, fused attention, GEMM epilogues, collective reductions):
    /// avx512, avx2 or portable; default the best this
    /// CPU has, or MESHC_ISA when set. One the CPU lacks is refused. Code compiled into the
    /// artifact follows its --target instead.
    #[arg(long, value_name = "ISA", env = "MESHC_ISA")]
    pub isa: Option<String>,
    /// Refuse the artifact unless it is signed by this public key (a file from `meshc
    /// keygen`) and the signature matches every section; checked before any code is mapped.
    #[arg(long, value_name = "PUBKEY")]
    pub require_signature: Option<PathBuf>,
    /// How the hosts of an artifact compiled with "hosts" are joined: `in-process` (this
    /// process runs every device; the default) or `mpi` (under `mpirun -n HOSTS`, each rank
    /// runs its host's devices; outputs are written by rank 0; needs a meshc built with
    /// `--features mpi`).
    #[arg(long, value_enum, default_value_t = TransportKind::InProcess)]
    pub transport: TransportKind,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    InProcess,
    Mpi,
}

/// Whether `path` is to be read as an artifact: named `.mshc`, or starting with the
/// artifact magic. An empty or damaged `.mshc` is then refused by the artifact reader with
/// its own message, not parsed as a graph. Only regular files are opened (a FIFO would
/// block).
pub fn is_artifact(path: &Path) -> bool {
    use std::io::Read;
    if path.extension().is_some_and(|e| e == "mshc") {
        return true;
    }
    let mut magic = [0u8; 8];
    path.is_file()
        && std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
        && magic == artifact::MAGIC
}

/// Opens the artifact at `path` as `run` does (`--trust-weights` skips the bulk checksum).
pub fn open(path: &Path, args: &RunArgs) -> Result<Loaded> {
    let public_key = args.require_signature.as_deref().map(crate::format::signature::read_public_key).transpose()?;
    let options = OpenOptions { trust_weights: args.trust_weights, public_key };
    Model::open_inner(path, &options)?.load_inner()
}

/// `run` of a loaded program: set up (`configure`), run, and with `--replan-on-failure`
/// once more without the devices a failed run found silent (they are degraded: the
/// collectives are re-planned around them).
pub fn run(loaded: &mut Loaded, io: &Io, args: &RunArgs) -> Result<()> {
    match args.transport {
        TransportKind::InProcess => run_here(loaded, io, args),
        TransportKind::Mpi => run_mpi(loaded, io, args),
    }
}

/// `run --transport mpi`: this process is one rank, running its host's devices. An error
/// on any rank is reported there and aborts the whole job (exit 1 from mpirun).
#[cfg(feature = "mpi")]
fn run_mpi(loaded: &mut Loaded, io: &Io, args: &RunArgs) -> Result<()> {
    if args.replan_on_failure {
        bail!("--replan-on-failure: under --transport mpi a lost host ends the job (MPI cannot go on without a process); start it with tools/mpirun-replan, which runs it again with --degrade-host");
    }
    let (mpi, transport) = crate::comm::mpi::init()?;
    let transport: std::sync::Arc<dyn crate::comm::transport::Transport> = std::sync::Arc::new(transport);
    let result = loaded.set_transport(transport.clone()).and_then(|()| run_here(loaded, io, args));
    let result = result.with_context(|| format!("host {}", transport.rank()));
    if let Err(e) = &result {
        report(e);
        transport.abort();
    }
    // MPI_Finalize, once every device thread is parked.
    drop(mpi);
    result
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &mut Loaded, _: &Io, _: &RunArgs) -> Result<()> {
    bail!(NO_MPI)
}

/// Why `--transport mpi` is refused by a meshc built without the `mpi` feature.
#[cfg(not(feature = "mpi"))]
pub(crate) const NO_MPI: &str = "--transport mpi: this meshc was built without MPI; build it with `cargo build --release --features mpi` (needs Open MPI: apt-get install openmpi-bin libopenmpi-dev pkg-config)";

/// `run` in this process (as one rank, under `--transport mpi`).
fn run_here(loaded: &mut Loaded, io: &Io, args: &RunArgs) -> Result<()> {
    configure(loaded, args)?;
    let failed = |e: &anyhow::Error| e.downcast_ref::<RunError>().map(RunError::failed_devices).unwrap_or_default();
    match run_loaded(loaded, io, args) {
        Err(e) if args.replan_on_failure && !failed(&e).is_empty() => {
            let dead = failed(&e);
            let names: Vec<String> = dead.iter().map(|&d| loaded.meta.mesh.coords_string(d)).collect();
            let why = format!("{e:#}: re-planning without {} and running again", names.join(", "));
            eprintln!("{}", escape_controls(&why, false));
            let deg = Degradation { nodes: dead, ..Default::default() };
            loaded.degrade(&deg, args.degrade_strict).context("--replan-on-failure")?;
            run_loaded(loaded, io, args)
        }
        r => r,
    }
}

/// The run options that set up loaded programs before they run: `--degrade`,
/// `--degrade-link` and `--degrade-strict` re-plan the collectives; `--fail-device` and
/// `--timeout` inject and detect failures; `--threads` caps the cores of a one-device run.
pub fn configure(loaded: &mut Loaded, args: &RunArgs) -> Result<()> {
    if let Some(isa) = &args.isa {
        let level = crate::api::Isa::parse(isa).map_err(|e| anyhow!("--isa: {e}"))?;
        crate::api::force_isa(level).map_err(|e| anyhow!("--isa {isa}: {e}"))?;
    }
    loaded.set_collective_timeout(timeout(args)?);
    if let Some(n) = args.threads {
        loaded.set_threads(n as usize);
    }
    if !args.degrade.is_empty() || !args.degrade_link.is_empty() || !args.degrade_host.is_empty() || args.degrade_strict
    {
        let mesh = &loaded.meta.mesh;
        let mut devices = Degradation::from_args(mesh, &args.degrade, &[]).context("--degrade")?;
        for &h in &args.degrade_host {
            devices.nodes.extend(host(loaded, "--degrade-host", h)?);
        }
        devices.nodes.sort_unstable();
        devices.nodes.dedup();
        let links = Degradation::from_args(mesh, &[], &args.degrade_link).context("--degrade-link")?;
        // What the degradation implies (a lost model shard, nothing left healthy) is the
        // degradation's as a whole.
        loaded.degrade(&devices.merged(&links), args.degrade_strict).context("--degrade")?;
    }
    if let Some(f) = &args.fail_device {
        let (device, step) = f
            .split_once('@')
            .and_then(|(d, s)| Some((d, s.trim().parse::<usize>().ok()?)))
            .ok_or_else(|| anyhow!("--fail-device '{f}': expected DEVICE@STEP such as 1,2@0"))?;
        let d = Degradation::from_args(&loaded.meta.mesh, &[device.to_string()], &[]).context("--fail-device")?;
        loaded.fail_device(d.nodes[0], step).context("--fail-device")?;
    }
    Ok(())
}

/// The devices of host `h` of the artifact, for option `flag`.
fn host<'a>(loaded: &'a Loaded, flag: &str, h: usize) -> Result<&'a [usize]> {
    match (loaded.meta.hosts.get(h), loaded.meta.hosts.len()) {
        (Some(group), _) => Ok(group),
        (None, 0) => bail!("{flag} {h}: the artifact names no hosts (a layout spec with \"hosts\" gives them)"),
        (None, n) => bail!("{flag} {h}: the artifact has hosts 0 to {}", n - 1),
    }
}

/// `--stop-host H@RUN`: the run before which this process stops, if it runs host H.
fn stop_before(loaded: &Loaded, args: &RunArgs) -> Result<Option<u64>> {
    let Some(s) = &args.stop_host else { return Ok(None) };
    let (h, run) = (s.split_once('@'))
        .and_then(|(h, r)| Some((h.trim().parse::<usize>().ok()?, r.trim().parse::<u64>().ok()?)))
        .ok_or_else(|| anyhow!("--stop-host '{s}': expected HOST@RUN such as 0@2"))?;
    host(loaded, "--stop-host", h)?;
    let runs = args.bench.unwrap_or(0).saturating_add(1);
    if run >= runs {
        bail!("--stop-host {s}: the command makes {runs} run(s) (1 + --bench), none numbered {run}");
    }
    if args.transport != TransportKind::Mpi {
        // One process runs every host: none would be left to notice.
        bail!("--stop-host: only under --transport mpi (a stopped process running every host would hang)");
    }
    Ok((h == loaded.host()).then_some(run))
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
        let nans = match c.nan_mismatches {
            0 => String::new(),
            n => format!("{n} element(s) NaN on one side only, "),
        };
        print(&format!(
            "check {name}: {nans}max abs error {:.3e} against {} ({})\n",
            c.max_abs_err,
            file.display(),
            if ok { "ok" } else { "FAILED" }
        ));
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
fn timeout(args: &RunArgs) -> Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or_else(|| anyhow!("--timeout {}: expected a positive number of seconds", args.timeout))
}

/// What the hosts of a run must agree on (`Loaded::agree`), each part said of a host that
/// differs: the artifact, the options that shape the runs (how many, the devices degraded,
/// the failures injected) and the inputs, every value of them.
pub fn agreement(loaded: &Loaded, args: &RunArgs, inputs: &HashMap<String, Tensor>) -> Vec<(&'static str, [u8; 32])> {
    use sha2::{Digest, Sha256};
    let options = (&args.bench, &args.degrade, &args.degrade_host, &args.degrade_link, &args.degrade_strict);
    let options = format!("{:?}", (options, &args.fail_device, &args.stop_host));
    let mut values = Sha256::new();
    let mut names: Vec<&String> = inputs.keys().collect();
    names.sort();
    for name in names {
        let t = &inputs[name];
        for part in [name.as_bytes(), t.ty().to_string().as_bytes(), &t.to_le_bytes()] {
            values.update(part.len().to_le_bytes());
            values.update(part);
        }
    }
    vec![
        ("runs another artifact", loaded.digest()),
        ("was given other options (--bench, --degrade*, --fail-device, --stop-host)", Sha256::digest(options).into()),
        ("was given other inputs", values.finalize().into()),
    ]
}

/// The inputs a loaded program expects, by name.
pub fn expected_inputs(loaded: &Loaded) -> Vec<(String, TensorType)> {
    loaded.meta.inputs.iter().filter_map(|s| Some((s.name.clone(), s.ty()?))).collect()
}

fn run_loaded(loaded: &Loaded, io: &Io, args: &RunArgs) -> Result<()> {
    loaded.set_timeout(timeout(args)?);
    let inputs = read_inputs(&expected_inputs(loaded), &io.inputs, loaded.meta.symbolic.is_some())?;
    loaded.agree(|| agreement(loaded, args, &inputs), timeout(args)?)?;
    let names: Vec<&str> = loaded.meta.outputs.iter().map(|o| o.name.as_str()).collect();
    let wanted = io.wanted(&names)?;
    // Every file the run writes appears together, once everything has succeeded.
    let mut out = Outputs::new();
    // Under hosts, host 0 gets the outputs and writes what is asked; the others run along.
    let leader = loaded.host() == 0;
    let stop = stop_before(loaded, args)?;
    let pause = |run: u64| {
        if stop == Some(run) {
            // SAFETY: raise(3) of a signal that stops this process until a SIGCONT (or
            // mpirun's kill when another host ends the job).
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    };
    pause(0);
    let results = match &args.trace {
        None => loaded.run(&inputs)?,
        Some(file) => {
            let mut times = Vec::new();
            let results = loaded.run_timed(&inputs, &mut |t| times.push(t.clone()))?;
            // Under hosts each rank traces its own devices: host h > 0 writes FILE with
            // `.host<h>` before its extension.
            let file = match loaded.host() {
                0 => file.clone(),
                h => file.with_extension(match file.extension() {
                    Some(e) => format!("host{h}.{}", e.to_string_lossy()),
                    None => format!("host{h}"),
                }),
            };
            out.write_bytes(
                &file,
                crate::tools::trace::chrome_trace(&loaded.meta, &loaded.programs, &times).as_bytes(),
            )?;
            results
        }
    };
    let links = args.link_stats.then(|| loaded.link_stats());
    // Every host reports what it sent across (measured, not modelled).
    if let Some(sent) = args.link_stats.then(|| loaded.host_stats()).flatten() {
        print!("{sent}");
    }
    if let Some(dir) = args.check_against.as_ref().filter(|_| leader) {
        check_against(&results, dir)?;
    }
    if let Some(n) = args.bench {
        let mut times = Vec::new();
        for run in 1..=n {
            pause(run);
            let t = std::time::Instant::now();
            loaded.run(&inputs)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        // (An artifact over symbolic dims counts its FLOPs at the bounds, not these sizes.)
        let rate = match loaded.meta.symbolic {
            None => {
                format!(", {:.2} GFLOP/s (median, {} FLOPs)", loaded.meta.flops as f64 / med / 1e9, loaded.meta.flops)
            }
            Some(_) => String::new(),
        };
        if leader {
            eprintln!(
                "bench: {} runs, latency min {:.3} ms, median {:.3} ms, max {:.3} ms{rate}",
                times.len(),
                times[0] * 1e3,
                med * 1e3,
                times[times.len() - 1] * 1e3,
            );
        }
    }
    if !leader {
        return out.commit();
    }
    io.write(&mut out, wanted, &results)?;
    out.commit()?;
    if let Some(links) = links {
        print!("{}", links.report());
    }
    Ok(())
}

/// `inspect ARTIFACT`.
pub fn inspect(path: &Path, json: bool) -> Result<()> {
    let art = Artifact::open_with(path, Verify::All)?;
    let report = match json {
        true => crate::tools::inspect::inspect_json,
        false => crate::tools::inspect::inspect,
    };
    print(&report(&art, &path.display().to_string())?);
    Ok(())
}

/// A one-line look at a tensor: type and its first values.
pub fn summary(t: &Tensor) -> String {
    let v = t.data.to_f64();
    let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
    format!("{} [{}{}]", t.ty(), head.join(", "), if v.len() > 6 { ", ..." } else { "" })
}
