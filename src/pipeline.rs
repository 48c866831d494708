//! The pipeline: one table of every pass, in the order they run, with the level each works
//! at (the whole graph, each stage, each device's program, each device's runtime program),
//! how its IR is dumped and whether the verifier checks what it made. `driver` runs the
//! global and stage passes and `compile` the device and program ones, each by walking this
//! table over its IR (`Ir`) with `run`, which verifies, times (`--time-passes`) and stops
//! after (`--stop-after`) every pass alike, and dumps it as `Dumps` asks: where the IR goes
//! after each pass (`--dump-after`, `--dump-dir`), in which form (`--dump-format`: text, or
//! Graphviz dot for the passes whose IR is a graph).

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use meshc_runtime::tools::output::Outputs;

/// The passes on the whole graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlobalPass {
    Verify,
    Pilot,
    Place,
    SendRecv,
}

/// The passes on each stage's graph over its mesh (the whole graph over the whole mesh
/// when the spec places nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagePass {
    Layout,
    Lower,
}

/// The passes on each device's program, in the graph IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePass {
    Expand,
    Quantize,
    Fold,
    Gelu,
    Attention,
    Epilogue,
    ZeroPoint,
    ReduceSplit,
    Fuse,
}

/// The passes that make and then work on each device's runtime program (steps, buffers,
/// streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramPass {
    Codegen,
    Streams,
    Buffers,
}

/// The level a pass works at, and which pass it is there: each runner matches the passes
/// of its levels exhaustively, so a pass added here cannot go unhandled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Global(GlobalPass),
    Stage(StagePass),
    Device(DevicePass),
    Program(ProgramPass),
}

impl Level {
    /// Whether `driver` runs it (the global and stage passes) rather than `compile`.
    pub const fn is_front(self) -> bool {
        matches!(self, Level::Global(_) | Level::Stage(_))
    }
}

/// One pass of the pipeline. Every pass is dumped as text (`--dump-after`).
#[derive(Debug, PartialEq, Eq)]
pub struct Pass {
    /// As `--dump-after`, `--stop-after` and `--time-passes` name it.
    pub name: &'static str,
    pub level: Level,
    /// It is also dumped as a Graphviz graph (`crate::dot`, `--dump-format dot`): its IR is
    /// a graph of stages, devices or streams.
    pub dot: bool,
    /// The programs it rewrites are verified (and their types inferred again) before the
    /// next pass reads them.
    pub verify: bool,
}

/// Every pass, in the order they run. The pilot runs on the global graph, before
/// placement, so its masks do not depend on the layout; each pass runs over every unit of
/// its level (stage, device) before the next pass starts.
pub const PASSES: &[Pass] = &[
    Pass { name: "verify", level: Level::Global(GlobalPass::Verify), dot: false, verify: false },
    Pass { name: "pilot", level: Level::Global(GlobalPass::Pilot), dot: false, verify: false },
    Pass { name: "place", level: Level::Global(GlobalPass::Place), dot: true, verify: false },
    Pass { name: "layout", level: Level::Stage(StagePass::Layout), dot: false, verify: false },
    Pass { name: "lower", level: Level::Stage(StagePass::Lower), dot: true, verify: true },
    Pass { name: "sendrecv", level: Level::Global(GlobalPass::SendRecv), dot: true, verify: true },
    Pass { name: "expand", level: Level::Device(DevicePass::Expand), dot: false, verify: true },
    Pass { name: "quantize", level: Level::Device(DevicePass::Quantize), dot: false, verify: true },
    Pass { name: "fold", level: Level::Device(DevicePass::Fold), dot: false, verify: false },
    Pass { name: "gelu", level: Level::Device(DevicePass::Gelu), dot: false, verify: true },
    Pass { name: "attention", level: Level::Device(DevicePass::Attention), dot: false, verify: true },
    Pass { name: "epilogue", level: Level::Device(DevicePass::Epilogue), dot: false, verify: true },
    Pass { name: "zero_point", level: Level::Device(DevicePass::ZeroPoint), dot: false, verify: true },
    Pass { name: "reduce_split", level: Level::Device(DevicePass::ReduceSplit), dot: false, verify: true },
    Pass { name: "fuse", level: Level::Device(DevicePass::Fuse), dot: false, verify: false },
    Pass { name: "codegen", level: Level::Program(ProgramPass::Codegen), dot: false, verify: false },
    Pass { name: "streams", level: Level::Program(ProgramPass::Streams), dot: true, verify: false },
    Pass { name: "buffers", level: Level::Program(ProgramPass::Buffers), dot: false, verify: false },
];

/// The names of the passes (with `dot`, of those with a dot form), in pipeline order.
const fn names<const N: usize>(dot: bool) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < PASSES.len() {
        if PASSES[i].dot || !dot {
            out[n] = PASSES[i].name;
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "N is the number of such passes");
    out
}

/// The number of passes with a dot form.
const fn count_dot() -> usize {
    let (mut i, mut n) = (0, 0);
    while i < PASSES.len() {
        if PASSES[i].dot {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The passes `--dump-after`, `--stop-after` and `--time-passes` name, in the order they
/// run (their number prefixes the files of `--dump-dir`).
pub const NAMES: [&str; PASSES.len()] = names(false);

/// The passes with a dot form.
pub const DOT_NAMES: [&str; count_dot()] = names(true);

/// The passes `driver` runs (global and stage), in order.
pub fn front() -> impl Iterator<Item = &'static Pass> + Clone {
    PASSES.iter().filter(|p| p.level.is_front())
}

/// The passes `compile` runs (device and program), in order.
pub fn back() -> impl Iterator<Item = &'static Pass> + Clone {
    PASSES.iter().filter(|p| !p.level.is_front())
}

/// The form of the dumps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    /// Graphviz's dot (`dot -Tsvg`), for `DOT_NAMES` only.
    Dot,
}

/// Where `--dump-after` sends the IR after each pass it names.
#[derive(Default)]
pub struct Dumps {
    pub after: Vec<String>,
    pub dir: Option<PathBuf>,
    pub format: Format,
}

impl Dumps {
    /// Checks the pass names (`all` names every pass, or every one with a dot form).
    pub fn new(after: Vec<String>, dir: Option<PathBuf>, format: Format) -> Result<Dumps> {
        for a in &after {
            if a != "all" && !NAMES.contains(&a.as_str()) {
                return Err(anyhow!("--dump-after: unknown pass '{a}' (passes: {}, or all)", NAMES.join(", ")));
            }
            if a != "all" && format == Format::Dot && !DOT_NAMES.contains(&a.as_str()) {
                return Err(anyhow!(
                    "--dump-format dot: pass '{a}' has no dot form (passes with one: {})",
                    DOT_NAMES.join(", ")
                ));
            }
        }
        if format == Format::Dot && after.iter().any(|a| a == "all") {
            let without: Vec<&str> = NAMES.iter().filter(|n| !DOT_NAMES.contains(n)).copied().collect();
            eprintln!(
                "note: --dump-after all --dump-format dot dumps {}; {} have no dot form",
                DOT_NAMES.join(", "),
                without.join(", ")
            );
        }
        Ok(Dumps { after, dir, format })
    }

    /// Whether `pass` is dumped.
    pub fn wants(&self, pass: &str) -> bool {
        let named = self.names(pass) || self.after.iter().any(|a| a == "all");
        named && (self.format == Format::Text || DOT_NAMES.contains(&pass))
    }

    /// Whether `pass` is named on its own: `all` dumps the passes that run, and a pass
    /// that cannot run (no spec, no pilot inputs) is an error only when named.
    pub fn names(&self, pass: &str) -> bool {
        self.after.iter().any(|a| a == pass)
    }

    /// The file the dump of `pass` goes to, `DIR/NN-PASS.txt` (`.dot`) with NN its place
    /// in the pipeline; None when dumps go to stdout.
    pub fn file(&self, pass: &str) -> Option<PathBuf> {
        let ext = match self.format {
            Format::Text => "txt",
            Format::Dot => "dot",
        };
        let n = NAMES.iter().position(|p| *p == pass).expect("a known pass") + 1;
        self.dir.as_ref().map(|dir| dir.join(format!("{n:02}-{pass}.{ext}")))
    }

    /// Writes the dump `text` of `pass` (in `format`'s form) where the dumps go.
    pub fn write(&self, pass: &str, text: &str) -> Result<()> {
        match (&self.dir, self.file(pass)) {
            (Some(dir), Some(file)) => {
                // Each dump appears whole, as its pass completes: a compile that fails in a
                // later pass keeps the dumps that show how far it got.
                let mut out = Outputs::new();
                std::fs::create_dir_all(dir)
                    .map_err(anyhow::Error::from)
                    .and_then(|_| out.write_bytes(&file, text.as_bytes()))
                    .and_then(|_| out.commit())
                    .with_context(|| format!("--dump-dir: cannot write {}", file.display()))
            }
            _ => {
                meshc_runtime::tools::cli::print(text);
                Ok(())
            }
        }
    }
}

/// The IR some passes of the table work on, as `run` drives them.
pub trait Ir {
    /// What this compile lacks for `pass` to run, as "a layout spec (--layout SPEC)"; None
    /// when it runs. A pass that cannot run is skipped, and is an error only when named.
    fn lacks(&self, pass: &Pass) -> Option<&'static str>;
    fn run(&mut self, pass: &Pass) -> Result<()>;
    /// Verifies what `pass` rewrote (called after the passes marked `verify`).
    fn verify(&mut self, pass: &Pass) -> Result<()>;
    /// The text dump of the IR after `pass`.
    fn text(&self, pass: &Pass) -> Result<String>;
    /// The Graphviz dump of the IR after `pass` (of the passes with a dot form).
    fn dot(&self, pass: &Pass) -> String;
}

/// What the user watches of a compile: the dumps, the pass to stop after
/// (`--stop-after`), and the wall time of every pass (`--time-passes`).
pub struct Instrument<'d> {
    pub dumps: &'d Dumps,
    stop_after: Option<&'static Pass>,
    /// With `--time-passes`, each pass that ran with its wall time, in order.
    times: Option<RefCell<Vec<(&'static str, Duration)>>>,
}

impl<'d> Instrument<'d> {
    /// Checks the name of the pass to stop after (its dump is written as `dumps` says, so
    /// under `--dump-format dot` it must have a dot form).
    pub fn new(dumps: &'d Dumps, stop_after: Option<&str>, time: bool) -> Result<Instrument<'d>> {
        let stop_after = match stop_after {
            None => None,
            Some(name) => Some(
                PASSES
                    .iter()
                    .find(|p| p.name == name)
                    .ok_or_else(|| anyhow!("--stop-after: unknown pass '{name}' (passes: {})", NAMES.join(", ")))?,
            ),
        };
        if let Some(p) = stop_after.filter(|p| dumps.format == Format::Dot && !p.dot) {
            bail!("--dump-format dot: pass '{}' has no dot form (passes with one: {})", p.name, DOT_NAMES.join(", "));
        }
        Ok(Instrument { dumps, stop_after, times: time.then(|| RefCell::new(Vec::new())) })
    }

    /// Only `dumps`: every pass runs, untimed.
    pub fn dumps(dumps: &'d Dumps) -> Instrument<'d> {
        Instrument { dumps, stop_after: None, times: None }
    }

    /// Whether the IR after `pass` is dumped: `--dump-after` names it, or the pipeline
    /// stops after it.
    fn wants(&self, pass: &Pass) -> bool {
        self.dumps.wants(pass.name) || self.stop_after == Some(pass)
    }

    /// The `--time-passes` report, laid out as LLVM's `-time-passes`: every pass that ran
    /// with its wall time and share of the total, the slowest first; None when not timed.
    pub fn report(&self) -> Option<String> {
        let mut times = self.times.as_ref()?.borrow().clone();
        times.sort_by_key(|t| std::cmp::Reverse(t.1));
        let total: Duration = times.iter().map(|t| t.1).sum();
        let share = |d: Duration| if total.is_zero() { 0.0 } else { 100.0 * d.as_secs_f64() / total.as_secs_f64() };
        let (rule, title) = ("===".to_string() + &"-".repeat(73) + "===", "Pass execution timing report");
        let mut s = format!("{rule}\n{}{title}\n{rule}\n", " ".repeat((rule.len() - title.len()) / 2));
        s += &format!(
            "  Total Execution Time: {:.4} seconds ({:.4} wall clock)\n\n",
            total.as_secs_f64(),
            total.as_secs_f64()
        );
        s += "   ---Wall Time---  --- Name ---\n";
        for (name, d) in &times {
            s += &format!("   {:.4} ({:5.1}%)  {name}\n", d.as_secs_f64(), share(*d));
        }
        s += &format!("   {:.4} (100.0%)  Total\n", total.as_secs_f64());
        Some(s)
    }
}

/// Whether `run` went through every pass or stopped after the one `--stop-after` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Done,
    Stopped,
}

/// Runs `passes` over `ir` in order, each verified, timed, dumped and perhaps stopped after
/// as `inst` asks. A pass named (dumped or stopped after) that cannot run is refused before
/// any runs, so a refused compile prints no dump.
pub fn run(ir: &mut impl Ir, passes: impl Iterator<Item = &'static Pass> + Clone, inst: &Instrument) -> Result<Flow> {
    for p in passes.clone() {
        if let Some(needs) = ir.lacks(p) {
            if inst.dumps.names(p.name) {
                bail!("--dump-after {} needs {needs}", p.name);
            }
            if inst.stop_after == Some(p) {
                bail!("--stop-after {} needs {needs}", p.name);
            }
        }
    }
    for p in passes {
        if ir.lacks(p).is_some() {
            continue;
        }
        let start = Instant::now();
        ir.run(p)?;
        if p.verify {
            ir.verify(p)?;
        }
        if let Some(times) = &inst.times {
            times.borrow_mut().push((p.name, start.elapsed()));
        }
        if inst.wants(p) {
            let text = match inst.dumps.format {
                Format::Text => ir.text(p)?,
                Format::Dot => ir.dot(p),
            };
            inst.dumps.write(p.name, &text)?;
        }
        if inst.stop_after == Some(p) {
            return Ok(Flow::Stopped);
        }
    }
    Ok(Flow::Done)
}
