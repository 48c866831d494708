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
pub mod reduce_split;
pub mod sendrecv;
pub mod streams;
pub mod zero_point;

/// Who computes and who reads each value of a program: what the passes that fold a chain
/// of nodes into one (attention, gelu, epilogue) ask of a value the chain would drop.
pub(crate) struct Reads<'g> {
    /// The node computing each value.
    pub producer: std::collections::HashMap<&'g str, usize>,
    /// The nodes reading each value, a node once per operand position it reads it in.
    pub readers: std::collections::HashMap<&'g str, Vec<usize>>,
    outputs: std::collections::HashSet<&'g str>,
}

impl<'g> Reads<'g> {
    pub fn new(g: &'g meshc_ir::Graph) -> Reads<'g> {
        let mut reads =
            Reads { producer: Default::default(), readers: Default::default(), outputs: Default::default() };
        for (i, n) in g.nodes.iter().enumerate() {
            reads.producer.insert(n.name.as_str(), i);
            for x in &n.inputs {
                reads.readers.entry(x.as_str()).or_default().push(i);
            }
        }
        reads.outputs = g.outputs.iter().map(|o| o.name.as_str()).collect();
        reads
    }

    /// How many times `name` is read.
    pub fn count(&self, name: &str) -> usize {
        self.readers.get(name).map_or(0, Vec::len)
    }

    /// The node reading `name` when it is read once.
    pub fn reader(&self, name: &str) -> Option<usize> {
        match self.readers.get(name).map(Vec::as_slice) {
            Some(&[i]) => Some(i),
            _ => None,
        }
    }

    pub fn is_output(&self, name: &str) -> bool {
        self.outputs.contains(name)
    }

    /// The node computing `name` when a chain may drop it: computed as the program runs
    /// (not folded), read once, no output.
    pub fn inner(&self, name: &str, folded: &fold::Folded) -> Option<usize> {
        let i = *self.producer.get(name)?;
        (self.count(name) == 1 && !self.is_output(name) && !folded.has(name)).then_some(i)
    }
}

/// Every name `g` defines (inputs, params, nodes): what a pass adding nodes keeps clear of
/// (`fresh`).
pub(crate) fn names(g: &meshc_ir::Graph) -> std::collections::HashSet<String> {
    let inputs = g.inputs.iter().map(|i| i.name.clone());
    inputs.chain(g.params.iter().map(|p| p.name.clone())).chain(g.nodes.iter().map(|n| n.name.clone())).collect()
}

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
