//! A symbol and its bounds, and the `--dim` syntax that gives them.

use std::collections::BTreeMap;
use std::fmt;

/// A symbol's allowed values: `lo..=hi`, multiples of `multiple_of`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    pub lo: i64,
    pub hi: i64,
    pub multiple_of: i64,
}

impl Symbol {
    /// Why `v` is not an allowed value, if it is not.
    pub fn refuse(&self, v: i64) -> Option<String> {
        if v < self.lo || v > self.hi {
            return Some(format!("outside {}..{}", self.lo, self.hi));
        }
        (v % self.multiple_of != 0).then(|| format!("not a multiple of {}", self.multiple_of))
    }

    /// A single value, as `--dim NAME=N` gives.
    pub fn is_fixed(&self) -> bool {
        self.lo == self.hi
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_fixed() {
            true => write!(f, "{}={}", self.name, self.lo)?,
            false => write!(f, "{}={}..{}", self.name, self.lo, self.hi)?,
        }
        if self.multiple_of > 1 {
            write!(f, ":multiple_of={}", self.multiple_of)?;
        }
        Ok(())
    }
}

/// The symbols of one compile, by name.
pub type Symbols = BTreeMap<String, Symbol>;

/// The largest bound a symbol may have: every size meshc describes fits far below it.
pub const MAX_BOUND: i64 = 1 << 40;

/// Parses `NAME=N`, `NAME=LO..HI` or either with `:multiple_of=K` (the `--dim` syntax).
pub fn parse_symbol(spec: &str) -> Result<Symbol, String> {
    let bad = |why: &str| format!("--dim {spec}: {why} (expected NAME=N, NAME=LO..HI or NAME=LO..HI:multiple_of=K)");
    let (name, rest) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
        return Err(bad("the name must be letters, digits, '_' or '.'"));
    }
    let (range, multiple_of) = match rest.split_once(':') {
        Some((r, m)) => {
            let k = m.trim().strip_prefix("multiple_of=").ok_or_else(|| bad("after ':' comes multiple_of=K"))?;
            (
                r,
                k.trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|&k| (1..=MAX_BOUND).contains(&k))
                    .ok_or_else(|| bad("K must be a positive integer"))?,
            )
        }
        None => (rest, 1),
    };
    let num = |s: &str| {
        s.trim()
            .parse::<i64>()
            .ok()
            .filter(|v| (0..=MAX_BOUND).contains(v))
            .ok_or_else(|| bad(&format!("'{}' is not a size", s.trim())))
    };
    let (lo, hi) = match range.split_once("..") {
        Some((l, h)) => (num(l)?, num(h)?),
        None => {
            let v = num(range)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(bad(&format!("the range {lo}..{hi} is empty")));
    }
    if hi / multiple_of * multiple_of < lo {
        return Err(bad(&format!("no multiple of {multiple_of} lies in {lo}..{hi}")));
    }
    Ok(Symbol { name: name.to_string(), lo, hi, multiple_of })
}

/// Parses every `--dim`; a name given twice is an error.
pub fn parse_symbols(specs: &[String]) -> Result<Symbols, String> {
    let mut out = Symbols::new();
    for s in specs {
        let sym = parse_symbol(s)?;
        if out.contains_key(&sym.name) {
            return Err(format!("--dim {}: given twice", sym.name));
        }
        out.insert(sym.name.clone(), sym);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim_syntax() {
        let s = parse_symbol("seq=1..512:multiple_of=8").unwrap();
        assert_eq!((s.lo, s.hi, s.multiple_of), (1, 512, 8));
        assert_eq!(s.to_string(), "seq=1..512:multiple_of=8");
        assert!(parse_symbol("batch=4").unwrap().is_fixed());
        for bad in ["seq", "seq=", "=3", "seq=5..2", "seq=1..x", "seq=1..9:8", "seq=9..15:multiple_of=8", "seq=-1..3"] {
            assert!(parse_symbol(bad).is_err(), "{bad}");
        }
        assert_eq!(s.refuse(600).as_deref(), Some("outside 1..512"));
        assert_eq!(s.refuse(13).as_deref(), Some("not a multiple of 8"));
        assert_eq!(s.refuse(16), None);
        assert!(parse_symbols(&["a=1".into(), "a=2".into()]).is_err());
    }
}
