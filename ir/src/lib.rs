//! meshc-ir: the graph data model, its JSON and text formats, the verifier, shape
//! inference and the reference interpreter — the oracle every compiled path is tested
//! against.

// First: the family pattern macros the op table defines (`unary_ops!()`) are in scope in
// the modules declared after it.
#[macro_use]
pub mod ops;

mod append;
pub mod attr;
pub mod attrs;
pub mod budget;
pub mod cost;
pub mod dtype;
pub mod einsum;
pub mod error;
pub mod file;
pub mod grad;
pub mod graph;
pub mod infer;
pub mod init;
pub mod interp;
pub mod json;
pub mod load;
pub mod loss;
pub mod optim;
pub mod params;
pub mod suggest;
pub mod sym;
pub mod tensor;
pub mod text;
pub mod verify;
pub mod weights;
pub mod window;

pub use attr::{Attr, Attrs};
pub use dtype::{DType, TensorType};
pub use error::{Error, Loc, Result};
pub use graph::{Dims, Graph, Init, Input, Node, Output, Param, ParamData};
pub use ops::{Family, Op};
pub use tensor::{Data, Tensor};
