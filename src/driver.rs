//! Glue between the compiler, the artifact container and the runner: writing a `Compiled`
//! as an artifact, opening an artifact into a runnable `Loaded`, a make-style depfile, and
//! the text of `meshc inspect`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use meshc_ir::{Graph, ParamData};

use std::collections::{BTreeMap, HashMap};

use meshc_ir::verify::Info;
use meshc_ir::Tensor;

use crate::artifact::{Artifact, SectionKind, Writer};
use crate::compile::{compile, compile_lowered, Compiled, Options};
use crate::layout::Spec;
use crate::passes;
use crate::program::{CollectiveOp, Exec, Library, Meta, Program, Storage, ALIGN};
use crate::runner::{Code, Loaded};

/// The passes `--dump-after` can name, in pipeline order (their number prefixes the files
/// of `--dump-dir`).
pub const PASSES: &[&str] = &["verify", "place", "layout", "lower", "sendrecv", "pilot", "buffers", "streams"];

/// Where `--dump-after` sends the IR after each pass it names.
#[derive(Default)]
pub struct Dumps {
    pub after: Vec<String>,
    pub dir: Option<PathBuf>,
}

impl Dumps {
    /// Checks the pass names (`all` names every pass).
    pub fn new(after: Vec<String>, dir: Option<PathBuf>) -> Result<Dumps> {
        for a in &after {
            if a != "all" && !PASSES.contains(&a.as_str()) {
                return Err(anyhow!("--dump-after: unknown pass '{a}' (passes: {}, or all)", PASSES.join(", ")));
            }
        }
        Ok(Dumps { after, dir })
    }

    fn emit(&self, pass: &str, text: impl FnOnce() -> String) -> Result<()> {
        if !self.after.iter().any(|a| a == pass || a == "all") {
            return Ok(());
        }
        let text = text();
        match &self.dir {
            Some(dir) => {
                let n = PASSES.iter().position(|p| *p == pass).expect("a known pass") + 1;
                let file = dir.join(format!("{n:02}-{pass}.txt"));
                std::fs::create_dir_all(dir)
                    .and_then(|_| std::fs::write(&file, text))
                    .with_context(|| format!("--dump-dir: cannot write {}", file.display()))
            }
            None => {
                print!("{text}");
                Ok(())
            }
        }
    }
}

/// The whole pipeline: the verified graph `g` (with its params' values), and optionally a
/// layout spec, to a compiled artifact. Without a spec the graph runs on one device. With
/// `pilot`, the pilot pass runs on the global graph (so its masks do not depend on the
/// layout) and prunes its params (`passes::pilot::apply`); the masks go with the weights
/// (sliced with them under a layout) into the artifact, where the matmuls skip their
/// pruned blocks.
pub fn build(
    g: &Graph,
    info: &Info,
    spec: Option<&Spec>,
    params: &HashMap<String, Tensor>,
    opts: &Options,
    dumps: &Dumps,
    pilot: Option<&passes::pilot::Config>,
) -> Result<Compiled> {
    dumps.emit("verify", || meshc_ir::text::print(g))?;
    let masks = pilot.map(|cfg| passes::pilot::run(g, info, params, cfg)).transpose()?;
    let pruned = match (pilot, &masks) {
        (Some(cfg), Some(m)) => Some(passes::pilot::apply(g, info, params, m, cfg.block)?),
        _ => None,
    };
    let pruned_opts = pruned.as_ref().map(|p| Options { masks: p.masks.clone(), ..opts.clone() });
    let (params, opts) = match (&pruned, &pruned_opts) {
        (Some(p), Some(o)) => (&p.params, o),
        _ => (params, opts),
    };
    let emit_pilot = || match (pilot, &masks, &pruned) {
        (Some(cfg), Some(m), Some(p)) => {
            dumps.emit("pilot", || passes::pilot::dump(cfg, m) + &passes::pilot::dump_pruned(p))
        }
        _ if dumps.after.iter().any(|a| a == "pilot") => {
            Err(anyhow!("--dump-after pilot needs pilot inputs (--pilot-input NAME=FILE.npy)"))
        }
        _ => Ok(()),
    };
    let placement = spec.map(|s| passes::place::place(g, info, s)).transpose()?.flatten();
    if placement.is_none() && dumps.after.iter().any(|a| a == "place" || a == "sendrecv") {
        return Err(anyhow!("--dump-after place/sendrecv need a layout spec with a \"placement\" (--layout SPEC)"));
    }
    let Some(spec) = spec else {
        if dumps.after.iter().any(|a| a == "layout" || a == "lower") {
            return Err(anyhow!("--dump-after layout/lower need a layout spec (--layout SPEC)"));
        }
        emit_pilot()?;
        let compiled = compile(g, info, params, opts)?;
        dumps.emit("buffers", || passes::buffers::dump(&compiled.programs))?;
        dumps.emit("streams", || passes::streams::dump(&compiled.programs))?;
        return Ok(compiled);
    };
    if let Some(placement) = placement {
        // Stages hand their results on by send/recv: a failed device would break the
        // pipeline. Failed links only re-plan the collectives.
        let degraded = crate::degraded::Degradation::from_spec(&spec.mesh, &spec.degraded);
        let topo = crate::degraded::Topo::new(&spec.mesh, &degraded, false).with_context(|| spec.file.clone())?;
        crate::degraded::keep_stages(&topo).with_context(|| spec.file.clone())?;
        let joined = lower_placed(g, info, spec, &placement, dumps)?;
        emit_pilot()?;
        let mut compiled = compile_lowered(g, info, &joined, params, opts)?;
        compiled.meta.degraded = degraded;
        dumps.emit("buffers", || passes::buffers::dump(&compiled.programs))?;
        dumps.emit("streams", || passes::streams::dump(&compiled.programs))?;
        check_memory(&compiled, spec)?;
        return Ok(compiled);
    }
    let layouts = passes::layout::propagate(g, info, &spec.mesh, spec.seed_layouts(g, info)?);
    dumps.emit("layout", || passes::layout::dump(g, info, &layouts))?;
    let mut lowered = passes::lower::lower(g, info, &layouts)?;
    let degraded = crate::degraded::Degradation::from_spec(&spec.mesh, &spec.degraded);
    let split: Vec<(&str, usize)> = g
        .params
        .iter()
        .flat_map(|p| layouts.of.get(&p.name).into_iter().flatten().flatten().map(|&a| (p.name.as_str(), a)))
        .collect();
    let topo = crate::degraded::Topo::new(&spec.mesh, &degraded, false).with_context(|| spec.file.clone())?;
    crate::degraded::keep_model_shards(&topo, &split).with_context(|| spec.file.clone())?;
    let mut model_axes: Vec<usize> = split.iter().map(|&(_, a)| a).filter(|&a| spec.mesh.shape[a] > 1).collect();
    model_axes.sort();
    model_axes.dedup();
    if degraded.is_empty() {
        dumps.emit("lower", || passes::lower::dump(&lowered))?;
    } else {
        let text = crate::degraded::dump_lowered(&lowered, &degraded).with_context(|| spec.file.clone())?;
        dumps.emit("lower", || text)?;
        crate::degraded::leave_out(&mut lowered, &degraded)?;
    }
    emit_pilot()?;
    let mut compiled = compile_lowered(g, info, &lowered, params, opts)?;
    compiled.meta.degraded = degraded;
    compiled.meta.model_axes = model_axes;
    dumps.emit("buffers", || passes::buffers::dump(&compiled.programs))?;
    dumps.emit("streams", || passes::streams::dump(&compiled.programs))?;
    check_memory(&compiled, spec)?;
    Ok(compiled)
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
) -> Result<passes::lower::Lowered> {
    // With micro-batches the unrolled graph is what runs.
    let (g, info) = placement.unrolled.as_ref().map_or((g, info), |(g, i)| (g, i));
    dumps.emit("place", || passes::place::dump(g, info, placement))?;
    let (mut layout_dump, mut lower_dump) = (String::new(), String::new());
    let mut stages = Vec::new();
    for (s, stage) in placement.stages.iter().enumerate() {
        let (sg, si) = placement.stage_graph(g, info, s)?;
        let layouts = passes::layout::propagate(&sg, &si, &stage.mesh.mesh, stage.seeds(&sg, &si)?);
        let lowered = passes::lower::lower(&sg, &si, &layouts).with_context(|| format!("stage {s}"))?;
        let devices: Vec<String> = stage.mesh.devices.iter().map(usize::to_string).collect();
        let head =
            format!("# stage {s}: devices [{}] (below, devices are numbered within the stage)\n", devices.join(","));
        layout_dump += &head;
        layout_dump += &passes::layout::dump(&sg, &si, &layouts);
        lower_dump += &head;
        lower_dump += &passes::lower::dump(&lowered);
        stages.push(lowered);
    }
    dumps.emit("layout", || layout_dump)?;
    dumps.emit("lower", || lower_dump)?;
    let joined = passes::sendrecv::join(g, info, &spec.mesh, placement, &stages)?;
    dumps.emit("sendrecv", || passes::lower::dump(&joined))?;
    Ok(joined)
}

/// Writes `c` as one artifact file. Programs are stored as a list, one per device.
pub fn write_artifact(c: &Compiled, out: &Path) -> Result<()> {
    let meta = serde_json::to_vec_pretty(&c.meta)?;
    let programs = serde_json::to_vec_pretty(&c.programs)?;
    let mut w = Writer::new();
    w.add_section(SectionKind::Meta, 8, meta)?;
    w.add_section(SectionKind::Program, 8, programs)?;
    w.add_section(SectionKind::Code, 64, &c.code[..])?;
    w.add_section(SectionKind::Weights, ALIGN, &c.weights[..])?;
    w.write(out)
}

fn parse_sections(art: &Artifact, file: &str) -> Result<(Meta, Vec<Program>)> {
    let section = |k: SectionKind| art.section(k).ok_or_else(|| anyhow!("{file}: no {} section", k.name()));
    let meta: Meta =
        serde_json::from_slice(section(SectionKind::Meta)?).with_context(|| format!("{file}: bad meta section"))?;
    let programs: Vec<Program> = serde_json::from_slice(section(SectionKind::Program)?)
        .with_context(|| format!("{file}: bad program section"))?;
    if programs.len() != meta.mesh.devices() {
        return Err(anyhow!("{file}: {} programs for a mesh of {} devices", programs.len(), meta.mesh.devices()));
    }
    Ok((meta, programs))
}

/// Opens a verified artifact for running. The code is mapped executable only after the
/// container verified it (`Artifact::map_code`) and the metadata parsed.
pub fn load_artifact<'a>(art: &'a Artifact, file: &str) -> Result<Loaded<'a>> {
    let (meta, programs) = parse_sections(art, file)?;
    let weights = art.section(SectionKind::Weights).unwrap_or(&[]);
    let code = art.map_code()?;
    Loaded::new(meta, programs, Code::Mapped(code), weights).with_context(|| file.to_string())
}

/// Every file an artifact is built from: the graph, its param files and the layout spec.
pub fn dependencies(graph_path: &Path, g: &Graph, spec: Option<&Path>) -> Vec<PathBuf> {
    let base = graph_path.parent().unwrap_or(Path::new("."));
    let mut deps = vec![graph_path.to_path_buf()];
    deps.extend(spec.map(Path::to_path_buf));
    for p in &g.params {
        if let ParamData::File { path, .. } = &p.data {
            let f = base.join(path);
            if !deps.contains(&f) {
                deps.push(f);
            }
        }
    }
    deps
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

/// The report of `meshc inspect`: sections, metadata, kernels, buffers and steps.
pub fn inspect(art: &Artifact, file: &str) -> Result<String> {
    let (meta, programs) = parse_sections(art, file)?;
    let mut s = String::new();
    writeln!(s, "artifact {file}")?;
    writeln!(s, "sections:")?;
    for sec in art.sections() {
        writeln!(
            s,
            "  {:<8} offset {:>10}  size {:>10}  crc32 {:08x}",
            sec.kind.name(),
            sec.offset,
            sec.size,
            sec.checksum
        )?;
    }
    writeln!(
        s,
        "graph {} | target {} [{}] | {} device(s)",
        meta.graph,
        meta.target,
        meta.features.join(" "),
        meta.mesh.devices()
    )?;
    let m = &meta.mesh;
    if m.devices() > 1 {
        let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
        writeln!(s, "mesh {} [{}] axes [{}]", m.topology.name(), shape.join("x"), m.axes.join(", "))?;
    }
    if !meta.degraded.is_empty() {
        let c = |d: usize| crate::degraded::coords_string(m, d);
        let nodes: Vec<String> = meta.degraded.nodes.iter().map(|&d| c(d)).collect();
        let links: Vec<String> = meta.degraded.links.iter().map(|&(a, b)| format!("{}-{}", c(a), c(b))).collect();
        writeln!(s, "degraded devices [{}] links [{}]", nodes.join(" "), links.join(" "))?;
    }
    let io = |what: &str, i: &crate::program::IoSpec| {
        let layout = if i.layout.iter().any(Option::is_some) {
            format!(" layout {}", i.mesh(m).layout_string(&i.layout))
        } else {
            String::new()
        };
        let stage = i.stage.as_ref().map_or(String::new(), |s| {
            let d: Vec<String> = s.devices.iter().map(usize::to_string).collect();
            format!(" on devices [{}]", d.join(","))
        });
        format!("{what} {}: {}{:?}{layout}{stage}", i.name, i.dtype, i.shape)
    };
    for i in &meta.inputs {
        writeln!(s, "{}", io("input ", i))?;
    }
    for o in &meta.outputs {
        writeln!(s, "{}", io("output", o))?;
    }
    for p in &programs {
        program_report(&mut s, p)?;
        mask_report(&mut s, p, art.section(SectionKind::Weights).unwrap_or(&[]))?;
    }
    if let Some(total) = flops_skipped(&programs, meta.flops) {
        writeln!(s, "{total}")?;
    }
    transfer_report(&mut s, &programs)?;
    Ok(s)
}

/// The pruning masks of one device's weights, read back from the weights section.
fn mask_report(s: &mut String, p: &Program, weights: &[u8]) -> Result<()> {
    for b in &p.buffers {
        let (Some(info), Storage::Weights { offset }) = (&b.mask, &b.storage) else { continue };
        let m = crate::mask::Mask::decode(weights, *offset, info.rows, info.cols)
            .with_context(|| format!("weight '{}'", b.name))?;
        let runs =
            |r: &[(usize, usize)]| r.iter().map(|(s, l)| format!("[{s},{})", s + l)).collect::<Vec<_>>().join(" ");
        let mut parts = Vec::new();
        if m.cols_kept() < m.cols {
            parts.push(format!(
                "columns kept {} of {} in {}-wide blocks {}",
                m.cols_kept(),
                m.cols,
                m.block,
                runs(&m.col_runs)
            ));
        }
        if m.rows_kept() < m.rows {
            parts.push(format!("rows kept {} of {} {}", m.rows_kept(), m.rows, runs(&m.row_runs)));
        }
        writeln!(
            s,
            "  mask {}: {}; FLOPs skipped {} of {} ({} bytes before the weight)",
            b.name,
            parts.join(", "),
            info.flops_skipped,
            info.flops,
            info.bytes
        )?;
    }
    Ok(())
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

/// The FLOPs the masks of `programs` skip, per weight and in total against `flops`, the
/// unpruned graph's; None without masks.
pub fn flops_skipped(programs: &[Program], flops: u64) -> Option<String> {
    let mut per: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for b in programs.iter().flat_map(|p| &p.buffers) {
        if let Some(m) = &b.mask {
            *per.entry(b.name.as_str()).or_default() += m.flops_skipped;
        }
    }
    if per.is_empty() {
        return None;
    }
    let total: u64 = per.values().sum();
    let each: Vec<String> = per.iter().map(|(n, f)| format!("{n} {f}")).collect();
    let pct = 100.0 * total as f64 / flops.max(1) as f64;
    Some(format!("pilot: FLOPs skipped {total} of {flops} ({pct:.1}%): {}", each.join(", ")))
}

fn program_report(s: &mut String, p: &Program) -> Result<()> {
    writeln!(
        s,
        "device {}: arena {} bytes, {} buffers, {} kernels, {} steps",
        p.device,
        p.arena_bytes,
        p.buffers.len(),
        p.kernels.len(),
        p.steps.len()
    )?;
    writeln!(s, "kernels:")?;
    for (i, k) in p.kernels.iter().enumerate() {
        let parts = if k.parts > 1 { format!("  {} parts", k.parts) } else { String::new() };
        writeln!(s, "  k{i:<3} {:<32} offset {:>7}  {:>6} bytes{parts}", k.name, k.offset, k.len)?;
    }
    writeln!(s, "buffers:")?;
    for (i, b) in p.buffers.iter().enumerate() {
        let at = match b.storage {
            Storage::Arena { offset } => format!("arena+{offset}"),
            Storage::Weights { offset } => format!("weights+{offset}"),
        };
        writeln!(s, "  b{i:<3} {:<24} {:>10} bytes  {at}", b.name, b.bytes)?;
    }
    if !p.streams.streams.is_empty() {
        writeln!(s, "streams: {}", passes::streams::summary(p))?;
    }
    writeln!(s, "steps:")?;
    for (i, st) in p.steps.iter().enumerate() {
        let exec = match &st.exec {
            Exec::Kernel(k) => format!("kernel k{k}"),
            Exec::Library(Library::Matmul { a, b, .. }) => format!("library gemm {a:?}x{b:?}"),
            Exec::Collective(c) => {
                let group = c.groups.iter().find(|g| g.contains(&p.device)).cloned().unwrap_or_default();
                let group: Vec<String> = group.iter().map(usize::to_string).collect();
                format!("#{} {} {}{:?} group [{}]", c.id, collective_name(&c.op), c.dtype, c.shape, group.join(","))
            }
            Exec::Send(t) => format!("send -> {} {} {} B", t.peer, t.protocol.name(), t.bytes),
            Exec::Recv(t) => format!("recv <- {} {} {} B", t.peer, t.protocol.name(), t.bytes),
        };
        let bufs: Vec<String> = st.buffers.iter().map(|b| format!("b{b}")).collect();
        let sync = if p.streams.streams.is_empty() { String::new() } else { passes::streams::step_note(p, i) };
        writeln!(s, "  {:<24} {:<36} ({}) {sync}", st.node, exec, bufs.join(", "))?;
    }
    Ok(())
}

/// The send/recv pairs of all programs, by key: who sends to whom, how many bytes, which
/// protocol.
fn transfer_report(s: &mut String, programs: &[Program]) -> Result<()> {
    let sends: Vec<(usize, &crate::program::Transfer)> = programs
        .iter()
        .flat_map(|p| {
            p.steps.iter().filter_map(move |st| if let Exec::Send(t) = &st.exec { Some((p.device, t)) } else { None })
        })
        .collect();
    if sends.is_empty() {
        return Ok(());
    }
    writeln!(s, "transfers: {} send/recv pair(s)", sends.len())?;
    for (d, t) in sends {
        writeln!(s, "  {:<32} device {d} -> device {}  {:>10} bytes  {}", t.key, t.peer, t.bytes, t.protocol.name())?;
    }
    Ok(())
}

fn collective_name(op: &CollectiveOp) -> String {
    match op {
        CollectiveOp::AllReduce { reduce } => format!("all_reduce {}", reduce.name()),
        CollectiveOp::AllGather { axis } => format!("all_gather axis {axis}"),
        CollectiveOp::ReduceScatter { axis, reduce } => format!("reduce_scatter axis {axis} {}", reduce.name()),
        CollectiveOp::AllToAll { split_axis, concat_axis } => format!("all_to_all {split_axis}->{concat_axis}"),
    }
}
