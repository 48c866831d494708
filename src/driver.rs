//! Glue between the compiler, the artifact container and the runner: writing a `Compiled`
//! as an artifact, opening an artifact into a runnable `Loaded`, a make-style depfile, and
//! the text of `meshc inspect`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::params::Params;
use meshc_ir::Graph;

use std::collections::{BTreeMap, BTreeSet};

use meshc_ir::verify::Info;
use meshc_ir::Tensor;

use crate::compile::{compile_lowered, Code, Compiled, Options};
use crate::dumps::Dumps;
use crate::layout::Spec;
use crate::passes;
use crate::passes::lower::Lowered;
use meshc_runtime::comm::degraded::Topo;
use meshc_runtime::format::artifact::{SectionKind, Writer};
use meshc_runtime::format::program::{Program, Storage, ALIGN};
use meshc_runtime::tools::output::Outputs;

/// The whole pipeline, in the order of `dumps::PASSES`: the verified graph `g` (with its
/// params' values), and optionally a layout spec, to a compiled artifact. Without a spec
/// the graph runs on one device. With `pilot`, the pilot pass runs on the global graph (so
/// its masks do not depend on the layout) and prunes its params (`passes::pilot::apply`);
/// the masks go with the weights (sliced with them under a layout) into the artifact,
/// where the matmuls skip their pruned blocks.
pub fn build<'p>(
    g: &Graph,
    info: &Info,
    spec: Option<&Spec>,
    params: impl Into<Params<'p>>,
    opts: &Options,
    dumps: &Dumps,
    pilot: Option<&passes::pilot::Config>,
) -> Result<Compiled> {
    let params = params.into();
    passes::epilogue::refuse_fused(g)?;
    passes::attention::refuse_fused(g)?;
    // Weights `--weights-dtype` rounds to a half type are listed after the graph, with the
    // largest rounding error of each: what the conversion costs is known before any pass.
    let converted = match opts.weights {
        passes::fold::WeightsDtype::F16 | passes::fold::WeightsDtype::BF16 if dumps.wants("verify") => {
            passes::fold::fold(g, info, &params, &std::collections::HashMap::new(), opts.weights)?.converted
        }
        _ => Vec::new(),
    };
    dumps.emit("verify", || {
        let mut text = meshc_ir::text::print(g);
        for (name, err) in &converted {
            let dtype = if opts.weights == passes::fold::WeightsDtype::F16 { "f16" } else { "bf16" };
            text += &format!("# {name}: f32 -> {dtype} (--weights-dtype), max abs rounding error {err:.3e}\n");
        }
        text
    })?;
    let pruned = match pilot {
        Some(cfg) => {
            let all = params.all(g)?;
            let masks = passes::pilot::run(g, info, &all, cfg)?;
            let pruned = passes::pilot::apply(g, info, &all, &masks, cfg.block)?;
            dumps.emit("pilot", || passes::pilot::dump(cfg, &masks) + &passes::pilot::dump_pruned(&pruned))?;
            Some(pruned)
        }
        None if dumps.names("pilot") => bail!("--dump-after pilot needs pilot inputs (--pilot-input NAME=FILE.npy)"),
        None => None,
    };
    let pruned_opts = pruned.as_ref().map(|p| Options { masks: p.masks.clone(), ..opts.clone() });
    let (params, opts) = match (&pruned, &pruned_opts) {
        (Some(p), Some(o)) => (Params::from(&p.params), o),
        _ => (params, opts),
    };
    let Some(spec) = spec else {
        if let Some(pass) = ["place", "layout", "lower", "sendrecv"].into_iter().find(|p| dumps.names(p)) {
            let with = if matches!(pass, "place" | "sendrecv") { " with a \"placement\"" } else { "" };
            bail!("--dump-after {pass} needs a layout spec{with} (--layout SPEC)");
        }
        return compile_lowered(g, info, &Lowered::single(g, info), &params, opts, dumps);
    };
    let (lowered, model_axes) = lower_spec(g, info, spec, dumps)?;
    let degraded = spec.degraded.degradation(&spec.mesh);
    let mut compiled = compile_lowered(g, info, &lowered, &params, opts, dumps)?;
    compiled.meta.degraded = degraded;
    compiled.meta.model_axes = model_axes;
    compiled.meta.hosts = spec.hosts.clone();
    check_memory(&compiled, spec)?;
    Ok(compiled)
}

/// The passes from `place` to `sendrecv` under `spec` (its degradation checked): the lowered
/// programs of every device and the mesh axes that split a param (the model axes `inspect`
/// reports).
pub fn lower_spec(g: &Graph, info: &Info, spec: &Spec, dumps: &Dumps) -> Result<(Lowered, Vec<usize>)> {
    let degraded = spec.degraded.degradation(&spec.mesh);
    let topo =
        meshc_runtime::comm::degraded::Topo::new(&spec.mesh, &degraded, false).with_context(|| spec.file.clone())?;
    topo.require_healthy().with_context(|| spec.file.clone())?;
    match passes::place::place(g, info, spec)? {
        Some(placement) => {
            // Stages hand their results on by send/recv: a failed device would break the
            // pipeline. Failed links only re-plan the collectives.
            crate::degrade::keep_stages(&topo).with_context(|| spec.file.clone())?;
            Ok((lower_placed(g, info, spec, &placement, dumps)?, Vec::new()))
        }
        None => {
            if let Some(pass) = ["place", "sendrecv"].into_iter().find(|p| dumps.names(p)) {
                bail!("--dump-after {pass} needs a layout spec with a \"placement\" (--layout SPEC)");
            }
            lower_laid_out(g, info, spec, &topo, dumps)
        }
    }
}

/// The passes `layout` and `lower` for a spec without a placement, under the spec's
/// degradation `topo`: the lowered programs (degraded devices left without work) and the
/// mesh axes that split a param or training state (the model axes `inspect` reports).
fn lower_laid_out(g: &Graph, info: &Info, spec: &Spec, topo: &Topo, dumps: &Dumps) -> Result<(Lowered, Vec<usize>)> {
    let layouts = passes::layout::propagate(g, info, &spec.mesh, spec.seed_layouts(g, info)?);
    dumps.emit("layout", || passes::layout::dump(g, info, &layouts))?;
    let mut lowered = passes::lower::lower(g, info, &layouts)?;
    // A training step's state is held like params: a device lost would take its shard with it.
    let split = layouts.held_splits(g);
    crate::degrade::keep_model_shards(topo, &split).with_context(|| spec.file.clone())?;
    let m = &spec.mesh;
    let mut model_axes: Vec<usize> =
        split.iter().filter(|&&(_, a)| m.shards(a) > 1).map(|&(_, a)| m.split(a).0).collect();
    model_axes.sort();
    model_axes.dedup();
    let degraded = spec.degraded.degradation(&spec.mesh);
    let dot = || crate::dot::lowered(&[(String::new(), &lowered)]);
    if degraded.is_empty() {
        dumps.emit_graph("lower", || passes::lower::dump(&lowered), dot)?;
    } else {
        let text = crate::degrade::dump_lowered(&lowered, &degraded).with_context(|| spec.file.clone())?;
        dumps.emit_graph("lower", || text, dot)?;
        crate::degrade::leave_out(&mut lowered, &degraded)?;
    }
    Ok((lowered, model_axes))
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
                Storage::Arena { .. } => None,
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

/// The passes from `place` to `sendrecv` for a spec with a placement: each stage's graph is
/// laid out and lowered over its sub-mesh, then the stages are joined by transfers.
pub fn lower_placed(
    g: &Graph,
    info: &Info,
    spec: &Spec,
    placement: &passes::place::Placement,
    dumps: &Dumps,
) -> Result<Lowered> {
    // With micro-batches the unrolled graph is what runs.
    let (g, info) = placement.unrolled.as_ref().map_or((g, info), |(g, i)| (g, i));
    dumps.emit_graph("place", || passes::place::dump(g, info, placement), || crate::dot::place(g, info, placement))?;
    let (mut layout_dump, mut lower_dump) = (String::new(), String::new());
    let (mut stages, mut labels) = (Vec::new(), Vec::new());
    // A tensor another stage reads is sent in the layout its stage gives it.
    let sent: BTreeSet<String> = placement.crossings(g, info).into_iter().map(|(t, _, _)| t).collect();
    for (s, stage) in placement.stages.iter().enumerate() {
        let (sg, si) = placement.stage_graph(g, info, s)?;
        let mut layouts = passes::layout::propagate(&sg, &si, &stage.mesh.mesh, stage.seeds(&sg, &si)?);
        layouts.free_outputs.retain(|o| !sent.contains(o));
        let lowered = passes::lower::lower(&sg, &si, &layouts).with_context(|| format!("stage {s}"))?;
        let devices: Vec<String> = stage.mesh.devices.iter().map(usize::to_string).collect();
        let head =
            format!("# stage {s}: devices [{}] (below, devices are numbered within the stage)\n", devices.join(","));
        layout_dump += &head;
        layout_dump += &passes::layout::dump(&sg, &si, &layouts);
        lower_dump += &head;
        lower_dump += &passes::lower::dump(&lowered);
        stages.push(lowered);
        labels.push(format!("stage {s}: devices [{}], numbered within it", devices.join(",")));
    }
    dumps.emit("layout", || layout_dump)?;
    dumps.emit_graph(
        "lower",
        || lower_dump,
        || crate::dot::lowered(&labels.iter().cloned().zip(&stages).collect::<Vec<_>>()),
    )?;
    let joined = passes::sendrecv::join(g, info, &spec.mesh, placement, &stages)?;
    dumps.emit_graph(
        "sendrecv",
        || passes::lower::dump(&joined),
        || crate::dot::lowered(&[(String::new(), &joined)]),
    )?;
    Ok(joined)
}

/// Writes `c` as one artifact file, signed when a key is given. Programs are stored as a
/// list, one per device.
pub fn write_artifact(c: &Compiled, out: &Path, signer: Option<ed25519_dalek::SigningKey>) -> Result<()> {
    let mut files = Outputs::new();
    stage_artifact(c, &mut files, out, signer, None)?;
    files.commit()
}

/// Stages `c` as an artifact at `out` in `files` (written when they commit), with the
/// state section `state` of a training step (`steps::State::to_section`) if given.
pub fn stage_artifact(
    c: &Compiled,
    files: &mut Outputs,
    out: &Path,
    signer: Option<ed25519_dalek::SigningKey>,
    state: Option<Vec<u8>>,
) -> Result<()> {
    let Code::Section(code) = &c.code else {
        bail!("compiled to run in memory: compile with `Emit::Artifact` to write an artifact");
    };
    let meta = serde_json::to_vec_pretty(&c.meta)?;
    let programs = serde_json::to_vec_pretty(&c.programs)?;
    let mut w = Writer::new();
    w.signer = signer;
    w.add_section(SectionKind::Meta, 8, meta)?;
    w.add_section(SectionKind::Program, 8, programs)?;
    w.add_section(SectionKind::Code, 64, &code[..])?;
    w.add_section(SectionKind::Weights, ALIGN, &c.weights[..])?;
    if let Some(state) = state {
        w.add_section(SectionKind::State, 8, state)?;
    }
    // Through a temporary file renamed into place when `files` commit: a runner that has
    // the old file mapped keeps its (unchanged) inode, and a crash never leaves a
    // half-written artifact under the final name.
    files.write(out, |f| w.write_to(f))
}

/// A make rule `OUT: DEP ...` with spaces escaped the way make reads them.
pub fn depfile(out: &Path, deps: &[PathBuf]) -> String {
    let esc = |p: &Path| p.display().to_string().replace(' ', "\\ ");
    let mut s = format!("{}:", esc(out));
    for d in deps {
        s.push_str(" \\\n  ");
        s.push_str(&esc(d));
    }
    s.push('\n');
    s
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
