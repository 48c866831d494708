//! The text of `inspect`: an artifact's sections, metadata, kernels, buffers, steps with
//! their streams and events and why each communication step is there, masks and send/recv
//! pairs; and the step and stream notes the compiler's `--dump-after codegen` and
//! `streams` share.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use crate::artifact::{Artifact, SectionKind};
use crate::loader::parse_sections;
use crate::program::{CollectiveOp, Exec, Library, Program, Step, Storage, StreamKind};

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
    if let crate::signature::Signed::By(key, valid) = art.signature()? {
        let state = if valid { "valid" } else { "DOES NOT MATCH the contents" };
        writeln!(s, "signed by ed25519 key {} ({state})", crate::signature::hex(key.as_bytes()))?;
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
        writeln!(s, "streams: {}", streams_summary(p))?;
    }
    writeln!(s, "steps:")?;
    for (i, st) in p.steps.iter().enumerate() {
        let exec = exec_text(p, st);
        let bufs: Vec<String> = st.buffers.iter().map(|b| format!("b{b}")).collect();
        let sync = if p.streams.streams.is_empty() { String::new() } else { step_note(p, i) };
        writeln!(s, "  {:<24} {:<36} ({}) {sync}", st.node, exec, bufs.join(", "))?;
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

/// What runs step `st` of `p`: its kernel, library call (with its shapes, epilogue and
/// how its operands are stored), collective or transfer, as `inspect` and the compiler's
/// `--dump-after codegen` print it.
pub fn exec_text(p: &Program, st: &Step) -> String {
    match &st.exec {
        Exec::Kernel(k) => format!("kernel k{k}"),
        Exec::Library(Library::Matmul { a, b, panels, epilogue, transposed, .. }) => {
            let steps: Vec<&str> = epilogue.iter().map(crate::epilogue::Step::name).collect();
            let epilogue = if steps.is_empty() { String::new() } else { format!(" + {}", steps.join(",")) };
            let stored = match (transposed.a, transposed.b) {
                (true, true) => " (a, b stored transposed)",
                (true, false) => " (a stored transposed)",
                (false, true) => " (b stored transposed)",
                (false, false) => "",
            };
            let panels = if *panels { " (weight in panels)" } else { "" };
            format!("library gemm {a:?}x{b:?}{epilogue}{panels}{stored}")
        }
        Exec::Library(Library::Attention { q, k, v, scale, mask, .. }) => {
            let scale = scale.map_or(String::new(), |s| format!(" {} scale", s.name()));
            let mask = mask.as_ref().map_or(String::new(), |m| format!(" + mask{m:?}"));
            format!("library attention {q:?}x{k:?}{scale}{mask} softmax x{v:?}")
        }
        Exec::Collective(c) => {
            let group = c.groups.iter().find(|g| g.contains(&p.device)).cloned().unwrap_or_default();
            let group: Vec<String> = group.iter().map(usize::to_string).collect();
            format!("#{} {} {}{:?} group [{}]", c.id, collective_name(&c.op), c.dtype, c.shape, group.join(","))
        }
        Exec::Send(t) => format!("send -> {} {} {} B", t.peer, t.protocol.name(), t.bytes),
        Exec::Recv(t) => format!("recv <- {} {} {} B", t.peer, t.protocol.name(), t.bytes),
    }
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

/// "s1 comm": how dumps and `meshc inspect` name stream `s` of `p`.
pub fn stream_name(p: &Program, s: usize) -> String {
    let kind = match p.streams.streams[s].kind {
        StreamKind::Compute => "compute",
        StreamKind::Comm => "comm",
    };
    format!("s{s} {kind}{}", if s == 0 { " (main)" } else { "" })
}

/// The one-line summary of `p`'s streams: each with its number of steps, the events, and
/// what the main stream joins.
pub fn streams_summary(p: &Program) -> String {
    let plan = &p.streams;
    let streams: Vec<String> = (0..plan.streams.len())
        .map(|k| format!("{}: {} steps", stream_name(p, k), plan.streams[k].steps.len()))
        .collect();
    let join: Vec<String> = plan.join.iter().map(|e| format!("e{e}")).collect();
    format!(
        "{}; {} events; join {}",
        streams.join(", "),
        plan.events.len(),
        if join.is_empty() { "-".to_string() } else { join.join(" ") }
    )
}

/// Step `i`'s stream and events: "s1 wait e0 record e1".
pub fn step_note(p: &Program, i: usize) -> String {
    let plan = &p.streams;
    let stream = plan.streams.iter().position(|s| s.steps.contains(&i)).unwrap_or(0);
    let mut note = format!("s{stream}");
    let waits: Vec<String> = plan.waits.iter().filter(|w| w.before == i).map(|w| format!("e{}", w.event)).collect();
    if !waits.is_empty() {
        let _ = write!(note, " wait {}", waits.join(" "));
    }
    let records: Vec<String> =
        plan.events.iter().enumerate().filter(|(_, e)| e.after == i).map(|(k, _)| format!("e{k}")).collect();
    if !records.is_empty() {
        let _ = write!(note, " record {}", records.join(" "));
    }
    note
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
