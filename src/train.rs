//! The training side of the driver: `meshc grad` (a graph with its gradients appended,
//! written as a graph file next to wherever the user wants it), and the training step
//! `compile`/`run` build with `--loss NAME --optimizer SPEC` (`meshc_ir::optim`), whose
//! state the runner keeps from step to step (`meshc_runtime::steps`).

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};
use meshc_ir::grad::{grad, select_wrt};
use meshc_ir::optim::{train_step, Optimizer};
use meshc_ir::verify::{self, Info};
use meshc_ir::{load, Graph, Input, Param, ParamData, Tensor};
use meshc_runtime::output::Outputs;
use meshc_runtime::steps::State;

/// `g` with the gradient of `loss` with respect to the params `wrt` selects (names or
/// globs; none: every f32 param) appended as outputs `grad.P`, verified.
pub fn differentiate(g: &Graph, info: &Info, loss: &str, wrt: &[String]) -> Result<(Graph, Info)> {
    let chosen = select_wrt(g, wrt)?;
    let gg = grad(g, info, loss, &chosen)?;
    let ginfo = verify::verify(&gg).context("the gradient graph does not verify (a meshc bug)")?;
    Ok((gg, ginfo))
}

/// `meshc grad GRAPH --loss NAME [--wrt P,...] -o OUT`: OUT.json as JSON, anything else
/// as the text format. Param files stay where they are: their paths are rewritten
/// relative to OUT's directory.
pub fn grad_cmd(path: &Path, loss: &str, wrt: &[String], out: &Path) -> Result<()> {
    let (g, info) = load::load(path)?;
    let (mut gg, _) = differentiate(&g, &info, loss, wrt).with_context(|| path.display().to_string())?;
    rebase_files(&mut gg, path.parent().unwrap_or(Path::new(".")), out.parent().unwrap_or(Path::new(".")))?;
    let text = if load::is_json(out) { meshc_ir::json::print(&gg) } else { meshc_ir::text::print(&gg) };
    let mut o = Outputs::new();
    o.write_bytes(out, text.as_bytes())?;
    o.commit()
}

/// Rewrites the relative param file paths of a graph read from directory `from` so that
/// they name the same files from directory `to`.
pub fn rebase_files(g: &mut Graph, from: &Path, to: &Path) -> Result<()> {
    let abs = |p: &Path| -> Result<PathBuf> {
        let p = if p.as_os_str().is_empty() { Path::new(".") } else { p };
        p.canonicalize().with_context(|| p.display().to_string())
    };
    let (from, to) = (abs(from)?, abs(to)?);
    if from == to {
        return Ok(());
    }
    for p in &mut g.params {
        if let ParamData::File { path, .. } = &mut p.data {
            if Path::new(path.as_str()).is_relative() {
                *path = relative(&from.join(path.as_str()), &to).to_string_lossy().into_owned();
            }
        }
    }
    Ok(())
}

/// `target` as a path relative to the directory `base` (both absolute, `base` canonical).
fn relative(target: &Path, base: &Path) -> PathBuf {
    let t: Vec<Component> = target.components().collect();
    let b: Vec<Component> = base.components().collect();
    let common = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out: PathBuf = b[common..].iter().map(|_| Component::ParentDir).collect();
    out.extend(&t[common..]);
    out
}

/// The flags that turn a compile (or an in-memory run) into a training step.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TrainArgs {
    /// Compile one training step of this scalar f32 output (with --optimizer): the
    /// program takes the params and optimizer state as inputs and returns them updated.
    #[arg(long, value_name = "NAME", requires = "optimizer")]
    pub loss: Option<String>,
    /// The params to train: names or globs, comma-separated (default: every f32 param).
    #[arg(long, value_name = "P,...", value_delimiter = ',', requires = "loss")]
    pub wrt: Vec<String>,
    /// sgd:LR | momentum:LR,BETA | adamw:LR,B1,B2,EPS,WD
    #[arg(long, value_name = "SPEC", requires = "loss")]
    pub optimizer: Option<String>,
}

/// A training step ready to compile: its graph, with the state (trained params and
/// optimizer state) turned from params into inputs, and the state's initial values.
pub struct Step {
    pub graph: Graph,
    pub info: Info,
    pub init: State,
}

/// The training step `args` asks for, if any: `value` gives a param's initial value.
pub fn step(
    g: &Graph,
    info: &Info,
    args: &TrainArgs,
    mut value: impl FnMut(&Param) -> Result<Tensor>,
) -> Result<Option<Step>> {
    let (Some(loss), Some(spec)) = (&args.loss, &args.optimizer) else { return Ok(None) };
    let opt = Optimizer::parse(spec)?;
    let chosen = select_wrt(g, &args.wrt)?;
    let (mut tg, state) = train_step(g, info, loss, &chosen, opt)?;
    let mut init = State { tensors: Default::default(), step: 0 };
    for name in &state {
        let at = tg.params.iter().position(|p| &p.name == name).expect("train_step makes every state tensor a param");
        let p = tg.params.remove(at);
        init.tensors.insert(name.clone(), value(&p)?);
        tg.inputs.push(Input { name: p.name, ty: p.ty, dims: p.dims, loc: p.loc });
    }
    let info = verify::verify(&tg).context("the training step does not verify (a meshc bug)")?;
    Ok(Some(Step { graph: tg, info, init }))
}

/// Where a training run writes its checkpoint unless told: PROGRAM.ckpt.safetensors.
pub fn checkpoint_path(program: &Path) -> PathBuf {
    program.with_extension("ckpt.safetensors")
}
