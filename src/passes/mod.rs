//! The passes between the verified graph and code generation, one module each, named as
//! `--dump-after` names them. Each is a function from IR to IR.

pub mod attention;
pub mod buffers;
pub mod epilogue;
pub mod expand;
pub mod fold;
pub mod fuse;
pub mod layout;
pub mod lower;
pub mod pilot;
pub mod place;
pub mod quantize;
pub mod sendrecv;
pub mod streams;
