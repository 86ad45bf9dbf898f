"""Content tokenized with the template text that touches it (`etl.tokens.joins`), in one batched call.

`run_texts` builds each turn's text run (lead + content, edge-stripped as the tokenizer or the
template strips it, + trail); `split_runs` cuts the run's ids back into the lead's, the content's
and the trail's with a few numpy passes over the rows (one per lead/trail token, W <= ~6).
Where a token straddles a join (ChatML's `assistant\\n` + content `\\n...` gives `ĊĊ`), it goes to
the content and the header (or the think block) loses its last token: the header's `trim`. So the
turn's ids are the run's, exactly, and the straddling token trains with the content, as
transformers' assistant mask (`char_to_token` of the content's first character) marks it.
Cost: the lead's few bytes per turn more to tokenize (`assistant\\n`: 10), and one copy of the
content ids (a range gather; docs/design.md, Measured costs).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from etl.arrow_values import list_offsets, numbers_of
from etl.columns import CALLS, CONTENT, IMAGE_AT, REASONING
from etl.ragged import range_gather
from etl.tokens.joins import Join
from etl.tokens.templates import TemplateIds
from etl.tokens.tokenizer import offsets_to_list_array
from etl.tokens.tokenizer_json import read_added_tokens

JOIN_KEY = "join_key"  # role table row of the turn, or len(joins) for a content after a think block
LEAD_TRIM, TRAIL_TRIM = "lead_trim", "trail_trim"  # tokens the straddles take from the header / end


def join_list(ids: TemplateIds) -> list[tuple[Join, Join]]:
    """Every (lead, trail) a turn may take, indexed by `JOIN_KEY`: the role table's rows, then the
    think block's lead, with no trail (the templates that write think blocks, Qwen3's, end an
    assistant content with a control token)."""
    return [*ids.joins, (ids.reasoning_join, Join())]


def join_key(role_number: pl.Expr, ids: TemplateIds) -> pl.Expr:
    """`JOIN_KEY` of each turn from its role table row (`etl.pipeline.stages._attach_template`)."""
    return pl.when(pl.col(REASONING).is_not_null()).then(pl.lit(len(ids.joins), pl.UInt32)).otherwise(role_number)


def _stripped(content: pl.Expr, key: pl.Expr, joins: list[Join], *, start: bool) -> pl.Expr:
    """`content` with each turn's edge characters stripped (a when/then per distinct set: 1-2)."""
    out = content
    for chars in sorted({j.strip for j in joins} - {""}):
        rows = [i for i, j in enumerate(joins) if j.strip == chars]
        strip = content.str.strip_chars_start(chars) if start else content.str.strip_chars_end(chars)
        out = pl.when(key.is_in(rows)).then(strip).otherwise(out)
    return out


def run_texts(key: pl.Expr, ids: TemplateIds) -> pl.Expr:
    """Each turn's text run: lead + content (edges stripped) + trail."""
    joins = join_list(ids)
    leads, trails = [lead for lead, _ in joins], [trail for _, trail in joins]
    content = _stripped(_stripped(pl.col(CONTENT), key, leads, start=True), key, trails, start=False)
    if not any(j.text for j in leads + trails):
        return content
    lead = pl.lit(pl.Series([j.text for j in leads], dtype=pl.String)).gather(key)
    trail = pl.lit(pl.Series([j.text for j in trails], dtype=pl.String)).gather(key)
    return pl.concat_str([lead, content, trail])


def run_offsets(key: pl.Expr, ids: TemplateIds) -> pl.Expr:
    """Each turn's image offsets (`IMAGE_AT`, into its content) as offsets into its text run: after
    the lead, less the characters stripped off the content's start."""
    leads = [lead for lead, _ in join_list(ids)]
    stripped = _stripped(pl.col(CONTENT), key, leads, start=True)
    lead_len = pl.lit(pl.Series([len(j.text) for j in leads], dtype=pl.Int32)).gather(key)
    shift = lead_len - (pl.col(CONTENT).str.len_chars() - stripped.str.len_chars()).cast(pl.Int32)
    return pl.col(IMAGE_AT) + shift


def _table(ids: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(K, W) ids padded with -1 and (K,) lengths."""
    table = np.full((len(ids), max(max(map(len, ids), default=0), 1)), -1, np.int64)
    for i, row in enumerate(ids):
        table[i, : len(row)] = row
    return table, np.asarray([len(row) for row in ids], np.int64)


def _common(values: np.ndarray, at: np.ndarray, room: np.ndarray, want: np.ndarray, want_len: np.ndarray,
            *, step: int) -> np.ndarray:
    """Per row, how many ids from `at` on (stepping by `step`, at most `room`) equal `want`'s first."""
    k = np.zeros(len(at), np.int64)
    alive = np.ones(len(at), bool)
    for j in range(want.shape[1]):  # a pass per lead/trail token, over all rows at once
        alive &= (j < want_len) & (j < room)
        if not alive.any():
            break
        alive &= values[np.where(alive, at + step * j, 0)] == want[:, j]
        k += alive
    return k


def split_runs(runs: pa.LargeListArray, key: np.ndarray, ids: TemplateIds
               ) -> tuple[pa.LargeListArray, np.ndarray, np.ndarray]:
    """(content ids, lead trim, trail trim) of each turn from its run's ids (`key`: `JOIN_KEY`).

    The lead's ids lead the run unless a token straddles the join: then the run's first k ids
    are the lead's first k, and the lead piece is trimmed by len(lead) - k (likewise the trail,
    compared backwards from the run's end).
    """
    joins = join_list(ids)
    lead, lead_len = (a[key] for a in _table([lead.ids for lead, _ in joins]))
    trail, trail_len = (a[key] for a in _table([trail.ids[::-1] for _, trail in joins]))
    offsets = list_offsets(runs).astype(np.int64, copy=False)
    values = numbers_of(runs.values, np.int32)  # ids: int32 (`TextTokenizer.encode_texts`)
    starts, lengths = offsets[:-1], np.diff(offsets)
    k = _common(values, starts, lengths, lead, lead_len, step=1)
    m = _common(values, offsets[1:] - 1, lengths - k, trail, trail_len, step=-1)
    if not (k.any() or m.any()):
        return runs, lead_len - k, trail_len - m
    keep = lengths - k - m
    new = np.zeros(len(keep) + 1, np.int64)
    np.cumsum(keep, out=new[1:])
    return offsets_to_list_array(values[range_gather(starts + k, keep)], new), lead_len - k, trail_len - m


def control_texts(tokenizer: object) -> list[str]:
    """The strings a template may use as control tokens: every added token of a tokenizer.json (special
    or not: etl encodes all of them as text in content), the registered specials of `bytes`."""
    path = getattr(tokenizer, "path", None)
    return list(_added(path)) if path else list(getattr(tokenizer, "_special", {}))


@functools.cache
def _added(path: str) -> tuple[str, ...]:  # once per process (docs/design.md, Measured costs)
    return tuple(t["content"] for t in read_added_tokens(Path(path).read_text("utf-8")))


def spells_control(records: pl.DataFrame, texts: list[str]) -> pl.Series:
    """Per record, whether a message's text spells a control token (`control_texts`): etl tokenizes
    it as text, apply_chat_template as the token, so the example's ids differ from the template's
    on purpose (content is data). One Aho-Corasick pass over the messages' text."""
    if not texts:
        return pl.Series(np.zeros(records.height, bool))
    fields = {f.name for f in records.schema["messages"].inner.fields}  # type: ignore[attr-defined]
    parts = [pl.element().struct.field(f).cast(pl.String) for f in (CONTENT, REASONING) if f in fields]
    if CALLS in fields:
        parts.append(pl.element().struct.field(CALLS).cast(pl.List(pl.String)).list.join(""))
    text = pl.concat_str(parts, ignore_nulls=True)
    hit = pl.col("messages").list.eval(text.str.contains_any(texts)).list.any().fill_null(False)
    return records.select(hit.alias("spells"))["spells"]
