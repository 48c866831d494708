//! Where the IR goes after each pass (`--dump-after`, `--dump-dir`), in which form
//! (`--dump-format`: text, or Graphviz dot for the passes whose IR is a graph), and the
//! list of passes in the order the pipeline runs them.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use meshc_runtime::tools::output::Outputs;

/// The passes `--dump-after` can name, in the order they run (their number prefixes the
/// files of `--dump-dir`). The pilot runs on the global graph, before placement, so its
/// masks do not depend on the layout; fold, attention, epilogue, fuse, streams and buffers run per
/// device.
pub const PASSES: &[&str] = &[
    "verify",
    "pilot",
    "place",
    "layout",
    "lower",
    "sendrecv",
    "fold",
    "attention",
    "epilogue",
    "fuse",
    "streams",
    "buffers",
];

/// The passes with a dot form (`crate::dot`): stages, devices and streams are graphs.
pub const DOT_PASSES: &[&str] = &["place", "lower", "sendrecv", "streams"];

/// The form of the dumps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    /// Graphviz's dot (`dot -Tsvg`), for `DOT_PASSES` only.
    Dot,
}

/// Where `--dump-after` sends the IR after each pass it names.
#[derive(Default)]
pub struct Dumps {
    pub after: Vec<String>,
    pub dir: Option<PathBuf>,
    pub format: Format,
}

impl Dumps {
    /// Checks the pass names (`all` names every pass, or every one with a dot form).
    pub fn new(after: Vec<String>, dir: Option<PathBuf>, format: Format) -> Result<Dumps> {
        for a in &after {
            if a != "all" && !PASSES.contains(&a.as_str()) {
                return Err(anyhow!("--dump-after: unknown pass '{a}' (passes: {}, or all)", PASSES.join(", ")));
            }
            if a != "all" && format == Format::Dot && !DOT_PASSES.contains(&a.as_str()) {
                return Err(anyhow!(
                    "--dump-format dot: pass '{a}' has no dot form (passes with one: {})",
                    DOT_PASSES.join(", ")
                ));
            }
        }
        Ok(Dumps { after, dir, format })
    }

    /// Whether `pass` is dumped.
    pub fn wants(&self, pass: &str) -> bool {
        let named = self.names(pass) || self.after.iter().any(|a| a == "all");
        named && (self.format == Format::Text || DOT_PASSES.contains(&pass))
    }

    /// Whether `pass` is named on its own: `all` dumps the passes that run, and a pass
    /// that cannot run (no spec, no pilot inputs) is an error only when named.
    pub fn names(&self, pass: &str) -> bool {
        self.after.iter().any(|a| a == pass)
    }

    /// Dumps a pass without a dot form (`wants` is false for it under dot).
    pub fn emit(&self, pass: &str, text: impl FnOnce() -> String) -> Result<()> {
        debug_assert!(!DOT_PASSES.contains(&pass), "{pass} has a dot form: emit_graph");
        self.emit_graph(pass, text, String::new)
    }

    /// Dumps a pass of `DOT_PASSES` in the chosen form.
    pub fn emit_graph(&self, pass: &str, text: impl FnOnce() -> String, dot: impl FnOnce() -> String) -> Result<()> {
        if !self.wants(pass) {
            return Ok(());
        }
        let (text, ext) = match self.format {
            Format::Text => (text(), "txt"),
            Format::Dot => (dot(), "dot"),
        };
        match &self.dir {
            Some(dir) => {
                let n = PASSES.iter().position(|p| *p == pass).expect("a known pass") + 1;
                let file = dir.join(format!("{n:02}-{pass}.{ext}"));
                // Each dump appears whole, as its pass completes: a compile that fails in a
                // later pass keeps the dumps that show how far it got.
                let mut out = Outputs::new();
                std::fs::create_dir_all(dir)
                    .map_err(anyhow::Error::from)
                    .and_then(|_| out.write_bytes(&file, text.as_bytes()))
                    .and_then(|_| out.commit())
                    .with_context(|| format!("--dump-dir: cannot write {}", file.display()))
            }
            None => {
                print!("{text}");
                Ok(())
            }
        }
    }
}
