//! The text format of a graph (HLO/MLIR-like, one declaration a line), both directions:
//! `parse` reads source into a `Graph`, `print` writes the canonical form, and
//! `parse(&print(g)) == Ok(g)` for every graph the data model can hold. This module owns
//! the syntax only: whether names resolve, shapes agree or attributes fit their op is the
//! verifier's business, which is why every parsed item keeps its `loc`. The grammar is
//! specified in docs/format.md.

use std::collections::HashMap;
use std::fmt;

use crate::attr::{Attr, Attrs};
use crate::dtype::{DType, ShapeDisplay, TensorType};
use crate::err;
use crate::error::{Error, Loc, Result};
use crate::graph::{Dims, Graph, Init, Input, Node, Output, Param, ParamData};
use crate::ops::Op;
use crate::sym::symbol::{Bounds, Symbol, Symbols};

/// Words that open a clause where a name could also stand. Newlines carry no meaning, so a
/// name spelled like one of these must be quoted rather than guessed at.
const RESERVED: &[&str] = &["input", "param", "output", "dims", "_"];

/// How deeply attribute lists may nest (serde_json's limit too): hostile input must get an
/// error, not a stack overflow.
const MAX_DEPTH: usize = 128;

/// Parses a graph in the text format. Errors point at the offending token (1-based
/// line:col, columns counted in characters).
pub fn parse(src: &str) -> Result<Graph> {
    Parser::new(src)?.graph()
}

/// Prints a graph in the canonical text format.
pub fn print(g: &Graph) -> String {
    Printer(g).to_string()
}

// ---------------------------------------------------------------------------------------
// Lexer

#[derive(Clone, Debug, PartialEq)]
enum Tok<'a> {
    Ident(&'a str),
    /// A string literal, escapes decoded.
    Str(String),
    /// Kept as text: whether it must fit an i64, a usize or a u64 depends on where it is.
    Int(&'a str),
    Float(f64),
    Punct(char),
    /// `..`, between a symbol's bounds.
    DotDot,
    Eof,
}

#[derive(Clone, Debug)]
struct Token<'a> {
    tok: Tok<'a>,
    /// The source text, for messages.
    text: &'a str,
    loc: Loc,
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tok {
            Tok::Eof => f.write_str("end of input"),
            // Shortened: a token may be a whole line of a hostile file, and an error is one
            // line a person reads (a `'` inside a token defeats shortening by quotes).
            Tok::Str(_) => write!(f, "string {}", crate::error::shorten(self.text)),
            _ => write!(f, "'{}'", crate::error::shorten(self.text)),
        }
    }
}

struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: u32,
    col: u32,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Whether a name can be printed bare, i.e. reads back as the same name.
fn is_plain(name: &str) -> bool {
    name.starts_with(is_ident_start) && name.chars().all(is_ident_char) && !RESERVED.contains(&name)
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Self {
        Lexer { src, pos: 0, line: 1, col: 1 }
    }

    fn loc(&self) -> Loc {
        Loc { line: self.line, col: self.col }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn eat_while(&mut self, pred: impl Fn(char) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.bump();
        }
    }

    fn skip_blanks(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('#') => self.eat_while(|c| c != '\n'),
                _ => return,
            }
        }
    }

    fn next(&mut self) -> Result<Token<'a>> {
        self.skip_blanks();
        let loc = self.loc();
        let start = self.pos;
        let tok = match self.peek() {
            None => Tok::Eof,
            Some('"') => Tok::Str(self.string(loc)?),
            Some('-' | '0'..='9') => self.number(loc)?,
            Some(c) if is_ident_start(c) => {
                self.eat_while(is_ident_char);
                Tok::Ident(&self.src[start..self.pos])
            }
            Some(c @ ('{' | '}' | '(' | ')' | '[' | ']' | ',' | ':' | '=' | '@' | '?')) => {
                self.bump();
                Tok::Punct(c)
            }
            Some('.') if self.src[self.pos..].starts_with("..") => {
                self.bump();
                self.bump();
                Tok::DotDot
            }
            Some(c) => return Err(err!(Some(loc), "unexpected character {c:?}")),
        };
        Ok(Token { tok, text: &self.src[start..self.pos], loc })
    }

    fn number(&mut self, loc: Loc) -> Result<Tok<'a>> {
        let start = self.pos;
        self.bump();
        // Take the whole word a reader would see as the number, so `1.2.3` or `12ab` is
        // reported as one bad number rather than as a number followed by a puzzling token.
        while let Some(c) = self.peek() {
            let exponent_sign = matches!(c, '+' | '-') && self.src[..self.pos].ends_with(['e', 'E']);
            // `1..512` is two numbers and the `..` between a symbol's bounds.
            if !(is_ident_char(c) || exponent_sign) || self.src[self.pos..].starts_with("..") {
                break;
            }
            self.bump();
        }
        let text = &self.src[start..self.pos];
        let bad = || err!(Some(loc), "bad number '{text}'");
        match number_shape(text).ok_or_else(bad)? {
            NumberShape::Int => Ok(Tok::Int(text)),
            NumberShape::Float => text.parse().map(Tok::Float).map_err(|_| bad()),
        }
    }

    /// A JSON string literal, so names and strings are spelled alike in both formats.
    /// Strings end on their line: a missing quote is reported where the string starts
    /// instead of swallowing the rest of the file.
    fn string(&mut self, open: Loc) -> Result<String> {
        self.bump();
        let mut s = String::new();
        loop {
            let loc = self.loc();
            match self.bump() {
                None | Some('\n') => return Err(err!(Some(open), "unterminated string")),
                Some('"') => return Ok(s),
                Some('\\') => s.push(self.escape(loc)?),
                Some(c) if c < ' ' => {
                    return Err(err!(Some(loc), "control character {c:?} in string (write it as an escape)"))
                }
                Some(c) => s.push(c),
            }
        }
    }

    fn escape(&mut self, at: Loc) -> Result<char> {
        Ok(match self.bump() {
            Some('"') => '"',
            Some('\\') => '\\',
            Some('/') => '/',
            Some('b') => '\u{8}',
            Some('f') => '\u{c}',
            Some('n') => '\n',
            Some('r') => '\r',
            Some('t') => '\t',
            Some('u') => return self.unicode_escape(at),
            _ => {
                return Err(err!(
                    Some(at),
                    "bad escape in string (expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"
                ))
            }
        })
    }

    fn unicode_escape(&mut self, at: Loc) -> Result<char> {
        let unpaired = || err!(Some(at), "unpaired surrogate in string escape");
        let hi = self.hex4(at)?;
        let code = if (0xD800..0xDC00).contains(&hi) {
            // As in JSON, a char outside the BMP is written as a UTF-16 surrogate pair.
            if !(self.bump() == Some('\\') && self.bump() == Some('u')) {
                return Err(unpaired());
            }
            let lo = self.hex4(at)?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(unpaired());
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        char::from_u32(code).ok_or_else(unpaired)
    }

    fn hex4(&mut self, at: Loc) -> Result<u32> {
        (0..4).try_fold(0, |acc, _| {
            let digit = self.bump().and_then(|c| c.to_digit(16));
            digit
                .map(|d| acc * 16 + d)
                .ok_or_else(|| err!(Some(at), "bad \\u escape in string (expected 4 hex digits)"))
        })
    }
}

enum NumberShape {
    Int,
    Float,
}

/// JSON's number syntax (but leading zeros are harmless here), plus `-inf`, which is how
/// Rust prints negative infinity; a `.` or an exponent makes it a float.
fn number_shape(text: &str) -> Option<NumberShape> {
    if text == "-inf" {
        return Some(NumberShape::Float);
    }
    let body = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match body.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (body, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(int) && frac.is_none_or(digits) && exponent.is_none_or(digits)) {
        return None;
    }
    Some(if frac.is_none() && exponent.is_none() { NumberShape::Int } else { NumberShape::Float })
}

/// What a node states about its result: dtype, shape and dims, each optional.
type Declared = (Option<DType>, Option<Vec<usize>>, Option<Dims>);

// ---------------------------------------------------------------------------------------
// Parser: recursive descent with one token of lookahead. Tokens are lexed on demand so
// errors come out in source order.

struct Parser<'a> {
    lex: Lexer<'a>,
    tok: Token<'a>,
    /// Where each symbol was declared, for the message about a second declaration.
    symbol_at: HashMap<String, Loc>,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Result<Self> {
        let mut lex = Lexer::new(src);
        let tok = lex.next()?;
        Ok(Parser { lex, tok, symbol_at: HashMap::new() })
    }

    fn bump(&mut self) -> Result<()> {
        self.tok = self.lex.next()?;
        Ok(())
    }

    fn is(&self, c: char) -> bool {
        self.tok.tok == Tok::Punct(c)
    }

    fn eat(&mut self, c: char) -> Result<bool> {
        let hit = self.is(c);
        if hit {
            self.bump()?;
        }
        Ok(hit)
    }

    fn expect(&mut self, c: char, context: fmt::Arguments) -> Result<()> {
        if self.eat(c)? {
            Ok(())
        } else {
            Err(self.unexpected(format_args!("'{c}' {context}")))
        }
    }

    fn unexpected(&self, expected: impl fmt::Display) -> Error {
        // Names in `expected` come from the file: a control character in one (a newline in
        // a quoted node name) must not break the one-line error.
        let expected = crate::error::escape_controls(&expected.to_string(), false).into_owned();
        err!(Some(self.tok.loc), "expected {expected}, found {}", self.tok)
    }

    /// `item {, item} close`, entered after the opening bracket; empty lists allowed.
    fn list<T>(&mut self, close: char, what: &str, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut items = Vec::new();
        if self.eat(close)? {
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            if !self.eat(',')? {
                break;
            }
        }
        self.expect(close, format_args!("after {what}"))?;
        Ok(items)
    }

    /// A bare identifier, or any string quoted.
    fn name(&mut self, what: fmt::Arguments) -> Result<(String, Loc)> {
        let loc = self.tok.loc;
        let name = match &self.tok.tok {
            Tok::Ident(s) if RESERVED.contains(s) => {
                return Err(err!(
                    Some(loc),
                    "expected {what}, found keyword '{s}' (quote it to use it as a name: \"{s}\")"
                ))
            }
            Tok::Ident(s) => s.to_string(),
            Tok::Str(s) => s.clone(),
            _ => return Err(self.unexpected(what)),
        };
        self.bump()?;
        Ok((name, loc))
    }

    /// An unsigned integer of type `T`, described as `what` in errors.
    fn uint<T: std::str::FromStr>(&mut self, what: &str) -> Result<T> {
        let Tok::Int(text) = self.tok.tok else { return Err(self.unexpected(what)) };
        if text.starts_with('-') {
            return Err(self.unexpected(what));
        }
        let v = text.parse().map_err(|_| err!(Some(self.tok.loc), "{text} is too large for {what}"))?;
        self.bump()?;
        Ok(v)
    }

    /// The float spelled by the current token, if it is one: ints count, and `inf`/`NaN`
    /// are how Rust prints the non-finite values.
    fn float_literal(&self) -> Option<f64> {
        match self.tok.tok {
            Tok::Float(x) => Some(x),
            Tok::Int(text) => text.parse().ok(),
            Tok::Ident("inf") => Some(f64::INFINITY),
            Tok::Ident("NaN") => Some(f64::NAN),
            _ => None,
        }
    }

    fn graph(&mut self) -> Result<Graph> {
        if self.tok.tok != Tok::Ident("graph") {
            return Err(self.unexpected("'graph'"));
        }
        self.bump()?;
        let (name, _) = self.name(format_args!("the graph's name"))?;
        self.expect('{', format_args!("after the graph's name"))?;
        let mut g = Graph { name, ..Graph::default() };
        while !self.eat('}')? {
            self.statement(&mut g)?;
        }
        if self.tok.tok != Tok::Eof {
            return Err(self.unexpected("end of input after the graph's closing '}'"));
        }
        Ok(g)
    }

    fn statement(&mut self, g: &mut Graph) -> Result<()> {
        match self.tok.tok {
            Tok::Ident("input") => {
                self.bump()?;
                g.inputs.push(self.input()?);
            }
            Tok::Ident("param") => {
                self.bump()?;
                g.params.push(self.param()?);
            }
            Tok::Ident("output") => {
                self.bump()?;
                let outputs = self.comma_separated(|p| {
                    let (name, loc) = p.name(format_args!("an output name"))?;
                    Ok(Output { name, loc: Some(loc) })
                })?;
                g.outputs.extend(outputs);
            }
            Tok::Ident("dim") => {
                let (name, loc) = self.name(format_args!("a node name"))?;
                // `dim seq = ...` declares a symbol; `dim = op(...)` or `dim: ...` is a node
                // named `dim`, which is why the word needs no quotes as a name.
                match self.tok.tok {
                    Tok::Ident(_) | Tok::Str(_) => self.symbol(&mut g.symbols)?,
                    _ => g.nodes.push(self.node_named(name, loc)?),
                }
            }
            Tok::Ident(_) | Tok::Str(_) => g.nodes.push(self.node()?),
            _ => return Err(self.unexpected("'input', 'param', 'output', 'dim', a node or '}'")),
        }
        Ok(())
    }

    /// `item {, item}` with no brackets: the list ends at the first item not followed by
    /// a comma.
    fn comma_separated<T>(&mut self, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut items = vec![item(self)?];
        while self.eat(',')? {
            items.push(item(self)?);
        }
        Ok(items)
    }

    fn input(&mut self) -> Result<Input> {
        let (name, loc) = self.name(format_args!("a name after 'input'"))?;
        let what = format!("input '{name}'");
        let (ty, dims) = self.typed(&what)?;
        Ok(Input { name, ty, dims, loc: Some(loc) })
    }

    fn param(&mut self) -> Result<Param> {
        let (name, loc) = self.name(format_args!("a name after 'param'"))?;
        let what = format!("param '{name}'");
        let (ty, dims) = self.typed(&what)?;
        self.expect('=', format_args!("after the type of {what}"))?;
        let data = self.param_data(&what)?;
        Ok(Param { name, ty, dims, data, loc: Some(loc) })
    }

    /// `: dtype[shape] [dims(...)]` of an input or param, where dtype and shape are required.
    fn typed(&mut self, what: &str) -> Result<(TensorType, Option<Dims>)> {
        self.expect(':', format_args!("after the name of {what}"))?;
        let dtype = self.dtype()?;
        if !self.is('[') {
            return Err(self.unexpected(format_args!("the shape of {what} ('[]' for a scalar)")));
        }
        let shape = self.shape()?;
        Ok((TensorType::new(dtype, shape), self.dims()?))
    }

    fn dtype(&mut self) -> Result<DType> {
        let Tok::Ident(s) = self.tok.tok else { return Err(self.unexpected("a dtype")) };
        let Some(dtype) = DType::parse(s) else {
            let known: Vec<_> = DType::ALL.iter().map(|d| d.name()).collect();
            return Err(err!(Some(self.tok.loc), "unknown dtype '{s}' (expected one of {})", known.join(", ")));
        };
        self.bump()?;
        Ok(dtype)
    }

    /// `[d, ...]`, entered at the `[`.
    fn shape(&mut self) -> Result<Vec<usize>> {
        self.bump()?;
        self.list(']', "the shape", |p| p.uint("a dimension size"))
    }

    /// An optional `dims(name | _, ...)`.
    fn dims(&mut self) -> Result<Option<Dims>> {
        if self.tok.tok != Tok::Ident("dims") {
            return Ok(None);
        }
        self.bump()?;
        self.expect('(', format_args!("after 'dims'"))?;
        let dims = self.list(')', "the dim names", |p| {
            if p.tok.tok == Tok::Ident("_") {
                p.bump()?;
                return Ok(None);
            }
            Ok(Some(p.name(format_args!("a dim name or '_'"))?.0))
        })?;
        Ok(Some(dims))
    }

    fn param_data(&mut self, what: &str) -> Result<ParamData> {
        let data = match self.tok.tok {
            Tok::Ident("file") => {
                self.bump()?;
                self.file(what)?
            }
            Tok::Ident("init") => {
                self.bump()?;
                ParamData::Init(self.init()?)
            }
            Tok::Ident("value") => {
                self.bump()?;
                ParamData::Value(self.value(0)?)
            }
            _ => return Err(self.unexpected(format_args!("'file', 'init' or 'value' as the data of {what}"))),
        };
        Ok(data)
    }

    /// `("path")` or `("path", key = "name")`, after `file`.
    fn file(&mut self, what: &str) -> Result<ParamData> {
        self.expect('(', format_args!("after 'file'"))?;
        let path = self.string(format_args!("the file path of {what} (a quoted string)"))?;
        let mut key = None;
        if self.eat(',')? {
            if self.tok.tok != Tok::Ident("key") {
                return Err(self.unexpected("'key' after the file path"));
            }
            self.bump()?;
            self.expect('=', format_args!("after 'key'"))?;
            key = Some(self.string(format_args!("the tensor key of {what} (a quoted string)"))?);
        }
        self.expect(')', format_args!("after the file of {what}"))?;
        Ok(ParamData::File { path, key })
    }

    fn string(&mut self, what: fmt::Arguments) -> Result<String> {
        let Tok::Str(s) = &self.tok.tok else { return Err(self.unexpected(what)) };
        let s = s.clone();
        self.bump()?;
        Ok(s)
    }

    /// `zeros`, `ones`, `normal{seed, [mean,] std}` or `uniform{seed, low, high}`, after
    /// `init`. Fields may come in any order; a missing one is reported at the kind.
    fn init(&mut self) -> Result<Init> {
        let loc = self.tok.loc;
        let kinds = "normal, uniform, zeros or ones";
        let Tok::Ident(kind) = self.tok.tok else {
            return Err(self.unexpected(format_args!("an init kind ({kinds})")));
        };
        let fields: &[&str] = match kind {
            "zeros" | "ones" => {
                self.bump()?;
                return Ok(if kind == "zeros" { Init::Zeros } else { Init::Ones });
            }
            "normal" => &["seed", "mean", "std"],
            "uniform" => &["seed", "low", "high"],
            _ => return Err(err!(Some(loc), "unknown init '{kind}' (expected {kinds})")),
        };
        self.bump()?;
        self.expect('{', format_args!("after 'init {kind}'"))?;
        let mut seed = None;
        let mut numbers: Vec<(&str, f64)> = Vec::new();
        self.list('}', &format!("the fields of 'init {kind}'"), |p| {
            let field = match p.tok.tok {
                Tok::Ident(f) if fields.contains(&f) => f,
                _ => return Err(p.unexpected(format_args!("a field of 'init {kind}' ({})", fields.join(", ")))),
            };
            if (field == "seed" && seed.is_some()) || numbers.iter().any(|&(f, _)| f == field) {
                return Err(err!(Some(p.tok.loc), "duplicate field '{field}' in 'init {kind}'"));
            }
            p.bump()?;
            p.expect('=', format_args!("after '{field}'"))?;
            if field == "seed" {
                seed = Some(p.uint("a seed (a non-negative integer)")?);
            } else {
                let x = p.float_literal().ok_or_else(|| p.unexpected("a number"))?;
                p.bump()?;
                numbers.push((field, x));
            }
            Ok(())
        })?;
        let missing = |field: &str| err!(Some(loc), "'init {kind}' is missing '{field}'");
        let number = |field: &str| numbers.iter().find(|&&(f, _)| f == field).map(|&(_, x)| x);
        let required = |field: &str| number(field).ok_or_else(|| missing(field));
        let seed = seed.ok_or_else(|| missing("seed"))?;
        Ok(if kind == "normal" {
            Init::Normal { seed, mean: number("mean").unwrap_or(0.0), std: required("std")? }
        } else {
            Init::Uniform { seed, low: required("low")?, high: required("high")? }
        })
    }

    /// `NAME = N | LO..HI [: multiple_of = K]`, after `dim`: the bounds of a symbol.
    fn symbol(&mut self, symbols: &mut Symbols) -> Result<()> {
        let (name, loc) = self.name(format_args!("a symbol name after 'dim'"))?;
        self.expect('=', format_args!("after 'dim {}'", Name(&name)))?;
        let what = "a size (a non-negative integer)";
        let lo = self.uint::<i64>(what)?;
        let hi = if self.tok.tok == Tok::DotDot {
            self.bump()?;
            self.uint::<i64>(what)?
        } else {
            lo
        };
        let mut multiple_of = 1;
        if self.eat(':')? {
            if self.tok.tok != Tok::Ident("multiple_of") {
                return Err(self.unexpected(format_args!("'multiple_of' after ':' in 'dim {}'", Name(&name))));
            }
            self.bump()?;
            self.expect('=', format_args!("after 'multiple_of'"))?;
            multiple_of = self.uint::<i64>("a divisor (a positive integer)")?;
        }
        let sym = Symbol::new(&name, lo, hi, multiple_of).map_err(|e| err!(Some(loc), "dim {}: {e}", Name(&name)))?;
        if let Some(first) = self.symbol_at.insert(name.clone(), loc) {
            return Err(err!(
                Some(loc),
                "dim {} is declared twice (first at {}:{})",
                Name(&name),
                first.line,
                first.col
            ));
        }
        symbols.insert(name, sym);
        Ok(())
    }

    fn node(&mut self) -> Result<Node> {
        let (name, loc) = self.name(format_args!("a node name"))?;
        self.node_named(name, loc)
    }

    /// A node after its name.
    fn node_named(&mut self, name: String, loc: Loc) -> Result<Node> {
        let (dtype, shape, dims) = if self.eat(':')? { self.declared_type(&name)? } else { (None, None, None) };
        self.expect('=', format_args!("after the name of node '{name}'"))?;
        let Tok::Ident(op_name) = self.tok.tok else {
            return Err(self.unexpected(format_args!("an op name in node '{name}'")));
        };
        let op = Op::from_name(op_name)
            .ok_or_else(|| err!(Some(self.tok.loc), "unknown op '{op_name}' in node '{name}'"))?;
        self.bump()?;
        self.expect('(', format_args!("after op '{op}' in node '{name}'"))?;
        let inputs =
            self.list(')', &format!("operands of node '{name}'"), |p| Ok(p.name(format_args!("an operand name"))?.0))?;
        let attrs = if self.is('{') { self.attrs(&name)? } else { Attrs::new() };
        let device = if self.eat('@')? { Some(self.uint("a device index")?) } else { None };
        Ok(Node { name, op, inputs, attrs, dtype, shape, dims, device, loc: Some(loc) })
    }

    /// `(dtype | ?) [shape] [dims(...)]` after a node's `:`; `?` leaves the dtype to
    /// inference.
    fn declared_type(&mut self, node: &str) -> Result<Declared> {
        let dtype = match self.tok.tok {
            Tok::Punct('?') => {
                self.bump()?;
                None
            }
            Tok::Ident(_) => Some(self.dtype()?),
            _ => return Err(self.unexpected(format_args!("a dtype or '?' after ':' in node '{node}'"))),
        };
        let shape = if self.is('[') { Some(self.shape()?) } else { None };
        Ok((dtype, shape, self.dims()?))
    }

    /// `{key = value, ...}`, entered at the `{`.
    fn attrs(&mut self, node: &str) -> Result<Attrs> {
        self.bump()?;
        let mut attrs = Attrs::new();
        self.list('}', &format!("the attributes of node '{node}'"), |p| {
            let (key, loc) = p.name(format_args!("an attribute name"))?;
            if attrs.contains_key(&key) {
                return Err(err!(Some(loc), "duplicate attribute '{key}' in node '{node}'"));
            }
            p.expect('=', format_args!("after attribute '{key}'"))?;
            attrs.insert(key, p.value(0)?);
            Ok(())
        })?;
        Ok(attrs)
    }

    /// A JSON-like literal; `depth` counts the enclosing lists.
    fn value(&mut self, depth: usize) -> Result<Attr> {
        let value = match &self.tok.tok {
            Tok::Ident("null") => Attr::Null,
            Tok::Ident("true") => Attr::Bool(true),
            Tok::Ident("false") => Attr::Bool(false),
            Tok::Int(text) => {
                let text = *text;
                Attr::Int(text.parse().map_err(|_| err!(Some(self.tok.loc), "integer {text} does not fit in 64 bits"))?)
            }
            Tok::Str(s) => Attr::Str(s.clone()),
            Tok::Punct('[') => {
                if depth == MAX_DEPTH {
                    return Err(err!(Some(self.tok.loc), "lists nested more than {MAX_DEPTH} deep"));
                }
                self.bump()?;
                return Ok(Attr::List(self.list(']', "the list items", |p| p.value(depth + 1))?));
            }
            _ => match self.float_literal() {
                Some(x) => Attr::Float(x),
                None => return Err(self.unexpected("a value (null, true, false, a number, a \"string\" or a [list])")),
            },
        };
        self.bump()?;
        Ok(value)
    }
}

// ---------------------------------------------------------------------------------------
// Printer

struct Printer<'g>(&'g Graph);

/// A string literal with JSON escapes.
struct Quoted<'s>(&'s str);

/// A name, bare when it reads back as itself, quoted otherwise.
struct Name<'s>(&'s str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self.0).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if is_plain(self.0) {
            f.write_str(self.0)
        } else {
            Quoted(self.0).fmt(f)
        }
    }
}

fn join<T>(
    f: &mut fmt::Formatter<'_>,
    items: impl IntoIterator<Item = T>,
    mut each: impl FnMut(&mut fmt::Formatter<'_>, T) -> fmt::Result,
) -> fmt::Result {
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, item)?;
    }
    Ok(())
}

fn write_names<'s>(f: &mut fmt::Formatter<'_>, names: impl IntoIterator<Item = &'s String>) -> fmt::Result {
    join(f, names, |f, n| write!(f, "{}", Name(n)))
}

fn write_dims(f: &mut fmt::Formatter<'_>, dims: &Option<Dims>) -> fmt::Result {
    match dims {
        Some(dims) => write!(f, " {}", DimsDisplay(dims)),
        None => Ok(()),
    }
}

/// Dim names as the text format writes them, `dims(batch, _)` (`_` unnamed, a name that
/// would not read back as itself quoted), so that other tools print them the same way.
pub struct DimsDisplay<'a>(pub &'a [Option<String>]);

impl fmt::Display for DimsDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dims(")?;
        join(f, self.0, |f, d| match d {
            Some(n) => write!(f, "{}", Name(n)),
            None => f.write_str("_"),
        })?;
        f.write_str(")")
    }
}

fn write_data(f: &mut fmt::Formatter<'_>, data: &ParamData) -> fmt::Result {
    match data {
        ParamData::File { path, key: None } => write!(f, "file({})", Quoted(path)),
        ParamData::File { path, key: Some(key) } => write!(f, "file({}, key = {})", Quoted(path), Quoted(key)),
        ParamData::Init(Init::Zeros) => f.write_str("init zeros"),
        ParamData::Init(Init::Ones) => f.write_str("init ones"),
        // `{:?}` keeps a `.` or exponent on floats, so `1.0` does not read back as an int.
        ParamData::Init(Init::Normal { seed, mean, std }) if *mean == 0.0 => {
            write!(f, "init normal{{seed = {seed}, std = {std:?}}}")
        }
        ParamData::Init(Init::Normal { seed, mean, std }) => {
            write!(f, "init normal{{seed = {seed}, mean = {mean:?}, std = {std:?}}}")
        }
        ParamData::Init(Init::Uniform { seed, low, high }) => {
            write!(f, "init uniform{{seed = {seed}, low = {low:?}, high = {high:?}}}")
        }
        ParamData::Value(v) => write!(f, "value {v}"),
    }
}

fn write_node(f: &mut fmt::Formatter<'_>, n: &Node) -> fmt::Result {
    write!(f, "  {}", Name(&n.name))?;
    if n.dtype.is_some() || n.shape.is_some() || n.dims.is_some() {
        match n.dtype {
            Some(d) => write!(f, ": {d}")?,
            None => f.write_str(": ?")?,
        }
        if let Some(shape) = &n.shape {
            write!(f, "{}", ShapeDisplay(shape))?;
        }
        write_dims(f, &n.dims)?;
    }
    write!(f, " = {}(", n.op)?;
    write_names(f, &n.inputs)?;
    f.write_str(")")?;
    if !n.attrs.is_empty() {
        f.write_str(" {")?;
        join(f, &n.attrs, |f, (k, v)| write!(f, "{} = {v}", Name(k)))?;
        f.write_str("}")?;
    }
    if let Some(d) = n.device {
        write!(f, " @{d}")?;
    }
    writeln!(f)
}

impl fmt::Display for Printer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.0;
        writeln!(f, "graph {} {{", Name(&g.name))?;
        for s in g.symbols.values() {
            writeln!(f, "  dim {} = {}", Name(&s.name), Bounds(s))?;
        }
        for i in &g.inputs {
            write!(f, "  input {}: {}", Name(&i.name), i.ty)?;
            write_dims(f, &i.dims)?;
            writeln!(f)?;
        }
        for p in &g.params {
            write!(f, "  param {}: {}", Name(&p.name), p.ty)?;
            write_dims(f, &p.dims)?;
            f.write_str(" = ")?;
            write_data(f, &p.data)?;
            writeln!(f)?;
        }
        for n in &g.nodes {
            write_node(f, n)?;
        }
        if !g.outputs.is_empty() {
            f.write_str("  output ")?;
            write_names(f, g.outputs.iter().map(|o| &o.name))?;
            writeln!(f)?;
        }
        f.write_str("}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn input(name: &str, dtype: DType, shape: &[usize], dims: Option<Dims>) -> Input {
        Input { name: name.into(), ty: TensorType::new(dtype, shape.to_vec()), dims, loc: None }
    }

    fn param(name: &str, shape: &[usize], dims: Option<Dims>, data: ParamData) -> Param {
        Param { name: name.into(), ty: TensorType::new(DType::F32, shape.to_vec()), dims, data, loc: None }
    }

    fn dims(names: &[Option<&str>]) -> Option<Dims> {
        Some(names.iter().map(|n| n.map(str::to_string)).collect())
    }

    /// A graph using every feature of the format once.
    fn everything() -> Graph {
        let mut a = Node::new("a", Op::Relu, &["h"]);
        (a.dtype, a.shape, a.dims) = (Some(DType::F32), Some(vec![512, 4096]), dims(&[Some("batch"), None]));
        let mut b = Node::new("b", Op::Relu, &["a"]);
        b.dtype = Some(DType::F32);
        let mut c2 = Node::new("c2", Op::Relu, &["b"]);
        c2.shape = Some(vec![512, 4096]);
        let mut d = Node::new("d", Op::Neg, &["c2"]);
        d.dims = dims(&[Some("_"), Some("x y")]);
        let mut s = Node::new("scalar", Op::ReduceSum, &["d"]);
        (s.dtype, s.shape, s.dims) = (Some(DType::F32), Some(vec![]), Some(vec![]));
        let mut r = Node::new("r", Op::Recv, &[])
            .with_attr("dtype", Attr::Str("f32".into()))
            .with_attr("from", Attr::Int(0))
            .with_attr("key", Attr::Str("k0".into()))
            .with_attr("shape", Attr::ints(&[2]));
        r.device = Some(1);
        let weird = Node::new("weird \"name\"\n", Op::Add, &["input", "a.b_c"])
            .with_attr("null", Attr::Null)
            .with_attr("odd key", Attr::Bool(false))
            .with_attr(
                "values",
                Attr::List(vec![
                    Attr::Int(i64::MIN),
                    Attr::Int(-7),
                    Attr::Float(-0.0),
                    Attr::Float(1e-7),
                    Attr::Float(1e300),
                    Attr::Float(f64::INFINITY),
                    Attr::Float(f64::NEG_INFINITY),
                    Attr::Str("tab\t\u{1} é 😀 \\ /".into()),
                    Attr::List(vec![Attr::List(vec![]), Attr::List(vec![Attr::Null])]),
                ]),
            );
        Graph {
            name: "mlp".into(),
            inputs: vec![
                input("x", DType::F32, &[512, 1024], dims(&[Some("batch"), Some("embed")])),
                input("t", DType::I32, &[], None),
                input("input", DType::Bool, &[3], dims(&[None])),
                input("a.b_c", DType::I64, &[0, 1], None),
            ],
            params: vec![
                param(
                    "w1",
                    &[1024, 4096],
                    dims(&[Some("embed"), Some("hidden")]),
                    ParamData::File { path: "w1.npy".into(), key: None },
                ),
                param(
                    "e",
                    &[50, 32],
                    None,
                    ParamData::File { path: "model.safetensors".into(), key: Some("emb".into()) },
                ),
                param("w2", &[4096, 1024], None, ParamData::Init(Init::Normal { seed: 1, mean: 0.0, std: 0.02 })),
                param("w3", &[4], None, ParamData::Init(Init::Normal { seed: u64::MAX, mean: -0.5, std: 1.0 })),
                param("u", &[4], None, ParamData::Init(Init::Uniform { seed: 3, low: -1.0, high: 1.0 })),
                param("z", &[3], None, ParamData::Init(Init::Zeros)),
                param("o", &[3], None, ParamData::Init(Init::Ones)),
                param(
                    "c",
                    &[2, 2],
                    None,
                    ParamData::Value(Attr::List(vec![
                        Attr::List(vec![Attr::Float(1.0), Attr::Float(2.0)]),
                        Attr::List(vec![Attr::Float(3.0), Attr::Float(4.0)]),
                    ])),
                ),
                param("k", &[], None, ParamData::Value(Attr::Int(7))),
            ],
            nodes: vec![
                Node::new("h", Op::MatMul, &["x", "w1"]),
                a,
                b,
                c2,
                d,
                Node::new("y", Op::ReduceSum, &["a"])
                    .with_attr("axes", Attr::ints(&[1]))
                    .with_attr("keepdims", Attr::Bool(true)),
                s,
                r,
                weird,
            ],
            outputs: ["y", "a", "weird \"name\"\n"].into_iter().map(Output::new).collect(),
            symbols: [("batch", 1, 512, 8), ("dims", 4, 4, 1), ("embed", 0, 1024, 1)]
                .into_iter()
                .map(|(n, lo, hi, k)| (n.to_string(), Symbol::new(n, lo, hi, k).unwrap()))
                .collect(),
        }
    }

    const EVERYTHING: &str = r#"graph mlp {
  dim batch = 1..512:multiple_of=8
  dim "dims" = 4
  dim embed = 0..1024
  input x: f32[512,1024] dims(batch, embed)
  input t: i32[]
  input "input": bool[3] dims(_)
  input a.b_c: i64[0,1]
  param w1: f32[1024,4096] dims(embed, hidden) = file("w1.npy")
  param e: f32[50,32] = file("model.safetensors", key = "emb")
  param w2: f32[4096,1024] = init normal{seed = 1, std = 0.02}
  param w3: f32[4] = init normal{seed = 18446744073709551615, mean = -0.5, std = 1.0}
  param u: f32[4] = init uniform{seed = 3, low = -1.0, high = 1.0}
  param z: f32[3] = init zeros
  param o: f32[3] = init ones
  param c: f32[2,2] = value [[1.0, 2.0], [3.0, 4.0]]
  param k: f32[] = value 7
  h = matmul(x, w1)
  a: f32[512,4096] dims(batch, _) = relu(h)
  b: f32 = relu(a)
  c2: ?[512,4096] = relu(b)
  d: ? dims("_", "x y") = neg(c2)
  y = reduce_sum(a) {axes = [1], keepdims = true}
  scalar: f32[] dims() = reduce_sum(d)
  r = recv() {dtype = "f32", from = 0, key = "k0", shape = [2]} @1
  "weird \"name\"\n" = add("input", a.b_c) {null = null, "odd key" = false, values = [-9223372036854775808, -7, -0.0, 1e-7, 1e300, inf, -inf, "tab\t\u0001 é 😀 \\ /", [[], [null]]]}
  output y, a, "weird \"name\"\n"
}
"#;

    #[test]
    fn text_prints_canonically_and_round_trips() {
        let g = everything();
        let text = print(&g);
        assert_eq!(text, EVERYTHING);
        assert_eq!(parse(&text), Ok(g));
    }

    #[test]
    fn text_parse_is_whitespace_insensitive_and_skips_comments() {
        let src = "# a graph\ngraph g{input x:f32[2]dims(a)#c\nparam\n\"w\"\n:\nf32[2]=init\nzeros y:?[2]=add(x,w){k=[1,-2.5e3]}@0 output y output x}  # end";
        let g = parse(src).unwrap();
        assert_eq!(g.inputs[0].dims, dims(&[Some("a")]));
        assert_eq!(g.params[0].name, "w");
        assert_eq!(g.nodes[0].attrs["k"], Attr::List(vec![Attr::Int(1), Attr::Float(-2500.0)]));
        assert_eq!(g.nodes[0].device, Some(0));
        // Several `output` statements append in order.
        assert_eq!(g.outputs, vec![Output::new("y"), Output::new("x")]);
        assert_eq!(parse(&print(&g)), Ok(g));
    }

    #[test]
    fn text_records_locations_of_names() {
        let g =
            parse("graph g {\n  input x: f32[2]\n  param \"w\": f32[2] = init ones\n\ty = add(x, w)\n  output y\n}")
                .unwrap();
        assert_eq!(g.inputs[0].loc, Some(Loc { line: 2, col: 9 }));
        assert_eq!(g.params[0].loc, Some(Loc { line: 3, col: 9 }));
        assert_eq!(g.nodes[0].loc, Some(Loc { line: 4, col: 2 }));
        assert_eq!(g.outputs[0].loc, Some(Loc { line: 5, col: 10 }));
    }

    #[test]
    fn text_empty_graph() {
        let g = Graph::default();
        assert_eq!(print(&g), "graph \"\" {\n}\n");
        assert_eq!(parse(&print(&g)), Ok(g));
    }

    #[test]
    fn text_nan_reads_back_as_nan() {
        let g = parse("graph g { p: ? dims() = relu(x) {a = NaN, b = [inf, -inf]} }").unwrap();
        assert!(matches!(g.nodes[0].attrs["a"], Attr::Float(x) if x.is_nan()));
        assert!(print(&g).contains("{a = NaN, b = [inf, -inf]}"));
    }

    #[test]
    fn text_the_documented_example_parses() {
        // The example of docs/format.md.
        let src = r#"# A two-layer MLP.
graph mlp {
  input x: f32[512,1024] dims(batch, embed)
  input t: i32[]                                   # a scalar
  param w1: f32[1024,4096] dims(embed, hidden) = file("w1.npy")
  param e: f32[50,32] = file("model.safetensors", key = "emb")
  param w2: f32[4096,1024] = init normal{seed = 1, std = 0.02}
  param u: f32[4] = init uniform{seed = 3, low = -1.0, high = 1.0}
  param z: f32[3] = init zeros
  param c: f32[2,2] = value [[1.0, 2.0], [3.0, 4.0]]
  h = matmul(x, w1)
  a: f32[512,4096] dims(batch, _) = relu(h)        # declared dtype, shape and dims
  b: f32 = relu(a)                                 # declared dtype only
  c2: ?[512,4096] = relu(b)                        # declared shape only
  y = matmul(c2, w2)
  s = reduce_sum(y) {axes = [1], keepdims = true}
  r = recv() {dtype = "f32", from = 0, key = "k0", shape = [2]} @1
  "layer.0/out" = add(s, r)
  output y, "layer.0/out"
}
"#;
        let g = parse(src).unwrap();
        assert_eq!((g.inputs.len(), g.params.len(), g.nodes.len(), g.outputs.len()), (2, 6, 8, 2));
        assert_eq!(parse(&print(&g)), Ok(g));
    }

    /// Parses `src`, expecting an error at `line:col` with message `msg`.
    #[track_caller]
    fn fails(src: &str, line: u32, col: u32, msg: &str) {
        let e = parse(src).expect_err(src);
        assert_eq!((e.loc, e.msg.as_str()), (Some(Loc { line, col }), msg), "{src}");
    }

    #[test]
    fn text_error_bad_dtype() {
        fails(
            "graph g {\n  input x: f64[2]\n}",
            2,
            12,
            "unknown dtype 'f64' (expected one of f32, i32, i64, bool, f16, bf16, i8, u8, i16, u16, u32, u64)",
        );
    }

    #[test]
    fn text_error_missing_paren() {
        fails("graph g {\n  h = matmul(x, w1 {k = 1}\n}", 2, 20, "expected ')' after operands of node 'h', found '{'");
    }

    #[test]
    fn text_error_unknown_op() {
        fails("graph g {\n  h = matmull(x, w1)\n}", 2, 7, "unknown op 'matmull' in node 'h'");
    }

    #[test]
    fn text_error_unterminated_string() {
        fails("graph g {\n  h = relu(x) {k = \"abc}\n}", 2, 20, "unterminated string");
        fails("graph \"g", 1, 7, "unterminated string");
    }

    #[test]
    fn text_error_bad_number() {
        fails("graph g {\n  h = relu(x) {k = 1.2.3}\n}", 2, 20, "bad number '1.2.3'");
        fails("graph g { input x: f32[2x] }", 1, 24, "bad number '2x'");
        fails("graph g { h = relu(x) {k = -} }", 1, 28, "bad number '-'");
    }

    #[test]
    fn text_error_unexpected_eof() {
        fails(
            "graph g {\n  h = relu(x)\n",
            3,
            1,
            "expected 'input', 'param', 'output', 'dim', a node or '}', found end of input",
        );
        fails("graph g { h = relu(", 1, 20, "expected an operand name, found end of input");
    }

    #[test]
    fn text_error_stray_token() {
        fails("graph g {\n}\nx", 3, 1, "expected end of input after the graph's closing '}', found 'x'");
        fails(
            "graph g {\n  h = relu(x) [1]\n}",
            2,
            15,
            "expected 'input', 'param', 'output', 'dim', a node or '}', found '['",
        );
        fails("graph g { input x: f32[2] ; }", 1, 27, "unexpected character ';'");
    }

    #[test]
    fn text_error_bad_init() {
        fails(
            "graph g {\n  param w: f32[2] = init gaussian{seed = 1}\n}",
            2,
            26,
            "unknown init 'gaussian' (expected normal, uniform, zeros or ones)",
        );
        fails("graph g { param w: f32[2] = init normal{seed = 1} }", 1, 34, "'init normal' is missing 'std'");
        fails(
            "graph g { param w: f32[2] = init uniform{seed = 1, lo = 0} }",
            1,
            52,
            "expected a field of 'init uniform' (seed, low, high), found 'lo'",
        );
        fails(
            "graph g { param w: f32[2] = init normal{seed = -1, std = 1} }",
            1,
            48,
            "expected a seed (a non-negative integer), found '-1'",
        );
        fails(
            "graph g { param w: f32[2] = init normal{std = 1, std = 2} }",
            1,
            50,
            "duplicate field 'std' in 'init normal'",
        );
    }

    #[test]
    fn text_error_bad_param_data() {
        fails(
            "graph g { param w: f32[2] = load(\"w.npy\") }",
            1,
            29,
            "expected 'file', 'init' or 'value' as the data of param 'w', found 'load'",
        );
        fails(
            "graph g { param w: f32[2] = file(w.npy) }",
            1,
            34,
            "expected the file path of param 'w' (a quoted string), found 'w.npy'",
        );
        fails("graph g { param w: f32[2] }", 1, 27, "expected '=' after the type of param 'w', found '}'");
    }

    #[test]
    fn text_error_duplicate_attribute() {
        fails(
            "graph g {\n  y = reduce_sum(x) {axes = [0], axes = [1]}\n}",
            2,
            34,
            "duplicate attribute 'axes' in node 'y'",
        );
    }

    #[test]
    fn text_error_bad_strings() {
        fails(
            "graph g { h = relu(x) {k = \"a\\qb\"} }",
            1,
            30,
            "bad escape in string (expected one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)",
        );
        fails("graph g { h = relu(x) {k = \"\\ud800\"} }", 1, 29, "unpaired surrogate in string escape");
        fails("graph g { h = relu(x) {k = \"\\u12g4\"} }", 1, 29, "bad \\u escape in string (expected 4 hex digits)");
        fails(
            "graph g { h = relu(x) {k = \"a\tb\"} }",
            1,
            30,
            "control character '\\t' in string (write it as an escape)",
        );
    }

    #[test]
    fn text_error_reserved_word_as_name() {
        fails(
            "graph g {\n  output dims\n}",
            2,
            10,
            "expected an output name, found keyword 'dims' (quote it to use it as a name: \"dims\")",
        );
        fails("graph g { input = relu(x) }", 1, 17, "expected a name after 'input', found '='");
    }

    #[test]
    fn text_error_numbers_out_of_range() {
        fails("graph g { input x: f32[-1] }", 1, 24, "expected a dimension size, found '-1'");
        fails(
            "graph g { input x: f32[99999999999999999999999] }",
            1,
            24,
            "99999999999999999999999 is too large for a dimension size",
        );
        fails("graph g { h = relu(x) @4294967296 }", 1, 24, "4294967296 is too large for a device index");
        fails(
            "graph g { h = relu(x) {k = 9223372036854775808} }",
            1,
            28,
            "integer 9223372036854775808 does not fit in 64 bits",
        );
        fails("graph g { h = relu(x) @1.0 }", 1, 24, "expected a device index, found '1.0'");
    }

    #[test]
    fn text_error_structure() {
        fails("grph g {}", 1, 1, "expected 'graph', found 'grph'");
        fails("graph g }", 1, 9, "expected '{' after the graph's name, found '}'");
        fails("graph g { input x f32[2] }", 1, 19, "expected ':' after the name of input 'x', found 'f32'");
        fails("graph g { input x: f32 }", 1, 24, "expected the shape of input 'x' ('[]' for a scalar), found '}'");
        fails("graph g { h: = relu(x) }", 1, 14, "expected a dtype or '?' after ':' in node 'h', found '='");
        fails(
            "graph g { h = relu(x) {k = v} }",
            1,
            28,
            "expected a value (null, true, false, a number, a \"string\" or a [list]), found 'v'",
        );
        fails("graph g { h = 3(x) }", 1, 15, "expected an op name in node 'h', found '3'");
    }

    #[test]
    fn text_symbols_and_a_node_named_dim() {
        let g = parse(
            "graph g { dim seq = 1..512 dim b=8..64 : multiple_of = 8 dim n = 3 dim = relu(x) dim: f32 = neg(dim) }",
        )
        .unwrap();
        let bounds: Vec<(&str, i64, i64, i64)> =
            g.symbols.values().map(|s| (s.name.as_str(), s.lo, s.hi, s.multiple_of)).collect();
        assert_eq!(bounds, [("b", 8, 64, 8), ("n", 3, 3, 1), ("seq", 1, 512, 1)]);
        assert_eq!(
            g.nodes.iter().map(|n| (n.name.as_str(), n.op)).collect::<Vec<_>>(),
            [("dim", Op::Relu), ("dim", Op::Neg)]
        );
        let text = print(&g);
        assert!(
            text.starts_with("graph g {\n  dim b = 8..64:multiple_of=8\n  dim n = 3\n  dim seq = 1..512\n"),
            "{text}"
        );
        assert_eq!(parse(&text), Ok(g));
    }

    #[test]
    fn text_error_symbols() {
        fails("graph g {\n  dim seq = 9..2\n}", 2, 7, "dim seq: the range 9..2 is empty");
        fails("graph g { dim seq = 1..8:multiple_of=0 }", 1, 15, "dim seq: multiple_of must be at least 1, not 0");
        fails("graph g { dim seq = 9..15:multiple_of=8 }", 1, 15, "dim seq: no multiple of 8 lies in 9..15");
        fails("graph g { dim s = 1..2 dim s = 3 }", 1, 28, "dim s is declared twice (first at 1:15)");
        fails("graph g { dim \"x y\" = 1..2 }", 1, 15, "dim \"x y\": the name must be letters, digits, '_' or '.'");
        fails(
            "graph g { dim s = 1..99999999999999 }",
            1,
            15,
            "dim s: hi 99999999999999 is above the largest size a symbol may take (1099511627776)",
        );
        fails("graph g { dim s = 1.. }", 1, 23, "expected a size (a non-negative integer), found '}'");
        fails("graph g { dim s = -1..2 }", 1, 19, "expected a size (a non-negative integer), found '-1'");
        fails("graph g { dim s 1..2 }", 1, 17, "expected '=' after 'dim s', found '1'");
        fails("graph g { dim s = 1..2:k=3 }", 1, 24, "expected 'multiple_of' after ':' in 'dim s', found 'k'");
        fails("graph g { dim s = 1...2 }", 1, 22, "unexpected character '.'");
    }

    #[test]
    fn text_error_deep_nesting_is_rejected_not_a_crash() {
        let deep = format!("graph g {{ h = relu(x) {{k = {}{}}} }}", "[".repeat(200), "]".repeat(200));
        fails(&deep, 1, 156, "lists nested more than 128 deep");
    }

    // --- random graphs ------------------------------------------------------------------

    fn any_name() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z_][A-Za-z0-9_.]{0,6}",
            prop::sample::select(vec![
                "input",
                "param",
                "output",
                "dims",
                "_",
                "graph",
                "inf",
                "NaN",
                "null",
                "f32",
                "file",
                "key",
                "",
                "dim",
                "multiple_of"
            ])
            .prop_map(String::from),
            prop::collection::vec(any::<char>(), 0..6).prop_map(|c| c.into_iter().collect()),
        ]
    }

    fn any_float() -> impl Strategy<Value = f64> {
        use prop::num::f64::{NORMAL, SUBNORMAL, ZERO};
        prop_oneof![NORMAL | SUBNORMAL | ZERO, Just(f64::INFINITY), Just(f64::NEG_INFINITY)]
    }

    fn any_attr() -> impl Strategy<Value = Attr> {
        let leaf = prop_oneof![
            Just(Attr::Null),
            any::<bool>().prop_map(Attr::Bool),
            any::<i64>().prop_map(Attr::Int),
            any_float().prop_map(Attr::Float),
            any_name().prop_map(Attr::Str),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| prop::collection::vec(inner, 0..4).prop_map(Attr::List))
    }

    fn any_shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(prop_oneof![0..5usize, any::<usize>()], 0..4)
    }

    fn any_dims() -> impl Strategy<Value = Option<Dims>> {
        prop::option::of(prop::collection::vec(prop::option::of(any_name()), 0..4))
    }

    fn any_type() -> impl Strategy<Value = TensorType> {
        (prop::sample::select(DType::ALL.to_vec()), any_shape()).prop_map(|(d, s)| TensorType::new(d, s))
    }

    fn any_data() -> impl Strategy<Value = ParamData> {
        prop_oneof![
            (any_name(), prop::option::of(any_name())).prop_map(|(path, key)| ParamData::File { path, key }),
            (any::<u64>(), any_float(), any_float()).prop_map(|(seed, mean, std)| ParamData::Init(Init::Normal {
                seed,
                mean,
                std
            })),
            (any::<u64>(), any_float(), any_float()).prop_map(|(seed, low, high)| ParamData::Init(Init::Uniform {
                seed,
                low,
                high
            })),
            Just(ParamData::Init(Init::Zeros)),
            Just(ParamData::Init(Init::Ones)),
            any_attr().prop_map(ParamData::Value),
        ]
    }

    fn any_node() -> impl Strategy<Value = Node> {
        (
            any_name(),
            prop::sample::select(Op::ALL.to_vec()),
            prop::collection::vec(any_name(), 0..3),
            prop::collection::btree_map(any_name(), any_attr(), 0..3),
            prop::option::of(prop::sample::select(DType::ALL.to_vec())),
            prop::option::of(any_shape()),
            any_dims(),
            prop::option::of(any::<u32>()),
        )
            .prop_map(|(name, op, inputs, attrs, dtype, shape, dims, device)| Node {
                name,
                op,
                inputs,
                attrs,
                dtype,
                shape,
                dims,
                device,
                loc: None,
            })
    }

    fn any_graph() -> impl Strategy<Value = Graph> {
        let input =
            (any_name(), any_type(), any_dims()).prop_map(|(name, ty, dims)| Input { name, ty, dims, loc: None });
        let param = (any_name(), any_type(), any_dims(), any_data()).prop_map(|(name, ty, dims, data)| Param {
            name,
            ty,
            dims,
            data,
            loc: None,
        });
        (
            any_name(),
            prop::collection::vec(input, 0..3),
            prop::collection::vec(param, 0..3),
            prop::collection::vec(any_node(), 0..5),
            prop::collection::vec(any_name().prop_map(Output::new), 0..3),
            prop::collection::vec(any_symbol(), 0..3),
        )
            .prop_map(|(name, inputs, params, nodes, outputs, symbols)| Graph {
                name,
                inputs,
                params,
                nodes,
                outputs,
                symbols: symbols.into_iter().map(|s| (s.name.clone(), s)).collect(),
            })
    }

    /// A symbol with any bounds the format accepts, under a name `--dim` can spell or a
    /// word of the syntax.
    fn any_symbol() -> impl Strategy<Value = Symbol> {
        let name = prop_oneof![
            "[A-Za-z0-9_.]{1,6}",
            prop::sample::select(vec!["dim", "input", "dims", "_", "multiple_of", "graph"]).prop_map(String::from),
        ];
        let size = prop_oneof![0..100i64, 0..=crate::sym::MAX_BOUND];
        (name, size.clone(), size, prop_oneof![Just(1i64), 1..10i64, 1..=crate::sym::MAX_BOUND])
            .prop_filter_map("bounds that allow a value", |(name, a, b, k)| {
                Symbol::new(&name, a.min(b), a.max(b), k).ok()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn text_random_graphs_round_trip(g in any_graph()) {
            let text = print(&g);
            prop_assert_eq!(parse(&text), Ok(g), "{}", text);
        }

        /// Truncated or arbitrary input gives an error with a location, never a panic.
        #[test]
        fn text_garbage_is_an_error_not_a_panic(g in any_graph(), cut in any::<prop::sample::Index>(), junk in "\\PC{0,40}") {
            let text = print(&g);
            let cut = text.char_indices().map(|(i, _)| i).nth(cut.index(text.chars().count())).unwrap_or(0);
            for src in [&text[..cut], junk.as_str()] {
                if let Err(e) = parse(src) {
                    prop_assert!(e.loc.is_some());
                }
            }
        }
    }
}
