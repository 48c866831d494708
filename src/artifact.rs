//! Writing a `Compiled` as an artifact file (signed, and with a training step's initial
//! state, when asked), and the make-style depfile (`compile -MF`) listing what it is built
//! from.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use meshc_runtime::format::artifact::{SectionKind, Writer};
use meshc_runtime::format::program::ALIGN;
use meshc_runtime::tools::output::Outputs;

use crate::compile::{Code, Compiled};

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
    let w = writer(c, signer, state)?;
    // Through a temporary file renamed into place when `files` commit: a runner that has
    // the old file mapped keeps its (unchanged) inode, and a crash never leaves a
    // half-written artifact under the final name.
    files.write(out, |f| w.write_to(f))
}

/// `c` as the bytes of an artifact file, for a model opened from memory
/// (`meshc_runtime::api::Model::from_bytes`) without writing one.
pub fn artifact_bytes(c: &Compiled) -> Result<Vec<u8>> {
    writer(c, None, None)?.to_bytes()
}

fn writer(c: &Compiled, signer: Option<ed25519_dalek::SigningKey>, state: Option<Vec<u8>>) -> Result<Writer<'_>> {
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
    Ok(w)
}

/// A make rule `OUT: DEP ...` with the characters make would read otherwise escaped as
/// make reads them: a space (a separator), `#` (a comment), `:` (the rule's colon) with a
/// backslash, `$` (a variable) doubled.
pub fn depfile(out: &Path, deps: &[PathBuf]) -> String {
    let esc = |p: &Path| {
        let mut s = String::new();
        for c in p.display().to_string().chars() {
            match c {
                ' ' | '#' | ':' => s.push('\\'),
                '$' => s.push('$'),
                _ => {}
            }
            s.push(c);
        }
        s
    };
    let mut s = format!("{}:", esc(out));
    for d in deps {
        s.push_str(" \\\n  ");
        s.push_str(&esc(d));
    }
    s.push('\n');
    s
}
