//! The passes between the verified graph and code generation, one module each, named as
//! `--dump-after` names them. Each is a function from IR to IR.

pub mod attention;
pub mod buffers;
pub mod epilogue;
pub mod expand;
pub mod fold;
pub mod fuse;
pub mod gelu;
pub mod layout;
pub mod lower;
pub mod pilot;
pub mod place;
pub mod quantize;
pub mod sendrecv;
pub mod streams;

/// `base.what`, or `base.whatK` for the first K from 2 that is not in `used`: the name of a
/// node a pass adds after `base`.
pub(crate) fn fresh(used: &std::collections::HashSet<String>, base: &str, what: &str) -> String {
    let mut name = format!("{base}.{what}");
    let mut k = 1;
    while used.contains(&name) {
        k += 1;
        name = format!("{base}.{what}{k}");
    }
    name
}
