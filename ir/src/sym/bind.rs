//! A call's sizes: the symbols' values read off its inputs' shapes, checked against the
//! bounds, the divisors and every run-time check, and the graph written at those values.

use super::expr::Binding;
use super::infer::SymInfo;
use crate::attr::Attr;
use crate::graph::Graph;

/// Binds the symbols from the inputs' actual shapes (`shape_of` gives an input's, by name);
/// the first violation is one line naming the input, the symbol and the bound.
pub fn bind<'a>(g: &Graph, si: &SymInfo, shape_of: impl Fn(&str) -> Option<&'a [usize]>) -> Result<Binding, String> {
    let mut b = Binding::new();
    let mut from: Vec<(String, String)> = Vec::new();
    for i in &g.inputs {
        let Some(actual) = shape_of(&i.name) else { continue };
        let want = &si.shapes[&i.name];
        if actual.len() != want.len() {
            return Err(format!(
                "input {}: rank {} given, the graph's {} is rank {}",
                i.name,
                actual.len(),
                super::infer::show(want),
                want.len()
            ));
        }
        for (k, (e, &v)) in want.iter().zip(actual).enumerate() {
            let v = i64::try_from(v).map_err(|_| format!("input {}: dim {k} is too large", i.name))?;
            let Some(s) = e.as_sym() else {
                if e.as_const() != Some(v) {
                    return Err(format!("input {}: dim {k} is {v}, the graph's is {e}", i.name));
                }
                continue;
            };
            if let Some(why) = si.symbols[s].refuse(v) {
                return Err(format!("input {}: dim {k} ({s}) is {v}, {why}", i.name));
            }
            match b.insert(s.to_string(), v) {
                Some(prev) if prev != v => {
                    let other = &from.iter().find(|(n, _)| n == s).expect("bound before").1;
                    return Err(format!("input {}: dim {k} ({s}) is {v}, but input {other} has {s} = {prev}", i.name));
                }
                Some(_) => {}
                None => from.push((s.to_string(), i.name.clone())),
            }
        }
    }
    for c in &si.checks {
        if c.kind.holds(&b) == Some(false) {
            let mut vals: Vec<String> = b.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            vals.sort();
            return Err(format!("input sizes {} fail the check {c}", vals.join(", ")));
        }
    }
    Ok(b)
}

/// `g` written at the binding `b` (which `bind` accepted): the inputs' shapes, the declared
/// node shapes and the size attributes evaluated, no symbols declared. At the graph's own
/// sizes it is `g` itself, without its symbols.
pub fn specialise(g: &Graph, si: &SymInfo, b: &Binding) -> Result<Graph, String> {
    // Every size of the written graph is a value: the bounds it declared are spent.
    if *b == si.example {
        return Ok(Graph { symbols: Default::default(), ..g.clone() });
    }
    let eval = |name: &str| -> Result<Vec<usize>, String> {
        si.shapes[name]
            .iter()
            .map(|e| {
                e.eval(b).and_then(|v| usize::try_from(v).ok()).ok_or_else(|| format!("'{name}': {e} has no size here"))
            })
            .collect()
    };
    let mut out = Graph { symbols: Default::default(), ..g.clone() };
    for i in &mut out.inputs {
        i.ty.shape = eval(&i.name)?;
    }
    for n in &mut out.nodes {
        if n.shape.is_some() {
            n.shape = Some(eval(&n.name)?);
        }
        for sa in si.sizes.get(&n.name).into_iter().flatten() {
            let Some(Attr::List(vals)) = n.attrs.get_mut(sa.key) else {
                return Err(format!("node '{}': attribute '{}' is not a list", n.name, sa.key));
            };
            for (v, e) in vals.iter_mut().zip(&sa.entries) {
                if let Some(e) = e {
                    let x = e.eval(b).ok_or_else(|| format!("node '{}': {e} has no value here", n.name))?;
                    *v = Attr::Int(x);
                }
            }
        }
    }
    Ok(out)
}
