//! The embedding API's errors: each is one line, as the command line prints it.

use crate::exec::mismatch::Mismatch;

/// What a call of the embedding API failed with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A tensor handed to a run does not fit the graph: a wrong name, dtype or shape, or a
    /// missing input.
    #[error(transparent)]
    Mismatch(#[from] Mismatch),
    /// A view whose memory does not hold its shape's elements of its dtype.
    #[error("{0}")]
    View(String),
    /// The artifact could not be opened, verified or loaded.
    #[error("{0}")]
    Open(String),
    /// The run failed (a device's error, a timeout, a panic caught in a device thread).
    #[error("{0}")]
    Run(String),
    /// A training call without the state it needs, or with state that does not fit.
    #[error("{0}")]
    State(String),
}

impl Error {
    /// A runner error: the typed mismatch it carries, if any, else `kind` of its one line.
    pub(crate) fn from_run(e: anyhow::Error, kind: fn(String) -> Error) -> Error {
        match e.downcast_ref::<Mismatch>() {
            Some(m) if e.chain().count() == 1 => Error::Mismatch(m.clone()),
            _ => kind(one_line(&e)),
        }
    }
}

/// An error's whole context chain on one line, control characters escaped and long quoted
/// strings shortened (escaped first, so that what is shortened is what is printed): how
/// every meshc error is shown.
pub fn one_line(e: &anyhow::Error) -> String {
    meshc_ir::error::shorten_quoted(&meshc_ir::error::escape_controls(&format!("{e:#}"), false))
}
