//! The one error type of the IR crate: a message plus where it points (file, line:col).
//! Every user-facing failure becomes one line: `FILE:LINE:COL: MESSAGE`.

use std::fmt;

/// A position in a text-format source, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    pub line: u32,
    pub col: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub file: Option<String>,
    pub loc: Option<Loc>,
    pub msg: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(msg: impl Into<String>) -> Self {
        Error { file: None, loc: None, msg: msg.into() }
    }

    pub fn at(loc: Option<Loc>, msg: impl Into<String>) -> Self {
        Error { file: None, loc, msg: msg.into() }
    }

    /// Sets the file unless an inner layer already named a more precise one
    /// (e.g. the weight file that failed to load).
    pub fn in_file(mut self, file: impl Into<String>) -> Self {
        if self.file.is_none() {
            self.file = Some(file.into());
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{file}:")?;
            if let Some(l) = self.loc {
                write!(f, "{}:{}:", l.line, l.col)?;
            }
            f.write_str(" ")?;
        } else if let Some(l) = self.loc {
            write!(f, "{}:{}: ", l.line, l.col)?;
        }
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

/// `bail!`-style shorthand used throughout the crate.
#[macro_export]
macro_rules! err {
    ($loc:expr, $($arg:tt)*) => { $crate::error::Error::at($loc, format!($($arg)*)) };
}

/// The longest name or value a message quotes whole: a 1 MB operand name must not become a
/// 1 MB error line.
pub const QUOTE_MAX: usize = 80;

/// The longest message printed whole: longer than any meshc writes, so reached only when
/// a name holding quotes of its own escaped `shorten_quoted`'s pairing.
pub const MESSAGE_MAX: usize = 900;

/// `msg` with every single-quoted part longer than `QUOTE_MAX` shortened, and the whole cut
/// at `MESSAGE_MAX` characters: how messages leave the process, whatever layer quoted a
/// user's name in them.
pub fn shorten_quoted(msg: &str) -> String {
    let parts: Vec<&str> = msg.split('\'').collect();
    // Odd parts sit between quotes (an unmatched last quote leaves its tail alone).
    let last = if parts.len().is_multiple_of(2) { parts.len() - 1 } else { parts.len() };
    let short = parts
        .iter()
        .enumerate()
        .map(|(i, p)| if i % 2 == 1 && i < last { shorten(p) } else { (*p).into() })
        .collect::<Vec<_>>()
        .join("'");
    match short.char_indices().nth(MESSAGE_MAX) {
        None => short,
        Some((at, _)) => format!("{}... ({} characters)", &short[..at], short.chars().count()),
    }
}

/// `s` as a message quotes it: whole when short, else its first characters and its length.
pub fn shorten(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(QUOTE_MAX) {
        None => s.into(),
        Some(_) => {
            let head: String = s.chars().take(QUOTE_MAX - 20).collect();
            format!("{head}... ({} characters)", s.chars().count()).into()
        }
    }
}

/// `s` with every control character escaped as Rust writes it (`\u{1b}`), line breaks too
/// unless `keep_newlines`: how text that quotes names from a file reaches a terminal, where
/// an ESC or a C1 control would start a sequence the terminal obeys.
pub fn escape_controls(s: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() && !(keep_newlines && c == '\n');
    if !s.chars().any(escaped) {
        return s.into();
    }
    s.chars().flat_map(|c| if escaped(c) { c.escape_default().collect() } else { vec![c] }).collect::<String>().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_quoted_names_are_shortened() {
        let name = "n".repeat(1 << 20);
        let msg = shorten_quoted(&format!("node 'y': operand '{name}' is not defined; 'x' is"));
        assert_eq!(
            msg,
            format!("node 'y': operand '{}... (1048576 characters)' is not defined; 'x' is", "n".repeat(60))
        );
        assert_eq!(shorten_quoted("it's fine"), "it's fine");
        // A name holding a quote pairs the wrong quotes: the whole line is still bounded.
        let odd = shorten_quoted(&format!("node 'a'{name}' is bad"));
        assert!(odd.ends_with("nnn... (1048592 characters)") && odd.len() < MESSAGE_MAX + 30, "{}", odd.len());
    }

    #[test]
    fn controls_are_escaped_newlines_only_when_asked() {
        let s = "a\u{1b}]0;x\u{7}\tb\u{9b}c\n";
        assert_eq!(escape_controls(s, false), "a\\u{1b}]0;x\\u{7}\\tb\\u{9b}c\\n");
        assert_eq!(escape_controls(s, true), "a\\u{1b}]0;x\\u{7}\\tb\\u{9b}c\n");
        assert!(matches!(escape_controls("plain\n", true), std::borrow::Cow::Borrowed(_)));
    }
}
