//! The front of the pipeline, and the whole compile: `Job::build` (`Job::run` with
//! `--stop-after` and `--time-passes`) walks the global and stage
//! passes of `pipeline::PASSES` (verify, pilot, place, layout, lower, sendrecv) over the
//! verified graph and its layout spec, hands the lowered programs to `compile::run` for
//! the device and program passes, adds what the spec says of the mesh to the result and
//! checks its memory budget. `compare` measures a pruned run against the unpruned one
//! (`run --compare-unpruned`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use anyhow::{anyhow, Context, Result};
use meshc_ir::params::Params;
use meshc_ir::verify::{verify, Info};
use meshc_ir::{Graph, Tensor};
use meshc_runtime::comm::degraded::Topo;
use meshc_runtime::format::mesh::Mesh;
use meshc_runtime::format::program::{Program, Storage};

use crate::compile::{Compiled, Options};
use crate::layout::Spec;
use crate::passes;
use crate::passes::layout::Layouts;
use crate::passes::lower::Lowered;
use crate::passes::pilot::{Pruned, WeightMask};
use crate::passes::place::Placement;
use crate::pipeline::{self, Dumps, Flow, GlobalPass, Instrument, Level, Pass, StagePass};

/// One compile: the verified graph `g` with its params' values, the options, and
/// optionally a layout spec (without one the graph runs on one device) and the pilot's
/// config. With `pilot`, the pilot pass runs on the global graph (so its masks do not
/// depend on the layout) and prunes its params (`passes::pilot::apply`); the masks go with
/// the weights (sliced with them under a layout) into the artifact, where the matmuls skip
/// their pruned blocks.
pub struct Job<'a, 'p> {
    g: &'a Graph,
    info: &'a Info,
    params: Params<'p>,
    opts: &'a Options,
    spec: Option<&'a Spec>,
    pilot: Option<&'a passes::pilot::Config>,
}

impl<'a, 'p> Job<'a, 'p> {
    pub fn new(g: &'a Graph, info: &'a Info, params: impl Into<Params<'p>>, opts: &'a Options) -> Self {
        Job { g, info, params: params.into(), opts, spec: None, pilot: None }
    }

    pub fn spec(self, spec: Option<&'a Spec>) -> Self {
        Job { spec, ..self }
    }

    pub fn pilot(self, pilot: Option<&'a passes::pilot::Config>) -> Self {
        Job { pilot, ..self }
    }

    /// The whole pipeline (`pipeline::PASSES`) to a compiled artifact, dumping what `dumps`
    /// asks.
    pub fn build(self, dumps: &Dumps) -> Result<Compiled> {
        let built = self.run(&Instrument::dumps(dumps))?;
        Ok(built.expect("only --stop-after stops the pipeline"))
    }

    /// `build`, dumped, timed and stopped as `inst` asks: None when it stops after a pass.
    pub fn run(self, inst: &Instrument) -> Result<Option<Compiled>> {
        let Job { g, info, params, opts, spec, pilot } = self;
        let mut front = Front::new(g, info, spec, &params, opts, pilot);
        if pipeline::run(&mut front, pipeline::front(), inst)? == Flow::Stopped {
            return Ok(None);
        }
        let (lowered, infos, model_axes, pruned) = front.finish();
        let pruned_opts = pruned.as_ref().map(|p| Options { masks: p.masks.clone(), ..opts.clone() });
        let (params, opts) = match (&pruned, &pruned_opts) {
            (Some(p), Some(o)) => (Params::from(&p.params), o),
            _ => (params, opts),
        };
        let Some(built) = crate::compile::run(&lowered, infos, &params, opts, inst)? else { return Ok(None) };
        let mut compiled = built.finish(g, info, &lowered)?;
        if let Some(spec) = spec {
            compiled.meta.degraded = spec.degraded.degradation(&spec.mesh);
            compiled.meta.model_axes = model_axes;
            compiled.meta.hosts = spec.hosts.clone();
            check_memory(&compiled, spec)?;
        }
        Ok(Some(compiled))
    }
}

/// The passes from `place` to `sendrecv` under `spec` (its degradation checked): the lowered
/// programs of every device and the mesh axes that split a param (the model axes `inspect`
/// reports).
pub fn lower_spec(g: &Graph, info: &Info, spec: &Spec) -> Result<(Lowered, Vec<usize>)> {
    let none = HashMap::new();
    let (params, opts) = (Params::from(&none), Options::default());
    let mut front = Front::new(g, info, Some(spec), &params, &opts, None);
    let dumps = Dumps::default();
    pipeline::run(&mut front, pipeline::front().skip_while(|p| p.name != "place"), &Instrument::dumps(&dumps))?;
    let (lowered, _, model_axes, _) = front.finish();
    Ok((lowered, model_axes))
}

/// One stage's graph over its mesh as the stage passes see it (without a placement, the
/// whole graph over the whole mesh).
struct Stage<'a> {
    graph: Cow<'a, Graph>,
    info: Cow<'a, Info>,
    mesh: Mesh,
    /// What heads its part of the dumps (under a placement: which stage, which devices).
    head: String,
    /// Its cluster's label in the dot dumps.
    label: String,
    layouts: Option<Layouts>,
    lowered: Option<Lowered>,
    /// What the verifier inferred of each device's lowered program (None: no work).
    infos: Vec<Option<Info>>,
}

/// The IR of the global and stage passes: the graph, its pruning, its placement, its
/// stages' layouts and lowered programs, and those joined over the mesh.
struct Front<'a, 'p> {
    g: &'a Graph,
    info: &'a Info,
    spec: Option<&'a Spec>,
    params: &'a Params<'p>,
    opts: &'a Options,
    pilot: Option<&'a passes::pilot::Config>,
    /// The pilot's masks, and the params they prune.
    pruned: Option<(Vec<WeightMask>, Pruned)>,
    /// The spec's degradation, checked as its first pass starts.
    topo: Option<Topo>,
    placement: Option<Placement>,
    stages: Vec<Stage<'a>>,
    /// The stages' programs joined by transfers, and what the verifier inferred of them.
    joined: Option<(Lowered, Vec<Option<Info>>)>,
    /// The text of `lower` under a degradation, made as the pass checks what it can lose
    /// (`degrade::dump_lowered`).
    degraded_lower: Option<String>,
    /// The mesh axes that split a param or training state (the model axes `inspect` reports).
    model_axes: Vec<usize>,
}

/// What a program verified after `pass` inferred, or None for a device with no work.
fn verify_lowered(l: &Lowered, pass: &Pass) -> Result<Vec<Option<Info>>> {
    (l.devices.iter().enumerate())
        .map(|(d, dev)| {
            if dev.nodes.is_empty() && dev.outputs.is_empty() {
                return Ok(None);
            }
            Ok(Some(
                verify(dev).with_context(|| format!("device {d}: the program {} made does not verify", pass.name))?,
            ))
        })
        .collect()
}

impl<'a, 'p> Front<'a, 'p> {
    fn new(
        g: &'a Graph,
        info: &'a Info,
        spec: Option<&'a Spec>,
        params: &'a Params<'p>,
        opts: &'a Options,
        pilot: Option<&'a passes::pilot::Config>,
    ) -> Self {
        Front {
            g,
            info,
            spec,
            params,
            opts,
            pilot,
            pruned: None,
            topo: None,
            placement: None,
            stages: Vec::new(),
            joined: None,
            degraded_lower: None,
            model_axes: Vec::new(),
        }
    }

    fn spec(&self) -> &'a Spec {
        self.spec.expect("the spec's passes run with a spec")
    }

    /// The spec's degradation, checked the first time (a degraded mesh must stay usable).
    fn topo(&mut self) -> Result<&Topo> {
        if self.topo.is_none() {
            let spec = self.spec();
            let degraded = spec.degraded.degradation(&spec.mesh);
            let topo = Topo::new(&spec.mesh, &degraded, false).with_context(|| spec.file.clone())?;
            topo.require_healthy().with_context(|| spec.file.clone())?;
            self.topo = Some(topo);
        }
        Ok(self.topo.as_ref().expect("just set"))
    }

    /// The graph the passes after placement compile (with micro-batches, the unrolled one).
    fn placed_graph(&self) -> (&Graph, &Info) {
        match self.placement.as_ref().and_then(|p| p.unrolled.as_ref()) {
            Some((g, i)) => (g, i),
            None => (self.g, self.info),
        }
    }

    /// The stages: the placement's, each its own graph over its sub-mesh, or the whole
    /// graph over the whole mesh.
    fn split(&self) -> Result<Vec<Stage<'a>>> {
        let Some(placement) = &self.placement else {
            let whole = Stage {
                graph: Cow::Borrowed(self.g),
                info: Cow::Borrowed(self.info),
                mesh: self.spec().mesh.clone(),
                head: String::new(),
                label: String::new(),
                layouts: None,
                lowered: None,
                infos: Vec::new(),
            };
            return Ok(vec![whole]);
        };
        let (g, info) = self.placed_graph();
        (placement.stages.iter().enumerate())
            .map(|(s, stage)| {
                let (sg, si) = placement.stage_graph(g, info, s)?;
                let devices: Vec<String> = stage.mesh.devices.iter().map(usize::to_string).collect();
                let devices = devices.join(",");
                Ok(Stage {
                    graph: Cow::Owned(sg),
                    info: Cow::Owned(si),
                    mesh: stage.mesh.mesh.clone(),
                    head: format!("# stage {s}: devices [{devices}] (below, devices are numbered within the stage)\n"),
                    label: format!("stage {s}: devices [{devices}], numbered within it"),
                    layouts: None,
                    lowered: None,
                    infos: Vec::new(),
                })
            })
            .collect()
    }

    /// Lays out stage `s` (its seeds from the placement's stage, or the spec).
    fn layout(&self, s: usize) -> Result<Layouts> {
        let st = &self.stages[s];
        let Some(placement) = &self.placement else {
            let seeds = self.spec().seed_layouts(&st.graph, &st.info)?;
            return Ok(passes::layout::propagate(&st.graph, &st.info, &st.mesh, seeds));
        };
        let seeds = placement.stages[s].seeds(&st.graph, &st.info)?;
        let mut layouts = passes::layout::propagate(&st.graph, &st.info, &st.mesh, seeds);
        // A tensor another stage reads is sent in the layout its stage gives it.
        let (g, info) = self.placed_graph();
        let sent: BTreeSet<String> = placement.crossings(g, info).into_iter().map(|(t, _, _)| t).collect();
        layouts.free_outputs.retain(|o| !sent.contains(o));
        Ok(layouts)
    }

    /// Lowers the whole graph over the whole mesh (no placement), under the spec's
    /// degradation: a device lost must hold no model shard, and gets no work.
    fn lower_whole(&mut self) -> Result<()> {
        let spec = self.spec();
        let st = &self.stages[0];
        let layouts = st.layouts.as_ref().expect("laid out");
        let mut lowered = passes::lower::lower(&st.graph, &st.info, layouts)?;
        // A training step's state is held like params: a device lost would take its shard with it.
        let split = layouts.held_splits(&st.graph);
        let m = &spec.mesh;
        let mut model_axes: Vec<usize> =
            split.iter().filter(|&&(_, a)| m.shards(a) > 1).map(|&(_, a)| m.split(a).0).collect();
        model_axes.sort();
        model_axes.dedup();
        let topo = self.topo.as_ref().expect("checked as the layout pass started");
        crate::degrade::keep_model_shards(topo, &split).with_context(|| spec.file.clone())?;
        let degraded = spec.degraded.degradation(&spec.mesh);
        if !degraded.is_empty() {
            let text = crate::degrade::dump_lowered(&lowered, &degraded).with_context(|| spec.file.clone())?;
            self.degraded_lower = Some(text);
            crate::degrade::leave_out(&mut lowered, &degraded)?;
        }
        self.model_axes = model_axes;
        self.stages[0].lowered = Some(lowered);
        Ok(())
    }

    /// The lowered programs of every device with what the verifier inferred of them, the
    /// model axes, and the pruned params: the single device's program without a spec.
    fn finish(self) -> (Lowered, Vec<Option<Info>>, Vec<usize>, Option<Pruned>) {
        let pruned = self.pruned.map(|(_, p)| p);
        let (lowered, infos) = match (self.joined, self.stages.into_iter().next()) {
            (Some(joined), _) => joined,
            (None, Some(Stage { lowered: Some(l), infos, .. })) => (l, infos),
            _ => (Lowered::single(self.g, self.info), vec![Some(self.info.clone())]),
        };
        (lowered, infos, self.model_axes, pruned)
    }

    /// The text of every stage's part, each under its head.
    fn per_stage(&self, part: impl Fn(&Stage) -> String) -> String {
        self.stages.iter().map(|st| st.head.clone() + &part(st)).collect()
    }

    fn stage_dot(&self) -> String {
        let stages: Vec<(String, &Lowered, &[Option<Info>])> = (self.stages.iter())
            .map(|st| (st.label.clone(), st.lowered.as_ref().expect("lowered"), st.infos.as_slice()))
            .collect();
        crate::dot::lowered(&stages)
    }
}

impl pipeline::Ir for Front<'_, '_> {
    fn lacks(&self, pass: &Pass) -> Option<&'static str> {
        let placed = self.spec.is_some_and(|s| s.placement.is_some());
        match pass.level {
            Level::Global(GlobalPass::Pilot) if self.pilot.is_none() => {
                Some("pilot inputs (--pilot-input NAME=FILE.npy)")
            }
            Level::Global(GlobalPass::Place | GlobalPass::SendRecv) if !placed => {
                Some("a layout spec with a \"placement\" (--layout SPEC)")
            }
            Level::Stage(_) if self.spec.is_none() => Some("a layout spec (--layout SPEC)"),
            _ => None,
        }
    }

    fn run(&mut self, pass: &Pass) -> Result<()> {
        let (g, info) = (self.g, self.info);
        match pass.level {
            Level::Global(GlobalPass::Verify) => {
                passes::epilogue::refuse_fused(g)?;
                passes::attention::refuse_fused(g)?;
            }
            Level::Global(GlobalPass::Pilot) => {
                let cfg = self.pilot.expect("the pilot runs with pilot inputs");
                let all = self.params.all(g)?;
                let masks = passes::pilot::run(g, info, &all, cfg)?;
                let pruned = passes::pilot::apply(g, info, &all, &masks, cfg.block)?;
                self.pruned = Some((masks, pruned));
            }
            Level::Global(GlobalPass::Place) => {
                self.topo()?;
                self.placement = passes::place::place(g, info, self.spec())?;
                // Stages hand their results on by send/recv: a failed device would break the
                // pipeline. Failed links only re-plan the collectives.
                crate::degrade::keep_stages(self.topo()?).with_context(|| self.spec().file.clone())?;
            }
            Level::Stage(StagePass::Layout) => {
                self.topo()?;
                self.stages = self.split()?;
                for s in 0..self.stages.len() {
                    self.stages[s].layouts = Some(self.layout(s)?);
                }
            }
            Level::Stage(StagePass::Lower) if self.placement.is_none() => self.lower_whole()?,
            Level::Stage(StagePass::Lower) => {
                for (s, st) in self.stages.iter_mut().enumerate() {
                    let layouts = st.layouts.as_ref().expect("laid out");
                    st.lowered =
                        Some(passes::lower::lower(&st.graph, &st.info, layouts).with_context(|| format!("stage {s}"))?);
                }
            }
            Level::Global(GlobalPass::SendRecv) => {
                let (g, info) = self.placed_graph();
                let placement = self.placement.as_ref().expect("placed");
                let stages: Vec<Lowered> = self.stages.iter().map(|st| st.lowered.clone().expect("lowered")).collect();
                let joined = passes::sendrecv::join(g, info, &self.spec().mesh, placement, &stages)?;
                self.joined = Some((joined, Vec::new()));
            }
            Level::Device(_) | Level::Program(_) => unreachable!("compile runs {}", pass.name),
        }
        Ok(())
    }

    fn verify(&mut self, pass: &Pass) -> Result<()> {
        match pass.level {
            Level::Stage(StagePass::Lower) => {
                let placed = self.placement.is_some();
                for (s, st) in self.stages.iter_mut().enumerate() {
                    let lowered = st.lowered.as_ref().expect("lowered");
                    let infos = verify_lowered(lowered, pass);
                    st.infos = if placed { infos.with_context(|| format!("stage {s}"))? } else { infos? };
                }
            }
            Level::Global(GlobalPass::SendRecv) => {
                let (joined, infos) = self.joined.as_mut().expect("joined");
                *infos = verify_lowered(joined, pass)?;
            }
            _ => unreachable!("{} rewrites no program", pass.name),
        }
        Ok(())
    }

    fn text(&self, pass: &Pass) -> Result<String> {
        let (g, info) = (self.g, self.info);
        Ok(match pass.level {
            Level::Global(GlobalPass::Verify) => {
                // Weights `--weights-dtype` rounds to a half type are listed after the graph,
                // with the largest rounding error of each: what the conversion costs is known
                // before any pass.
                let mut text = meshc_ir::text::print(g);
                let opts = self.opts;
                use passes::fold::WeightsDtype;
                let converted = match opts.weights {
                    WeightsDtype::F16 | WeightsDtype::BF16 => {
                        let dtype = if opts.weights == WeightsDtype::F16 { "f16" } else { "bf16" };
                        let f = passes::fold::fold(
                            g,
                            info,
                            self.params,
                            &HashMap::new(),
                            opts.weights,
                            &Default::default(),
                        )?;
                        f.converted.into_iter().map(|(name, err)| (name, dtype, err)).collect()
                    }
                    WeightsDtype::Int8 => passes::quantize::errors(g, info, self.params)?,
                    WeightsDtype::Keep | WeightsDtype::F32 => Vec::new(),
                };
                for (name, dtype, err) in &converted {
                    text += &format!("# {name}: f32 -> {dtype} (--weights-dtype), max abs rounding error {err:.3e}\n");
                }
                text
            }
            Level::Global(GlobalPass::Pilot) => {
                let (masks, pruned) = self.pruned.as_ref().expect("pilot ran");
                let cfg = self.pilot.expect("pilot ran");
                passes::pilot::dump(cfg, masks) + &passes::pilot::dump_pruned(pruned)
            }
            Level::Global(GlobalPass::Place) => {
                let (g, info) = self.placed_graph();
                passes::place::dump(g, info, self.placement.as_ref().expect("placed"))
            }
            Level::Stage(StagePass::Layout) => {
                self.per_stage(|st| passes::layout::dump(&st.graph, &st.info, st.layouts.as_ref().expect("laid out")))
            }
            Level::Stage(StagePass::Lower) => match &self.degraded_lower {
                Some(text) => text.clone(),
                None => self.per_stage(|st| passes::lower::dump(st.lowered.as_ref().expect("lowered"))),
            },
            Level::Global(GlobalPass::SendRecv) => passes::lower::dump(&self.joined.as_ref().expect("joined").0),
            Level::Device(_) | Level::Program(_) => unreachable!("compile dumps {}", pass.name),
        })
    }

    fn dot(&self, pass: &Pass) -> String {
        match pass.level {
            Level::Global(GlobalPass::Place) => {
                let (g, info) = self.placed_graph();
                crate::dot::place(g, info, self.placement.as_ref().expect("placed"))
            }
            Level::Stage(StagePass::Lower) => self.stage_dot(),
            Level::Global(GlobalPass::SendRecv) => {
                let (joined, infos) = self.joined.as_ref().expect("joined");
                crate::dot::lowered(&[(String::new(), joined, infos.as_slice())])
            }
            _ => unreachable!("{} has no dot form", pass.name),
        }
    }
}

/// Each device's memory — the weights its program reads plus its arena — against the spec's
/// `memory_per_device`; the error names the device that needs most and by how much it is over.
fn check_memory(c: &Compiled, spec: &Spec) -> Result<()> {
    let Some(budget) = spec.memory_per_device else { return Ok(()) };
    let need = |p: &Program| {
        let mut weights: Vec<(usize, usize)> = p
            .buffers
            .iter()
            .filter_map(|b| match b.storage {
                Storage::Weights { offset } => Some((offset, b.bytes)),
                Storage::Arena { .. } | Storage::Sizes => None,
            })
            .collect();
        weights.sort();
        weights.dedup();
        let w: usize = weights.iter().map(|w| w.1).sum();
        (w as u64, p.arena_bytes as u64)
    };
    let worst = c.programs.iter().map(|p| (need(p), p.device)).max_by_key(|((w, a), d)| (w + a, std::cmp::Reverse(*d)));
    match worst {
        Some(((w, a), d)) if w + a > budget => Err(anyhow!(
            "{}: memory_per_device {budget} bytes: device {d} needs {} bytes (weights {w} + arena {a}), {} more; \
             spread the graph over more devices (\"placement\": {{\"auto\": {{\"stages\": N}}}}, or split its params)",
            spec.file,
            w + a,
            w + a - budget
        )),
        _ => Ok(()),
    }
}

/// The error of each of the `pruned` outputs against the `unpruned` ones (`run
/// --compare-unpruned`): max abs, relative L2 (‖pruned − unpruned‖ / ‖unpruned‖), and for
/// classifier-like outputs (f32, rank ≥ 2, a last axis of 2..=1000 classes) the rows whose
/// argmax agrees.
pub fn compare(pruned: &BTreeMap<String, Tensor>, unpruned: &BTreeMap<String, Tensor>) -> Result<String> {
    let mut s = String::new();
    for (name, p) in pruned {
        let u = unpruned.get(name).ok_or_else(|| anyhow!("the unpruned graph has no output '{name}'"))?;
        if u.ty() != p.ty() {
            return Err(anyhow!("output '{name}' is {} pruned but {} unpruned", p.ty(), u.ty()));
        }
        let (pv, uv) = (p.data.to_f64(), u.data.to_f64());
        let max_abs = pv.iter().zip(&uv).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let diff: f64 = pv.iter().zip(&uv).map(|(a, b)| (a - b) * (a - b)).sum();
        let norm: f64 = uv.iter().map(|b| b * b).sum();
        let rel = if norm == 0.0 {
            if diff == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (diff / norm).sqrt()
        };
        write!(s, "compare-unpruned {name}: max abs error {max_abs:.3e}, relative L2 {rel:.3e}")?;
        let classes = *p.shape.last().unwrap_or(&0);
        if p.dtype() == meshc_ir::DType::F32 && p.shape.len() >= 2 && (2..=1000).contains(&classes) {
            let argmax = |row: &[f64]| (0..row.len()).max_by(|&i, &j| row[i].total_cmp(&row[j]).then(j.cmp(&i)));
            let rows = pv.len() / classes;
            let agree = (pv.chunks(classes).zip(uv.chunks(classes))).filter(|(a, b)| argmax(a) == argmax(b)).count();
            write!(s, ", argmax agrees on {agree} of {rows} rows ({:.2}%)", 100.0 * agree as f64 / rows.max(1) as f64)?;
        }
        writeln!(s)?;
    }
    Ok(s)
}
