//! What can be wrong with the tensors a run is handed, as values: the runner's checks, the
//! embedding API (`crate::api`) and the command line all report these, so each mistake reads
//! the same one line wherever it is made.

use meshc_ir::TensorType;

/// A tensor handed to a run that does not fit the program.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// An input the graph does not have; `hint` is a "did you mean" (or empty), `known` the
    /// graph's inputs, listed.
    #[error("the graph has no input '{name}'{hint} ({known})")]
    UnknownInput { name: String, hint: String, known: String },
    #[error("missing input '{name}' ({want})")]
    MissingInput { name: String, want: TensorType },
    #[error("input '{name}' is {got}, the graph expects {want}")]
    WrongInput { name: String, got: TensorType, want: TensorType },
    #[error("input '{name}' is given twice")]
    DuplicateInput { name: String },
    #[error("the graph has no output '{name}'{hint} ({known})")]
    UnknownOutput { name: String, hint: String, known: String },
    #[error("output '{name}' is {want}, its buffer is {got}")]
    WrongOutput { name: String, got: TensorType, want: TensorType },
    #[error("output '{name}' is asked for twice")]
    DuplicateOutput { name: String },
}

impl Mismatch {
    /// `name` is not among `names` (what the graph has, an input's or an output's).
    pub fn unknown<'a>(name: &str, names: impl Iterator<Item = &'a str> + Clone, output: bool) -> Mismatch {
        let hint = meshc_ir::suggest::did_you_mean(name, names.clone());
        let what = if output { "outputs" } else { "inputs" };
        let known = match names.collect::<Vec<_>>().join(", ") {
            // A graph whose every input was fixed at compile time (an ONNX input with an
            // initializer, or --const) takes none.
            none if none.is_empty() => format!("it has no {what}"),
            some => format!("its {what}: {some}"),
        };
        let name = name.to_string();
        match output {
            false => Mismatch::UnknownInput { name, hint, known },
            true => Mismatch::UnknownOutput { name, hint, known },
        }
    }
}
