"""Preference pairs and unpaired completions of one chunk, from each side's whole conversation.

Each side (chosen and rejected, or the completion) goes through the SFT plan untruncated
(`build_examples`): the same rendering, tokenizing, reasoning and tools, so `prompt_ids +
chosen_ids` is the chosen conversation exactly as the template renders it. The prompt ends
after the header of the completion's first turn: the generation header that
`add_generation_prompt` renders. Rendered per turn, the two sides' prompts are the same ids
(checked: a pair whose are not is rejected as `prompt_renders_differently`); the token cache
gives a text repeated across the sides its ids once. The pair is then fitted into S as one
(`etl.pipeline.pair_truncation`) and written one row per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.arrow_values import from_numpy, list_lengths
from etl.kinds import PREFERENCE, UNPAIRED, kind_of
from etl.output.parquet import KIND_SCHEMAS
from etl.output.part_writer import PartWriter
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.pair_truncation import TOO_LONG, PairCut, PairLengths, PromptUnits, pair_policy
from etl.pipeline.resources import Resources
from etl.ragged import range_gather

PROMPT_DIFFERS = "prompt_renders_differently"
PROMPT_DIFFERS_DETAIL = ("the chosen and rejected conversations render their shared prompt as different ids; the "
                         "template renders an earlier turn by what follows it")


@dataclass(frozen=True)
class Sides:
    """The chunk's conversations as flat ids: chosen 0..n-1, then rejected n..2n-1 (pairs)."""

    ids: np.ndarray
    offsets: np.ndarray
    prompt: np.ndarray  # per conversation: tokens before its completion
    trained: np.ndarray  # per token: False inside a completion turn that is not the assistant's
    turns: np.ndarray  # per conversation: its turns
    n: int

    def lengths(self, paired: bool) -> PairLengths:
        total = np.diff(self.offsets)
        n = self.n
        rejected = total[n:] - self.prompt[n:] if paired else np.zeros(n, np.int64)
        return PairLengths(self.prompt[:n], total[:n] - self.prompt[:n], rejected)


def side_records(source_name: str, good: pa.Table, domain: pa.Array, split: pa.Array, *, paired: bool) -> pl.DataFrame:
    """One record per conversation: the chosen ones (or the completions), then the rejected ones."""
    cols = [c.SOURCE_LINE, "messages"] + [c.TOOLS] * (c.TOOLS in good.column_names)
    table = good.select(cols)
    if paired:
        rejected = good.select([c.SOURCE_LINE, "rejected"] + cols[2:]).rename_columns(cols)
        table = pa.concat_tables([table, rejected])
        domain, split = (pa.chunked_array([a, a]).combine_chunks() if isinstance(a, pa.Array)
                         else pa.chunked_array(a.chunks * 2).combine_chunks() for a in (domain, split))
    return records_frame(source_name, table, domain=domain, split=split)


def plan_sides(records: pl.DataFrame, completion_turns: np.ndarray, res: Resources, timings: Timings, *,
               paired: bool) -> tuple[Sides, pl.DataFrame]:
    """Every conversation through the SFT plan; where each one's prompt ends; its prompt turns.

    `completion_turns`: per conversation, how many of its last turns are the completion.
    """
    # Every turn kept: the pair is fitted into S afterwards (fit_pairs).
    examples, plan = build_examples(records, res, timings, truncate=False)
    ids = examples[c.INPUT_IDS].to_arrow()
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    offsets = np.concatenate(([0], np.cumsum(list_lengths(ids))))
    values = ids.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    k = pl.DataFrame({c.CONV: np.arange(len(completion_turns), dtype=np.uint32), "k": completion_turns})
    turns = (
        plan.select(c.CONV, c.TURN_INDEX, c.ROLE, c.START, c.END, c.HEADER_LEN, c.UNIT)
        .with_columns(pl.col(c.CONV).cast(pl.UInt32))
        .join(k, on=c.CONV, how="left", maintain_order="left")
        .with_columns((pl.len().over(c.CONV) - pl.col("k")).alias("first"))
    )
    starts = turns.filter(pl.col(c.TURN_INDEX) == pl.col("first"))
    prompt = (starts[c.START] + starts[c.HEADER_LEN]).to_numpy().astype(np.int64)
    # A tool result (any turn not the assistant's) inside a completion is context, not a target.
    trained = np.ones(len(values), bool)
    other = turns.filter((pl.col(c.TURN_INDEX) >= pl.col("first")) & (pl.col(c.ROLE) != "assistant"))
    at = offsets[other[c.CONV].to_numpy()] + other[c.START].to_numpy()
    trained[range_gather(at, (other[c.END] - other[c.START]).to_numpy())] = False
    n_turns = np.bincount(turns[c.CONV].to_numpy(), minlength=len(completion_turns)).astype(np.int32)
    n = len(completion_turns) // (2 if paired else 1)
    if paired:
        # A completion whose first token merges with the generation header's last (ChatML's "\n" +
        # content "\n...": `ĊĊ`, etl.pipeline.joins) takes that token: the pair's prompt is the part
        # both sides share, as TRL's common-prefix cut gives it.
        prompt = np.tile(np.minimum(prompt[:n], prompt[n:]), 2)
    sides = Sides(values, offsets, prompt, trained, n_turns, n)
    return sides, turns.filter(pl.col(c.TURN_INDEX) < pl.col("first"))


def prompts_differ(sides: Sides) -> np.ndarray:
    """Per pair: the chosen and the rejected conversation's prompts are not the same ids.

    Rendered per turn they always are, unless a template renders a turn by what follows it."""
    n, off, ids = sides.n, sides.offsets, sides.ids
    p, pr = sides.prompt[:n], sides.prompt[n:]
    same_len = p == pr
    length = np.where(same_len, p, 0)
    diff = ids[range_gather(off[:n], length)] != ids[range_gather(off[n : 2 * n], length)]
    pair = np.repeat(np.arange(n), length)
    return ~same_len | (np.bincount(pair[diff], minlength=n) > 0)


def prompt_units(prompt_turns: pl.DataFrame, n: int) -> PromptUnits:
    """The chosen conversations' droppable prompt turns: after the system head, before the last unit."""
    turns = prompt_turns.filter(pl.col(c.CONV) < n).with_columns(pl.col(c.UNIT).max().over(c.CONV).alias("last"))
    turns = turns.filter((pl.col(c.UNIT) >= 0) & (pl.col(c.UNIT) < pl.col("last")))
    return PromptUnits(turns[c.CONV].to_numpy().astype(np.int64), turns[c.UNIT].to_numpy(),
                       turns[c.START].to_numpy().astype(np.int64), (turns[c.END] - turns[c.START]).to_numpy())


def fit_pairs(sides: Sides, prompt_turns: pl.DataFrame, res: Resources, *, paired: bool) -> tuple[PairLengths, PairCut]:
    """The pairs' lengths, and what the run's truncation policy keeps of them."""
    lengths = sides.lengths(paired)
    policy = pair_policy(res.config.truncation)
    cut = policy(lengths, prompt_units(prompt_turns, sides.n), seq_len=res.config.seq_len, fit=res.config.pair_fit)
    return lengths, cut


def _lists(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> pa.ListArray:
    """values[starts[i] : starts[i] + lengths[i]] for each kept row, as one Arrow list column."""
    starts, lengths = starts[rows], lengths[rows]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    flat = values[range_gather(starts, lengths)]
    # Arrow's bools are bits: a numpy bool array is packed by pa.array (one vectorized copy).
    return pa.ListArray.from_arrays(from_numpy(offsets), pa.array(flat) if flat.dtype == bool else from_numpy(flat))


def token_columns(sides: Sides, lengths: PairLengths, cut: PairCut, rows: np.ndarray, *, paired: bool) -> dict[str, pa.Array]:
    """The ids and masks of the kept pairs `rows` (indices), cut as `cut` says."""
    n, off = sides.n, sides.offsets
    prompt_flat = range_gather(off[:n], lengths.prompt)[cut.prompt_keep]  # positions in sides.ids
    prompt_len = np.bincount(np.repeat(np.arange(n), lengths.prompt)[cut.prompt_keep], minlength=n)
    prompt_start = np.concatenate(([0], np.cumsum(prompt_len)[:-1]))
    columns = {c.PROMPT_IDS: _lists(sides.ids[prompt_flat], prompt_start, prompt_len, rows)}
    names = [(c.CHOSEN_IDS, c.CHOSEN_MASK, cut.chosen, 0)] if paired else [(c.COMPLETION_IDS, c.COMPLETION_MASK,
                                                                             cut.chosen, 0)]
    if paired:
        names.append((c.REJECTED_IDS, c.REJECTED_MASK, cut.rejected, n))
    for ids_name, mask_name, kept, first in names:
        start = off[first : first + n] + sides.prompt[first : first + n]
        columns[ids_name] = _lists(sides.ids, start, kept, rows)
        columns[mask_name] = _lists(sides.trained, start, kept, rows)
    return columns


def _trues(mask: pa.ListArray) -> np.ndarray:
    """Per list, how many of its values are true (int32): one pass over the flat bools."""
    flat = mask.flatten().to_numpy(zero_copy_only=False)
    offsets = np.asarray(mask.offsets)
    return np.add.reduceat(np.append(flat, False).astype(np.int32), offsets[:-1])[: len(mask)] * (
        np.diff(offsets) > 0)


def pair_table(records: pl.DataFrame, good: pa.Table, sides: Sides, lengths: PairLengths, cut: PairCut,
               rows: np.ndarray, *, paired: bool, seq_len: int, fit: str) -> pa.Table:
    """The `data` rows of the kept pairs `rows`, in the kind's schema."""
    take = from_numpy(rows.astype(np.int64))
    head = records.head(sides.n).select(c.ID, c.SOURCE_FILE, c.SOURCE_LINE, c.DOMAIN, c.SPLIT).to_arrow().take(take)
    tokens = token_columns(sides, lengths, cut, rows, paired=paired)
    prompt = np.asarray(list_lengths(tokens[c.PROMPT_IDS]), np.int32)
    chosen, rejected = cut.chosen[rows].astype(np.int32), cut.rejected[rows].astype(np.int32)
    numbers = {c.NUM_PROMPT_TOKENS: prompt, c.NUM_TOKENS: prompt + chosen + rejected,
               c.NUM_TURNS: sides.turns[: sides.n][rows], c.NUM_TURNS_DROPPED: cut.turns_dropped[rows]}
    if paired:
        numbers |= {c.NUM_CHOSEN_TOKENS: chosen, c.NUM_REJECTED_TOKENS: rejected}
        given = {name: good.column(name).take(take) for name in (c.SCORE_CHOSEN, c.SCORE_REJECTED)}
    else:
        numbers[c.NUM_COMPLETION_TOKENS] = chosen
        given = {c.LABEL: good.column(c.LABEL).take(take)}
    masks = [tokens[m] for m in (c.CHOSEN_MASK, c.REJECTED_MASK, c.COMPLETION_MASK) if m in tokens]
    numbers[c.NUM_TRAINED] = sum(_trues(m) for m in masks)
    truncated = pa.array(lengths.fit(fit)[rows] > seq_len)
    columns = {name: head.column(name) for name in head.column_names} | tokens | given | {
        name: from_numpy(np.ascontiguousarray(v, np.int32)) for name, v in numbers.items()} | {c.TRUNCATED: truncated}
    schema = KIND_SCHEMAS[PREFERENCE if paired else UNPAIRED]
    return pa.table([columns[f.name] for f in schema], schema=schema)


def _rejected_pairs(records: pl.DataFrame, good: pa.Table, bad: np.ndarray) -> pa.Table:
    """Rejects rows (without `source_file`) of the pairs whose two prompts differ."""
    where = from_numpy(np.flatnonzero(bad).astype(np.int64))
    n = len(where)
    return pa.table({
        c.SOURCE_LINE: good.column(c.SOURCE_LINE).take(where),
        c.REASON: pa.array([PROMPT_DIFFERS] * n, pa.string()),
        c.DETAIL: pa.array([PROMPT_DIFFERS_DETAIL] * n, pa.string()),
        c.RAW: pa.nulls(n, pa.string()),
    })


def write_pairs(source_name: str, good: pa.Table, domain: pa.Array, split: pa.Array, *, res: Resources,
                counts: Counts, parts: PartWriter, timings: Timings) -> pa.Table | None:
    """Plan, check, fit and write one chunk's good pairs (or unpaired completions); update the
    counts. Returns the rejects it found (for the caller to write with the file's name), or None."""
    paired = kind_of(res.config.input_type).paired
    k = good.column("completion_turns").to_numpy()
    if paired:
        k = np.concatenate([k, good.column("rejected_turns").to_numpy()])
    records = side_records(source_name, good, domain, split, paired=paired)
    sides, prompt_turns = plan_sides(records, k.astype(np.int64), res, timings, paired=paired)
    bad = prompts_differ(sides) if paired else np.zeros(sides.n, bool)
    lengths, cut = fit_pairs(sides, prompt_turns, res, paired=paired)
    counts.rejected[PROMPT_DIFFERS] += int(bad.sum())
    counts.dropped[TOO_LONG] += int((~cut.keep & ~bad).sum())
    rows = np.flatnonzero(cut.keep & ~bad)
    cfg = res.config
    table = pair_table(records, good, sides, lengths, cut, rows, paired=paired, seq_len=cfg.seq_len, fit=cfg.pair_fit)
    numbers = {name: table.column(name).to_numpy() for name in (c.NUM_TOKENS, c.NUM_PROMPT_TOKENS)}
    counts.written += table.num_rows
    counts.truncated += int(table.column(c.TRUNCATED).to_numpy(zero_copy_only=False).sum())
    counts.tokens += int(numbers[c.NUM_TOKENS].sum())
    counts.trained_tokens += int(table.column(c.NUM_TRAINED).to_numpy().sum())
    counts.over_shared += int((numbers[c.NUM_TOKENS] > cfg.seq_len).sum()) if paired else 0
    names = sorted(pc.unique(table.column(c.SPLIT)).to_pylist())
    for name in names:
        # One split (no val fraction): the chunk as it is, without a filter's copy.
        rows_of = table if len(names) == 1 else table.filter(pc.equal(table.column(c.SPLIT), name))
        parts.write(f"{c.DATA_DIR}/{name}", rows_of)
    return _rejected_pairs(records, good, bad) if bad.any() else None
