//! A symbol and its bounds, and the `--dim` syntax that gives them (a graph declares them
//! in the same spelling: `dim seq = 1..512`).

use std::collections::BTreeMap;
use std::fmt;

/// A symbol's allowed values: `lo..=hi`, multiples of `multiple_of`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Symbol {
    pub name: String,
    pub lo: i64,
    pub hi: i64,
    pub multiple_of: i64,
}

impl Symbol {
    /// The symbol `name` over `lo..=hi`, multiples of `multiple_of`; why not, if the
    /// bounds allow no value (an empty range, a divisor of 0 or no multiple inside).
    pub fn new(name: &str, lo: i64, hi: i64, multiple_of: i64) -> Result<Symbol, String> {
        check_name(name)?;
        for (what, v, min) in [("lo", lo, 0), ("hi", hi, 0), ("multiple_of", multiple_of, 1)] {
            if v < min {
                return Err(format!("{what} must be at least {min}, not {v}"));
            }
            if v > MAX_BOUND {
                return Err(format!("{what} {v} is above the largest size a symbol may take ({MAX_BOUND})"));
            }
        }
        if lo > hi {
            return Err(format!("the range {lo}..{hi} is empty"));
        }
        if hi / multiple_of * multiple_of < lo {
            return Err(format!("no multiple of {multiple_of} lies in {lo}..{hi}"));
        }
        Ok(Symbol { name: name.to_string(), lo, hi, multiple_of })
    }

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

/// A symbol's bounds as `--dim` and the text format spell them: `N`, `LO..HI` or
/// `LO..HI:multiple_of=K`.
pub struct Bounds<'a>(pub &'a Symbol);

impl fmt::Display for Bounds<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        match s.is_fixed() {
            true => write!(f, "{}", s.lo)?,
            false => write!(f, "{}..{}", s.lo, s.hi)?,
        }
        if s.multiple_of > 1 {
            write!(f, ":multiple_of={}", s.multiple_of)?;
        }
        Ok(())
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, Bounds(self))
    }
}

/// The symbols of one compile, by name.
pub type Symbols = BTreeMap<String, Symbol>;

/// The largest bound a symbol may have: every size meshc describes fits far below it.
pub const MAX_BOUND: i64 = 1 << 40;

/// A symbol's name is one `--dim` can spell, so that the command line can override every
/// bound a graph declares.
pub fn check_name(name: &str) -> Result<(), String> {
    match !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
        true => Ok(()),
        false => Err("the name must be letters, digits, '_' or '.'".to_string()),
    }
}

/// Parses `NAME=N`, `NAME=LO..HI` or either with `:multiple_of=K` (the `--dim` syntax).
pub fn parse_symbol(spec: &str) -> Result<Symbol, String> {
    let bad = |why: &str| format!("--dim {spec}: {why} (expected NAME=N, NAME=LO..HI or NAME=LO..HI:multiple_of=K)");
    let (name, rest) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
    let name = name.trim();
    check_name(name).map_err(|e| bad(&e))?;
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
    Symbol::new(name, lo, hi, multiple_of).map_err(|e| bad(&e))
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
