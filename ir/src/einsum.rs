//! The contraction order of an einsum of three or more operands: pairwise, in the order
//! opt_einsum's `greedy` path picks (each time the pair whose contraction removes the most
//! memory: the smallest size(result) − size(a) − size(b), among pairs that share a letter
//! if any do). A letter no other operand and not the output needs is summed in the first
//! contraction that holds it. Evaluated as one loop nest over every letter, an einsum of n
//! operands costs the product of all its letters' sizes (2^30 for thirty operands of
//! size-2 letters); pairwise, each step costs only the letters of its pair. The
//! interpreter, the compiler (`expand` writes one two-operand einsum per step) and the cost
//! model follow the same path, so they agree on the order of the sums.

use std::collections::BTreeMap;

use crate::budget;

/// One contraction: operands `a` and `b` (numbered as `path` says) into `letters`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub a: usize,
    pub b: usize,
    pub letters: Vec<char>,
}

/// The letters of every operand, numbered as the steps number them: the einsum's operands
/// `0..n`, then the result of step k as `n + k`.
pub fn operand_letters(terms: &[Vec<char>], steps: &[Step]) -> Vec<Vec<char>> {
    terms.iter().cloned().chain(steps.iter().map(|s| s.letters.clone())).collect()
}

/// The equation of step `s`: `"ab,bc->ac"`.
pub fn equation(s: &Step, letters: &[Vec<char>]) -> String {
    let term = |v: &[char]| v.iter().collect::<String>();
    format!("{},{}->{}", term(&letters[s.a]), term(&letters[s.b]), term(&s.letters))
}

fn size(letters: &[char], sizes: &BTreeMap<char, usize>) -> u128 {
    letters.iter().fold(1u128, |n, c| n.saturating_mul(sizes.get(c).copied().unwrap_or(1) as u128))
}

/// The pairwise steps of the einsum `terms -> out` with letter `sizes`: `n − 1` steps for
/// `n` operands, the last giving `out` in its order; none for fewer than three operands,
/// which are one contraction already.
pub fn path(terms: &[Vec<char>], out: &[char], sizes: &BTreeMap<char, usize>) -> Vec<Step> {
    let n = terms.len();
    if n < 3 {
        return Vec::new();
    }
    // The operands not contracted yet, by number, with their letters.
    let mut live: Vec<(usize, Vec<char>)> = terms.iter().cloned().enumerate().collect();
    let mut steps = Vec::with_capacity(n - 1);
    while live.len() > 1 {
        // What the pair (i, j) contracts to: its letters the output or another operand needs.
        let result = |i: usize, j: usize| -> Vec<char> {
            let needed = |c: &char| {
                out.contains(c) || live.iter().enumerate().any(|(k, (_, l))| k != i && k != j && l.contains(c))
            };
            let (a, b) = (&live[i].1, &live[j].1);
            let mut r: Vec<char> =
                a.iter().chain(b.iter().filter(|c| !a.contains(c))).copied().filter(needed).collect();
            if live.len() == 2 {
                // The last step gives the output, in its order.
                r = out.to_vec();
            }
            r
        };
        let shares = |i: usize, j: usize| live[i].1.iter().any(|c| live[j].1.contains(c));
        let pairs = (0..live.len()).flat_map(|i| (i + 1..live.len()).map(move |j| (i, j)));
        let connected: Vec<(usize, usize)> = pairs.clone().filter(|&(i, j)| shares(i, j)).collect();
        let (i, j) = if connected.is_empty() {
            // Nothing shares a letter: the outer product of the two smallest.
            let mut by_size: Vec<usize> = (0..live.len()).collect();
            by_size.sort_by_key(|&k| (size(&live[k].1, sizes), k));
            (by_size[0].min(by_size[1]), by_size[0].max(by_size[1]))
        } else {
            let removed = |(i, j): (usize, usize)| {
                let r = size(&result(i, j), sizes) as i128;
                r.saturating_sub(size(&live[i].1, sizes) as i128).saturating_sub(size(&live[j].1, sizes) as i128)
            };
            *connected.iter().min_by_key(|&&p| (removed(p), p)).expect("a connected pair")
        };
        let letters = result(i, j);
        steps.push(Step { a: live[i].0, b: live[j].0, letters: letters.clone() });
        live.remove(j);
        live.remove(i);
        live.push((n + steps.len() - 1, letters));
    }
    steps
}

/// The multiply-adds of the einsum `terms -> out`: per pairwise step (`path`), the product
/// of the sizes of its pair's letters; with fewer than three operands, of all letters,
/// once per operand beyond the first (at least once).
pub fn multiply_adds(terms: &[Vec<char>], out: &[char], sizes: &BTreeMap<char, usize>) -> u128 {
    let steps = path(terms, out, sizes);
    if steps.is_empty() {
        let all: Vec<char> = sizes.keys().copied().collect();
        return size(&all, sizes).saturating_mul(terms.len().saturating_sub(1).max(1) as u128);
    }
    let letters = operand_letters(terms, &steps);
    steps.iter().fold(0u128, |total, s| {
        let mut pair = letters[s.a].clone();
        pair.extend(letters[s.b].iter().filter(|c| !letters[s.a].contains(c)));
        total.saturating_add(size(&pair, sizes))
    })
}

/// Checks the intermediates of `steps` (all but the last, which is the einsum's result)
/// against the memory budget, as f32 tensors.
pub fn check_intermediates(steps: &[Step], sizes: &BTreeMap<char, usize>) -> Result<(), String> {
    for (k, s) in steps.iter().enumerate().take(steps.len().saturating_sub(1)) {
        let what = format_args!("einsum step {k} ({})", s.letters.iter().collect::<String>());
        budget::check(what, size(&s.letters, sizes), 4)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(eq: &str) -> (Vec<Vec<char>>, Vec<char>) {
        let (lhs, rhs) = eq.split_once("->").unwrap();
        (lhs.split(',').map(|t| t.chars().collect()).collect(), rhs.chars().collect())
    }

    fn sizes(s: &[(char, usize)]) -> BTreeMap<char, usize> {
        s.iter().copied().collect()
    }

    /// A matrix chain contracts its small end first, as opt_einsum's greedy does.
    #[test]
    fn a_chain_contracts_pairwise() {
        let (terms, out) = parse("ab,bc,cd->ad");
        let sz = sizes(&[('a', 2), ('b', 100), ('c', 100), ('d', 2)]);
        let steps = path(&terms, &out, &sz);
        assert_eq!(steps.len(), 2);
        let letters = operand_letters(&terms, &steps);
        assert_eq!(equation(&steps[0], &letters), "ab,bc->ac");
        assert_eq!(equation(&steps[1], &letters), "cd,ac->ad");
        assert_eq!(multiply_adds(&terms, &out, &sz), 2 * 100 * 100 + 2 * 100 * 2);
    }

    /// Thirty operands of one letter each: thirty pairwise steps of a few elements, not
    /// 2^30 points; sixty in a chain likewise.
    #[test]
    fn many_operands_cost_their_pairs() {
        let letters: Vec<char> = ('a'..='z').chain('A'..='Z').collect();
        let terms: Vec<Vec<char>> = letters[..30].iter().map(|&c| vec![c]).collect();
        let sz: BTreeMap<char, usize> = letters.iter().map(|&c| (c, 2)).collect();
        let steps = path(&terms, &[], &sz);
        assert_eq!(steps.len(), 29);
        assert!(multiply_adds(&terms, &[], &sz) <= 29 * 4);
        let chain: Vec<Vec<char>> = (0..60).map(|i| vec![letters[i % 51], letters[i % 51 + 1]]).collect();
        assert!(multiply_adds(&chain, &[], &sz) <= 59 * 8);
    }

    #[test]
    fn two_operands_are_one_step() {
        let (terms, out) = parse("ij,jk->ik");
        let sz = sizes(&[('i', 2), ('j', 3), ('k', 4)]);
        assert!(path(&terms, &out, &sz).is_empty());
        assert_eq!(multiply_adds(&terms, &out, &sz), 24);
    }
}
