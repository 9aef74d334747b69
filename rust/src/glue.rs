//! PyO3 glue: moves values between Python and the kernels. No format logic lives here: the
//! kernels decide every byte of output and every accept/reject; this file only maps Python
//! types to kernel calls and kernel faults to `durable_agent.CodecError`.

use crate::codec::{self, Builder, DictFrame, Encoder, Fault};
use crate::keycache::{self, KeyCache};
use crate::{aead, b64, token, transcode};
use pyo3::exceptions::{PyException, PyTypeError, PyUnicodeEncodeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PySet, PySlice, PyString, PyTuple,
    PyType,
};
use std::borrow::Cow;
use std::sync::{Mutex, MutexGuard};

static CODEC_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INT_REPR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static STR_OF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static INT_DIGIT_LIMIT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static GC: PyOnceLock<(Py<PyAny>, Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
/// The output buffer, kept between calls (up to `KEEP_BUFFER` bytes) so that a large
/// checkpoint does not cost fresh pages every time it is saved.
static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
const KEEP_BUFFER: usize = 64 << 20;
/// Texts at least this long are decoded with the cyclic GC paused (see `decode`).
const PAUSE_GC_FROM: usize = 8 * 1024;

/// `durable_agent.CodecError` (its public name), the one class codec faults are raised as.
fn codec_error(py: Python<'_>, message: String) -> PyErr {
    match CODEC_ERROR.get_or_try_init(py, || -> PyResult<Py<PyType>> {
        let class = py.import("durable_agent")?.getattr("CodecError")?;
        Ok(class.cast_into::<PyType>()?.unbind())
    }) {
        Ok(class) => PyErr::from_type(class.bind(py).clone(), message),
        Err(err) => err,
    }
}

/// Why encoding stopped: a codec fault (raised as `CodecError`) or an exception raised by
/// Python code the walk ran (a dict subclass's `items()`, say), passed through unchanged.
enum Stop {
    Fault(Fault),
    Py(PyErr),
}

impl From<Fault> for Stop {
    fn from(fault: Fault) -> Self {
        Stop::Fault(fault)
    }
}

impl From<PyErr> for Stop {
    fn from(err: PyErr) -> Self {
        Stop::Py(err)
    }
}

impl Stop {
    fn inside(self, step: impl FnOnce() -> String) -> Self {
        match self {
            Stop::Fault(fault) => Stop::Fault(fault.inside(step())),
            other => other,
        }
    }

    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self {
            Stop::Fault(fault) => codec_error(py, fault.render()),
            Stop::Py(err) => err,
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".to_owned())
}

/// `cell` holding `owner.name` (a builtin type's own method, which no subclass can override).
fn builtin_attr<'a>(
    py: Python<'_>,
    cell: &'a PyOnceLock<Py<PyAny>>,
    owner: &Bound<'_, PyAny>,
    name: &str,
) -> PyResult<&'a Py<PyAny>> {
    cell.get_or_try_init(py, || Ok(owner.getattr(name)?.unbind()))
}

/// `s` itself if it is a `str`, else a `str` of its characters (`str.__str__`): a subclass is
/// read by its data, never through its methods (its `__len__`, `encode` or `__getitem__` may lie).
fn exact_str<'py>(s: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyString>> {
    if s.is_exact_instance_of::<PyString>() {
        return Ok(s.clone());
    }
    let py = s.py();
    let str_of = builtin_attr(py, &STR_OF, py.get_type::<PyString>().as_any(), "__str__")?;
    Ok(str_of.bind(py).call1((s,))?.cast_into::<PyString>()?)
}

/// `repr(obj)` for a message, as its characters; `<TypeName>` when repr() raises an
/// `Exception` or gives a string that is not valid Unicode (other errors propagate).
fn shown(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = obj.py();
    match obj.repr() {
        Ok(text) => Ok(text.to_str().map(str::to_owned).unwrap_or_else(|_| format!("<{}>", type_name(obj)))),
        Err(err) if err.is_instance_of::<PyException>(py) => Ok(format!("<{}>", type_name(obj))),
        Err(err) => Err(err),
    }
}

/// `repr()` of a `str` (a key on a fault's path): no user code runs.
fn str_repr(s: &Bound<'_, PyString>) -> String {
    s.repr().map(|r| r.to_string_lossy().into_owned()).unwrap_or_default()
}

fn write_str(enc: &mut Encoder, s: &Bound<'_, PyString>) {
    match s.to_str() {
        Ok(text) => enc.str(text),
        Err(_) => enc.lone_surrogate(),
    }
}

/// The most digits an int may have: `codec::MAX_INT_DIGITS`, or the interpreter's
/// `sys.get_int_max_str_digits()` if that is lower (0 means no limit).
fn int_digit_limit(py: Python<'_>) -> PyResult<usize> {
    let get = builtin_attr(py, &INT_DIGIT_LIMIT, py.import("sys")?.as_any(), "get_int_max_str_digits")?;
    let limit: usize = get.bind(py).call0()?.extract()?;
    Ok(if limit == 0 { codec::MAX_INT_DIGITS } else { limit.min(codec::MAX_INT_DIGITS) })
}

fn write_big_int(enc: &mut Encoder, obj: &Bound<'_, PyAny>) -> Result<(), Stop> {
    let py = obj.py();
    let int_repr = builtin_attr(py, &INT_REPR, py.get_type::<PyInt>().as_any(), "__repr__")?;
    match int_repr.bind(py).call1((obj,)) {
        Ok(text) => Ok(enc.big_int(&text.cast_into::<PyString>().map_err(PyErr::from)?.to_cow()?)?),
        // Past the interpreter's int-to-str digit limit.
        Err(err) if err.is_instance_of::<PyValueError>(py) => {
            Err(Fault::at(codec::too_many_digits(int_digit_limit(py)?)).into())
        }
        Err(err) => Err(err.into()),
    }
}

fn write_int(enc: &mut Encoder, obj: &Bound<'_, PyAny>) -> Result<(), Stop> {
    match obj.extract::<i64>() {
        Ok(v) => {
            enc.int(v);
            Ok(())
        }
        Err(_) => write_big_int(enc, obj),
    }
}

type Pairs<'py> = Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>;

/// Write a dict from its `pairs`, read once when the encoder reached it (docs/codec.md, "User
/// objects"): code run meanwhile cannot change what is written for it. `careful`: the pairs
/// may repeat a key's characters (they came from a dict subclass's items()); from the first key
/// that is a `str` subclass on, every key is checked against the earlier ones anyway.
fn dict_pairs(enc: &mut Encoder, pairs: &Pairs<'_>, depth: usize, mut careful: bool) -> Result<(), Stop> {
    let sole = match pairs.as_slice() {
        [(key, _)] => key.cast::<PyString>().ok().and_then(|s| s.to_str().ok()),
        _ => None,
    };
    let mut frame: DictFrame = enc.begin_dict(depth, sole)?;
    let mut seen: Option<Bound<'_, PySet>> = None;
    for (index, (key, value)) in pairs.iter().enumerate() {
        let Ok(key) = key.cast::<PyString>() else {
            return Err(Fault::at(format!("dict key {} is not a str", shown(key)?)).into());
        };
        let key = if key.is_exact_instance_of::<PyString>() {
            key.clone()
        } else {
            careful = true;
            exact_str(key)?
        };
        if careful {
            // Until now every key was a plain str of a plain dict: distinct.
            if seen.is_none() {
                seen = Some(PySet::new(key.py(), pairs[..index].iter().map(|(k, _)| k))?);
            }
            if let Some(seen) = &seen {
                if seen.contains(&key)? {
                    return Err(Fault::at(format!("duplicate key {}", str_repr(&key))).into());
                }
                seen.add(&key)?;
            }
        }
        match key.to_str() {
            Ok(text) => enc.key(&mut frame, text),
            Err(_) => enc.lone_surrogate_key(&mut frame),
        }
        walk(enc, value, frame.child_depth).map_err(|stop| stop.inside(|| str_repr(&key)))?;
    }
    enc.end_dict(frame);
    Ok(())
}

/// A dict subclass's pairs, from one pass over its `items()` (its `__len__`, `__iter__` and
/// `keys()` are not used), each a `(key, value)` tuple.
fn subclass_pairs<'py>(mapping: &Bound<'py, PyAny>) -> Result<Pairs<'py>, Stop> {
    let items = one_pass(&mapping.call_method0(intern!(mapping.py(), "items"))?)?;
    let mut pairs = Vec::with_capacity(items.len());
    for item in items {
        match item.cast_exact::<PyTuple>() {
            Ok(pair) if pair.len() == 2 => pairs.push((pair.get_item(0)?, pair.get_item(1)?)),
            Ok(pair) => return Err(not_a_pair(mapping, format!("a tuple of {}", pair.len()))),
            Err(_) => return Err(not_a_pair(mapping, type_name(&item))),
        }
    }
    Ok(pairs)
}

fn not_a_pair(mapping: &Bound<'_, PyAny>, got: String) -> Stop {
    Fault::at(format!("{}.items() gave {got}, not a (key, value) tuple", type_name(mapping))).into()
}

/// Every item of `iterable`, from one pass of its iterator (no length hint is asked for: a
/// subclass's may lie).
fn one_pass<'py>(iterable: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut items = Vec::new();
    for item in iterable.try_iter()? {
        items.push(item?);
    }
    Ok(items)
}

fn write_seq<'py>(enc: &mut Encoder, items: impl Iterator<Item = Bound<'py, PyAny>>, depth: usize) -> Result<(), Stop> {
    enc.begin_list(depth)?;
    for (i, item) in items.enumerate() {
        if i > 0 {
            enc.comma();
        }
        walk(enc, &item, depth + 1).map_err(|stop| stop.inside(|| i.to_string()))?;
    }
    enc.end_list();
    Ok(())
}

/// Encode `obj` at `depth`, in the reference's order of type checks: exact builtins first,
/// then dict, list/tuple, bytes-likes and str/int/float subclasses (as their base value).
fn walk(enc: &mut Encoder, obj: &Bound<'_, PyAny>, depth: usize) -> Result<(), Stop> {
    if let Ok(s) = obj.cast_exact::<PyString>() {
        write_str(enc, s);
        return Ok(());
    }
    if obj.is_none() {
        enc.null();
        return Ok(());
    }
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        enc.bool(b.is_true());
        return Ok(());
    }
    if obj.is_exact_instance_of::<PyInt>() {
        return write_int(enc, obj);
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        return Ok(enc.float(f.value())?);
    }
    if let Ok(dict) = obj.cast_exact::<PyDict>() {
        return dict_pairs(enc, &dict.iter().collect(), depth, false);
    }
    if let Ok(list) = obj.cast_exact::<PyList>() {
        return write_seq(enc, list.to_tuple().iter(), depth);
    }
    if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        return write_seq(enc, tuple.iter(), depth);
    }
    if let Ok(bytes) = obj.cast_exact::<PyBytes>() {
        return Ok(enc.bytes(depth, bytes.as_bytes())?);
    }
    walk_other(enc, obj, depth)
}

fn walk_other(enc: &mut Encoder, obj: &Bound<'_, PyAny>, depth: usize) -> Result<(), Stop> {
    let py = obj.py();
    if obj.is_instance_of::<PyDict>() {
        if depth > codec::MAX_DEPTH {
            return Err(codec::too_deep().into()); // before running the subclass's code, as the reference
        }
        return dict_pairs(enc, &subclass_pairs(obj)?, depth, true);
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        if depth > codec::MAX_DEPTH {
            return Err(codec::too_deep().into());
        }
        return write_seq(enc, one_pass(obj)?.into_iter(), depth);
    }
    if let Ok(bytes) = obj.cast::<PyBytes>() {
        return Ok(enc.bytes(depth, bytes.as_bytes())?);
    }
    if let Ok(array) = obj.cast::<PyByteArray>() {
        if depth > codec::MAX_DEPTH {
            return Err(codec::too_deep().into());
        }
        return Ok(enc.bytes(depth, &array.to_vec())?);
    }
    if obj.is_instance_of::<PyMemoryView>() {
        if depth > codec::MAX_DEPTH {
            return Err(codec::too_deep().into());
        }
        return match obj.call_method0("tobytes") {
            Ok(raw) => Ok(enc.bytes(depth, raw.cast::<PyBytes>().map_err(PyErr::from)?.as_bytes())?),
            Err(err) if err.is_instance_of::<PyValueError>(py) => Err(Fault::at(codec::RELEASED_MEMORYVIEW).into()),
            Err(err) => Err(err.into()),
        };
    }
    if let Ok(s) = obj.cast::<PyString>() {
        write_str(enc, s);
        return Ok(());
    }
    if obj.is_instance_of::<PyInt>() {
        return write_int(enc, obj);
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(enc.float(f.value())?);
    }
    Err(Fault::at(format!("{} is not JSON-compatible data", type_name(obj))).into())
}

/// Encode JSON-compatible data (bytes allowed) to compact JSON text. Raises `CodecError`.
#[pyfunction]
fn encode<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    // try_lock: a nested call (Python code run by the walk, e.g. a dict subclass's items(),
    // may encode too) or another thread simply uses a fresh buffer.
    let mut shared = BUFFER.try_lock().ok();
    let buffer = shared.as_deref_mut().map(std::mem::take).unwrap_or_default();
    let mut enc = Encoder::with_buffer(buffer);
    let walked = walk(&mut enc, value, 1);
    let (made, buffer) = match walked {
        Ok(()) => {
            let (made, buffer) = enc.finish_with(|text| PyString::new(py, text));
            (made.map_err(Stop::Fault), buffer)
        }
        Err(stop) => (Err(stop), enc.into_buffer()),
    };
    if let Some(slot) = shared.as_deref_mut() {
        if buffer.capacity() <= KEEP_BUFFER {
            *slot = buffer;
        }
    }
    made.map_err(|stop| stop.into_pyerr(py))
}

/// Makes Python objects for the kernel's parser. Keys are shared per call (as `json.loads`
/// does), so a checkpoint's thousands of `"role"` keys are one str object; the cache does a
/// bounded amount of work per key whatever the keys (see [`keycache`]).
struct PyBuilder<'py> {
    py: Python<'py>,
    keys: KeyCache<Bound<'py, PyString>>,
    /// The last short key seen per slot, in front of `keys` (see [`RecentKey`]).
    recent: RecentKeys,
    int_type: Bound<'py, PyType>,
}

/// The recent short keys of small texts, kept from call to call: a token payload or a small
/// record repeats the same few keys on every call, and a key found here costs neither a new
/// str nor its hash. Direct-mapped like every [`RecentKeys`] table (one compare per key, a
/// clash replaces the entry), so it stays bounded in size and in work per key whatever keys
/// an input holds; a decode that finds it in use (a decode run re-entrantly by a finalizer,
/// or by another thread meanwhile) goes without it.
static SHARED_RECENT: Mutex<Vec<Option<RecentKey>>> = Mutex::new(Vec::new());

/// Where a decode keeps its recent short keys.
enum RecentKeys {
    /// None (not worth it, or the shared table was in use).
    Off,
    /// A table of this call's own (a large text).
    Own(Vec<Option<RecentKey>>),
    /// [`SHARED_RECENT`] (a small text).
    Shared(MutexGuard<'static, Vec<Option<RecentKey>>>),
}

impl RecentKeys {
    fn for_text(len: usize) -> Self {
        if len >= PAUSE_GC_FROM {
            let mut own = Vec::new();
            own.resize_with(RECENT_KEYS, || None);
            return RecentKeys::Own(own);
        }
        match SHARED_RECENT.try_lock() {
            Ok(mut shared) => {
                if shared.is_empty() {
                    shared.resize_with(RECENT_KEYS, || None);
                }
                RecentKeys::Shared(shared)
            }
            Err(_) => RecentKeys::Off,
        }
    }

    fn slots(&mut self) -> Option<&mut [Option<RecentKey>]> {
        match self {
            RecentKeys::Off => None,
            RecentKeys::Own(slots) => Some(slots),
            RecentKeys::Shared(slots) => Some(slots),
        }
    }
}

impl<'py> PyBuilder<'py> {
    /// The str object of this call for the key `value` (at most 64 bytes): shared, unless
    /// the cache had no room for it.
    fn shared_key(&mut self, value: &str) -> Bound<'py, PyString> {
        let py = self.py;
        self.keys.get_or_insert_with(value, || PyString::new(py, value))
    }
}

/// Slots of the direct-mapped cache of recent short keys.
const RECENT_KEYS: usize = 512;

/// A key of at most 16 bytes as three integers (two words that hold all its bytes, and its
/// length), so that finding it again is three compares, not a map lookup.
struct RecentKey {
    words: [u64; 3],
    key: Py<PyString>,
}

impl RecentKey {
    /// Loads straight from the text (the first and last 8 or 4 bytes, or three bytes, which
    /// together cover every byte of a key of that length): no copy to a padded buffer.
    #[inline]
    fn words(value: &str) -> Option<[u64; 3]> {
        let b = value.as_bytes();
        let n = b.len();
        let load = |at: usize, width: usize| -> u64 {
            let mut word = [0u8; 8];
            word[..width].copy_from_slice(&b[at..at + width]);
            u64::from_le_bytes(word)
        };
        let (first, last) = match n {
            17.. => return None,
            8..=16 => (load(0, 8), load(n - 8, 8)),
            4..=7 => (load(0, 4), load(n - 4, 4)),
            1..=3 => (u64::from(b[0]) | (u64::from(b[n / 2]) << 8) | (u64::from(b[n - 1]) << 16), 0),
            0 => (0, 0),
        };
        Some([first, last, n as u64])
    }

    #[inline]
    fn slot(words: [u64; 3]) -> usize {
        let mixed = (words[0] ^ words[1].rotate_left(31) ^ words[2]).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> 55) as usize % RECENT_KEYS
    }
}

impl<'py> Builder for PyBuilder<'py> {
    type Out = Bound<'py, PyAny>;

    fn null(&mut self) -> Result<Self::Out, Fault> {
        Ok(self.py.None().into_bound(self.py))
    }

    fn bool(&mut self, value: bool) -> Result<Self::Out, Fault> {
        Ok(PyBool::new(self.py, value).to_owned().into_any())
    }

    fn int(&mut self, value: i64) -> Result<Self::Out, Fault> {
        Ok(value.into_pyobject(self.py).map_err(|e| Fault::plain(e.to_string()))?.into_any())
    }

    fn big_int(&mut self, text: &str) -> Result<Self::Out, Fault> {
        // Python's int() applies the interpreter's int-from-str digit limit, as json.loads does.
        self.int_type.call1((text,)).map_err(|err| match int_digit_limit(self.py) {
            Ok(limit) if err.is_instance_of::<PyValueError>(self.py) => Fault::plain(codec::too_many_digits(limit)),
            _ => Fault::plain(err.to_string()),
        })
    }

    fn float(&mut self, value: f64) -> Result<Self::Out, Fault> {
        Ok(PyFloat::new(self.py, value).into_any())
    }

    fn str(&mut self, value: &str) -> Result<Self::Out, Fault> {
        Ok(PyString::new(self.py, value).into_any())
    }

    fn key(&mut self, value: &str) -> Result<Self::Out, Fault> {
        let py = self.py;
        let words = if matches!(self.recent, RecentKeys::Off) { None } else { RecentKey::words(value) };
        let Some(words) = words else {
            if value.len() > 64 {
                return Ok(PyString::new(py, value).into_any());
            }
            return Ok(self.shared_key(value).into_any());
        };
        let slot = RecentKey::slot(words);
        if let Some(Some(recent)) = self.recent.slots().map(|slots| &slots[slot]) {
            if recent.words == words {
                return Ok(recent.key.bind(py).clone().into_any());
            }
        }
        let key = self.shared_key(value);
        if let Some(slots) = self.recent.slots() {
            slots[slot] = Some(RecentKey { words, key: key.clone().unbind() });
        }
        Ok(key.into_any())
    }

    fn bytes(&mut self, encoded: &str) -> Result<Self::Out, Fault> {
        let len = b64::std_decoded_len(encoded.as_bytes()).map_err(codec::bytes_fault)?;
        let mut failure = None;
        let made = PyBytes::new_with(self.py, len, |buf| {
            b64::std_decode_into(encoded.as_bytes(), buf).map_err(|e| {
                failure = Some(e);
                PyValueError::new_err("invalid base64")
            })
        });
        match (made, failure) {
            (Ok(bytes), _) => Ok(bytes.into_any()),
            (Err(_), Some(error)) => Err(codec::bytes_fault(error)),
            (Err(err), None) => Err(Fault::plain(err.to_string())),
        }
    }

    fn list(&mut self, items: std::vec::Drain<'_, Self::Out>) -> Result<Self::Out, Fault> {
        Ok(PyList::new(self.py, items).map_err(|e| Fault::plain(e.to_string()))?.into_any())
    }

    fn dict(&mut self, mut items: std::vec::Drain<'_, Self::Out>) -> Result<Self::Out, Fault> {
        let dict = PyDict::new(self.py);
        let mut count = 0usize;
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            dict.set_item(&key, value).map_err(|e| Fault::plain(e.to_string()))?;
            count += 1;
            if dict.len() != count {
                let shown = key.cast::<PyString>().map(str_repr).unwrap_or_default();
                return Err(codec::duplicate_key_fault(&shown));
            }
        }
        Ok(dict.into_any())
    }
}

/// Decode text produced by `encode` (or any JSON within the same limits). Raises `CodecError`.
#[pyfunction]
fn decode<'py>(py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    decode_counting(py, text).map(|(value, _)| value)
}

/// For tests: decode `text` and return what its key cache did: (lookups, slots probed, keys
/// held at the end).
#[pyfunction]
#[pyo3(name = "_key_cache_stats")]
fn key_cache_stats<'py>(py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<(usize, usize, usize)> {
    let (_, stats) = decode_counting(py, text)?;
    Ok((stats.lookups, stats.probes, stats.cached))
}

fn decode_counting<'py>(py: Python<'py>, text: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, keycache::Stats)> {
    let Ok(s) = text.cast::<PyString>() else {
        return Err(codec_error(py, format!("expected str to decode, got {}", type_name(text))));
    };
    let s = exact_str(s)?;
    let utf8 = utf8_of(&s)
        .ok_or_else(|| codec_error(py, "the text contains a lone surrogate, which is not valid Unicode".to_owned()))?;
    let (result, stats) = decode_utf8(py, &utf8)?;
    Ok((result.map_err(|fault| codec_error(py, fault.render()))?, stats))
}

/// Decode `utf8`: its value or the codec fault (raised or not by the caller), and what the key
/// cache did. An `Err` is a failure of the interpreter (pausing the GC), not of the text.
fn decode_utf8<'py>(py: Python<'py>, utf8: &str) -> PyResult<(Result<Bound<'py, PyAny>, Fault>, keycache::Stats)> {
    // A large text gets a cache of recent short keys of its own, and room for a few dozen keys;
    // a small one the shared recent keys.
    let keys = if utf8.len() >= PAUSE_GC_FROM { KeyCache::with_capacity(64) } else { KeyCache::default() };
    let recent = RecentKeys::for_text(utf8.len());
    let mut builder = PyBuilder { py, keys, recent, int_type: py.get_type::<PyInt>() };
    // A large text makes many containers; the cyclic GC would rescan the growing result again
    // and again (it cannot hold a cycle: it is fresh dicts and lists). Paused, then restored;
    // no Python code runs in between.
    let gc = if utf8.len() >= PAUSE_GC_FROM { pause_gc(py)? } else { None };
    let result = codec::decode_with(utf8, &mut builder);
    if let Some(enable) = gc {
        enable.bind(py).call0()?;
    }
    Ok((result, builder.keys.stats()))
}

/// The UTF-8 of `s` (None if it holds a lone surrogate). ASCII text is borrowed as is; other
/// text is converted in slices, so that neither a UTF-8 copy is cached on the caller's str
/// for good nor the interpreter's worst-case (3 or 4 bytes per character) buffer is made for
/// the whole text. CPython's UTF-8 encoder goes character by character, so a slice is first
/// asked for as Latin-1 (a copy, when all its characters are below U+0100), which the kernel
/// converts; see [`push_piece`].
fn utf8_of<'a>(s: &'a Bound<'_, PyString>) -> Option<Cow<'a, str>> {
    if s.call_method0("isascii").ok()?.is_truthy().ok()? {
        return s.to_str().ok().map(Cow::Borrowed);
    }
    const SLICE: usize = 1 << 16;
    let chars = s.len().ok()?;
    let mut out = String::with_capacity(chars + chars / 8);
    let mut at = 0;
    while at < chars {
        let end = (at + SLICE).min(chars);
        let piece = if at == 0 && end == chars { s.clone() } else { substring(s, at, end)? };
        push_piece(&mut out, &piece)?;
        at = end;
    }
    Some(Cow::Owned(out))
}

/// `s[start:end]`.
fn substring<'py>(s: &Bound<'py, PyString>, start: usize, end: usize) -> Option<Bound<'py, PyString>> {
    let slice = PySlice::new(s.py(), isize::try_from(start).ok()?, isize::try_from(end).ok()?, 1);
    s.get_item(slice).ok()?.cast_into::<PyString>().ok()
}

/// Append the UTF-8 of `piece` to `out`; None for a lone surrogate.
///
/// As Latin-1 when it can be. Failing that, a piece whose first character beyond Latin-1 comes
/// late enough (the odd dash or quote mark in a long text) is split around that run of wide
/// characters, and the rest tried as Latin-1 once more; anything else (CJK text, emoji, a
/// piece with wide characters throughout) goes through CPython's UTF-8 encoder.
fn push_piece(out: &mut String, piece: &Bound<'_, PyString>) -> Option<()> {
    let py = piece.py();
    let latin1 = intern!(py, "latin-1");
    let (start, end) = match as_latin1(piece, latin1)? {
        Ok(raw) => {
            transcode::push_latin1(out, raw.as_bytes());
            return Some(());
        }
        Err(run) => run,
    };
    let len = piece.len().ok()?;
    if start < 64 || start >= end || end > len {
        return push_utf8(out, piece);
    }
    let head = substring(piece, 0, start)?;
    transcode::push_latin1(out, as_latin1(&head, latin1)?.ok()?.as_bytes());
    push_utf8(out, &substring(piece, start, end)?)?;
    if end == len {
        return Some(());
    }
    let rest = substring(piece, end, len)?;
    match as_latin1(&rest, latin1)? {
        Ok(raw) => {
            transcode::push_latin1(out, raw.as_bytes());
            Some(())
        }
        Err(_) => push_utf8(out, &rest),
    }
}

/// `piece.encode("latin-1")`, or the span of its first run of characters beyond Latin-1 (None
/// for any other failure).
fn as_latin1<'py>(
    piece: &Bound<'py, PyString>,
    latin1: &Bound<'py, PyString>,
) -> Option<Result<Bound<'py, PyBytes>, (usize, usize)>> {
    let py = piece.py();
    match piece.call_method1(intern!(py, "encode"), (latin1,)) {
        Ok(raw) => Some(Ok(raw.cast_into::<PyBytes>().ok()?)),
        Err(err) if err.is_instance_of::<PyUnicodeEncodeError>(py) => {
            let failure = err.value(py);
            let start: usize = failure.getattr(intern!(py, "start")).ok()?.extract().ok()?;
            let end: usize = failure.getattr(intern!(py, "end")).ok()?.extract().ok()?;
            Some(Err((start, end)))
        }
        Err(_) => None,
    }
}

/// Append the UTF-8 of `piece` as CPython encodes it; None for a lone surrogate.
fn push_utf8(out: &mut String, piece: &Bound<'_, PyString>) -> Option<()> {
    out.push_str(std::str::from_utf8(piece.encode_utf8().ok()?.as_bytes()).ok()?);
    Some(())
}

/// Pause the cyclic GC if it is enabled; returns `gc.enable` to call afterwards.
fn pause_gc(py: Python<'_>) -> PyResult<Option<&Py<PyAny>>> {
    let (is_enabled, disable, enable) = GC.get_or_try_init(py, || -> PyResult<_> {
        let gc = py.import("gc")?;
        Ok((gc.getattr("isenabled")?.unbind(), gc.getattr("disable")?.unbind(), gc.getattr("enable")?.unbind()))
    })?;
    if is_enabled.bind(py).call0()?.is_truthy()? {
        disable.bind(py).call0()?;
        Ok(Some(enable))
    } else {
        Ok(None)
    }
}

fn need_bytes<'a, 'py>(value: &'a Bound<'py, PyAny>, name: &str) -> PyResult<&'a Bound<'py, PyBytes>> {
    value.cast::<PyBytes>().map_err(|_| PyTypeError::new_err(format!("{name} must be bytes, not {}", type_name(value))))
}

/// Unpadded URL-safe base64 of `data`.
#[pyfunction]
fn b64url_encode(data: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(b64::url_encode(need_bytes(data, "data")?.as_bytes()))
}

/// Decode canonical unpadded URL-safe base64; None for anything `b64url_encode` cannot produce.
#[pyfunction]
fn b64url_decode<'py>(py: Python<'py>, text: &Bound<'py, PyAny>) -> Option<Bound<'py, PyBytes>> {
    let text = text.cast::<PyString>().ok()?.to_str().ok()?;
    b64::url_decode(text).map(|raw| PyBytes::new(py, &raw))
}

/// HMAC-SHA256 of `message` under `key` (32 bytes).
#[pyfunction]
fn hmac_sha256<'py>(
    py: Python<'py>,
    key: &Bound<'py, PyAny>,
    message: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let key = need_bytes(key, "key")?;
    let message = need_bytes(message, "message")?;
    Ok(PyBytes::new(py, &token::hmac_sha256(key.as_bytes(), message.as_bytes())))
}

/// The `v1` token carrying `payload` (a text, normally codec JSON), MACed with `key`.
#[pyfunction]
fn token_sign(key: &Bound<'_, PyAny>, payload: &Bound<'_, PyAny>) -> PyResult<String> {
    let key = need_bytes(key, "key")?;
    let payload = payload
        .cast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("payload must be str, not {}", type_name(payload))))?;
    // A lone surrogate raises UnicodeEncodeError here, as str.encode("utf-8") does.
    Ok(token::token_sign(key.as_bytes(), payload.to_str()?))
}

/// The payload text of `token` if its MAC verifies under `key`, else None. Never raises on `token`.
#[pyfunction]
fn token_verify(token: &Bound<'_, PyAny>, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    let key = need_bytes(key, "key")?;
    let Ok(token) = token.cast::<PyString>() else { return Ok(None) };
    let Ok(token) = token.to_str() else { return Ok(None) };
    Ok(token::token_verify(token, key.as_bytes()))
}

/// `decode(token_verify(token, key))`: the payload of `token` as data if its MAC verifies under
/// `key` and its payload text decodes, else None (None too for a payload of `null`). Never
/// raises on `token`.
#[pyfunction]
fn token_open<'py>(
    py: Python<'py>,
    token: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let key = need_bytes(key, "key")?;
    let Ok(token) = token.cast::<PyString>() else { return Ok(None) };
    let Ok(token) = token.to_str() else { return Ok(None) };
    let Some(text) = token::token_verify(token, key.as_bytes()) else { return Ok(None) };
    let (result, _) = decode_utf8(py, &text)?;
    Ok(result.ok())
}

/// `decode` of the texts that `values` (envelopes of text, stored as text or as bytes) seal, value `i` bound to
/// the place whose associated data is `place_head` + `first + i` + `]` (a place ending in a sequence number),
/// under the keys of `keys` (key id to 32-byte key): `(decoded, misses)`. `misses` lists the indexes of the
/// values that did not open or decode (any reason: see the `aead` kernel), None in `decoded`, for the caller's
/// reference implementation to say why.
///
/// One call for a checkpoint's rows, no text made in between: the plaintexts are joined, a batch of about
/// `OPENED_BATCH` bytes at a time, into the codec text of their list and decoded in one pass, as
/// `durable_agent._storage.history.decode_batched` does with stored texts (and, as there, a batch whose list
/// does not come out one value per plaintext is decoded plaintext by plaintext instead).
#[pyfunction]
fn envelopes_decode<'py>(
    py: Python<'py>,
    keys: &Bound<'py, PyDict>,
    values: &Bound<'py, PyAny>,
    place_head: &Bound<'py, PyAny>,
    first: u64,
) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
    let place_head = need_bytes(place_head, "place_head")?.as_bytes();
    let mut held = Vec::with_capacity(keys.len());
    for (key_id, key) in keys.iter() {
        let key_id = key_id
            .cast::<PyString>()
            .map_err(|_| PyTypeError::new_err(format!("a key id must be str, not {}", type_name(&key_id))))?;
        held.push((key_id.to_str()?.as_bytes().to_vec(), need_bytes(&key, "key")?.as_bytes().to_vec()));
    }
    let mut ring = aead::Ring::new(held.iter().map(|(id, key)| (&id[..], &key[..])))
        .ok_or_else(|| PyValueError::new_err("a key must be 32 bytes"))?;
    let values: Vec<Bound<'py, PyAny>> = values.try_iter()?.collect::<PyResult<_>>()?;
    let mut batch = OpenedBatch {
        builder: PyBuilder {
            py,
            keys: KeyCache::with_capacity(64),
            recent: RecentKeys::for_text(PAUSE_GC_FROM),
            int_type: py.get_type::<PyInt>(),
        },
        joined: Vec::with_capacity(OPENED_BATCH + OPENED_BATCH / 4),
        spans: Vec::new(),
        decoded: PyList::empty(py),
        misses: Vec::new(),
    };
    let mut place = place_head.to_vec();
    let mut digits = itoa::Buffer::new();
    let mut scratch = Vec::new();
    // As `decode_utf8` does for a large text: the rows make many fresh containers and no cycle.
    let gc = pause_gc(py)?;
    let mut outcome = Ok(());
    for (seq, value) in (first..).zip(&values) {
        place.truncate(place_head.len());
        place.extend_from_slice(digits.format(seq).as_bytes());
        place.push(b']');
        let stored = if value.is_exact_instance_of::<PyString>() {
            value
                .cast::<PyString>()
                .ok()
                .and_then(|text| text.to_str().ok())
                .map(|text| (text.as_bytes(), aead::Stored::Text))
        } else if value.is_exact_instance_of::<PyBytes>() {
            value.cast::<PyBytes>().ok().map(|bytes| (bytes.as_bytes(), aead::Stored::Binary))
        } else {
            None
        };
        batch
            .push(stored.and_then(|(envelope, form)| aead::open_text(&mut ring, envelope, form, &place, &mut scratch)));
        if batch.joined.len() >= OPENED_BATCH {
            outcome = batch.flush();
            if outcome.is_err() {
                break;
            }
        }
    }
    if outcome.is_ok() {
        outcome = batch.flush();
    }
    if let Some(enable) = gc {
        enable.bind(py).call0()?;
    }
    outcome.map(|()| (batch.decoded, batch.misses))
}

/// Plaintexts joined, at least, into one text before `envelopes_decode` decodes them (as `BATCH_CHARS` in
/// `durable_agent._storage.history`).
const OPENED_BATCH: usize = 1 << 16;

/// The plaintexts `envelopes_decode` has opened and not decoded yet, and what it has decoded.
struct OpenedBatch<'py> {
    builder: PyBuilder<'py>,
    /// `[` then the plaintexts, comma-separated (`]` added when decoded).
    joined: Vec<u8>,
    /// Per value of the batch: where its plaintext is in `joined`, None for a miss.
    spans: Vec<Option<(usize, usize)>>,
    decoded: Bound<'py, PyList>,
    misses: Vec<usize>,
}

impl OpenedBatch<'_> {
    fn push(&mut self, plaintext: Option<&str>) {
        let Some(plaintext) = plaintext else {
            self.spans.push(None);
            return;
        };
        self.joined.push(if self.spans.iter().any(Option::is_some) { b',' } else { b'[' });
        let start = self.joined.len();
        self.joined.extend_from_slice(plaintext.as_bytes());
        self.spans.push(Some((start, self.joined.len())));
    }

    /// Decode the batch into `decoded` (and `misses`), and empty it.
    fn flush(&mut self) -> PyResult<()> {
        let opened = self.spans.iter().flatten().count();
        let mut items = None;
        if opened > 0 {
            self.joined.push(b']');
            let list = std::str::from_utf8(&self.joined)
                .ok()
                .and_then(|text| codec::decode_with(text, &mut self.builder).ok());
            items = list.and_then(|list| list.cast_into::<PyList>().ok()).filter(|list| list.len() == opened);
        }
        let mut next = 0;
        for span in std::mem::take(&mut self.spans) {
            let item = match (span, &items) {
                (None, _) => None,
                (Some(_), Some(list)) => {
                    next += 1;
                    Some(list.get_item(next - 1)?)
                }
                (Some((start, end)), None) => std::str::from_utf8(&self.joined[start..end])
                    .ok()
                    .and_then(|text| codec::decode_with(text, &mut self.builder).ok()),
            };
            match item {
                Some(item) => self.decoded.append(item)?,
                None => {
                    self.misses.push(self.decoded.len());
                    self.decoded.append(self.builder.py.None())?;
                }
            }
        }
        self.joined.clear();
        Ok(())
    }
}

#[pymodule]
fn durable_agent_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // maturin's package __init__ star-imports this module: __all__ carries __version__ and the
    // test hook too.
    m.add(
        "__all__",
        [
            "__version__",
            "_key_cache_stats",
            "b64url_decode",
            "b64url_encode",
            "decode",
            "encode",
            "envelopes_decode",
            "hmac_sha256",
            "token_open",
            "token_sign",
            "token_verify",
        ],
    )?;
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_function(wrap_pyfunction!(key_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(b64url_encode, m)?)?;
    m.add_function(wrap_pyfunction!(b64url_decode, m)?)?;
    m.add_function(wrap_pyfunction!(hmac_sha256, m)?)?;
    m.add_function(wrap_pyfunction!(token_open, m)?)?;
    m.add_function(wrap_pyfunction!(token_sign, m)?)?;
    m.add_function(wrap_pyfunction!(token_verify, m)?)?;
    m.add_function(wrap_pyfunction!(envelopes_decode, m)?)?;
    Ok(())
}
