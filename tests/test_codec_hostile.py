"""Hostile input: user objects that lie, callers deep in their stack, adversarial texts.

Each case pins the one behaviour written in ``docs/codec.md`` ("User objects" and "Limits") and
runs on every kernel (the `kernels` fixture), so the pure and the native codec cannot drift
apart. The key-cache test needs the native extension (it counts the cache's work).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, ClassVar

import pytest

from durable_agent import CodecError

# --- strings that lie --------------------------------------------------------------------


class LyingStr(str):
    """Every method a codec might be tempted to call answers something else."""

    def __len__(self) -> int:
        return 5188146770730811392

    def __getitem__(self, index: Any) -> str:
        return '{"forged":1}'

    def __iter__(self) -> Iterator[str]:
        return iter('{"forged":1}')

    def __str__(self) -> str:
        return '{"forged":1}'

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return self is other

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b'{"forged":1}'

    def isascii(self) -> bool:
        return not str.isascii(self)

    def startswith(self, *args: Any) -> bool:
        return True

    def count(self, *args: Any) -> int:
        return 10**6


@pytest.mark.parametrize(
    "text",
    [
        '{"a":[1,"x"]}',
        '{"a":"caf\u00e9 \u2014 \U0001f600"}',
        # long enough that the native decoder converts it in slices
        '{"a":"' + "\u00e9" * 70_000 + "\u2014" + "b" * 70_000 + '"}',
    ],
    ids=["ascii", "non-ascii", "sliced"],
)
def test_a_str_subclass_is_decoded_from_its_own_characters(kernels: ModuleType, text: str) -> None:
    assert kernels.decode(LyingStr(text)) == kernels.decode(text)


def test_a_str_subclass_value_is_written_as_its_characters(kernels: ModuleType) -> None:
    assert kernels.encode([LyingStr("v\u00e9")]) == '["v\u00e9"]'


def test_a_reserved_key_is_recognised_by_its_characters_not_its_hash(kernels: ModuleType) -> None:
    text = kernels.encode({LyingStr("$bytes"): 1})
    assert text == '{"$esc":{"$bytes":1}}'
    assert kernels.decode(text) == {"$bytes": 1}


class RecordsEq(str):
    """A key whose __hash__ collides with its siblings' and whose __eq__ records each call."""

    calls: ClassVar[list[str]] = []

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        RecordsEq.calls.append(str.__str__(self))
        return self is other


def test_encoding_a_dict_that_shrank_calls_no_key_method(kernels: ModuleType) -> None:
    """A dict that once held more keys is copied by re-inserting its keys, which compares
    colliding ones with __eq__: the encoder must read its pairs without copying it so."""
    shrunk: dict[str, Any] = {f"gone{i}": 0 for i in range(8)}
    shrunk.update({RecordsEq("a"): 1, RecordsEq("b"): 2})
    for i in range(8):
        del shrunk[f"gone{i}"]
    RecordsEq.calls.clear()
    assert kernels.encode({"v": shrunk}) == '{"v":{"a":1,"b":2}}'
    assert RecordsEq.calls == []


@pytest.mark.parametrize(
    "value",
    [
        {LyingStr("a"): 1, LyingStr("a"): 2},
        {"a": 1, LyingStr("a"): 2},
        {LyingStr("a"): 1, "b": 2, "a": 3},
    ],
    ids=["two-subclass-keys", "str-then-subclass", "subclass-then-str"],
)
def test_keys_with_the_same_characters_are_a_duplicate_key(
    kernels: ModuleType, value: dict[str, Any]
) -> None:
    assert len(value) >= 2
    with pytest.raises(CodecError) as caught:
        kernels.encode({"outer": [value]})
    assert str(caught.value) == "duplicate key 'a' at $['outer'][0]"


# --- dict subclasses that lie --------------------------------------------------------------


class LenLies(dict[str, Any]):
    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[str]:
        return iter(["$bytes"])

    def keys(self) -> Any:
        return ["$esc"]


class LenRaises(dict[str, Any]):
    def __len__(self) -> int:
        raise AssertionError("the codec must not call __len__")


class ItemsLie(dict[str, Any]):
    """Reports other pairs than it holds: its items() is what the codec writes."""

    pairs: list[Any]  # set by items_lie

    def items(self) -> Any:
        return iter(self.pairs)


def items_lie(pairs: list[Any], **real: Any) -> ItemsLie:
    mapping = ItemsLie(real)
    mapping.pairs = pairs
    return mapping


def test_a_dict_subclass_is_read_through_items_alone(kernels: ModuleType) -> None:
    assert kernels.encode(LenLies({"$bytes": 1, "b": 2})) == '{"$bytes":1,"b":2}'
    assert kernels.encode(LenRaises({"$esc": 1})) == '{"$esc":{"$esc":1}}'
    assert kernels.encode(items_lie([("$bytes", 1)], a=1, b=2)) == '{"$esc":{"$bytes":1}}'
    assert kernels.encode(items_lie([("x", 1), ("y", 2)], **{"$bytes": 1})) == '{"x":1,"y":2}'
    assert kernels.encode(items_lie([])) == "{}"


def test_a_dict_subclass_whose_items_repeat_a_key_is_refused(kernels: ModuleType) -> None:
    with pytest.raises(CodecError) as caught:
        kernels.encode([items_lie([("a", 1), ("b", [2]), ("a", 3)])])
    assert str(caught.value) == "duplicate key 'a' at $[0]"


@pytest.mark.parametrize("pair", [("a", 1, 2), ["a", 1], "ab", ("a",), None])
def test_items_that_are_not_pairs_are_refused(kernels: ModuleType, pair: Any) -> None:
    with pytest.raises(CodecError) as caught:
        kernels.encode({"d": items_lie([("k", 0), pair])})
    got = f"a tuple of {len(pair)}" if type(pair) is tuple else type(pair).__name__
    assert str(caught.value) == f"ItemsLie.items() gave {got}, not a (key, value) tuple at $['d']"


def test_an_exception_from_items_propagates_unchanged(kernels: ModuleType) -> None:
    class Broken(dict[str, Any]):
        def items(self) -> Any:
            raise ValueError("items broke")

    with pytest.raises(ValueError, match="items broke") as caught:
        kernels.encode({"a": Broken()})
    assert not isinstance(caught.value, CodecError)


# --- containers changed while they are encoded ---------------------------------------------


class Meddler(list[Any]):
    """A list subclass whose iteration (run by the encoder) runs `meddle` first."""

    meddle: Callable[[], None] = staticmethod(lambda: None)

    def __iter__(self) -> Iterator[Any]:
        self.meddle()
        return super().__iter__()


def meddler(items: list[Any], meddle: Callable[[], None]) -> Meddler:
    out = Meddler(items)
    out.meddle = meddle
    return out


def test_a_dict_is_written_as_it_was_when_the_encoder_reached_it(kernels: ModuleType) -> None:
    outer: dict[str, Any] = {}
    outer["a"] = meddler([1], lambda: outer.update(b="changed", added=1))
    outer["b"] = 2
    assert kernels.encode(outer) == '{"a":[1],"b":2}'
    emptied: dict[str, Any] = {}
    emptied["a"] = meddler([1], emptied.clear)
    emptied["b"] = 2
    assert kernels.encode(emptied) == '{"a":[1],"b":2}'


def test_a_list_is_written_as_it_was_when_the_encoder_reached_it(kernels: ModuleType) -> None:
    outer: list[Any] = []
    outer += [meddler([1], lambda: outer.extend([3, 4])), 2]
    assert kernels.encode(outer) == "[[1],2]"
    shrunk: list[Any] = []
    shrunk += [meddler([1], shrunk.clear), 2, 3]
    assert kernels.encode(shrunk) == "[[1],2,3]"
    later: list[Any] = [0]
    value = [meddler([1], lambda: later.append(9)), later]
    assert kernels.encode(value) == "[[1],[0,9]]"  # not reached yet: its change shows


# --- messages that run user code ---------------------------------------------------------


class ReprRaises:
    def __repr__(self) -> str:
        raise RuntimeError("repr broke")


def test_a_key_whose_repr_raises_is_still_a_codec_error(kernels: ModuleType) -> None:
    with pytest.raises(CodecError) as caught:
        kernels.encode({"a": {ReprRaises(): 1}})
    assert str(caught.value) == "dict key <ReprRaises> is not a str at $['a']"


def test_a_path_shows_a_str_subclass_key_by_its_characters(kernels: ModuleType) -> None:
    class Shouty(str):
        def __repr__(self) -> str:
            raise RuntimeError("repr broke")

    with pytest.raises(CodecError) as caught:
        kernels.encode({Shouty("k"): {1}})
    assert str(caught.value) == "set is not JSON-compatible data at $['k']"


# --- huge integers under the interpreter's digit limit -----------------------------------


@pytest.mark.parametrize("limit, shown", [(1000, 1000), (4300, 4300), (10_000, 4300), (0, 4300)])
def test_int_digit_limit_messages(kernels: ModuleType, limit: int, shown: int) -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        with pytest.raises(CodecError) as encoding:
            kernels.encode({"a": [-(10**shown)]})
        with pytest.raises(CodecError) as decoding:
            kernels.decode('{"a":[' + "9" * (shown + 1) + "]}")
        assert kernels.encode([10**shown - 1]) == f"[{'9' * shown}]"
    finally:
        sys.set_int_max_str_digits(old)
    assert str(encoding.value) == f"integer with more than {shown} digits at $['a'][0]"
    assert str(decoding.value) == f"integer with more than {shown} digits"


# --- a caller already deep in its stack --------------------------------------------------


def _stack_depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


def test_a_valid_deep_value_works_for_a_caller_deep_in_its_stack(kernels: ModuleType) -> None:
    value: Any = {"$bytes": 1}  # escaped: two levels
    for _ in range(127):
        value = [value]
    for _ in range(127):
        value = {"k": value}
    text = '{"k":' * 127 + "[" * 127 + '{"$esc":{"$bytes":1}}' + "]" * 127 + "}" * 127
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(_stack_depth() + 60)  # the caller has 60 frames left, far fewer than 256
    try:
        encoded = kernels.encode(value)
        decoded = kernels.decode(text)
        with pytest.raises(CodecError, match="nesting deeper than 256"):
            kernels.decode("[" * 257 + "]" * 257)
    finally:
        sys.setrecursionlimit(old)
    assert sys.getrecursionlimit() == old
    assert encoded == text
    assert kernels.encode(decoded) == text


# --- the native key cache under keys that all collide ------------------------------------

_MASK = (1 << 64) - 1
_KEY_HASH_MULTIPLIER = 0xF135_7AEA_2E62_A9C5
_PLAIN = frozenset(range(0x21, 0x7F)) - {ord('"'), ord("\\")}


def colliding_keys(count: int, target: int = 0x5F5F_5F5F_5F5F_5F5F) -> list[str]:
    """`count` distinct printable 16-byte keys with one hash under the native key cache's hash.

    That hash (see `rust/src/keycache.rs`) mixes a 16-byte key's two words `w0`, `w1` only
    as `w0 * M ^ w1`: every key with `w1 = target ^ (w0 * M)` collides. Byte j of `w0 * M`
    depends on bytes 0..j of `w0` alone, so a depth-first search picks `w0` byte by byte
    keeping the matching byte of `w1` printable.
    """
    out: list[str] = []

    def search(j: int, w0: int) -> None:
        if j == 8:
            w1 = target ^ ((w0 * _KEY_HASH_MULTIPLIER) & _MASK)
            out.append((w0.to_bytes(8, "little") + w1.to_bytes(8, "little")).decode("ascii"))
            return
        shift = 8 * j
        for byte in sorted(_PLAIN):
            w = w0 | (byte << shift)
            if (target >> shift) & 0xFF ^ ((w * _KEY_HASH_MULTIPLIER) >> shift) & 0xFF in _PLAIN:
                search(j + 1, w)
                if len(out) == count:
                    return

    search(0, 0)
    return out


@pytest.fixture
def native() -> ModuleType:
    if os.environ.get("DURABLE_AGENT_NATIVE", "auto") == "0":
        pytest.skip("native kernels disabled by DURABLE_AGENT_NATIVE=0")
    import durable_agent_native

    return durable_agent_native


BOUND = 16  # slots looked at per key: the cache's limit is 8 (rust/src/keycache.rs)


@pytest.mark.host_only("needs the native extension")
def test_colliding_keys_cost_the_key_cache_bounded_work(native: ModuleType) -> None:
    """40,000 keys of one hash once took the native decoder ~5 s (every lookup walked every
    earlier key). The cache must look at a bounded number of slots per key, whatever the keys;
    it counts its work, so this is checked by counting, not timing."""
    keys = colliding_keys(40_000)
    assert len(set(keys)) == len(keys)
    text = "{" + ",".join(f'"{key}":{i}' for i, key in enumerate(keys)) + "}"
    lookups, probes, cached = native._key_cache_stats(text)
    assert lookups == len(keys)
    assert probes <= BOUND * lookups  # unbounded probing looks at ~20,000 slots per key here
    # The premise: these keys do collide in the cache, so it held only the few that fit near
    # their common home slot (else this proves nothing: if the cache's hash changed, make
    # colliding_keys follow it).
    assert cached <= BOUND, "the keys no longer collide under the cache's hash"
    assert native.decode(text) == {key: i for i, key in enumerate(keys)}


@pytest.mark.host_only("needs the native extension")
def test_the_key_cache_shares_ordinary_keys(native: ModuleType) -> None:
    text = native.encode(
        [{"role": "user", "content": [{"type": "text", "text": str(i)}]} for i in range(3000)]
    )
    lookups, probes, cached = native._key_cache_stats(text)
    assert cached == 4  # role, content, type, text
    assert probes <= lookups
    first, second = native.decode(text)[:2]
    assert next(iter(first)) is next(iter(second))


@pytest.mark.host_only("needs the native extension")
def test_small_texts_share_their_short_keys_from_call_to_call(native: ModuleType) -> None:
    """A token payload repeats the same few keys on every verify: a small text's short keys
    come from a table kept across calls, not a new str per key per call."""
    first = native.decode('{"approval_id":"a","input":{"path":"p"}}')
    second = native.decode('{"approval_id":"b","input":{"path":"q"}}')
    assert next(iter(first)) is next(iter(second))
    assert next(iter(first["input"])) is next(iter(second["input"]))


@pytest.mark.host_only("needs the native extension")
def test_the_shared_key_table_stays_exact_when_keys_clash(native: ModuleType) -> None:
    """The shared table is direct-mapped and far smaller than the keys here, so they clash and
    evict each other; every decode must still give exactly its own keys, in every length class
    the table holds (up to 16 bytes), colliding hashes included."""
    keys = [f"k{i}" for i in range(3000)] + colliding_keys(500) + ["", "a", "ab", "abc", "x" * 16]
    for round_ in range(2):
        for i in range(0, len(keys), 7):
            chunk = keys[i : i + 7]
            text = "{" + ",".join(f'"{key}":{j + round_}' for j, key in enumerate(chunk)) + "}"
            assert native.decode(text) == {key: j + round_ for j, key in enumerate(chunk)}
