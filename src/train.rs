//! The training side of the driver: `meshc grad` (a graph with its gradients appended,
//! written as a graph file next to wherever the user wants it), and the training step
//! `compile`/`run` build with `--loss NAME --optimizer SPEC` (`meshc_ir::optim`), whose
//! state the runner keeps from step to step (`meshc_runtime::tools::steps`).

use std::borrow::Cow;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use meshc_ir::grad::{grad, select_wrt};
use meshc_ir::loss;
use meshc_ir::optim::{train_step, Optimizer};
use meshc_ir::verify::{self, Info};
use meshc_ir::{load, Graph, Input, Param, ParamData, Tensor};

use crate::layout::Spec;
use meshc_runtime::tools::output::Outputs;
use meshc_runtime::tools::steps::State;

/// `g` with the gradient of `loss` with respect to the params `wrt` selects (names or
/// globs; none: every f32 param) appended as outputs `grad.P`, verified.
pub fn differentiate(g: &Graph, info: &Info, loss: &str, wrt: &[String]) -> Result<(Graph, Info)> {
    let (g, info, loss) = with_loss(g, info, loss)?;
    let chosen = select_wrt(&g, wrt)?;
    let gg = grad(&g, &info, &loss, &chosen)?;
    let ginfo = verify::verify(&gg).context("the gradient graph does not verify (a meshc bug)")?;
    Ok((gg, ginfo))
}

/// `g` with the loss `--loss` names (a tensor of `g`, or a built-in loss of one:
/// `meshc_ir::loss`) attached and verified, and the loss's name.
fn with_loss<'a>(g: &'a Graph, info: &'a Info, loss: &str) -> Result<(Cow<'a, Graph>, Cow<'a, Info>, String)> {
    let (kind, of) = match loss::Spec::parse(loss)? {
        loss::Spec::Named(name) => return Ok((Cow::Borrowed(g), Cow::Borrowed(info), name)),
        loss::Spec::Builtin { kind, of } => (kind, of),
    };
    let (lg, name) = loss::attach(g, info, kind, &of)?;
    let linfo = verify::verify(&lg).context("the graph with its loss does not verify (a meshc bug)")?;
    Ok((Cow::Owned(lg), Cow::Owned(linfo), name))
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
    /// Compile one training step of this scalar f32 output (with --optimizer), or of a
    /// built-in loss of an output: mse:Y, l1:Y, bce_with_logits:Y (truth in a new input
    /// `target`), cross_entropy:Y (logits, classes last; i64 `labels`). The program takes
    /// the params and optimizer state as inputs and returns them updated.
    #[arg(long, value_name = "NAME|KIND:OUTPUT", requires = "optimizer")]
    pub loss: Option<String>,
    /// The params to train: names or globs, comma-separated (default: every f32 param).
    #[arg(long, value_name = "P,...", value_delimiter = ',', requires = "loss")]
    pub wrt: Vec<String>,
    /// sgd:LR | momentum:LR,BETA | adamw:LR[,B1,B2,EPS,WD]; values by position or by name
    /// (adamw:lr=1e-3,wd=0.01), the rest optax's defaults (b1 0.9, b2 0.999, eps 1e-8, wd 1e-4)
    #[arg(long, value_name = "SPEC", requires = "loss")]
    pub optimizer: Option<String>,
    /// ZeRO-1 under --layout: each device of the data-parallel axes keeps and updates its
    /// 1/n of the optimizer state (gradients reduce-scattered, params all-gathered).
    #[arg(long, requires = "optimizer")]
    pub zero: bool,
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
    let (g, info, loss) = with_loss(g, info, loss)?;
    let chosen = select_wrt(&g, &args.wrt)?;
    let (mut tg, state) = train_step(&g, &info, &loss, &chosen, opt)?;
    let mut init = State { tensors: Default::default(), step: 0 };
    for name in &state {
        let at = tg.params.iter().position(|p| &p.name == name).expect("train_step makes every state tensor a param");
        let p = tg.params.remove(at);
        let t = value(&p)?;
        // Finite where it is required: a trained param's NaN or infinity would reach every
        // gradient and update, and the whole state within a step.
        if chosen.contains(name) {
            if let Some(what) = meshc_ir::params::non_finite(&t) {
                bail!(
                    "param '{}' is trained (--wrt) but holds {what}: every update would spread them",
                    meshc_ir::error::shorten(name)
                );
            }
        }
        init.tensors.insert(name.clone(), t);
        tg.inputs.push(Input { name: p.name, ty: p.ty, dims: p.dims, loc: p.loc });
    }
    let info = verify::verify(&tg).context("the training step does not verify (a meshc bug)")?;
    Ok(Some(Step { graph: tg, info, init }))
}

/// Where a training run writes its checkpoint unless told: NAME.ckpt.safetensors in the
/// working directory, NAME the program's file name without its extension — never beside
/// the program, which may be the user's source.
pub fn checkpoint_path(program: &Path) -> PathBuf {
    let stem = program.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from(format!("{stem}.ckpt.safetensors"))
}

/// ZeRO-1 (`--zero`) as layouts added to `spec` for the training step `g` (state `step`):
/// the data-parallel axes are the mesh axes that split no trained param. For every trained
/// param P, the sharded layout is P's own with one more dimension split over each
/// data-parallel axis (the first unsplit one it divides). It goes to P's optimizer state,
/// to the update's nodes (those of P's shape that read the gradient or the state), and to
/// the gradient back through the reshapes that produce it, so lowering reduce-scatters
/// the gradient's partial sums where it would all-reduce them and each device updates only
/// its block; P and `next.P` keep P's layout, so the updated blocks are all-gathered.
/// Layouts the spec gives explicitly win.
pub fn zero(spec: &mut Spec, g: &Graph, info: &Info, step: &State) -> Result<()> {
    let seeds = spec.seed_layouts(g, info)?;
    let shape = |n: &str| &info.types[n].shape;
    let layout_of = |n: &str| seeds.get(n).map_or_else(|| vec![None; shape(n).len()], |s| s.layout.clone());
    let params: Vec<&String> = step.tensors.keys().filter(|n| !n.starts_with("opt.")).collect();
    // The mesh axes (not entries: a sub-axis uses its whole axis here) that split a param.
    let used: Vec<usize> = params.iter().flat_map(|p| layout_of(p)).flatten().map(|e| spec.mesh.split(e).0).collect();
    let data: Vec<usize> =
        (0..spec.mesh.shape.len()).filter(|a| spec.mesh.shape[*a] > 1 && !used.contains(a)).collect();
    if data.is_empty() {
        anyhow::bail!(
            "--zero: every axis of the mesh splits some param: no data-parallel axis is left to shard the optimizer state over"
        );
    }
    let node = |n: &str| g.nodes.iter().find(|x| x.name == n);
    for p in params {
        let whole = layout_of(p);
        let mut sharded = whole.clone();
        for &a in &data {
            let s = shape(p);
            if let Some(d) = (0..s.len()).find(|&d| sharded[d].is_none() && s[d] % spec.mesh.shape[a] == 0) {
                sharded[d] = Some(a);
            }
        }
        let next = meshc_ir::optim::next_name(p);
        let mut layouts = vec![(p.clone(), whole.clone()), (next.clone(), whole)];
        // The gradient, and what it is a reshape of.
        let mut t = meshc_ir::grad::grad_name(p);
        loop {
            layouts.push((t.clone(), sharded.clone()));
            match node(&t) {
                Some(n) if n.op == meshc_ir::Op::Reshape && shape(&n.inputs[0]) == shape(p) => t = n.inputs[0].clone(),
                _ => break,
            }
        }
        // The state, and the update's nodes of P's shape downstream of it or the gradient.
        let mut tainted: Vec<String> = vec![meshc_ir::grad::grad_name(p), format!("opt.m.{p}"), format!("opt.v.{p}")];
        for n in &g.nodes {
            if n.name != next && n.inputs.iter().any(|i| tainted.contains(i)) && shape(&n.name) == shape(p) {
                tainted.push(n.name.clone());
            }
        }
        layouts.extend(tainted.into_iter().filter(|n| info.types.contains_key(n)).map(|n| (n, sharded.clone())));
        for (name, layout) in layouts {
            spec.layouts.entry(name).or_insert(layout);
        }
    }
    Ok(())
}
