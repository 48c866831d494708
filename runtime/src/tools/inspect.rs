//! The text of `inspect`: an artifact's sections, metadata, kernels, buffers, steps with
//! their streams and events and why each communication step is there, masks and send/recv
//! pairs; `inspect --json`, the same artifact as data; and `flops_skipped`. The step and stream notes it shares with the compiler's
//! dumps are `format::order`'s.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use meshc_ir::text::DimsDisplay;

use crate::exec::loader::parse_sections;
use crate::format::artifact::{Artifact, SectionKind};
use crate::format::order::{collective_name, exec_text, step_note, streams_summary};
use crate::format::program::{Exec, Program, Storage};
use crate::format::symbolic::{Scaling, Symbolic};

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
    if let crate::format::signature::Signed::By(key, valid) = art.signature()? {
        let state = if valid { "valid" } else { "DOES NOT MATCH the contents" };
        writeln!(s, "signed by ed25519 key {} ({state})", crate::format::signature::hex(key.as_bytes()))?;
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
        let c = |d: usize| m.coords_string(d);
        let nodes: Vec<String> = meta.degraded.nodes.iter().map(|&d| c(d)).collect();
        let links: Vec<String> = meta.degraded.links.iter().map(|&(a, b)| format!("{}-{}", c(a), c(b))).collect();
        writeln!(s, "degraded devices [{}] links [{}]", nodes.join(" "), links.join(" "))?;
    }
    let sym = meta.symbolic.as_ref();
    if let Some(sym) = sym {
        writeln!(s, "symbols {} (buffers planned at the upper bounds)", crate::exec::sizes::describe(sym))?;
        for c in &sym.checks {
            writeln!(s, "run-time check: {c}")?;
        }
    }
    // With symbols, a tensor's shape over them and, after it, at the upper bounds.
    let shape = |dims: Option<&Vec<meshc_ir::sym::Expr>>, at: &[usize]| match dims {
        Some(d) => format!("{} (at most {at:?})", meshc_ir::sym::infer::show(d)),
        None => format!("{at:?}"),
    };
    let io = |what: &str, i: &crate::format::program::IoSpec, dims: Option<&Vec<meshc_ir::sym::Expr>>| {
        let layout = if i.layout.iter().any(Option::is_some) {
            format!(" layout {}", i.mesh(m).layout_string(&i.layout))
        } else {
            String::new()
        };
        let stage = i.stage.as_ref().map_or(String::new(), |s| {
            let d: Vec<String> = s.devices.iter().map(usize::to_string).collect();
            format!(" on devices [{}]", d.join(","))
        });
        let names = if i.dims.is_empty() { String::new() } else { format!(" {}", DimsDisplay(&i.dims)) };
        format!("{what} {}: {}{}{names}{layout}{stage}", i.name, i.dtype, shape(dims, &i.shape))
    };
    for (k, i) in meta.inputs.iter().enumerate() {
        writeln!(s, "{}", io("input ", i, sym.and_then(|y| y.inputs.get(k))))?;
    }
    for (k, o) in meta.outputs.iter().enumerate() {
        writeln!(s, "{}", io("output", o, sym.and_then(|y| y.outputs.get(k))))?;
    }
    for p in &programs {
        program_report(&mut s, p, sym)?;
        mask_report(&mut s, p, art.section(SectionKind::Weights).unwrap_or(&[]))?;
    }
    if let Some(total) = flops_skipped(&programs, meta.flops) {
        writeln!(s, "{total}")?;
    }
    transfer_report(&mut s, &programs)?;
    Ok(s)
}

/// `inspect --json`: the sections with their checksums, the signature, and the metadata and
/// programs exactly as the artifact stores them (the format's own serde form, so a script
/// sees every field the runner does, named as in docs/artifact.md).
pub fn inspect_json(art: &Artifact, file: &str) -> Result<String> {
    let (meta, programs) = parse_sections(art, file)?;
    let sections: Vec<serde_json::Value> = art
        .sections()
        .iter()
        .map(|sec| {
            serde_json::json!({
                "kind": sec.kind.name(),
                "offset": sec.offset,
                "size": sec.size,
                "crc32": format!("{:08x}", sec.checksum),
            })
        })
        .collect();
    let signature = match art.signature()? {
        crate::format::signature::Signed::No => serde_json::Value::Null,
        crate::format::signature::Signed::By(key, valid) => serde_json::json!({
            "ed25519": crate::format::signature::hex(key.as_bytes()),
            "valid": valid,
        }),
    };
    let report = serde_json::json!({
        "artifact": file,
        "sections": sections,
        "signature": signature,
        "meta": meta,
        "programs": programs,
    });
    Ok(serde_json::to_string_pretty(&report)? + "\n")
}

/// The pruning masks of one device's weights, read back from the weights section.
fn mask_report(s: &mut String, p: &Program, weights: &[u8]) -> Result<()> {
    for b in &p.buffers {
        let (Some(info), Storage::Weights { offset }) = (&b.mask, &b.storage) else { continue };
        let m = crate::format::mask::Mask::decode(weights, *offset, info.rows, info.cols)
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

fn program_report(s: &mut String, p: &Program, sym: Option<&Symbolic>) -> Result<()> {
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
            Storage::Sizes => "sizes".to_string(),
        };
        writeln!(s, "  b{i:<3} {:<24} {:>10} bytes  {at}", b.name, b.bytes)?;
    }
    if !p.streams.streams.is_empty() {
        writeln!(s, "streams: {}", streams_summary(p))?;
    }
    writeln!(s, "steps:")?;
    for (i, st) in p.steps.iter().enumerate() {
        let exec = exec_text(p, st);
        let bufs: Vec<String> = st.buffers.iter().map(|b| format!("b{b}")).collect();
        let sync = if p.streams.streams.is_empty() { String::new() } else { step_note(p, i) };
        writeln!(s, "  {:<24} {:<36} ({}) {sync}", st.node, exec, bufs.join(", "))?;
        // Which steps depend on the symbols, and how.
        match (&st.scaling, sym) {
            (Some(Scaling::Rows { size, .. }), Some(sym)) => {
                let rows = sym.sizes.get(*size).map_or("?".to_string(), ToString::to_string);
                writeln!(s, "    scales: rows {rows}")?;
            }
            (Some(Scaling::Shapes(shapes)), _) => {
                let shapes: Vec<String> = shapes.iter().map(|d| meshc_ir::sym::infer::show(d)).collect();
                writeln!(s, "    scales: planned per call for {}", shapes.join(", "))?;
            }
            _ => {}
        }
        if let Some(w) = &st.why {
            let what = match &st.exec {
                Exec::Collective(c) => collective_name(&c.op),
                other => other.kind().to_string(),
            };
            writeln!(s, "    why: {}", w.describe(&what))?;
        }
    }
    Ok(())
}

/// The send/recv pairs of all programs, by key: who sends to whom, how many bytes, which
/// protocol.
fn transfer_report(s: &mut String, programs: &[Program]) -> Result<()> {
    let sends: Vec<(usize, &crate::format::program::Transfer)> = programs
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
