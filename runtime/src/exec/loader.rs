//! Opening an artifact into a runnable `Loaded`: the metadata and program sections parsed,
//! the code mapped executable only after the container verified it.

use anyhow::{anyhow, Context, Result};

use crate::exec::runner::{Code, Loaded, Weights};
use crate::format::artifact::{Artifact, SectionKind};
use crate::format::program::{Meta, Program};

/// The metadata and the per-device programs of `art`; `file` names it in errors.
pub fn parse_sections(art: &Artifact, file: &str) -> Result<(Meta, Vec<Program>)> {
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
pub fn load_artifact(art: Artifact, file: &str) -> Result<Loaded> {
    let (meta, programs) = parse_sections(&art, file)?;
    let code = art.map_code()?;
    Loaded::new(meta, programs, Code::Mapped(code), Weights::Artifact(std::sync::Arc::new(art)))
        .with_context(|| file.to_string())
}
