//! Dim expressions in one canonical form, so that two expressions for the same size compare
//! equal: a sum of monomials with integer coefficients, each monomial a sorted product of
//! atoms — a symbol, or the floor of an expression divided by a constant (pooling windows,
//! strides and splits give those). Products, sums and exact divisions are folded into the
//! sum; only a division that does not come out even stays an atom.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A factor a monomial cannot be broken into further.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Atom {
    Sym(String),
    /// `floor(e / k)`, `k > 1`, with `e` not a multiple of `k` term by term.
    Div(Box<Expr>, i64),
}

/// A dim size: `Σ coeff · Π atoms`. The empty product is the constant term; no stored
/// coefficient is 0, so the map is the canonical form and derived equality is meaningful.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Expr {
    terms: BTreeMap<Vec<Atom>, i64>,
}

/// As its terms, `[[atoms, coefficient], ...]`: JSON maps take only string keys, and
/// reading the terms back through `add_term` makes any list canonical again.
impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.terms.iter())
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Expr, D::Error> {
        let mut e = Expr::default();
        for (mono, c) in Vec::<(Vec<Atom>, i64)>::deserialize(d)? {
            if let Some(bad) = mono.iter().find_map(|a| match a {
                Atom::Div(_, k) if *k < 2 => Some(*k),
                _ => None,
            }) {
                return Err(serde::de::Error::custom(format!("a division by {bad} in a dim expression")));
            }
            let mut mono = mono;
            mono.sort();
            if e.terms.contains_key(&mono) {
                return Err(serde::de::Error::custom("a dim expression repeats a term"));
            }
            e.add_term(mono, c);
        }
        Ok(e)
    }
}

/// Symbol values, by name.
pub type Binding = HashMap<String, i64>;

impl Expr {
    pub fn constant(c: i64) -> Expr {
        let mut e = Expr::default();
        e.add_term(Vec::new(), c);
        e
    }

    pub fn sym(name: &str) -> Expr {
        let mut e = Expr::default();
        e.add_term(vec![Atom::Sym(name.to_string())], 1);
        e
    }

    pub fn of_atom(a: Atom) -> Expr {
        let mut e = Expr::default();
        e.add_term(vec![a], 1);
        e
    }

    fn add_term(&mut self, mono: Vec<Atom>, c: i64) {
        let v = self.terms.entry(mono).or_insert(0);
        *v += c;
        if *v == 0 {
            self.terms.retain(|_, c| *c != 0);
        }
    }

    /// The value when the expression has no atoms.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The symbol when the expression is exactly one.
    pub fn as_sym(&self) -> Option<&str> {
        match self.terms.iter().next() {
            Some((m, 1)) if self.terms.len() == 1 && m.len() == 1 => match &m[0] {
                Atom::Sym(s) => Some(s),
                Atom::Div(..) => None,
            },
            _ => None,
        }
    }

    /// `c · Π atoms` when the expression is one monomial.
    pub fn as_monomial(&self) -> Option<(i64, Vec<Atom>)> {
        match self.terms.len() {
            0 => Some((0, Vec::new())),
            1 => self.terms.iter().next().map(|(m, &c)| (c, m.clone())),
            _ => None,
        }
    }

    /// The term without atoms.
    pub fn constant_term(&self) -> i64 {
        self.terms.get(&Vec::new()).copied().unwrap_or(0)
    }

    /// Whether there are terms and every coefficient is negative.
    pub fn all_negative(&self) -> bool {
        !self.terms.is_empty() && self.terms.values().all(|&c| c < 0)
    }

    pub fn is_const(&self) -> bool {
        self.as_const().is_some()
    }

    pub fn add(&self, o: &Expr) -> Expr {
        let mut e = self.clone();
        for (m, &c) in &o.terms {
            e.add_term(m.clone(), c);
        }
        e
    }

    pub fn sub(&self, o: &Expr) -> Expr {
        self.add(&o.scale(-1))
    }

    pub fn scale(&self, k: i64) -> Expr {
        let mut e = Expr::default();
        for (m, &c) in &self.terms {
            e.add_term(m.clone(), c * k);
        }
        e
    }

    pub fn mul(&self, o: &Expr) -> Expr {
        let mut e = Expr::default();
        for (ma, &ca) in &self.terms {
            for (mb, &cb) in &o.terms {
                let mut m = [ma.as_slice(), mb.as_slice()].concat();
                m.sort();
                e.add_term(m, ca * cb);
            }
        }
        e
    }

    /// `floor(self / k)` for `k >= 1`. The part of every coefficient that `k` divides comes
    /// out exactly (`floor((k·A + R) / k) = A + floor(R / k)` for integer `A`), so only the
    /// remainder `R` stays under a division atom, and nested divisions merge.
    pub fn floor_div(&self, k: i64) -> Expr {
        assert!(k >= 1, "floor_div by {k}");
        if k == 1 {
            return self.clone();
        }
        let (mut q, mut r) = (Expr::default(), Expr::default());
        for (m, &c) in &self.terms {
            q.add_term(m.clone(), c.div_euclid(k));
            r.add_term(m.clone(), c.rem_euclid(k));
        }
        if let Some(c) = r.as_const() {
            return q.add(&Expr::constant(c.div_euclid(k)));
        }
        let rest = match r.terms.iter().next() {
            Some((m, 1)) if r.terms.len() == 1 && m.len() == 1 => match &m[0] {
                Atom::Div(inner, j) => Expr::of_atom(Atom::Div(inner.clone(), j * k)),
                Atom::Sym(_) => Expr::of_atom(Atom::Div(Box::new(r), k)),
            },
            _ => Expr::of_atom(Atom::Div(Box::new(r), k)),
        };
        q.add(&rest)
    }

    /// The value at `b`; `None` when a symbol is unbound or the value overflows.
    pub fn eval(&self, b: &Binding) -> Option<i64> {
        self.eval_with(&|s| b.get(s).copied())
    }

    /// The value with each symbol's from `value` (which a run looks up without building a
    /// `Binding`); `None` when a symbol has none or the value overflows.
    pub fn eval_with(&self, value: &dyn Fn(&str) -> Option<i64>) -> Option<i64> {
        let mut sum: i64 = 0;
        for (m, &c) in &self.terms {
            let mut p = c;
            for a in m {
                let v = match a {
                    Atom::Sym(s) => value(s)?,
                    Atom::Div(e, k) => e.eval_with(value)?.checked_div_euclid(*k)?,
                };
                p = p.checked_mul(v)?;
            }
            sum = sum.checked_add(p)?;
        }
        Some(sum)
    }

    /// The least and greatest value over every binding within `bounds` (interval arithmetic:
    /// sound, not always tight when a symbol appears twice).
    pub fn range(&self, bounds: &dyn Fn(&str) -> (i64, i64)) -> (i128, i128) {
        let mul = |(a, b): (i128, i128), (c, d): (i128, i128)| {
            let p = [a * c, a * d, b * c, b * d];
            (*p.iter().min().expect("four"), *p.iter().max().expect("four"))
        };
        let clamp = |v: i128| v.clamp(-(1 << 80), 1 << 80);
        let (mut lo, mut hi) = (0i128, 0i128);
        for (m, &c) in &self.terms {
            let mut r = (c as i128, c as i128);
            for a in m {
                let ar = match a {
                    Atom::Sym(s) => {
                        let (l, h) = bounds(s);
                        (l as i128, h as i128)
                    }
                    Atom::Div(e, k) => {
                        let (l, h) = e.range(bounds);
                        (l.div_euclid(*k as i128), h.div_euclid(*k as i128))
                    }
                };
                r = mul(r, ar);
                r = (clamp(r.0), clamp(r.1));
            }
            lo = clamp(lo + r.0);
            hi = clamp(hi + r.1);
        }
        (lo, hi)
    }

    /// Whether every value is a multiple of `k`, given each symbol's known divisor.
    pub fn divisible_by(&self, k: i64, multiple_of: &dyn Fn(&str) -> i64) -> bool {
        self.terms.iter().all(|(m, &c)| {
            let mut d = c as i128;
            for a in m {
                d *= match a {
                    Atom::Sym(s) => multiple_of(s) as i128,
                    Atom::Div(..) => 1,
                };
            }
            d % k as i128 == 0
        })
    }

    /// The product of several expressions.
    pub fn product<'a>(es: impl IntoIterator<Item = &'a Expr>) -> Expr {
        es.into_iter().fold(Expr::constant(1), |p, e| p.mul(e))
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Sym(s) => f.write_str(s),
            Atom::Div(e, k) if e.terms.len() == 1 => write!(f, "{e}/{k}"),
            Atom::Div(e, k) => write!(f, "({e})/{k}"),
        }
    }
}

/// `batch*seq`, `2*seq + 1`, `(seq - 1)/2 + 1`: symbols' products first, the constant
/// last, the way the sizes are read aloud.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // The constant term sorts first in the map; it is written last.
        let mut terms: Vec<(&Vec<Atom>, i64)> = self.terms.iter().map(|(m, &c)| (m, c)).collect();
        let shift = usize::from(terms[0].0.is_empty() && terms.len() > 1);
        terms.rotate_left(shift);
        for (i, (m, c)) in terms.into_iter().enumerate() {
            let mag = c.unsigned_abs();
            match (i, c < 0) {
                (0, true) => f.write_str("-")?,
                (0, false) => {}
                (_, true) => f.write_str(" - ")?,
                (_, false) => f.write_str(" + ")?,
            }
            let atoms: Vec<String> = m.iter().map(Atom::to_string).collect();
            match (mag, atoms.is_empty()) {
                (_, true) => write!(f, "{mag}")?,
                (1, false) => f.write_str(&atoms.join("*"))?,
                (_, false) => write!(f, "{mag}*{}", atoms.join("*"))?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: &str) -> Expr {
        Expr::sym(n)
    }

    #[test]
    fn equal_sizes_have_one_form() {
        let (b, t) = (s("batch"), s("seq"));
        assert_eq!(b.mul(&t), t.mul(&b));
        assert_eq!(b.add(&t).add(&Expr::constant(2)), Expr::constant(1).add(&t).add(&b).add(&Expr::constant(1)));
        assert_eq!(b.mul(&t).scale(4).floor_div(2), b.mul(&t).scale(2));
        assert_eq!(t.sub(&t), Expr::constant(0));
        assert_eq!(t.floor_div(2).floor_div(3), t.floor_div(6));
        assert_eq!(t.scale(3).add(&Expr::constant(1)).floor_div(3), t);
    }

    #[test]
    fn prints_as_read() {
        let (b, t) = (s("batch"), s("seq"));
        assert_eq!(b.mul(&t).to_string(), "batch*seq");
        assert_eq!(t.scale(2).add(&Expr::constant(1)).to_string(), "2*seq + 1");
        // floor((seq - 1) / 2) + 1 is floor((seq + 1) / 2): the constant moves under the division.
        assert_eq!(t.sub(&Expr::constant(1)).floor_div(2).add(&Expr::constant(1)).to_string(), "(seq + 1)/2");
        assert_eq!(Expr::constant(-3).add(&t).to_string(), "seq - 3");
        assert_eq!(Expr::constant(0).to_string(), "0");
    }

    #[test]
    fn evaluates_like_integer_arithmetic() {
        let b: Binding = [("seq".to_string(), 13), ("batch".to_string(), 3)].into();
        let e = s("seq").sub(&Expr::constant(3)).floor_div(2).add(&Expr::constant(1)).mul(&s("batch"));
        assert_eq!(e.eval(&b), Some(((13 - 3) / 2 + 1) * 3));
        assert_eq!(s("x").eval(&b), None);
        // Sound, not tight: batch appears twice in batch*(seq + 1)/2 - batch.
        let (lo, hi) = e.range(&|_| (1, 8));
        let every = (1..=8).flat_map(|s| (1..=8).map(move |b| ((s - 3i128).div_euclid(2) + 1) * b));
        assert!(every.clone().all(|v| (lo..=hi).contains(&v)), "{lo}..{hi}");
        assert_eq!((lo, hi), (-7, 31));
    }
}
