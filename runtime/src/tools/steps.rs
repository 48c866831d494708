//! Training runs: a training artifact (`meshc compile --loss --optimizer`) computes one
//! step, state tensors in (the params and the optimizer's moments and step count, as
//! inputs) and `next.S` out. `train` runs it N times on one loaded program — compiled code
//! and weights stay mapped, the state stays on the devices from one step to the next
//! (`crate::exec::resident`) — with a new batch per step from a data directory, prints the
//! loss of every step, and writes the state as a safetensors checkpoint (temporary file,
//! fsync, rename: a crash leaves the previous checkpoint or the new one, never a torn one).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::optim::next_name;
use meshc_ir::tensor::{safetensors_bytes, safetensors_dtype};
use meshc_ir::{DType, Tensor, TensorType};

use crate::exec::resident::Resident;
use crate::exec::runner::Loaded;
use crate::format::artifact::SectionKind;
use crate::tools::output::Outputs;

/// The flags of a training run.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct StepArgs {
    /// Run a training artifact (or graph, with --loss and --optimizer) N steps, feeding
    /// each step's updated state to the next.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..),
        conflicts_with_all = ["inputs", "outputs", "output_dir", "bench", "check_against", "trace", "link_stats",
            "fail_device", "stop_host", "replan_on_failure", "compare_unpruned", "conditional", "pilot_inputs"]
    )]
    pub steps: Option<u64>,
    /// The batches: DIR/step_000000/NAME.npy... per step, or DIR/NAME.npy with a leading
    /// step axis.
    #[arg(long, value_name = "DIR", requires = "steps")]
    pub data: Option<PathBuf>,
    /// Also write the checkpoint every K steps.
    #[arg(long, value_name = "K", requires = "steps", value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,
    /// Start from this checkpoint (a previous run's), at the step it was written after.
    #[arg(long, value_name = "CKPT", requires = "steps")]
    pub resume: Option<PathBuf>,
    /// Where the checkpoint goes (default: NAME.ckpt.safetensors in the working directory,
    /// NAME the program's file name without its extension).
    #[arg(long, value_name = "CKPT", requires = "steps")]
    pub checkpoint: Option<PathBuf>,
}

/// The state of a training run: its tensors by name and the steps done so far.
#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub tensors: BTreeMap<String, Tensor>,
    pub step: u64,
}

const STEP_KEY: &str = "meshc.step";
/// In a checkpoint: `State::checksum` in hex, which reading it checks (a flipped bit in a
/// tensor would otherwise resume silently).
const CHECKSUM_KEY: &str = "meshc.crc32";
/// In a state section: the tensors left out because they are all zero, name → type.
const ZEROS_KEY: &str = "meshc.zeros";

impl State {
    /// The checkpoint's bytes: every tensor under its name, the step in the metadata.
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        let tensors: Vec<(&str, &Tensor)> = self.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let meta = HashMap::from([
            (STEP_KEY.to_string(), self.step.to_string()),
            (CHECKSUM_KEY.to_string(), format!("{:08x}", self.checksum())),
        ]);
        Ok(safetensors_bytes(&tensors, Some(meta))?)
    }

    /// CRC-32 of the step and of every tensor's name, type and bytes, in name order.
    pub fn checksum(&self) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&self.step.to_le_bytes());
        for (name, t) in &self.tensors {
            for part in [name.as_bytes(), t.ty().to_string().as_bytes(), &t.to_le_bytes()] {
                h.update(&part.len().to_le_bytes());
                h.update(part);
            }
        }
        h.finalize()
    }

    /// Reads a checkpoint `to_safetensors` wrote: a regular file (a FIFO would hang the
    /// read, a device never end), whose checksum must match what it holds.
    pub fn read(path: &Path) -> Result<State> {
        let file = path.display().to_string();
        let bytes = meshc_ir::file::read(path, u64::MAX, "checkpoint").map_err(|e| anyhow!("{file}: {}", e.msg))?;
        let state = State::parse(&bytes, &file, |_| None)?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("parsed above");
        match meta.metadata().as_ref().and_then(|m| m.get(CHECKSUM_KEY)) {
            None => bail!("{file}: no '{CHECKSUM_KEY}' in its metadata (a checkpoint meshc writes has one)"),
            Some(c) if *c != format!("{:08x}", state.checksum()) => {
                bail!("{file}: its contents do not match its checksum '{CHECKSUM_KEY}' (the file is corrupted)")
            }
            Some(_) => Ok(state),
        }
    }

    /// The bytes of a training artifact's state section: the checkpoint's, but with every
    /// tensor that is all zero (the optimizer's fresh moments, zero biases) left out and
    /// only named, with its type, in the metadata: the artifact does not grow by the
    /// optimizer's state.
    pub fn to_section(&self) -> Result<Vec<u8>> {
        let zero = |t: &Tensor| t.to_le_bytes().iter().all(|&b| b == 0);
        let tensors: Vec<(&str, &Tensor)> =
            self.tensors.iter().filter(|(_, t)| !zero(t)).map(|(n, t)| (n.as_str(), t)).collect();
        let zeros: BTreeMap<&str, String> =
            self.tensors.iter().filter(|(_, t)| zero(t)).map(|(n, t)| (n.as_str(), t.ty().to_string())).collect();
        let meta = HashMap::from([
            (STEP_KEY.to_string(), self.step.to_string()),
            (ZEROS_KEY.to_string(), serde_json::to_string(&zeros)?),
        ]);
        Ok(safetensors_bytes(&tensors, Some(meta))?)
    }

    /// The initial state in the state section of the artifact `loaded` was loaded from
    /// (`to_section`), if it has one: the tensors it leaves out are zeros of the program's
    /// input types.
    pub fn initial(loaded: &Loaded, file: &str) -> Result<Option<State>> {
        let Some(bytes) = loaded.section(SectionKind::State) else { return Ok(None) };
        let ty = |n: &str| loaded.meta.inputs.iter().find(|i| i.name == n).and_then(|i| i.ty());
        State::parse(bytes, &format!("{file}: state section"), ty).map(Some)
    }

    /// A checkpoint's (or a state section's) bytes; `zero_type` types the tensors the
    /// metadata lists as zeros.
    fn parse(bytes: &[u8], file: &str, zero_type: impl Fn(&str) -> Option<TensorType>) -> Result<State> {
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .with_context(|| format!("{file}: not a safetensors checkpoint"))?;
        let meta = meta.metadata().clone().unwrap_or_default();
        let step = match meta.get(STEP_KEY) {
            None => bail!("{file}: not a meshc checkpoint (no '{STEP_KEY}' in its metadata)"),
            Some(s) => s.parse().map_err(|_| anyhow!("{file}: '{STEP_KEY}' is '{s}', not a count of steps"))?,
        };
        let st = safetensors::SafeTensors::deserialize(bytes)
            .with_context(|| format!("{file}: not a safetensors checkpoint"))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let dtype = DType::ALL.into_iter().find(|&d| safetensors_dtype(d) == view.dtype()).ok_or_else(|| {
                anyhow!("{file}: tensor '{name}' has dtype {:?}, which meshc does not read", view.dtype())
            })?;
            let ty = TensorType::new(dtype, view.shape().to_vec());
            tensors.insert(name.clone(), Tensor::from_le_bytes(&ty, view.data()));
        }
        if let Some(zeros) = meta.get(ZEROS_KEY) {
            let zeros: BTreeMap<String, String> = serde_json::from_str(zeros)
                .map_err(|e| anyhow!("{file}: '{ZEROS_KEY}' is not a map of names to types: {e}"))?;
            for (name, written) in zeros {
                let ty = zero_type(&name)
                    .filter(|t| t.to_string() == written)
                    .ok_or_else(|| anyhow!("{file}: zero tensor '{name}' ({written}) is no input of the program"))?;
                tensors.insert(name, Tensor::from_le_bytes(&ty, &vec![0u8; ty.size_bytes()]));
            }
        }
        Ok(State { tensors, step })
    }

    /// Writes the checkpoint to `path`: all of it, or (on any failure or kill) nothing.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut out = Outputs::new();
        out.write_bytes(path, &self.to_safetensors()?)?;
        out.commit()
    }
}

/// The state inputs of a training program: the inputs S with an output `next.S`, in the
/// program's input order.
pub fn state_names(loaded: &Loaded) -> Vec<String> {
    let outputs: Vec<&str> = loaded.meta.outputs.iter().map(|o| o.name.as_str()).collect();
    loaded.meta.inputs.iter().map(|i| i.name.clone()).filter(|n| outputs.contains(&next_name(n).as_str())).collect()
}

/// Where the batches of a run come from.
enum Batches {
    /// DIR/step_NNNNNN/NAME.npy
    PerStep(PathBuf),
    /// DIR/NAME.npy, each with a leading step axis: its bytes and its number of steps.
    Stacked(HashMap<String, (Vec<u8>, u64)>),
}

impl Batches {
    fn open(dir: &Path, inputs: &[(String, TensorType)]) -> Result<Batches> {
        if dir.join("step_000000").is_dir() {
            return Ok(Batches::PerStep(dir.to_path_buf()));
        }
        let mut all = HashMap::new();
        for (name, ty) in inputs {
            let path = dir.join(format!("{name}.npy"));
            let t = Tensor::read_npy(&path).map_err(|e| anyhow!("--data: {e}"))?;
            if t.dtype() != ty.dtype || t.shape.len() != ty.rank() + 1 || t.shape[1..] != ty.shape[..] {
                bail!(
                    "--data {}: {} but input '{name}' is {ty} (a batch per step needs [STEPS, ...])",
                    path.display(),
                    t.ty()
                );
            }
            all.insert(name.clone(), (t.to_le_bytes(), t.shape[0] as u64));
        }
        Ok(Batches::Stacked(all))
    }

    fn get(&self, step: u64, inputs: &[(String, TensorType)]) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for (name, ty) in inputs {
            let t = match self {
                Batches::PerStep(dir) => {
                    let path = dir.join(format!("step_{step:06}")).join(format!("{name}.npy"));
                    let t = Tensor::read_npy(&path).map_err(|e| anyhow!("--data: {e}"))?;
                    if t.ty() != *ty {
                        bail!("--data {}: {} but input '{name}' is {ty}", path.display(), t.ty());
                    }
                    t
                }
                Batches::Stacked(all) => {
                    let (bytes, steps) = &all[name];
                    if step >= *steps {
                        bail!("--data: {name}.npy holds {steps} steps; step {step} has no batch");
                    }
                    let size = ty.size_bytes();
                    let at = step as usize * size;
                    Tensor::from_le_bytes(ty, &bytes[at..at + size])
                }
            };
            out.insert(name.clone(), t);
        }
        Ok(out)
    }
}

/// Runs `args.steps` steps of the training program `loaded` from `state`, printing each
/// step's loss (every scalar output that is not state) on stdout, and writes the checkpoint
/// to `checkpoint` every `save_every` steps and at the end.
pub fn train(loaded: &Loaded, mut state: State, args: &StepArgs, checkpoint: &Path) -> Result<State> {
    let names = state_names(loaded);
    if names.is_empty() {
        bail!("--steps: this program has no state (compile it with --loss NAME --optimizer SPEC)");
    }
    for n in &names {
        let want = loaded.meta.inputs.iter().find(|i| &i.name == n).and_then(|i| i.ty());
        match state.tensors.get(n) {
            None => bail!("the initial state has no tensor '{n}'"),
            Some(t) if Some(t.ty()) != want => {
                bail!(
                    "the initial state's '{n}' is {} but the program's is {}",
                    t.ty(),
                    want.map_or("?".into(), |w| w.to_string())
                )
            }
            Some(_) => {}
        }
    }
    // Moments of an optimizer this program does not have would be dropped silently.
    if let Some(n) = state.tensors.keys().find(|n| !names.contains(n)) {
        bail!("the initial state holds '{n}', which is no state of this program (a checkpoint of another optimizer?)");
    }
    let batch_inputs: Vec<(String, TensorType)> =
        crate::tools::cli::expected_inputs(loaded).into_iter().filter(|(n, _)| !names.contains(n)).collect();
    let batches = match &args.data {
        Some(dir) => Some(Batches::open(dir, &batch_inputs)?),
        None if batch_inputs.is_empty() => None,
        None => bail!("--steps: the program reads {} per step; give them with --data DIR", batch_inputs[0].0),
    };
    let reported: Vec<&str> = loaded
        .meta
        .outputs
        .iter()
        .filter(|o| o.shape.is_empty() && !o.name.starts_with("next."))
        .map(|o| o.name.as_str())
        .collect();
    let steps = args.steps.unwrap_or(0);
    if state.step.checked_add(steps).is_none() {
        bail!("--steps {steps} from step {}: the step count would pass {}", state.step, u64::MAX);
    }
    // A run that would find no batch for its last steps is refused before its first.
    if let Some(Batches::Stacked(all)) = &batches {
        let short = batch_inputs.iter().map(|(n, _)| (n, all[n].1)).find(|&(_, have)| state.step + steps > have);
        if let Some((name, have)) = short {
            bail!(
                "--data: {name}.npy holds {have} steps; steps {} to {} need a batch each",
                state.step,
                state.step + steps - 1
            );
        }
    }
    // The state goes onto the devices once and stays there; only checkpoints gather it.
    let mut resident = loaded.upload(&state.tensors, &names, next_name)?;
    let save = |state: &mut State, resident: &Resident| -> Result<()> {
        state.tensors = loaded.download(resident)?;
        state.save(checkpoint)
    };
    let start = state.step;
    for _ in 0..steps {
        let inputs = match batches.as_ref().map(|b| b.get(state.step, &batch_inputs)).transpose() {
            Ok(inputs) => inputs.unwrap_or_default(),
            // A bad batch found only at its step does not lose the steps before it.
            Err(e) if state.step > start => {
                save(&mut state, &resident)?;
                // Steps count from 0: the last one run is state.step - 1.
                bail!("{e:#} (the state after step {} is saved in {})", state.step - 1, checkpoint.display());
            }
            Err(e) => return Err(e),
        };
        let out = loaded.run_resident(&inputs, &mut resident).with_context(|| format!("step {}", state.step))?;
        let losses: Vec<String> =
            reported.iter().filter_map(|r| out.get(*r).map(|t| format!("{r} {}", t.data.to_f64()[0] as f32))).collect();
        // Numbered like the batches (DIR/step_K) and errors: from 0.
        crate::tools::cli::print(&format!("step {} {}\n", state.step, losses.join(" ")));
        state.step += 1;
        if args.save_every.is_some_and(|k| state.step.is_multiple_of(k)) {
            save(&mut state, &resident)?;
        }
    }
    save(&mut state, &resident)?;
    Ok(state)
}
