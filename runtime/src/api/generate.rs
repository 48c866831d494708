//! Autoregressive generation over a decode-step artifact (docs/generation.md): the prompt
//! fed one position a step, then each step's sampled token fed back, with the KV caches
//! kept on the devices between steps as the artifact's state (`Session::set_state`).
//!
//! Over hosts (`Session::set_transport`) every host runs the same loop on its own devices'
//! blocks of the caches: only host 0 gets the logits, so it samples, and the ids it picks
//! (and a prefill's caches) are broadcast to the others before they run on.
//!
//! A decode-step artifact takes `ids` (i32 or i64 `[batch, 1]`: each sequence's token at
//! this step) and `pos` (i32 or i64 `[1]`: its position), gives `logits` (f32 `[batch, 1,
//! vocab]` or `[batch, vocab]`), and every other input S is state with an output `next.S`
//! (the caches, written at `pos`), starting from zeros. The context it holds is the size
//! of the dim its state names `ctx`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use meshc_ir::{DType, Data, Tensor, TensorType};

use crate::api::error::Error;
use crate::api::session::{ctx_axis, Session};
use crate::api::view::{TensorView, TensorViewMut};
use crate::format::program::IoSpec;

/// How the next token is picked from a step's logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The highest logit (the first of equal ones).
    Greedy,
    /// From softmax(logits / T).
    Temperature(f32),
    /// From the K highest logits, softmax over them.
    TopK(usize),
    /// From the smallest set of the highest logits whose probabilities reach P (nucleus).
    TopP(f32),
}

impl std::str::FromStr for Sampling {
    type Err = String;

    /// `greedy`, `temperature:T`, `top-k:K` or `top-p:P`.
    fn from_str(s: &str) -> Result<Sampling, String> {
        let bad = || format!("'{s}' is not a sampling (greedy, temperature:T, top-k:K, top-p:P)");
        let (kind, value) = s.split_once(':').unwrap_or((s, ""));
        let float = |v: &str| v.parse::<f32>().ok().filter(|x| x.is_finite());
        match kind {
            "greedy" if value.is_empty() => Ok(Sampling::Greedy),
            "temperature" => match float(value) {
                Some(t) if t > 0.0 => Ok(Sampling::Temperature(t)),
                _ => Err(format!("temperature:{value}: the temperature must be a number above 0")),
            },
            "top-k" => match value.parse::<usize>() {
                Ok(k) if k > 0 => Ok(Sampling::TopK(k)),
                _ => Err(format!("top-k:{value}: K must be a whole number above 0")),
            },
            "top-p" => match float(value) {
                Some(p) if p > 0.0 && p <= 1.0 => Ok(Sampling::TopP(p)),
                _ => Err(format!("top-p:{value}: P must be a number in (0, 1]")),
            },
            _ => Err(bad()),
        }
    }
}

/// What a generation does besides the prompt.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// The positions a sequence may take, prompt included: at most the artifact's.
    pub context: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// A sequence that emits one of these stops (the stop token is its last).
    pub stop: Vec<i64>,
}

/// The new tokens of each sequence, `[batch, steps]`: a sequence that stopped early has
/// -1 after its stop token. `steps` is `max_new_tokens` unless every sequence stopped first.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<Vec<i64>>,
    pub steps: usize,
}

impl Generated {
    /// The tokens as an i64 `[batch, steps]` tensor, -1 after a stop.
    pub fn to_tensor(&self) -> Tensor {
        let data = self.tokens.iter().flat_map(|t| t.iter().copied().chain(std::iter::repeat(-1)).take(self.steps));
        Tensor::new(vec![self.tokens.len(), self.steps], Data::I64(data.collect()))
    }
}

/// What makes a model a decode step: the dtypes of its `ids` and `pos`, its batch and
/// vocabulary, its context, its state, and the shape of its logits.
struct Contract {
    ids: DType,
    pos: DType,
    batch: usize,
    vocab: usize,
    context: usize,
    state: Vec<(String, TensorType)>,
    /// The axis of each state tensor that names `ctx`.
    ctx_axes: BTreeMap<String, usize>,
    logits: Vec<usize>,
}

fn contract(session: &Session) -> Result<Contract, Error> {
    let bad = |why: String| Error::State(format!("not a decode-step artifact (docs/generation.md): {why}"));
    let meta = &session.loaded().meta;
    fn typed(s: &IoSpec) -> Option<(&IoSpec, TensorType)> {
        s.ty().map(|t| (s, t))
    }
    let input = |name: &str| meta.inputs.iter().find(|i| i.name == name).and_then(typed);
    let index = |d: DType| matches!(d, DType::I32 | DType::I64);
    let (_, ids) = input("ids").ok_or_else(|| bad("it has no input 'ids'".into()))?;
    if !index(ids.dtype) || ids.rank() != 2 || ids.shape[1] != 1 {
        return Err(bad(format!("'ids' is {ids}, where a step takes i32 or i64 [batch, 1]")));
    }
    let (_, pos) = input("pos").ok_or_else(|| bad("it has no input 'pos'".into()))?;
    if !index(pos.dtype) || pos.shape != [1] {
        return Err(bad(format!("'pos' is {pos}, where a step takes i32 or i64 [1]")));
    }
    let batch = ids.shape[0];
    let logits = meta.outputs.iter().find(|o| o.name == "logits").and_then(typed);
    let (_, logits) = logits.ok_or_else(|| bad("it has no output 'logits'".into()))?;
    let vocab = match logits.shape.as_slice() {
        [b, 1, v] | [b, v] if *b == batch && logits.dtype == DType::F32 => *v,
        _ => return Err(bad(format!("'logits' is {logits}, where a step gives f32 [{batch}, 1, vocab]"))),
    };
    let names = session.state_names();
    let mut context: Option<usize> = None;
    let mut state = Vec::new();
    let mut ctx_axes = BTreeMap::new();
    for name in &names {
        let (spec, ty) = input(name).ok_or_else(|| bad(format!("state '{name}' has an unknown dtype")))?;
        if let Some(d) = ctx_axis(spec) {
            context = Some(context.map_or(ty.shape[d], |c| c.min(ty.shape[d])));
            ctx_axes.insert(name.clone(), d);
        }
        state.push((name.clone(), ty));
    }
    let others = meta.inputs.iter().map(|i| &i.name).filter(|n| !["ids", "pos"].contains(&n.as_str()));
    if let Some(other) = others.clone().find(|n| !names.contains(n)) {
        return Err(bad(format!(
            "its input '{other}' is neither ids, pos nor state (an input S with an output next.S)"
        )));
    }
    let context = context.ok_or_else(|| bad("no state tensor names a dim 'ctx' (the cache's positions)".into()))?;
    Ok(Contract { ids: ids.dtype, pos: pos.dtype, batch, vocab, context, state, ctx_axes, logits: logits.shape })
}

/// Whether `session`'s model is a decode step `Session::generate` can run: the one line
/// saying what it lacks if not.
pub fn check_decode_step(session: &Session) -> Result<(), Error> {
    contract(session).map(drop)
}

/// An i32 or i64 tensor of `shape` holding `values`.
fn index_tensor(dtype: DType, shape: Vec<usize>, values: &[i64]) -> Tensor {
    match dtype {
        DType::I32 => Tensor::new(shape, Data::I32(values.iter().map(|&v| v as i32).collect())),
        _ => Tensor::new(shape, Data::I64(values.to_vec())),
    }
}

/// A state tensor's first positions from a prefill: its `ctx` axis and the bytes (the
/// prefill's own, or under hosts the copy host 0 sent).
type Prefix<'a> = Option<(usize, Cow<'a, [u8]>)>;

/// A prefill's outputs as the decode step's state: for each state tensor of `c`, the
/// prefill's first `len` positions along its `ctx` axis (that axis, and the bytes), or
/// `None` for a state without one, which starts as zeros. Refused in one line when the
/// prefill lacks a state's block or gives it of another shape or dtype.
fn prefilled<'a>(c: &Contract, out: &'a BTreeMap<String, Tensor>, len: usize) -> Result<Vec<Prefix<'a>>, Error> {
    let bad = |why: String| Error::State(format!("not a prefill of this decode step (docs/generation.md): {why}"));
    let mut blocks = Vec::new();
    for (name, ty) in &c.state {
        let block = out.get(name).ok_or_else(|| bad(format!("it has no output '{name}'")))?;
        let Some(axis) = c.ctx_axes.get(name).copied() else {
            blocks.push(None);
            continue;
        };
        let mut want = ty.shape.clone();
        want[axis] = len;
        if block.shape != want || block.dtype() != ty.dtype {
            return Err(bad(format!("'{name}' is {}, where {} {want:?} was expected", block.ty(), ty.dtype)));
        }
        blocks.push(Some((axis, Cow::Borrowed(crate::exec::io::le_bytes(block)))));
    }
    Ok(blocks)
}

impl Session {
    /// Generates up to `options.max_new_tokens` tokens after each row of `prompt` (`[batch,
    /// prompt_len]` token ids, `prompt_len >= 1`) on a decode-step artifact, from empty
    /// caches, the prompt fed one position a step. Refused in one line: a model that is not
    /// a decode step, a prompt of another batch or with ids outside the vocabulary, and a
    /// context beyond the artifact's or too short for the prompt and the new tokens.
    pub fn generate(&self, prompt: &[Vec<i64>], options: &GenerateOptions) -> Result<Generated, Error> {
        self.generate_from(None, prompt, options)
    }

    /// `generate`, with the whole prompt run in one call of `prefill`: an artifact taking
    /// `ids` `[batch, P]` and giving `logits` (`[batch, P, vocab]`) and, for each state
    /// tensor S of this decode step, S's first P positions along its `ctx` dim, under S's
    /// name; or with an input `last` (`[1]`, the position whose logits it gives as
    /// `[batch, 1, vocab]`), which takes prompts of up to P ids. Refused in one line when
    /// `prefill` is not that.
    pub fn generate_with_prefill(
        &self,
        prefill: &Session,
        prompt: &[Vec<i64>],
        options: &GenerateOptions,
    ) -> Result<Generated, Error> {
        self.generate_from(Some(prefill), prompt, options)
    }

    fn generate_from(
        &self,
        prefill: Option<&Session>,
        prompt: &[Vec<i64>],
        options: &GenerateOptions,
    ) -> Result<Generated, Error> {
        let c = contract(self)?;
        let len = prompt.first().map_or(0, Vec::len);
        if prompt.len() != c.batch || len == 0 || prompt.iter().any(|p| p.len() != len) {
            return Err(Error::State(format!(
                "the prompt is {} sequences of {len} ids, where the artifact takes a batch of {} (at least one id each)",
                prompt.len(),
                c.batch
            )));
        }
        if let Some(bad) = prompt.iter().flatten().find(|&&t| t < 0 || t as u64 >= c.vocab as u64) {
            return Err(Error::State(format!("prompt id {bad} is outside the vocabulary 0..{}", c.vocab)));
        }
        if options.context > c.context {
            return Err(Error::State(format!(
                "a context of {} is beyond the artifact's {} positions (its caches' ctx dim)",
                options.context, c.context
            )));
        }
        // The last new token is sampled, never fed: the positions fed are the prompt's and
        // every new token's but the last.
        let fed = len + options.max_new_tokens.saturating_sub(1);
        if fed > options.context {
            return Err(Error::State(format!(
                "a prompt of {len} and {} new tokens take {fed} positions, beyond the context of {}",
                options.max_new_tokens, options.context
            )));
        }
        let mut g = Picks { out: vec![Vec::new(); c.batch], done: vec![false; c.batch], steps: 0, options };
        let mut logits = vec![0f32; c.batch * c.vocab];
        // The first position fed to the decode step: 0, or past the prompt a prefill ran.
        let start = match prefill {
            None => {
                self.set_state_with((0, fed), |_, _, _, _| {})?;
                0
            }
            Some(p) => {
                self.prefill(&c, p, prompt, &mut logits, fed)?;
                self.pick(&mut g, &logits, c.vocab)?;
                len
            }
        };
        let shape = c.logits.clone();
        for pos in start..fed {
            if g.steps == options.max_new_tokens || g.done.iter().all(|&d| d) {
                break;
            }
            let token: Vec<i64> = match pos < len {
                true => prompt.iter().map(|p| p[pos]).collect(),
                // A stopped sequence is fed its last token; its logits are not read.
                false => g.out.iter().map(|t| t.last().copied().unwrap_or(0)).collect(),
            };
            let ids = index_tensor(c.ids, vec![c.batch, 1], &token);
            let at = index_tensor(c.pos, vec![1], &[pos as i64]);
            let view = TensorViewMut::new(&mut logits, &shape)?;
            let inputs = [("ids", TensorView::of(&ids)), ("pos", TensorView::of(&at))];
            self.generation_step(&inputs, &mut [("logits", view)])?;
            if pos + 1 >= len {
                self.pick(&mut g, &logits, c.vocab)?;
            }
        }
        Ok(Generated { tokens: g.out, steps: g.steps })
    }
}

/// The tokens picked so far, and which sequences have stopped.
struct Picks<'a> {
    out: Vec<Vec<i64>>,
    done: Vec<bool>,
    steps: usize,
    options: &'a GenerateOptions,
}

impl Picks<'_> {
    /// One step's picks from `logits`, `[batch, vocab]`: the token of every sequence not
    /// stopped, -1 for the others.
    fn choose(&self, logits: &[f32], vocab: usize) -> Vec<i64> {
        let batch = self.out.len();
        let pick = |(b, row): (usize, &[f32])| match self.done[b] {
            true => -1,
            // Each (step, sequence) its own draw: a sequence that stops changes no other's
            // tokens.
            false => sample(row, self.options.sampling, self.options.seed, (self.steps * batch + b) as u64) as i64,
        };
        logits.chunks(vocab).enumerate().map(pick).collect()
    }

    /// A step's `picks` (`choose`) taken: each sequence not stopped gets its token, and
    /// stops if it is a stop id.
    fn record(&mut self, picks: &[i64]) {
        for (b, &t) in picks.iter().enumerate() {
            if !self.done[b] {
                self.out[b].push(t);
                self.done[b] = self.options.stop.contains(&t);
            }
        }
        self.steps += 1;
    }
}

impl Session {
    /// One step's picks from `logits` (`[batch, vocab]`). Under hosts only host 0 has the
    /// logits: it picks, and every host records its picks, so that each feeds the same
    /// ids next and stops after the same step (the same stop ids, which every host is
    /// given alike, end the same sequences), and none waits for a step the others skip.
    fn pick(&self, g: &mut Picks, logits: &[f32], vocab: usize) -> Result<(), Error> {
        let picks = match self.loaded().host() {
            0 => g.choose(logits, vocab),
            _ => vec![-1; g.out.len()],
        };
        let picks = match self.loaded().spans_hosts() {
            false => picks,
            true => {
                let mut bytes: Vec<u8> = picks.iter().flat_map(|t| t.to_le_bytes()).collect();
                self.loaded().broadcast(&mut bytes).map_err(|e| Error::from_run(e, Error::Run))?;
                bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect()
            }
        };
        g.record(&picks);
        Ok(())
    }

    /// Runs `prompt` (`c.batch` rows of equal length) through the prefill `p`, puts the
    /// caches it gives on the devices as this decode step's state and its logits of each
    /// prompt's last position in `logits`. A prefill with an input `last` takes prompts up
    /// to its length, padded after their end (what a causal model never reads back). The
    /// steps after it write positions below `reach`.
    fn prefill(
        &self,
        c: &Contract,
        p: &Session,
        prompt: &[Vec<i64>],
        logits: &mut [f32],
        reach: usize,
    ) -> Result<(), Error> {
        let len = prompt[0].len();
        let input = |name: &str| p.loaded().meta.inputs.iter().find(|i| i.name == name).and_then(IoSpec::ty);
        let (takes, last) = (input("ids"), input("last"));
        let width = match takes.as_ref().map(|t| t.shape.as_slice()) {
            Some(&[b, w]) if b == c.batch && (w == len || last.is_some() && w > len) => w,
            _ => {
                let most = match (&takes, &last) {
                    (Some(t), Some(_)) if t.rank() == 2 => format!(": prompts of at most {} ids", t.shape[1]),
                    _ => String::new(),
                };
                return Err(Error::State(format!(
                    "the prefill takes ids {}{most}, where the prompt is [{}, {len}] (docs/generation.md)",
                    takes.map_or("of no known type".into(), |t| t.to_string()),
                    c.batch
                )));
            }
        };
        let ids: Vec<i64> =
            prompt.iter().flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(0, width - len))).collect();
        let ids = index_tensor(c.ids, vec![c.batch, width], &ids);
        let at = last.map(|t| index_tensor(t.dtype, vec![1], &[len as i64 - 1]));
        let mut inputs = vec![("ids", TensorView::of(&ids))];
        inputs.extend(at.as_ref().map(|t| ("last", TensorView::of(t))));
        let out = p.run(&inputs)?;
        // Under hosts only host 0 has the prefill's outputs: it picks from the logits,
        // checks the caches' first positions and gives them to the others.
        let blocks = match p.loaded().host() {
            0 => {
                let all = out.get("logits").and_then(|l| l.as_f32()).filter(|l| l.len() % (c.batch * c.vocab) == 0);
                let all = all.ok_or_else(|| {
                    Error::State(
                        "not a prefill (docs/generation.md): it gives no f32 logits [batch, len, vocab]".into(),
                    )
                })?;
                // Each sequence's last position's logits pick its first new token: the one
                // row a prefill with `last` gives, else the last of all.
                let rows = all.len() / (c.batch * c.vocab);
                for (b, row) in logits.chunks_mut(c.vocab).enumerate() {
                    let at = (b * rows + rows - 1) * c.vocab;
                    row.copy_from_slice(&all[at..at + c.vocab]);
                }
                prefilled(c, &out, width)?
            }
            _ => vec![None; c.state.len()],
        };
        let blocks = self.host_0s(c, blocks, width)?;
        self.set_state_with((len, reach), |k, i, d, dst| {
            if let Some((axis, bytes)) = &blocks[k] {
                self.loaded().cut_prefix(i, d, (*axis, width, len), bytes, dst);
            }
        })
    }

    /// Host 0's `blocks` (`prefilled`, checked there) on every host, under hosts; else
    /// `blocks` themselves. Each state tensor with a `ctx` axis crosses in state order,
    /// which every host shares, as `width` positions along it.
    fn host_0s<'a>(&self, c: &Contract, blocks: Vec<Prefix<'a>>, width: usize) -> Result<Vec<Prefix<'a>>, Error> {
        if !self.loaded().spans_hosts() {
            return Ok(blocks);
        }
        let mut given = Vec::new();
        for ((name, ty), block) in c.state.iter().zip(blocks) {
            let Some(&axis) = c.ctx_axes.get(name) else {
                given.push(None);
                continue;
            };
            let mut bytes = match block {
                Some((_, b)) => b.into_owned(),
                None => vec![0; ty.numel() / ty.shape[axis] * width * ty.dtype.size_bytes()],
            };
            self.loaded().broadcast(&mut bytes).map_err(|e| Error::from_run(e, Error::Run))?;
            given.push(Some((axis, Cow::Owned(bytes))));
        }
        Ok(given)
    }
}

/// The token `sampling` picks from `logits`; the `draw`th random draw of `seed` decides
/// among several. NaN is never picked (unless every logit is NaN: then 0); among equal
/// logits the lowest index comes first, so greedy takes it.
pub fn sample(logits: &[f32], sampling: Sampling, seed: u64, draw: u64) -> usize {
    // Candidates by logit, highest first (the lower index first among equal ones).
    let by_logit = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
    let candidates = (0..logits.len()).filter(|&i| !logits[i].is_nan());
    let (temperature, keep) = match sampling {
        // The first of that order, without sorting: sorting a 50257-token vocabulary took
        // 2 ms, a tenth of a GPT-2 small step.
        Sampling::Greedy => return candidates.min_by(by_logit).unwrap_or(0),
        Sampling::Temperature(t) => (t, Keep::All),
        Sampling::TopK(k) => (1.0, Keep::Top(k)),
        Sampling::TopP(p) => (1.0, Keep::Mass(p)),
    };
    let mut order: Vec<usize> = candidates.collect();
    order.sort_by(by_logit);
    let Some(&top) = order.first() else { return 0 };
    // Relative to the top logit; an infinite top (or all -inf) shares the mass among the
    // logits equal to it, where the differences would be NaN.
    let max = logits[top];
    let weight = |l: f32| match max.is_finite() {
        true => (((l - max) / temperature) as f64).exp(),
        false => f64::from(u8::from(l == max)),
    };
    let weights: Vec<f64> = order.iter().map(|&i| weight(logits[i])).collect();
    let total: f64 = weights.iter().sum();
    let n = match keep {
        Keep::All => order.len(),
        Keep::Top(k) => k.min(order.len()),
        Keep::Mass(p) => {
            let mut mass = 0.0;
            weights
                .iter()
                .position(|w| {
                    mass += w / total;
                    mass >= p as f64
                })
                .map_or(order.len(), |i| i + 1)
        }
    };
    let kept: f64 = weights[..n].iter().sum();
    let mut u = meshc_ir::init::uniform01(seed, draw) * kept;
    for (k, w) in weights[..n].iter().enumerate() {
        if u < *w {
            return order[k];
        }
        u -= w;
    }
    order[n - 1]
}

enum Keep {
    All,
    Top(usize),
    Mass(f32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplings_parse_and_refuse_in_one_line() {
        assert_eq!("greedy".parse(), Ok(Sampling::Greedy));
        assert_eq!("temperature:0.7".parse(), Ok(Sampling::Temperature(0.7)));
        assert_eq!("top-k:40".parse(), Ok(Sampling::TopK(40)));
        assert_eq!("top-p:0.9".parse(), Ok(Sampling::TopP(0.9)));
        for bad in ["temperature:0", "temperature:x", "top-k:0", "top-p:1.5", "nucleus", "greedy:1"] {
            let e = bad.parse::<Sampling>().unwrap_err();
            assert!(!e.contains('\n') && e.contains(bad.split(':').next().unwrap()), "{bad}: {e}");
        }
    }

    #[test]
    fn greedy_picks_the_first_of_the_logits_sorted() {
        let values = [0.5f32, -0.0, 0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 2.0, -3.0];
        let mut x = 7u64;
        for len in [1, 2, 5, 64, 1000] {
            for _ in 0..50 {
                let logits: Vec<f32> = (0..len)
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        values[(x >> 60) as usize % values.len()]
                    })
                    .collect();
                let mut order: Vec<usize> = (0..len).filter(|&i| !logits[i].is_nan()).collect();
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
                assert_eq!(sample(&logits, Sampling::Greedy, 0, 0), order.first().copied().unwrap_or(0), "{logits:?}");
            }
        }
    }

    #[test]
    fn sampling_picks_within_what_it_keeps() {
        let logits = [0.5f32, 3.0, -1.0, 2.9, f32::NAN, 1.0];
        assert_eq!(sample(&logits, Sampling::Greedy, 0, 0), 1);
        for draw in 0..200 {
            assert!([1, 3].contains(&sample(&logits, Sampling::TopK(2), 7, draw)));
            // 3.0 and 2.9 hold 0.76 of the mass: top-p 0.7 keeps both, 0.4 the first.
            assert!([1, 3].contains(&sample(&logits, Sampling::TopP(0.7), 7, draw)));
            assert_eq!(sample(&logits, Sampling::TopP(0.4), 7, draw), 1);
            assert_ne!(sample(&logits, Sampling::Temperature(1.0), 7, draw), 4, "NaN is never drawn");
        }
        // The same seed and draw give the same token; a low temperature is near greedy, a
        // high one spreads over every finite logit.
        let a: Vec<usize> = (0..50).map(|d| sample(&logits, Sampling::Temperature(1.0), 3, d)).collect();
        assert_eq!(a, (0..50).map(|d| sample(&logits, Sampling::Temperature(1.0), 3, d)).collect::<Vec<_>>());
        assert!((0..50).all(|d| sample(&logits, Sampling::Temperature(0.01), 3, d) == 1));
        // NaN first is not greedy's pick; an infinite top logit takes every draw, and all
        // -inf logits share them.
        let odd = [f32::NAN, 1.0, f32::INFINITY, 2.0];
        for how in [Sampling::Greedy, Sampling::TopK(1), Sampling::TopP(0.5), Sampling::Temperature(2.0)] {
            assert!((0..50).all(|d| sample(&odd, how, 1, d) == 2), "{how:?}");
        }
        let low = [f32::NEG_INFINITY; 3];
        let picks: std::collections::BTreeSet<usize> =
            (0..200).map(|d| sample(&low, Sampling::TopK(3), 1, d)).collect();
        assert_eq!(picks.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(sample(&[f32::NAN; 2], Sampling::Greedy, 0, 0), 0);
        let spread: std::collections::BTreeSet<usize> =
            (0..400).map(|d| sample(&logits, Sampling::Temperature(100.0), 3, d)).collect();
        assert_eq!(spread.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 5]);
    }
}
