//! The checkpoint codec kernel: the format of `docs/codec.md`, byte for byte the same as the
//! pure-Python reference (`python/durable_agent/_codec_pure.py`).
//!
//! No Python types here. Encoding is driven by a caller that walks its own data and calls
//! the [`Encoder`] (the PyO3 glue walks Python objects; [`encode`] walks a [`Value`]).
//! Decoding is a parser generic over a [`Builder`] that makes the caller's values.

use crate::b64::{self, B64Error};
use std::borrow::Cow;

pub const BYTES_TAG: &str = "$bytes";
pub const ESCAPE_TAG: &str = "$esc";
/// Containers (JSON objects and arrays, as written in the text) nest at most this deep.
pub const MAX_DEPTH: usize = 256;
/// Integers have at most this many decimal digits (CPython's default `int` string limit).
pub const MAX_INT_DIGITS: usize = 4300;

/// True for the keys that make a single-key object a tag (`$bytes`, `$esc`).
pub fn is_reserved(key: &str) -> bool {
    key == BYTES_TAG || key == ESCAPE_TAG
}

/// A value that cannot be encoded or a text that cannot be decoded.
///
/// `path` holds the rendered steps (e.g. `'messages'`, `3`) from the innermost outwards;
/// `located` says whether the message ends with ` at $[...]` (encoding faults do, decoding
/// faults and the lone-surrogate check do not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub message: String,
    pub path: Vec<String>,
    pub located: bool,
}

impl Fault {
    /// An encoding fault at the value being visited (the caller adds path steps on the way out).
    pub fn at(message: impl Into<String>) -> Self {
        Fault { message: message.into(), path: Vec::new(), located: true }
    }

    /// A fault without a location.
    pub fn plain(message: impl Into<String>) -> Self {
        Fault { message: message.into(), path: Vec::new(), located: false }
    }

    /// Record that the fault happened inside the container step `step` (rendered by the caller).
    pub fn inside(mut self, step: String) -> Self {
        self.path.push(step);
        self
    }

    /// The message as the reference writes it: `... at $['a'][0]` (the last 8 steps).
    pub fn render(&self) -> String {
        if !self.located {
            return self.message.clone();
        }
        let mut text = format!("{} at $", self.message);
        if self.path.len() > 8 {
            text.push_str("[...]");
        }
        for step in self.path.iter().take(8).rev() {
            text.push('[');
            text.push_str(step);
            text.push(']');
        }
        text
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of every byte of `w` that is a control character, '"' or '\\' (and possibly of
/// bytes above such a byte: only the lowest marked byte is exact, as the scan needs).
#[inline(always)]
fn special_bytes(w: u64) -> u64 {
    let quote = w ^ (ONES * u64::from(b'"'));
    let backslash = w ^ (ONES * u64::from(b'\\'));
    ((quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash)
        | (w.wrapping_sub(ONES * 0x20) & !w))
        & HIGHS
}

#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk = bytes.get(at..at + 8)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(chunk);
    Some(u64::from_le_bytes(word))
}

/// The index of the first byte of `bytes[from..]` that is a control character, '"' or '\\'.
#[inline]
fn plain_run_end(bytes: &[u8], from: usize) -> usize {
    // Most runs (keys, short values, lines between escapes) are short: eight bytes at a time
    // in a register, up to 128 bytes; a longer run goes on with SIMD below.
    let mut i = from;
    while i < from + 128 {
        let Some(w) = word_at(bytes, i) else {
            let rest = bytes.get(i..).unwrap_or_default();
            return i + rest.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\').unwrap_or(rest.len());
        };
        let special = special_bytes(w);
        if special != 0 {
            return i + (special.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let rest = bytes.get(i..).unwrap_or_default();
    // SIMD search for the two ASCII stoppers, then a branch-free (vectorizable) sweep of the
    // run for control characters, 64 bytes at a time.
    let stop = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
    let run = &rest[..stop];
    for (k, chunk) in run.chunks(64).enumerate() {
        if chunk.iter().copied().min().unwrap_or(0xFF) < 0x20 {
            let at = chunk.iter().position(|&b| b < 0x20).unwrap_or(0);
            return i + k * 64 + at;
        }
    }
    i + stop
}

/// The message for an integer of more than `limit` digits (encoding and decoding).
pub fn too_many_digits(limit: usize) -> String {
    format!("integer with more than {limit} digits")
}

/// The fault for a container (or bytes) nested deeper than [`MAX_DEPTH`].
pub fn too_deep() -> Fault {
    Fault::at(format!("nesting deeper than {MAX_DEPTH}"))
}

/// The fault for a released `memoryview` (Python hosts).
pub const RELEASED_MEMORYVIEW: &str = "a released memoryview holds no data";

pub const LONE_SURROGATE_MESSAGE: &str = "a string contains a lone surrogate, which is not valid Unicode";

// ---------------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------------

/// What a dict becomes, decided by [`Encoder::begin_dict`].
#[derive(Debug, Clone, Copy)]
pub struct DictFrame {
    escaped: bool,
    first: bool,
    /// The depth of the dict's values.
    pub child_depth: usize,
}

/// The output writer. Depths count containers as written in the text, the outermost at 1.
#[derive(Debug, Default)]
pub struct Encoder {
    out: Vec<u8>,
    lone_surrogate: bool,
}

// Bytes that a JSON string cannot hold raw: control characters, '"' and '\\'.
const fn escape_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0A] = b'n';
    t[0x0C] = b'f';
    t[0x0D] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
}
static ESCAPE: [u8; 256] = escape_table();
const HEX: &[u8; 16] = b"0123456789abcdef";

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        Encoder { out: Vec::with_capacity(capacity), lone_surrogate: false }
    }

    /// Write into `buffer` (cleared first), to reuse its allocation.
    pub fn with_buffer(mut buffer: Vec<u8>) -> Self {
        buffer.clear();
        Encoder { out: buffer, lone_surrogate: false }
    }

    /// The buffer (for reuse), abandoning the text.
    pub fn into_buffer(self) -> Vec<u8> {
        self.out
    }

    /// The text as a `&str` plus the buffer back (for reuse), or the lone-surrogate fault.
    pub fn finish_with<R>(self, then: impl FnOnce(&str) -> R) -> (Result<R, Fault>, Vec<u8>) {
        let result = if self.lone_surrogate {
            Err(Fault::plain(LONE_SURROGATE_MESSAGE))
        } else {
            std::str::from_utf8(&self.out).map(then).map_err(|_| Fault::plain(LONE_SURROGATE_MESSAGE))
        };
        (result, self.out)
    }

    /// The text, or the lone-surrogate fault if a string could not be written.
    pub fn finish(self) -> Result<String, Fault> {
        if self.lone_surrogate {
            return Err(Fault::plain(LONE_SURROGATE_MESSAGE));
        }
        // Every write below appends valid UTF-8 (ASCII, or whole `&str`s).
        String::from_utf8(self.out).map_err(|_| Fault::plain(LONE_SURROGATE_MESSAGE))
    }

    pub fn null(&mut self) {
        self.out.extend_from_slice(b"null");
    }

    pub fn bool(&mut self, value: bool) {
        self.out.extend_from_slice(if value { b"true" } else { b"false" });
    }

    pub fn int(&mut self, value: i64) {
        self.out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
    }

    /// An integer given as its decimal text (`-?[0-9]+`, as Python's `int.__repr__` writes it).
    pub fn big_int(&mut self, text: &str) -> Result<(), Fault> {
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Fault::at(format!("{text:?} is not an integer")));
        }
        if digits.len() > MAX_INT_DIGITS {
            return Err(Fault::at(too_many_digits(MAX_INT_DIGITS)));
        }
        self.out.extend_from_slice(text.as_bytes());
        Ok(())
    }

    /// A float as Python's `repr` writes it; NaN and infinities are refused.
    pub fn float(&mut self, value: f64) -> Result<(), Fault> {
        if !value.is_finite() {
            let shown = if value.is_nan() {
                "nan"
            } else if value > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            return Err(Fault::at(format!("{shown} is not valid JSON (NaN and infinities are refused)")));
        }
        write_float_repr(&mut self.out, value);
        Ok(())
    }

    /// A string (a value or a key), quoted and escaped; non-ASCII is written raw.
    pub fn str(&mut self, text: &str) {
        let bytes = text.as_bytes();
        self.out.reserve(bytes.len() + 2);
        self.out.push(b'"');
        let mut start = 0;
        loop {
            let i = plain_run_end(bytes, start);
            self.out.extend_from_slice(&bytes[start..i]);
            let Some(&b) = bytes.get(i) else { break };
            let esc = ESCAPE[b as usize];
            if esc == b'u' {
                self.out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
            } else {
                self.out.extend_from_slice(&[b'\\', esc]);
            }
            start = i + 1;
        }
        self.out.push(b'"');
    }

    /// A string the caller could not hand over as Unicode scalar values (a lone surrogate).
    /// Encoding goes on (so that an earlier-reported fault elsewhere wins, as in the
    /// reference) and [`Encoder::finish`] fails.
    pub fn lone_surrogate(&mut self) {
        self.lone_surrogate = true;
        self.out.extend_from_slice(b"\"\"");
    }

    /// Binary data at `depth`: `{"$bytes":"<standard padded base64>"}`.
    pub fn bytes(&mut self, depth: usize, data: &[u8]) -> Result<(), Fault> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        self.out.extend_from_slice(b"{\"$bytes\":\"");
        b64::std_encode_into(&mut self.out, data);
        self.out.extend_from_slice(b"\"}");
        Ok(())
    }

    /// Open a list at `depth`; its items are at `depth + 1`.
    pub fn begin_list(&mut self, depth: usize) -> Result<(), Fault> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        self.out.push(b'[');
        Ok(())
    }

    /// Call before every item but the first.
    pub fn comma(&mut self) {
        self.out.push(b',');
    }

    pub fn end_list(&mut self) {
        self.out.push(b']');
    }

    /// Open a dict at `depth`. `sole_key` is its key when it has exactly one key and that
    /// key is a str: a dict whose only key is reserved is written `{"$esc":{...}}`, which
    /// puts the dict itself at `depth + 1` and its values at `depth + 2`.
    pub fn begin_dict(&mut self, depth: usize, sole_key: Option<&str>) -> Result<DictFrame, Fault> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        let escaped = sole_key.is_some_and(is_reserved);
        if escaped {
            if depth + 1 > MAX_DEPTH {
                return Err(too_deep());
            }
            self.out.extend_from_slice(b"{\"$esc\":{");
        } else {
            self.out.push(b'{');
        }
        Ok(DictFrame { escaped, first: true, child_depth: depth + if escaped { 2 } else { 1 } })
    }

    /// Write a key (and its separator); the value follows.
    pub fn key(&mut self, frame: &mut DictFrame, key: &str) {
        if !frame.first {
            self.out.push(b',');
        }
        frame.first = false;
        self.str(key);
        self.out.push(b':');
    }

    /// A key that could not be handed over as Unicode (a lone surrogate); see [`Encoder::lone_surrogate`].
    pub fn lone_surrogate_key(&mut self, frame: &mut DictFrame) {
        if !frame.first {
            self.out.push(b',');
        }
        frame.first = false;
        self.lone_surrogate();
        self.out.push(b':');
    }

    pub fn end_dict(&mut self, frame: DictFrame) {
        self.out.extend_from_slice(if frame.escaped { b"}}" } else { b"}" });
    }
}

/// Append `value` (finite) as Python's `float.__repr__` writes it: the shortest digits that
/// round-trip, positional when the decimal exponent is in [-4, 16), else `d.ddde+XX`.
pub fn write_float_repr(out: &mut Vec<u8>, value: f64) {
    if value == 0.0 {
        out.extend_from_slice(if value.is_sign_negative() { b"-0.0" } else { b"0.0" });
        return;
    }
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(value).as_bytes();
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.iter().position(|&c| c == b'e' || c == b'E') {
        Some(at) => {
            let exp_text = &text[at + 1..];
            let (sign, digits) = match exp_text.split_first() {
                Some((b'-', rest)) => (-1i32, rest),
                Some((b'+', rest)) => (1, rest),
                _ => (1, exp_text),
            };
            let magnitude = digits.iter().fold(0i32, |acc, &d| acc * 10 + i32::from(d - b'0'));
            (&text[..at], sign * magnitude)
        }
        None => (text, 0),
    };
    // The significant digits and the position of the decimal point (value = 0.DIGITS * 10^point).
    let mut digits = [0u8; 40];
    let mut count = 0usize;
    let mut integer_len = 0i32;
    let mut seen_point = false;
    for &c in mantissa {
        if c == b'.' {
            seen_point = true;
        } else if count == 0 && c == b'0' {
            if seen_point {
                integer_len -= 1;
            }
        } else {
            digits[count] = c;
            count += 1;
            if !seen_point {
                integer_len += 1;
            }
        }
    }
    while count > 1 && digits[count - 1] == b'0' {
        count -= 1;
    }
    let digits = &digits[..count];
    let point = integer_len + exponent;
    if negative {
        out.push(b'-');
    }
    if point <= -4 || point > 16 {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        let exp = point - 1;
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let magnitude = exp.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0');
        }
        out.extend_from_slice(itoa::Buffer::new().format(magnitude).as_bytes());
    } else if point <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', point.unsigned_abs() as usize));
        out.extend_from_slice(digits);
    } else {
        let point = point as usize;
        if point < digits.len() {
            out.extend_from_slice(&digits[..point]);
            out.push(b'.');
            out.extend_from_slice(&digits[point..]);
        } else {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', point - digits.len()));
            out.extend_from_slice(b".0");
        }
    }
}

/// A plain Rust value the kernel can encode and decode, for tests and for Rust callers.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    /// An integer beyond 64 bits, as decimal text.
    BigInt(String),
    Float(f64),
    Str(String),
    /// A string holding a lone surrogate (which a host language may have, and Rust cannot).
    LoneSurrogate,
    Bytes(Vec<u8>),
    List(Vec<Value>),
    /// Pairs in insertion order; keys that are not `Str` are refused when encoding.
    Dict(Vec<(Value, Value)>),
    /// Anything else the host has (a set, an object): refused, naming the type.
    Unsupported(String),
}

impl Value {
    fn type_name(&self) -> &str {
        match self {
            Value::Null => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) | Value::LoneSurrogate => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Unsupported(name) => name,
        }
    }
}

/// A rough rendering of a key for fault paths (the Python glue uses Python's `repr`).
fn render_key(key: &Value) -> String {
    match key {
        Value::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Int(i) => i.to_string(),
        Value::BigInt(text) => text.clone(),
        Value::Null => "None".to_owned(),
        Value::Bool(b) => (if *b { "True" } else { "False" }).to_owned(),
        Value::Float(f) if f.is_finite() => {
            let mut out = Vec::new();
            write_float_repr(&mut out, *f);
            String::from_utf8(out).unwrap_or_default()
        }
        other => format!("<{}>", other.type_name()),
    }
}

fn encode_value(enc: &mut Encoder, value: &Value, depth: usize) -> Result<(), Fault> {
    match value {
        Value::Null => enc.null(),
        Value::Bool(b) => enc.bool(*b),
        Value::Int(i) => enc.int(*i),
        Value::BigInt(text) => enc.big_int(text)?,
        Value::Float(f) => enc.float(*f)?,
        Value::Str(s) => enc.str(s),
        Value::LoneSurrogate => enc.lone_surrogate(),
        Value::Bytes(data) => enc.bytes(depth, data)?,
        Value::List(items) => {
            enc.begin_list(depth)?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    enc.comma();
                }
                encode_value(enc, item, depth + 1).map_err(|f| f.inside(i.to_string()))?;
            }
            enc.end_list();
        }
        Value::Dict(pairs) => {
            let sole_key = match pairs.as_slice() {
                [(Value::Str(key), _)] => Some(key.as_str()),
                _ => None,
            };
            let mut frame = enc.begin_dict(depth, sole_key)?;
            for (key, item) in pairs {
                match key {
                    Value::Str(k) => enc.key(&mut frame, k),
                    Value::LoneSurrogate => enc.lone_surrogate_key(&mut frame),
                    other => return Err(Fault::at(format!("dict key {} is not a str", render_key(other)))),
                }
                encode_value(enc, item, frame.child_depth).map_err(|f| f.inside(render_key(key)))?;
            }
            enc.end_dict(frame);
        }
        Value::Unsupported(name) => {
            if depth > MAX_DEPTH {
                return Err(too_deep());
            }
            return Err(Fault::at(format!("{name} is not JSON-compatible data")));
        }
    }
    Ok(())
}

/// Encode a [`Value`] to the codec's text.
pub fn encode(value: &Value) -> Result<String, Fault> {
    let mut enc = Encoder::new();
    encode_value(&mut enc, value, 1)?;
    enc.finish()
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

/// Makes the caller's values while [`decode_with`] parses. Object keys are made with
/// [`Builder::key`]; lists and dicts are handed their items in order (a dict's as key, value,
/// key, value, ...), and the builder refuses duplicate keys.
pub trait Builder {
    type Out;
    fn null(&mut self) -> Result<Self::Out, Fault>;
    fn bool(&mut self, value: bool) -> Result<Self::Out, Fault>;
    fn int(&mut self, value: i64) -> Result<Self::Out, Fault>;
    /// An integer beyond 64 bits, as decimal text (at most [`MAX_INT_DIGITS`] digits).
    fn big_int(&mut self, text: &str) -> Result<Self::Out, Fault>;
    fn float(&mut self, value: f64) -> Result<Self::Out, Fault>;
    fn str(&mut self, value: &str) -> Result<Self::Out, Fault>;
    fn key(&mut self, value: &str) -> Result<Self::Out, Fault>;
    /// Binary data from `encoded`, which has the shape of padded base64: decode it with
    /// [`b64::std_decode_into`] (a `B64Error` becomes [`bytes_fault`]).
    fn bytes(&mut self, encoded: &str) -> Result<Self::Out, Fault>;
    fn list(&mut self, items: std::vec::Drain<'_, Self::Out>) -> Result<Self::Out, Fault>;
    /// `items` alternates key, value; refuse a repeated key with [`duplicate_key_fault`].
    fn dict(&mut self, items: std::vec::Drain<'_, Self::Out>) -> Result<Self::Out, Fault>;
}

/// The fault for a `$bytes` tag that does not hold canonical base64.
pub fn bytes_fault(error: B64Error) -> Fault {
    Fault::plain(match error {
        B64Error::Invalid => format!("{BYTES_TAG} holds invalid base64"),
        B64Error::NonCanonical => format!("{BYTES_TAG} holds non-canonical base64"),
    })
}

/// The fault for an object with a repeated key (`shown` is the key as the host renders it).
pub fn duplicate_key_fault(shown: &str) -> Fault {
    Fault::plain(format!("duplicate key {shown}"))
}

fn invalid(message: &str, at: usize) -> Fault {
    Fault::plain(format!("invalid JSON: {message} at offset {at}"))
}

fn hex4(bytes: &[u8], at: usize) -> Result<u32, Fault> {
    let quad = bytes.get(at..at + 4).ok_or_else(|| invalid("invalid \\uXXXX escape", at))?;
    let mut v = 0u32;
    for &c in quad {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return Err(invalid("invalid \\uXXXX escape", at)),
        };
        v = (v << 4) | u32::from(d);
    }
    Ok(v)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    Bytes,
    Escape,
}

/// A parsed value whose meaning may depend on its context (the reference's "exact path").
enum Item<'t, O> {
    Done(O, &'static str),
    Str(Cow<'t, str>),
    Tag(Tag, Box<Item<'t, O>>),
}

struct Parser<'t, 'b, B: Builder> {
    text: &'t str,
    bytes: &'t [u8],
    pos: usize,
    builder: &'b mut B,
    stack: Vec<B::Out>,
    /// The text of the last string that had escapes.
    scratch: String,
}

impl<'t, B: Builder> Parser<'t, '_, B> {
    #[inline]
    fn skip_ws(&mut self) {
        while let Some(&c) = self.bytes.get(self.pos) {
            if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn expect(&mut self, c: u8, what: &str) -> Result<(), Fault> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(invalid(what, self.pos))
        }
    }

    /// Parse a JSON string starting at the opening quote. Returns the text borrowed from the
    /// input when it has no escapes, else None: the text is then in `self.scratch`.
    #[inline]
    fn scan(&mut self) -> Result<Option<&'t str>, Fault> {
        let start = self.pos + 1;
        let i = plain_run_end(self.bytes, start);
        match self.bytes.get(i) {
            Some(b'"') => {
                self.pos = i + 1;
                Ok(Some(&self.text[start..i]))
            }
            Some(b'\\') => {
                self.unescape(start, i)?;
                Ok(None)
            }
            Some(_) => Err(invalid("control character in string", i)),
            None => Err(invalid("unterminated string", self.pos)),
        }
    }

    /// Parse a JSON string starting at the opening quote, as an owned text when it has escapes.
    fn string(&mut self) -> Result<Cow<'t, str>, Fault> {
        Ok(match self.scan()? {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(std::mem::take(&mut self.scratch)),
        })
    }

    /// The rest of a string (opened at `start - 1`) whose first escape is at `i`, unescaped into
    /// `self.scratch`.
    fn unescape(&mut self, start: usize, mut i: usize) -> Result<(), Fault> {
        let out = &mut self.scratch;
        out.clear();
        out.push_str(&self.text[start..i]);
        let mut run = i;
        loop {
            i = plain_run_end(self.bytes, i);
            match self.bytes.get(i) {
                None => return Err(invalid("unterminated string", start - 1)),
                Some(b'"') => {
                    out.push_str(&self.text[run..i]);
                    self.pos = i + 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    out.push_str(&self.text[run..i]);
                    let esc = self.bytes.get(i + 1).copied();
                    i += 2;
                    match esc {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let unit = hex4(self.bytes, i)?;
                            i += 4;
                            let ch = if (0xD800..0xDC00).contains(&unit) {
                                let low = if self.bytes.get(i) == Some(&b'\\') && self.bytes.get(i + 1) == Some(&b'u') {
                                    hex4(self.bytes, i + 2)?
                                } else {
                                    0
                                };
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(Fault::plain(
                                        "a string escape decodes to a lone surrogate, which is not valid Unicode",
                                    ));
                                }
                                i += 6;
                                0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                            } else {
                                unit
                            };
                            match char::from_u32(ch) {
                                Some(c) => out.push(c),
                                None => {
                                    return Err(Fault::plain(
                                        "a string escape decodes to a lone surrogate, which is not valid Unicode",
                                    ))
                                }
                            }
                        }
                        _ => return Err(invalid("invalid escape", i - 2)),
                    }
                    run = i;
                }
                Some(_) => return Err(invalid("control character in string", i)),
            }
        }
    }

    fn number(&mut self) -> Result<B::Out, Fault> {
        let start = self.pos;
        let b = self.bytes;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => return Err(invalid("expecting value", start)),
        }
        let int_end = i;
        let mut is_float = false;
        if b.get(i) == Some(&b'.') && matches!(b.get(i + 1), Some(b'0'..=b'9')) {
            i += 2;
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
            is_float = true;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let mut j = i + 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if matches!(b.get(j), Some(b'0'..=b'9')) {
                while matches!(b.get(j), Some(b'0'..=b'9')) {
                    j += 1;
                }
                i = j;
                is_float = true;
            }
        }
        self.pos = i;
        let literal = &self.text[start..i];
        if is_float {
            let value: f64 = literal.parse().map_err(|_| invalid("bad number", start))?;
            if !value.is_finite() {
                let shown: String = literal.chars().take(40).collect();
                return Err(Fault::plain(format!("number {shown} overflows to infinity")));
            }
            return self.builder.float(value);
        }
        let digits = int_end - start - usize::from(b[start] == b'-');
        if digits > MAX_INT_DIGITS {
            return Err(Fault::plain(too_many_digits(MAX_INT_DIGITS)));
        }
        if digits <= 18 {
            let mut v: i64 = 0;
            for &d in &b[start + usize::from(b[start] == b'-')..int_end] {
                v = v * 10 + i64::from(d - b'0');
            }
            return self.builder.int(if b[start] == b'-' { -v } else { v });
        }
        match literal.parse::<i64>() {
            Ok(v) => self.builder.int(v),
            Err(_) => self.builder.big_int(literal),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Fault> {
        if self.bytes.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(invalid("expecting value", self.pos))
        }
    }

    /// Parse a value at `depth` whose meaning does not depend on its context.
    fn value(&mut self, depth: usize) -> Result<B::Out, Fault> {
        match self.peek() {
            Some(b'"') => match self.scan()? {
                Some(text) => self.builder.str(text),
                None => self.builder.str(&self.scratch),
            },
            Some(b'{') => {
                let item = self.object(depth, true)?;
                self.resolve(item)
            }
            Some(b'[') => self.array(depth),
            _ => self.scalar(),
        }
    }

    /// Parse a value at `depth` keeping strings and tags unresolved.
    fn item(&mut self, depth: usize) -> Result<Item<'t, B::Out>, Fault> {
        Ok(match self.peek() {
            Some(b'"') => Item::Str(self.string()?),
            Some(b'{') => return self.object(depth, false),
            Some(b'[') => Item::Done(self.array(depth)?, "list"),
            Some(b't' | b'f') => Item::Done(self.scalar()?, "bool"),
            Some(b'n') => Item::Done(self.scalar()?, "NoneType"),
            _ => {
                let start = self.pos;
                let out = self.scalar()?;
                let is_float = self.bytes[start..self.pos].iter().any(|c| matches!(c, b'.' | b'e' | b'E'));
                Item::Done(out, if is_float { "float" } else { "int" })
            }
        })
    }

    fn scalar(&mut self) -> Result<B::Out, Fault> {
        match self.peek() {
            Some(b't') => {
                self.literal(b"true")?;
                self.builder.bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                self.builder.bool(false)
            }
            Some(b'n') => {
                self.literal(b"null")?;
                self.builder.null()
            }
            Some(b'N') | Some(b'I') => Err(Fault::plain("NaN and Infinity are not valid JSON")),
            Some(b'-') if self.bytes.get(self.pos + 1) == Some(&b'I') => {
                Err(Fault::plain("-Infinity is not valid JSON"))
            }
            _ => self.number(),
        }
    }

    fn resolve(&mut self, item: Item<'t, B::Out>) -> Result<B::Out, Fault> {
        match item {
            Item::Done(out, _) => Ok(out),
            Item::Str(s) => self.builder.str(&s),
            Item::Tag(Tag::Bytes, inner) => match *inner {
                Item::Str(s) => {
                    b64::std_decoded_len(s.as_bytes()).map_err(bytes_fault)?;
                    self.builder.bytes(&s)
                }
                Item::Done(_, name) => Err(Fault::plain(format!("{BYTES_TAG} must hold a base64 string, not {name}"))),
                Item::Tag(..) => Err(Fault::plain(format!("{BYTES_TAG} must hold a base64 string, not dict"))),
            },
            Item::Tag(Tag::Escape, inner) => match *inner {
                Item::Tag(tag, value) => {
                    let key = self.builder.key(if tag == Tag::Bytes { BYTES_TAG } else { ESCAPE_TAG })?;
                    let value = self.resolve(*value)?;
                    let base = self.stack.len();
                    self.stack.push(key);
                    self.stack.push(value);
                    let items = self.stack.drain(base..);
                    self.builder.dict(items)
                }
                _ => Err(Fault::plain(format!("{ESCAPE_TAG} must hold an object whose only key is a reserved tag"))),
            },
        }
    }

    fn array(&mut self, depth: usize) -> Result<B::Out, Fault> {
        if depth > MAX_DEPTH {
            return Err(Fault::plain(format!("nesting deeper than {MAX_DEPTH}")));
        }
        self.pos += 1;
        let base = self.stack.len();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                self.skip_ws();
                let v = self.value(depth + 1)?;
                self.stack.push(v);
                self.skip_ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(invalid("expecting ',' delimiter", self.pos)),
                }
            }
        }
        let items = self.stack.drain(base..);
        self.builder.list(items)
    }

    /// Parse an object key (the builder's key object) and tell whether it is a reserved tag.
    #[inline]
    fn key(&mut self) -> Result<(B::Out, Option<Tag>), Fault> {
        if self.peek() != Some(b'"') {
            return Err(invalid("expecting property name enclosed in double quotes", self.pos));
        }
        let text = match self.scan()? {
            Some(text) => text,
            None => self.scratch.as_str(),
        };
        let tag = match text {
            BYTES_TAG => Some(Tag::Bytes),
            ESCAPE_TAG => Some(Tag::Escape),
            _ => None,
        };
        Ok((self.builder.key(text)?, tag))
    }

    /// At the string value of an object's first key `$bytes`: if the object is exactly
    /// `{"$bytes":"<canonical base64>"}`, make the bytes and step past the object. Otherwise
    /// (escapes, more keys, anything invalid) None, having moved nothing: the general path
    /// then parses the object and reports what is wrong with it.
    fn eager_bytes(&mut self) -> Option<B::Out> {
        let start = self.pos + 1;
        let end = start + memchr::memchr(b'"', self.bytes.get(start..)?)?;
        let mut after = end + 1;
        while matches!(self.bytes.get(after), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            after += 1;
        }
        if self.bytes.get(after) != Some(&b'}') {
            return None;
        }
        let encoded = self.text.get(start..end)?;
        b64::std_decoded_len(encoded.as_bytes()).ok()?;
        let out = self.builder.bytes(encoded).ok()?;
        self.pos = after + 1;
        Some(out)
    }

    /// Parse an object at `depth`: a tag when its only key is reserved, else a dict. `eager`:
    /// the caller resolves the result at once, so bytes may be made straight away.
    fn object(&mut self, depth: usize, eager: bool) -> Result<Item<'t, B::Out>, Fault> {
        if depth > MAX_DEPTH {
            return Err(Fault::plain(format!("nesting deeper than {MAX_DEPTH}")));
        }
        self.pos += 1;
        let base = self.stack.len();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            let items = self.stack.drain(base..);
            return Ok(Item::Done(self.builder.dict(items)?, "dict"));
        }
        let (key, tag) = self.key()?;
        self.skip_ws();
        self.expect(b':', "expecting ':' delimiter")?;
        self.skip_ws();
        if let Some(tag) = tag {
            if eager && tag == Tag::Bytes && self.peek() == Some(b'"') {
                if let Some(out) = self.eager_bytes() {
                    return Ok(Item::Done(out, "dict"));
                }
            }
            let item = self.item(depth + 1)?;
            self.skip_ws();
            if self.peek() == Some(b'}') {
                self.pos += 1;
                drop(key);
                return Ok(Item::Tag(tag, Box::new(item)));
            }
            let v = self.resolve(item)?;
            self.stack.push(key);
            self.stack.push(v);
        } else {
            let v = self.value(depth + 1)?;
            self.stack.push(key);
            self.stack.push(v);
        }
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => return Err(invalid("expecting ',' delimiter", self.pos)),
            }
            self.skip_ws();
            let (key, _) = self.key()?;
            self.skip_ws();
            self.expect(b':', "expecting ':' delimiter")?;
            self.skip_ws();
            let v = self.value(depth + 1)?;
            self.stack.push(key);
            self.stack.push(v);
        }
        let items = self.stack.drain(base..);
        Ok(Item::Done(self.builder.dict(items)?, "dict"))
    }
}

/// Decode `text` with `builder`.
pub fn decode_with<B: Builder>(text: &str, builder: &mut B) -> Result<B::Out, Fault> {
    let mut parser =
        Parser { text, bytes: text.as_bytes(), pos: 0, builder, stack: Vec::new(), scratch: String::new() };
    parser.skip_ws();
    let item = parser.item(1)?;
    let value = parser.resolve(item)?;
    parser.skip_ws();
    if parser.pos != parser.bytes.len() {
        return Err(invalid("extra data", parser.pos));
    }
    Ok(value)
}

/// Builds [`Value`]s.
#[derive(Debug, Default)]
pub struct ValueBuilder;

impl Builder for ValueBuilder {
    type Out = Value;
    fn null(&mut self) -> Result<Value, Fault> {
        Ok(Value::Null)
    }
    fn bool(&mut self, value: bool) -> Result<Value, Fault> {
        Ok(Value::Bool(value))
    }
    fn int(&mut self, value: i64) -> Result<Value, Fault> {
        Ok(Value::Int(value))
    }
    fn big_int(&mut self, text: &str) -> Result<Value, Fault> {
        Ok(Value::BigInt(text.to_owned()))
    }
    fn float(&mut self, value: f64) -> Result<Value, Fault> {
        Ok(Value::Float(value))
    }
    fn str(&mut self, value: &str) -> Result<Value, Fault> {
        Ok(Value::Str(value.to_owned()))
    }
    fn key(&mut self, value: &str) -> Result<Value, Fault> {
        Ok(Value::Str(value.to_owned()))
    }
    fn bytes(&mut self, encoded: &str) -> Result<Value, Fault> {
        b64::std_decode(encoded).map(Value::Bytes).map_err(bytes_fault)
    }
    fn list(&mut self, items: std::vec::Drain<'_, Value>) -> Result<Value, Fault> {
        Ok(Value::List(items.collect()))
    }
    fn dict(&mut self, mut items: std::vec::Drain<'_, Value>) -> Result<Value, Fault> {
        let mut pairs: Vec<(Value, Value)> = Vec::with_capacity(items.len() / 2);
        // A set, not a scan of the earlier keys: an object with many keys stays linear. (Its
        // hasher is std's, seeded per process: Rust callers only; the Python glue checks with
        // the dict it builds.)
        let mut seen = std::collections::HashSet::with_capacity(items.len() / 2);
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            let Value::Str(name) = &k else {
                return Err(Fault::plain(format!("object key {} is not a string", render_key(&k))));
            };
            if !seen.insert(name.clone()) {
                return Err(duplicate_key_fault(&render_key(&k)));
            }
            pairs.push((k, v));
        }
        Ok(Value::Dict(pairs))
    }
}

/// Decode `text` to a [`Value`].
pub fn decode(text: &str) -> Result<Value, Fault> {
    decode_with(text, &mut ValueBuilder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(f: f64) -> String {
        let mut out = Vec::new();
        write_float_repr(&mut out, f);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e16, "1.5e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (123.456, "123.456"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-2.5e-7, "-2.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e22, "1e+22"),
            (123456789012345680.0, "1.2345678901234568e+17"),
        ];
        for (f, want) in cases {
            assert_eq!(repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn plain_runs_stop_at_exactly_the_special_bytes() {
        for fill in [b'a', 0x80, 0xff, b' ', b'!', b'#', b'[', b']', 0x7f] {
            for b in 0..=255u8 {
                for at in [0, 1, 7, 8, 15, 16, 63, 64, 65, 130] {
                    let mut text = vec![fill; 150];
                    text.truncate(at.max(140));
                    text.resize(at + 9, fill);
                    text[at] = b;
                    let special = b < 0x20 || b == b'"' || b == b'\\';
                    assert_eq!(plain_run_end(&text, 0), if special { at } else { text.len() }, "byte {b} at {at}");
                    assert_eq!(plain_run_end(&text, at + 1), text.len());
                }
            }
        }
        // The first special byte wins, whichever kind it is.
        assert_eq!(plain_run_end(b"ab\n\"", 0), 2);
        assert_eq!(plain_run_end(b"ab\x01\"", 0), 2);
        assert_eq!(plain_run_end(&[b'a'; 100], 100), 100);
    }

    #[test]
    fn escaped_dict_nests_one_deeper() {
        let mut v = Value::Dict(vec![(Value::Str("$bytes".into()), Value::Int(1))]);
        for _ in 0..255 {
            v = Value::List(vec![v]);
        }
        // 255 lists + the wrapper at 256 + the dict at 257.
        assert_eq!(encode(&v).unwrap_err().message, "nesting deeper than 256");
    }
}
