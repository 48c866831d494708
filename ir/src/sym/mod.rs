//! Symbolic dims: a graph compiled once for a range of sizes. A symbol (`seq`) names the
//! dims of the graph's inputs that carry that dim name, and has bounds `lo..hi` and an
//! optional divisor; the graph as written is one instance (its sizes are the symbols'
//! example values, which read the size attributes of reshape, broadcast_to and slice).
//! `infer` gives every tensor a shape of dim expressions and the checks a run must pass;
//! `bind` takes the symbols' values from a call's inputs and `specialise` writes the graph at
//! them, for the interpreter. docs/dynamic-shapes.md describes the model and the stages.

pub mod bind;
pub mod expr;
pub mod infer;
pub mod symbol;

pub use bind::{bind, specialise};
pub use expr::{Binding, Expr};
pub use infer::{infer_graph, Check, SymInfo};
pub use symbol::{parse_symbol, parse_symbols, Bounds, Symbol, Symbols, MAX_BOUND};
