//! Glue between the compiler, the artifact container and the runner: writing a `Compiled`
//! as an artifact, opening an artifact into a runnable `Loaded`, a make-style depfile, and
//! the text of `meshc inspect`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use meshc_ir::{Graph, ParamData};

use std::collections::HashMap;

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
pub const PASSES: &[&str] = &["verify", "layout", "lower", "pilot", "buffers", "streams"];

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
/// layout); its masks are computed and dumped, not yet applied: the artifact is the
/// unpruned one.
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
    let emit_pilot = || match (pilot, &masks) {
        (Some(cfg), Some(m)) => dumps.emit("pilot", || passes::pilot::dump(cfg, m)),
        _ if dumps.after.iter().any(|a| a == "pilot") => {
            Err(anyhow!("--dump-after pilot needs pilot inputs (--pilot-input NAME=FILE.npy)"))
        }
        _ => Ok(()),
    };
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
    let layouts = passes::layout::propagate(g, info, &spec.mesh, spec.seed_layouts(g, info)?);
    dumps.emit("layout", || passes::layout::dump(g, info, &layouts))?;
    let lowered = passes::lower::lower(g, info, &layouts)?;
    dumps.emit("lower", || passes::lower::dump(&lowered))?;
    emit_pilot()?;
    let compiled = compile_lowered(g, info, &lowered, params, opts)?;
    dumps.emit("buffers", || passes::buffers::dump(&compiled.programs))?;
    dumps.emit("streams", || passes::streams::dump(&compiled.programs))?;
    Ok(compiled)
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
    let io = |what: &str, i: &crate::program::IoSpec| {
        let layout = if i.layout.iter().any(Option::is_some) {
            format!(" layout {}", m.layout_string(&i.layout))
        } else {
            String::new()
        };
        format!("{what} {}: {}{:?}{layout}", i.name, i.dtype, i.shape)
    };
    for i in &meta.inputs {
        writeln!(s, "{}", io("input ", i))?;
    }
    for o in &meta.outputs {
        writeln!(s, "{}", io("output", o))?;
    }
    for p in &programs {
        program_report(&mut s, p)?;
    }
    Ok(s)
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
        writeln!(s, "  k{i:<3} {:<32} offset {:>7}  {:>6} bytes", k.name, k.offset, k.len)?;
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
        };
        let bufs: Vec<String> = st.buffers.iter().map(|b| format!("b{b}")).collect();
        let sync = if p.streams.streams.is_empty() { String::new() } else { passes::streams::step_note(p, i) };
        writeln!(s, "  {:<24} {:<36} ({}) {sync}", st.node, exec, bufs.join(", "))?;
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
