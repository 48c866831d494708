//! What the binaries do with a runner: the run command shared by `meshc-run` and `meshc run`
//! (`cli`), training runs (`steps`), token generation (`generate`), the text of `inspect` (`inspect`), Chrome traces
//! (`trace`), and all-or-nothing output files (`output`).

pub mod cli;
pub mod generate;
pub mod inspect;
pub mod output;
pub mod steps;
pub mod trace;
