"""TRL's own tokenization of preference pairs, and why etl's pairs differ from it where they do.

The reference is TRL's `DPOTrainer._prepare_dataset` itself, called unbound on a `datasets.Dataset`:
per pair it runs `apply_chat_template` three times (prompt with the generation header, prompt +
chosen, prompt + rejected), and cuts the prompt at the longest common token prefix. Where that cut
is shorter than the prompt rendered alone, TRL warns; etl's rule is the conversation's rendering
(`prompt_ids + chosen_ids` is the whole chosen conversation), so there the two differ, for one of
two reasons: the chat template renders the prompt alone differently from inside the conversation
(`template`), or tokens merge across the prompt/completion join when the whole string is tokenized
while etl tokenizes turn by turn (`bpe`). A diagnostic: Python loops per pair, TRL's speed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from etl import columns as c
from etl.errors import EtlError
from etl.formats.transcript import DEFAULT_MARKERS

# Per-pair verdicts: equal to TRL, or why not. `special_text`: content holds special-token text,
# which etl encodes as text on purpose (content is data) and TRL's tokenizer parses as control.
# `conversation`: TRL does not warn, and etl's ids of a whole conversation differ from
# apply_chat_template's: not a matter of pairs (check-template on the conversations shows it).
# `trl_error`: TRL's own preparation raises on the pair (TRL could not train on it as given).
EQUAL, TEMPLATE, BPE, SPECIAL_TEXT, CONVERSATION, TRL_ERROR, OTHER = (
    "equal", "template", "bpe", "special_text", "conversation", "trl_error", "other")
REASONS = (TEMPLATE, BPE, SPECIAL_TEXT, CONVERSATION, TRL_ERROR, OTHER)
REASON_TEXT = {
    TEMPLATE: "the prompt rendered alone differs from inside the conversation",
    BPE: "tokens merge across the prompt/completion join (whole-string tokenization vs etl's per-turn)",
    SPECIAL_TEXT: "content has special-token text: etl encodes it as text, TRL's tokenizer as control",
    CONVERSATION: "etl's ids of the whole conversation differ from apply_chat_template's (check-template "
                  "on the conversations shows why)",
    TRL_ERROR: "TRL's _prepare_dataset raises on the pair alone: TRL could not train on it as given",
    OTHER: "unexplained",
}
TRL_PATH = ("trl {version} DPOTrainer._prepare_dataset (extract_prompt for implicit pairs; prompt, "
            "prompt+chosen, prompt+rejected through apply_chat_template; cut at their common prefix)")
Pair = tuple[Sequence[int], Sequence[int], Sequence[int]]  # prompt_ids, chosen_ids, rejected_ids


def transcript_messages(text: str, markers: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """A transcript string (hh-rlhf's `"\\n\\nHuman: ...\\n\\nAssistant: ..."`) as a message list,
    cut exactly as etl's `transcript` builder cuts it: leftmost markers (longest first at one place),
    each content stripped by `str.strip()`, text before the first marker ignored.
    """
    marks = dict(DEFAULT_MARKERS if markers is None else markers)
    pattern = "(" + "|".join(re.escape(m) for m in sorted(marks, key=len, reverse=True)) + ")"
    pieces = re.split(pattern, text)
    return [{"role": marks[pieces[i]], "content": pieces[i + 1].strip()} for i in range(1, len(pieces), 2)]


def hh_record(record: Mapping[str, Any], markers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An hh-rlhf record (`chosen`/`rejected` transcripts) in TRL's implicit conversational form."""
    return {key: transcript_messages(record[key], markers) for key in ("chosen", "rejected")}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars from `datasets` and no TRL warning: the caller counts the warned pairs itself."""
    from datasets.utils import logging as ds_logging

    trl_logger = logging.getLogger("trl.trainer.dpo_trainer")
    level, bars = trl_logger.level, ds_logging.is_progress_bar_enabled()
    trl_logger.setLevel(logging.ERROR)
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        trl_logger.setLevel(level)
        if bars:
            ds_logging.enable_progress_bar()


def _with_tool_text(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Records with `tools` as JSON text (None where absent) in every one, when any has tools.

    `Dataset.from_list` takes its columns from the first record, and tool schemas of different
    shapes do not fit one Arrow type; TRL reads a string `tools` back with `json.loads`.
    """
    rows = [dict(r) for r in records]
    if any(r.get("tools") for r in rows):
        for r in rows:
            tools = r.get("tools")
            r["tools"] = tools if tools is None or isinstance(tools, str) else json.dumps(tools)
    return rows


def _uniform_keys(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Records whose messages all carry the same keys (None where a message has none).

    `Dataset.from_list` gives each column one struct type, so a key that only some messages of a
    column have (`tool_calls`, `reasoning_content`) becomes None in the others, and a column
    without it lacks it: the two sides' shared messages then differ as dicts and TRL's
    `extract_prompt` finds an empty prompt (an IndexError). transformers drops None keys when it
    renders, so the filled keys change no text.
    """
    rows = [dict(r) for r in records]
    sides = [k for k in ("prompt", "chosen", "rejected") if any(isinstance(r.get(k), list) for r in rows)]
    keys = sorted({key for r in rows for k in sides if isinstance(r.get(k), list) for m in r[k] for key in m})
    for r in rows:
        for k in sides:
            if isinstance(r.get(k), list):
                r[k] = [{key: m.get(key) for key in keys} for m in r[k]]
    return rows


def trl_rows(records: Sequence[Mapping[str, Any]], tokenizer: Any) -> list[dict[str, Any] | None]:
    """`trl_prepare`'s rows for `records`, None for a pair TRL's preparation raises on.

    One call for them all, or one per pair where a tool call is present (its `arguments` of
    different shapes would share one struct type, None-filled keys included) or the call for them
    all raised: slower (docs/design.md, Measured costs), and the pair TRL fails on is told apart.
    """
    records = _uniform_keys(records)
    calls = any(m.get("tool_calls") for r in records for k in ("prompt", "chosen", "rejected")
                if isinstance(r.get(k), list) for m in r[k])
    if not calls:
        with contextlib.suppress(Exception):  # TRL and datasets raise many kinds; retried one by one
            return trl_prepare(records, tokenizer).to_list()
    rows: list[dict[str, Any] | None] = []
    for record in records:
        try:
            rows.append(trl_prepare([record], tokenizer).to_list()[0])
        except EtlError:
            raise
        except Exception:  # noqa: BLE001 (TRL's own error on this pair: the pair's verdict)
            rows.append(None)
    return rows


def trl_prepare(records: Sequence[Mapping[str, Any]] | Any, tokenizer: Any, *, num_proc: int | None = None) -> Any:
    """TRL's `DPOTrainer._prepare_dataset` on preference records, called as the trainer calls it.

    No trainer is built (that needs a model): the method is called unbound with a stand-in `self`
    holding what it reads (`_tokenizer`, for the EOS of string pairs) and DPOConfig's fields it
    reads (`dataset_num_proc`, `max_length=None` so nothing is dropped, `truncation_mode`).
    Trade-off: the exact code TRL runs, at TRL's speed (docs/design.md, Measured costs).

    Args:
        records: TRL-format pairs (`chosen`, `rejected`, optional `prompt`, `tools`; strings or
            message lists; hh transcripts through `hh_record` first), or a `datasets.Dataset`.
        tokenizer: a transformers tokenizer (TRL's `processing_class`).
        num_proc: `DPOConfig.dataset_num_proc` (None: in this process).

    Returns:
        The `datasets.Dataset` TRL trains on: its input columns (prompt extracted) plus
        `prompt_ids`, `chosen_ids`, `rejected_ids`.
    """
    try:
        from datasets import Dataset
        from trl.trainer.dpo_trainer import DPOTrainer
    except ImportError as exc:
        raise EtlError(f"comparing preference pairs with TRL needs trl and datasets ({exc}); install them "
                       "with `pip install trl datasets` (or etl's `hf` extra)") from exc
    data = records if isinstance(records, Dataset) else Dataset.from_list(_with_tool_text(_uniform_keys(records)))
    self = SimpleNamespace(_tokenizer=tokenizer)
    args = SimpleNamespace(dataset_num_proc=num_proc, max_length=None, truncation_mode="keep_start")
    with _quiet():
        return DPOTrainer._prepare_dataset(self, data, tokenizer, args, "train")


def _render(tokenizer: Any, row: Mapping[str, Any]) -> tuple[list[int], str, tuple[str, str]]:
    """(prompt alone ids, prompt alone text, (prompt+chosen text, prompt+rejected text)) as TRL renders them."""
    prompt = row["prompt"]
    if isinstance(prompt, str):  # TRL's string pairs: plain text, chosen/rejected with its added EOS
        ids = list(tokenizer(text=prompt)["input_ids"])
        return ids, prompt, (prompt + row["chosen"], prompt + row["rejected"])
    tools = row.get("tools")
    kwargs = {"tools": json.loads(tools) if isinstance(tools, str) else tools} if tools else {}
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs)
    alone = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False, **kwargs)
    whole = tuple(tokenizer.apply_chat_template(prompt + row[k], tokenize=False, **kwargs) for k in ("chosen", "rejected"))
    return list(ids["input_ids"]), alone, whole  # type: ignore[return-value]


def _has_special_text(tokenizer: Any, row: Mapping[str, Any]) -> bool:
    """Whether any message content holds an added token's text (etl encodes it as text)."""
    specials = [t.content for t in tokenizer.added_tokens_decoder.values()]
    parts = [row[k] if isinstance(row[k], str) else [m.get("content") or "" for m in row[k]]
             for k in ("prompt", "chosen", "rejected")]
    texts = [t for p in parts for t in ([p] if isinstance(p, str) else p)]
    return any(s in t for t in texts for s in specials)


def classify(tokenizer: Any, row: Mapping[str, Any], ours: Pair) -> tuple[str, bool]:
    """Where etl's pair `ours` stands against TRL's row of `trl_prepare`: (`equal` or the reason they
    differ, whether TRL warned: its cut is shorter than the prompt rendered alone).

    `template` and `bpe` hold only where TRL warns and etl's prompt+completion is the same text as
    TRL's (the whole conversation, cut elsewhere or tokenized turn by turn): `template` when the
    prompt's text rendered alone is not a prefix of the conversation's, `bpe` when it is. Where
    TRL does not warn, its prompt+completion is apply_chat_template's whole conversation: etl's
    differs from it (`conversation`) or the pair is equal; anything else is `other`. Renders the
    prompt once more (the warning is not in TRL's output; its cost: docs/design.md, Measured costs).
    """
    alone_ids, alone, whole = _render(tokenizer, row)
    theirs = (row["prompt_ids"], row["chosen_ids"], row["rejected_ids"])
    warned = len(theirs[0]) < len(alone_ids)
    if all(list(a) == list(b) for a, b in zip(ours, theirs, strict=True)):
        return EQUAL, warned
    if _has_special_text(tokenizer, row):
        return SPECIAL_TEXT, warned
    if not warned:
        whole_differs = any([*ours[0], *ours[k]] != [*theirs[0], *theirs[k]] for k in (1, 2))
        return (CONVERSATION if whole_differs else OTHER), warned

    def text(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    if any(text([*ours[0], *ours[k]]) != text([*theirs[0], *theirs[k]]) for k in (1, 2)):
        return OTHER, warned
    return (BPE if all(w.startswith(alone) for w in whole) else TEMPLATE), warned


def pairs_by_line(table: Any) -> dict[int, Pair]:
    """etl's (prompt, chosen, rejected) ids by source line, from a table of pair rows. Python lists:
    the comparison with TRL's per-example rows is one pair at a time anyway (not a hot path)."""
    columns = [table.column(k).to_pylist() for k in (c.SOURCE_LINE, c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS)]
    return {line: tuple(triple) for line, *triple in zip(*columns, strict=True)}  # type: ignore[misc]


def compare(tokenizer: Any, trl_rows: Sequence[Mapping[str, Any]], ours: Sequence[Pair | None]) -> dict[str, Any]:
    """Counts over pairs: `pairs` (both sides), `equal`, `trl_warns`, `differ` by reason, `not_in_etl`
    (rows etl rejected or dropped: None in `ours`) and the first example of each reason (index).
    """
    counts: dict[str, Any] = {"pairs": 0, "equal": 0, "trl_warns": 0, "differ": dict.fromkeys(REASONS, 0),
                              "not_in_etl": 0, "examples": {}}
    for index, (row, pair) in enumerate(zip(trl_rows, ours, strict=True)):
        if pair is None:
            counts["not_in_etl"] += 1
            continue
        counts["pairs"] += 1
        verdict, warned = classify(tokenizer, row, pair)
        counts["trl_warns"] += warned
        if verdict == EQUAL:
            counts["equal"] += 1
            continue
        counts["differ"][verdict] += 1
        counts["examples"].setdefault(verdict, index)
    return counts
