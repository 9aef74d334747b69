"""What an interrupted run's records prove of the step it was in: the step closed from them (`healed_step`).

A run whose process died mid-step has a checkpoint at its last boundary and, for the step in flight, step records
(its model answer, its tool results: `done` or `failed`) and stream partials (the text its model call streamed).
`DurableSession` heals such a run from them, joins a resumed run's partials into an aborted turn, and counts what
a run stopped for good had paid; the endpoint rebuilds the events its readers missed from the same proofs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._checkpoint import AgentCheckpoint, Usage
from ._messages import Message
from ._storage.keys import MODEL_CALL, parse_step_key, step_key
from ._storage.records import StepRecord, StreamPartialRecord
from ._tool_calls import TOOL_INTERRUPTED_MESSAGE
from ._transcript import assistant_message, tool_message, unresolved_calls


def is_model_call(key: str, run_id: str, turn: int) -> bool:
    """True when `key` is an attempt (any) of the model call of `turn` in run `run_id`."""
    parts = parse_step_key(key)
    return parts.run == run_id and parts.turn == turn and parts.call == MODEL_CALL


def aborted_turn(run_id: str, turn: int, partials: Sequence[StreamPartialRecord],
                 records: Sequence[StepRecord]) -> Message | None:
    """The assistant turn the model call of `turn` leaves when it never finished: the text its latest attempt
    streamed before the process stopped (an earlier attempt failed: its own text was dropped with it). None when
    it streamed nothing, or an attempt finished (its answer is recorded)."""
    streamed = [p for p in partials if is_model_call(p.step_key, run_id, turn)]
    if not streamed or any(r.status == "done" and is_model_call(r.key, run_id, turn) for r in records):
        return None
    latest = max(parse_step_key(p.step_key).attempt for p in streamed)
    text = "".join(p.text for p in sorted(streamed, key=lambda p: p.seq) if parse_step_key(p.step_key).attempt == latest)
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def paid_in_step(run_id: str, turn: int, records: Sequence[StepRecord]) -> Usage:
    """What the recorded steps of `turn` were paid: its model answer's tokens and those its tool results carry (a
    sub-agent's, `durable_agent._tool_calls`), as the loop counts them once the step is checkpointed."""
    usage = Usage()
    for record in records:
        parts, result = parse_step_key(record.key), record.result
        if record.status != "done" or parts.run != run_id or parts.turn != turn or not isinstance(result, dict):
            continue
        if parts.call == MODEL_CALL or (result.get("type") == "tool-result" and result.get("tool_call_id") == parts.call):
            usage += Usage.from_dict(result.get("usage") or {})
    return usage


def healed_step(checkpoint: AgentCheckpoint, records: Sequence[StepRecord],
                partials: Sequence[StreamPartialRecord]) -> tuple[list[Message], Usage]:
    """The history and usage of an interrupted run with its step in flight closed from its records.

    The step's model answer, when its call finished, else the text the call streamed as an aborted
    turn (`aborted_turn`); then a result for each call the history leaves unanswered: its recorded
    one, or an interrupted marker. The usage counts what the step's records were paid (`paid_in_step`).
    """
    messages = list(checkpoint.messages)
    turn = checkpoint.step_index + 1
    usage = checkpoint.usage + paid_in_step(checkpoint.run_id, turn, records)
    done = {r.key: r.result for r in records if r.status == "done"}
    model_answer = next((r.result for r in records if r.status == "done"
                         and is_model_call(r.key, checkpoint.run_id, turn)), None)
    if model_answer is not None:  # the message the loop writes of it, reasoning and refusal included
        messages.append(assistant_message(model_answer["text"], model_answer["tool_calls"], (),
                                          model_answer.get("reasoning", ()), model_answer.get("refusal", "")))
    elif (aborted := aborted_turn(checkpoint.run_id, turn, partials, records)) is not None:
        messages.append(aborted)
    calls, _ = unresolved_calls(messages)
    if calls:
        answers = [
            done.get(step_key(checkpoint.run_id, turn, c["tool_call_id"]))
            or {"type": "tool-result", "tool_call_id": c["tool_call_id"], "tool_name": c["tool_name"],
                "output": TOOL_INTERRUPTED_MESSAGE, "is_error": True}
            for c in calls
        ]
        messages.append(tool_message(answers))
    return messages, usage
