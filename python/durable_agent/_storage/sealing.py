"""The one seam where a checkpoint store's rows are built and read back, sealed or not (encryption at rest).

Every persistent checkpoint store writes a run as a header row plus one row per message
(`history`), and builds those rows here, from a `RowSealer` it gets once from its `encryption`
option (`row_sealer`):

* `PLAINTEXT` (no keyring): the codec's text, as before; each method is the `history` call itself.
* `KeyringSealer` (``encryption=keyring``): the same text sealed into an envelope bound to the row's
  place (`durable_agent.encryption`): ``("checkpoint-message", run_id, seq)`` for message `seq`,
  ``("checkpoint-header", run_id, step_index)`` for the header saved at `step_index` (the run's
  latest header and its step-log entry hold the same envelope). A row copied to another run, another
  seq or another step does not open: `DecryptionError` naming the place.

So a backend writes and reads rows through its sealer and has no branch of its own on encryption.
What is sealed: each message (contents, tool inputs and outputs), the header (usage, pending
approvals and their tokens, agent path, trace context). What a backend keeps beside them in
plaintext, to index and list runs: the run id, status, step index, created_at, message count,
revision. A stored value that does not start with the envelope marker is read as plaintext: a
row written before encryption was turned on (the codec's text never starts with ``enc1``), so an
existing database keeps loading and can be rewritten under the keyring later (`durable_agent.encryption.rekey`).
With a strict keyring (``Keyring(..., strict=True)``) such a value is refused instead: `DecryptionError`
naming its place (`PLAINTEXT_REFUSED`), so after the rekey a plaintext row planted in the database does
not load silently.

Message rows are text envelopes, or binary ones (bytes) for a backend built with ``binary_messages``
(SQLite, whose TEXT columns keep bytes as BLOBs; `docs/encryption.md`); either form opens.

Two forms: text rows (`header_row`, `message_rows`, `rebuild`: SQL, Redis, Durable Object) and
value rows for a store that keeps messages as JSON values inside a bigger record (`header_value`,
`message_values`, `open_*`: JSONL). The text rows also come awaited (`header_row_async`...: the
same rows, at the same places, through the keyring's `seal_async`/`open_async`) for an async face
that must run where WebCrypto is the only AES-GCM: `AsyncDurableObjectCheckpointStore` in a Worker.

The SQL runtimes' journal and the endpoint's event logs store their payloads through the same sealer,
one value per column (`value`/`open_value` for a JSON value stored as codec text, `text`/`open_text`
for a raw string: a stream partial), each at a place their module names (the step journal's:
`durable_agent.backends._sql.journal`; the event log's: `durable_agent.http._sql`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._checkpoint import AgentCheckpoint
from .._errors import CheckpointCorruptError, CodecError, ConfigurationError, DecryptionError
from .._kernels import kernels
from .._messages import Message
from ..encryption import Keyring, Place
from ..encryption._envelope import marked
from ..encryption._rekey import PLAINTEXT_REFUSED
from .history import (
    decode_header,
    decode_message,
    decode_messages,
    encode_header,
    encode_messages,
    rebuild,
    rebuild_decoded,
)

HEADER = "checkpoint-header"
MESSAGE = "checkpoint-message"
NO_KEYRING = "it is encrypted, and was read without a keyring (open it with encryption=Keyring(...))"
SEALED = "sealed"  # the key of a value-form header's envelope (`KeyringSealer.header_value`)


class RowSealer:
    """The rows of a checkpoint store, in plaintext (`PLAINTEXT`); `KeyringSealer` seals them."""

    # -- text rows ---------------------------------------------------------------------------------

    def header_row(self, checkpoint: AgentCheckpoint) -> str:
        """The stored header of `checkpoint` (the checkpoint without its messages)."""
        return encode_header(checkpoint)

    def message_rows(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        """The stored rows of `messages[start:]`, message `start` first: codec texts, or envelopes (text, or bytes
        where the backend stores binary envelopes). Raises `CodecError`."""
        return encode_messages(messages, start)

    def rebuild(self, run_id: str, step_index: object, header: Any, bodies: Sequence[Any]) -> AgentCheckpoint:
        """The checkpoint stored as `header` (saved at `step_index`, as the row says) and message `bodies` 0, 1...

        Raises `CheckpointCorruptError` for damaged rows, `DecryptionError` for a sealed row that does not open
        (here, without a keyring: every sealed row, `NO_KEYRING`).
        """
        if _sealed(header):
            raise DecryptionError((HEADER, run_id), NO_KEYRING)
        return rebuild(run_id, header, bodies)

    def comparable(self, run_id: str, bodies: Sequence[Any]) -> Sequence[Any]:
        """`bodies` (message rows 0, 1...) as codec text to compare with a new history (`kept_by_encoding`);
        a row that cannot be read is None there (it differs from any message: the save replaces it)."""
        return bodies

    # -- text rows, awaited: the same rows through the keyring's `seal_async`/`open_async` -------------------
    #
    # For a store's async face (the Durable Object store's): they also run where WebCrypto is the only
    # AES-GCM (a Cloudflare Worker), and an envelope written by either pair is read by the other.

    async def header_row_async(self, checkpoint: AgentCheckpoint) -> str:
        """`header_row`, awaited."""
        return self.header_row(checkpoint)

    async def message_rows_async(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        """`message_rows`, awaited."""
        return self.message_rows(run_id, messages, start)

    async def rebuild_async(self, run_id: str, step_index: object, header: Any, bodies: Sequence[Any]) -> AgentCheckpoint:
        """`rebuild`, awaited."""
        return self.rebuild(run_id, step_index, header, bodies)

    async def comparable_async(self, run_id: str, bodies: Sequence[Any]) -> Sequence[Any]:
        """`comparable`, awaited."""
        return self.comparable(run_id, bodies)

    # -- value rows (a JSON record holding the header and messages as values) -------------------------

    def header_value(self, checkpoint: AgentCheckpoint) -> dict[str, Any]:
        """The stored header of `checkpoint` as a JSON object holding at least its status, step index and
        created_at in plaintext."""
        return checkpoint.to_dict(messages=False)

    def message_values(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        """The stored values of `messages[start:]`."""
        return list(messages[start:])

    def open_header(self, run_id: str, header: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint header a `header_value` holds (a sealed one, read here without a keyring: `NO_KEYRING`)."""
        if isinstance(header, dict) and SEALED in header:
            raise DecryptionError((HEADER, run_id), NO_KEYRING)
        return header

    def open_messages(self, run_id: str, values: list[Any]) -> list[Any]:
        """The messages `message_values` 0, 1... hold."""
        return values

    # -- journal values (a runtime's rows, an event log's): one column's value at a place --------------

    def value(self, value: Any, place: Place) -> str:
        """The stored text of a JSON `value` (a step's result, a queue, an event...) kept at `place`.
        Raises `CodecError` for a value the codec cannot encode."""
        text: str = kernels.encode(value)
        return text

    def open_value(self, stored: Any, place: Place) -> Any:
        """The value `value` stored at `place` as `stored`. Raises `CodecError`, `DecryptionError`."""
        if _sealed(stored):
            raise DecryptionError(tuple(place), NO_KEYRING)
        return kernels.decode(stored)

    def text(self, text: str, place: Place) -> str:
        """The stored form of a raw string (a stream partial's text) kept at `place`."""
        return text

    def open_text(self, stored: Any, place: Place) -> Any:
        """The string `text` stored at `place` as `stored`. Raises `DecryptionError`."""
        return stored


PLAINTEXT = RowSealer()


_sealed = marked  # a value with the marker is read as an envelope; one without, as plaintext (module docs)


class KeyringSealer(RowSealer):
    """`RowSealer` whose rows are envelopes of `keyring` (sealed with its primary key) bound to their place."""

    def __init__(self, keyring: Keyring, *, binary_messages: bool = False) -> None:
        self.keyring = keyring
        self.binary_messages = binary_messages

    def _open(self, value: Any, place: Place) -> Any:
        """The text `value` seals at `place`; a value that is not sealed is read as plaintext (module docs),
        or refused by a strict keyring."""
        if _sealed(value):
            return self.keyring.open(value, place)
        return self._plaintext(value, place)

    async def _open_async(self, value: Any, place: Place) -> Any:
        """`_open`, through the keyring's `open_async`."""
        if _sealed(value):
            return await self.keyring.open_async(value, place)
        return self._plaintext(value, place)

    def _plaintext(self, value: Any, place: Place) -> Any:
        """`value`, stored unsealed at `place`: `DecryptionError` when the keyring is strict."""
        if self.keyring.strict:
            raise DecryptionError(tuple(place), PLAINTEXT_REFUSED)
        return value

    def _open_header(self, run_id: str, step_index: object, header: Any) -> Any:
        return self._open(header, _header_place(run_id, step_index, header))

    def header_row(self, checkpoint: AgentCheckpoint) -> str:
        return self.keyring.seal(encode_header(checkpoint), (HEADER, checkpoint.run_id, checkpoint.step_index))

    def message_rows(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        seal, binary = self.keyring.seal, self.binary_messages
        return [seal(text, (MESSAGE, run_id, seq), binary=binary)
                for seq, text in enumerate(encode_messages(messages, start), start)]

    def _decode_series(self, values: Sequence[Any], run_id: str) -> list[Any]:
        """The messages of run `run_id`'s rows `values`, row ``seq`` at ``(MESSAGE, run_id, seq)``: opened and decoded
        in one native call when the keyring has one (`Keyring._decode_fast`), with `_open` and `decode_message` left
        to the rows that call does not take (so the same messages, plaintext rows and errors as one by one)."""
        place: Place = (MESSAGE, run_id)
        fast = self.keyring._decode_fast(values, place, 0)
        if fast is None:
            return decode_messages([self._open(value, (*place, seq)) for seq, value in enumerate(values)], run_id)
        decoded, misses = fast
        for seq in misses:
            decoded[seq] = decode_message(self._open(values[seq], (*place, seq)), run_id, seq)
        return decoded

    def rebuild(self, run_id: str, step_index: object, header: Any, bodies: Sequence[Any]) -> AgentCheckpoint:
        data = decode_header(self._open_header(run_id, step_index, header), run_id)
        return rebuild_decoded(run_id, data, self._decode_series(bodies, run_id))

    def comparable(self, run_id: str, bodies: Sequence[Any]) -> Sequence[Any]:
        texts: list[Any] = []
        for seq, body in enumerate(bodies):
            try:
                texts.append(self._open(body, (MESSAGE, run_id, seq)))
            except DecryptionError:
                texts.append(None)
        return texts

    async def header_row_async(self, checkpoint: AgentCheckpoint) -> str:
        place = (HEADER, checkpoint.run_id, checkpoint.step_index)
        return await self.keyring.seal_async(encode_header(checkpoint), place)

    async def message_rows_async(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        seal, binary = self.keyring.seal_async, self.binary_messages
        return [
            await seal(text, (MESSAGE, run_id, seq), binary=binary)
            for seq, text in enumerate(encode_messages(messages, start), start)
        ]

    async def rebuild_async(self, run_id: str, step_index: object, header: Any, bodies: Sequence[Any]) -> AgentCheckpoint:
        texts = [await self._open_async(body, (MESSAGE, run_id, seq)) for seq, body in enumerate(bodies)]
        opened = await self._open_async(header, _header_place(run_id, step_index, header))
        return rebuild(run_id, opened, texts)

    async def comparable_async(self, run_id: str, bodies: Sequence[Any]) -> Sequence[Any]:
        texts: list[Any] = []
        for seq, body in enumerate(bodies):
            try:
                texts.append(await self._open_async(body, (MESSAGE, run_id, seq)))
            except DecryptionError:
                texts.append(None)
        return texts

    def header_value(self, checkpoint: AgentCheckpoint) -> dict[str, Any]:
        return sealed_header(checkpoint.step_index, checkpoint.status, checkpoint.created_at, self.header_row(checkpoint))

    def message_values(self, run_id: str, messages: Sequence[Message], start: int = 0) -> list[Any]:
        return self.message_rows(run_id, messages, start)

    def open_header(self, run_id: str, header: dict[str, Any]) -> dict[str, Any]:
        if SEALED not in header:
            plain: dict[str, Any] = self._plaintext(header, (HEADER, run_id, header.get("step_index", "?")))
            return plain
        data = _decoded(self._open_header(run_id, header.get("step_index"), header[SEALED]), run_id, "header")
        if not isinstance(data, dict):
            raise CheckpointCorruptError(f"header is not an object ({type(data).__name__})", run_id=run_id)
        return data

    def value(self, value: Any, place: Place) -> str:
        return self.keyring.seal(kernels.encode(value), place)

    def open_value(self, stored: Any, place: Place) -> Any:
        return kernels.decode(self._open(stored, place))

    def text(self, text: str, place: Place) -> str:
        return self.keyring.seal(text, place)

    def open_text(self, stored: Any, place: Place) -> Any:
        return self._open(stored, place)

    def open_messages(self, run_id: str, values: list[Any]) -> list[Any]:
        sealed = [seq for seq, value in enumerate(values) if _sealed(value)]
        if len(sealed) < len(values) and self.keyring.strict:
            first = next(seq for seq, value in enumerate(values) if not _sealed(value))
            raise DecryptionError((MESSAGE, run_id, first), PLAINTEXT_REFUSED)
        if not sealed:
            return values
        if len(sealed) == len(values):
            return self._decode_series(values, run_id)
        texts = [self.keyring.open(values[seq], (MESSAGE, run_id, seq)) for seq in sealed]
        opened = list(values)
        for seq, message in zip(sealed, decode_messages(texts, run_id), strict=True):
            opened[seq] = message
        return opened


def _header_place(run_id: str, step_index: object, header: Any) -> Place:
    """Where the header `header`, saved at `step_index` as its row says, is sealed. A header row without an
    int step index (written before headers were sealed) is plaintext: its place names the run only."""
    if type(step_index) is int:
        return (HEADER, run_id, step_index)
    if not _sealed(header):
        return (HEADER, run_id)
    raise CheckpointCorruptError(f"the header's step index is {step_index!r}, not an int", run_id=run_id)


def sealed_header(step_index: int, status: str, created_at: int, envelope: str) -> dict[str, Any]:
    """The value form of a header (`KeyringSealer.header_value`): `envelope` (the header sealed) beside the
    plaintext fields an index reads."""
    return {"step_index": step_index, "status": status, "created_at": created_at, SEALED: envelope}


def _decoded(text: Any, run_id: str, what: str) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return kernels.decode(text)
    except CodecError as exc:
        raise CheckpointCorruptError(f"{what} cannot be decoded: {exc}", run_id=run_id) from None


def row_sealer(encryption: object, *, binary_messages: bool = False) -> RowSealer:
    """The sealer of a store's `encryption` option: `PLAINTEXT` for None, a `KeyringSealer` for a `Keyring`.
    `binary_messages`: seal the message rows into binary envelopes (bytes), for a backend whose message column
    keeps bytes (SQLite: `Dialect.binary_envelopes`); a text envelope already stored there still opens."""
    if encryption is None:
        return PLAINTEXT
    if not isinstance(encryption, Keyring):
        raise ConfigurationError(
            f"encryption must be a durable_agent.encryption.Keyring or None, not {type(encryption).__name__}"
        )
    return KeyringSealer(encryption, binary_messages=binary_messages)


DAMAGE = (CheckpointCorruptError, DecryptionError)
"""What a load raises for a run whose stored rows cannot be trusted: its store forgets the run (`PrefixCache.forgetting`)."""
