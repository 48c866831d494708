//! Where the IR goes after each pass (`--dump-after`, `--dump-dir`), and the list of
//! passes in the order the pipeline runs them.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use meshc_runtime::output::Outputs;

/// The passes `--dump-after` can name, in the order they run (their number prefixes the
/// files of `--dump-dir`). The pilot runs on the global graph, before placement, so its
/// masks do not depend on the layout; fold, fuse, streams and buffers run per device.
pub const PASSES: &[&str] =
    &["verify", "pilot", "place", "layout", "lower", "sendrecv", "fold", "fuse", "streams", "buffers"];

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

    /// Whether `pass` is dumped.
    pub fn wants(&self, pass: &str) -> bool {
        self.names(pass) || self.after.iter().any(|a| a == "all")
    }

    /// Whether `pass` is named on its own: `all` dumps the passes that run, and a pass
    /// that cannot run (no spec, no pilot inputs) is an error only when named.
    pub fn names(&self, pass: &str) -> bool {
        self.after.iter().any(|a| a == pass)
    }

    pub fn emit(&self, pass: &str, text: impl FnOnce() -> String) -> Result<()> {
        if !self.wants(pass) {
            return Ok(());
        }
        let text = text();
        match &self.dir {
            Some(dir) => {
                let n = PASSES.iter().position(|p| *p == pass).expect("a known pass") + 1;
                let file = dir.join(format!("{n:02}-{pass}.txt"));
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
