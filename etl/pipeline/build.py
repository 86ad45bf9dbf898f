"""From per-conversation records to examples: plan the turns (Polars), assemble the tokens (numpy)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from etl import columns as c
from etl.pipeline import stages as st
from etl.pipeline.accounting import Timings
from etl.pipeline.assemble import Assembled, assemble
from etl.pipeline.image_read import IMAGE_DATA
from etl.pipeline.images import record_images
from etl.pipeline.resources import Resources


def records_frame(
    source_name: str,
    good: pa.Table,
    *,
    domain: pa.Array | None = None,
    split: pa.Array | None = None,
) -> pl.DataFrame:
    """Canonical per-conversation rows of one chunk: conv number, id, source, domain, split."""
    n = good.num_rows
    return (
        # The record's tool list when the template renders it (the builder's `tools` column).
        pl.from_arrow(good.select([c.SOURCE_LINE, "messages"] + [c.TOOLS] * (c.TOOLS in good.column_names)))
        .with_row_index(c.CONV)
        .with_columns(
            pl.lit(source_name).alias(c.SOURCE_FILE),
            pl.concat_str([pl.lit(source_name + ":"), pl.col(c.SOURCE_LINE).cast(pl.String)]).alias(
                c.ID
            ),
            pl.Series(
                c.DOMAIN, domain if domain is not None else [c.DEFAULT_DOMAIN] * n, dtype=pl.String
            ),
            pl.Series(c.SPLIT, split if split is not None else ["train"] * n, dtype=pl.String),
        )
        .with_columns(record_images(good) if IMAGE_DATA in good.column_names else [])
    )


def _conversation_summary(plan: pl.DataFrame, seq_len: int | None, bos_eos: int) -> pl.DataFrame:
    # Only the columns it reads: a group_by rechunks its frame, list columns of ids included.
    return (
        plan.select(c.CONV, c.KEPT, c.TURN_LEN, c.DROP_REASON)
        .group_by(c.CONV, maintain_order=True)
        .agg(
            pl.len().cast(pl.Int32).alias(c.NUM_TURNS),
            (~pl.col(c.KEPT)).sum().cast(pl.Int32).alias(c.NUM_TURNS_DROPPED),
            (((pl.col(c.TURN_LEN).sum() + bos_eos) > seq_len) if seq_len is not None else pl.lit(False))
            .alias(c.TRUNCATED),
            pl.col(c.DROP_REASON).first(),
        )
    )


def _token_lists(records: pl.DataFrame, built: Assembled) -> list[pl.Series]:
    """The token list columns (ids, mask, weights) aligned to `records`' rows.

    Every conversation usually has tokens, and then the assembled lists are the columns as
    they are (no copy of the ~14 MiB of ids of a 16 MiB chunk). A conversation whose every turn
    was dropped gets a null list, through a take that copies them once.
    """
    lists = dict(zip((c.INPUT_IDS, c.LOSS_MASK), built.list_arrays(), strict=True))
    if built.weight is not None:
        lists[c.LOSS_WEIGHT] = built.weight_array()
    if len(built.conv) != records.height:
        where = np.full(records.height, -1, dtype=np.int64)
        where[built.conv] = np.arange(len(built.conv))
        index = pa.array(where, mask=where < 0)
        lists = {name: arr.take(index) for name, arr in lists.items()}
    return [pl.Series(name, arr) for name, arr in lists.items()]


def _examples(
    records: pl.DataFrame, plan: pl.DataFrame, built: Assembled, res: Resources, *, truncate: bool
) -> pl.DataFrame:
    seq_len = res.config.seq_len if truncate else None
    bos_eos = len(res.bos) + len(res.eos)
    counts = pl.DataFrame({
        c.CONV: built.conv,
        c.NUM_TOKENS: np.diff(built.offsets).astype(np.int32),
        c.NUM_TRAINED: built.num_trained(),
    })
    # The joins move only per-conversation numbers; the token lists are put on afterwards,
    # in place (a join on them copied every id twice: ~30 MiB per 16 MiB chunk).
    return (
        records.select(c.CONV, c.ID, c.SOURCE_FILE, c.SOURCE_LINE, c.DOMAIN, c.SPLIT)
        # left join: a conversation whose every turn was dropped (keep_prefix) has no tokens
        # but must still be counted with its drop reason
        .join(counts, on=c.CONV, how="left", maintain_order="left")
        .with_columns(pl.col(c.NUM_TOKENS, c.NUM_TRAINED).fill_null(0))
        .join(
            _conversation_summary(plan, seq_len, bos_eos),
            on=c.CONV,
            how="left",
            maintain_order="left",
        )
        .with_columns(_token_lists(records, built))
    )


def build_examples(
    records: pl.DataFrame, res: Resources, timings: Timings | None = None, *, truncate: bool = True
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Examples (one row per conversation, all columns of `data`) and the per-turn plan.

    `truncate`: fit each conversation into S by the run's policy; False keeps every turn (a
    preference pair's sides: the pair stage fits the pair afterwards).

    Conversations with no trained token are still in the result (num_trained == 0); the
    caller drops them with a reason. `timings` gets the stages' wall seconds, the tokenizer's
    batched call on its own (it runs inside the Polars plan).
    """
    cfg = res.config
    timings = Timings() if timings is None else timings

    def encode(texts: pa.Array) -> pa.LargeListArray:
        return res.encoder.encode(texts, timings)  # times `tokenizer` and `token_cache` apart

    with timings.timed("tokenize_plan"):
        plan = st.plan_turns(
            records.lazy(),
            encode=encode,
            template=res.template,
            reasoning=res.reasoning,
            tools=res.template.tools,
            system_ids=res.system_ids,
            system_text=cfg.default_system,
            mask=res.mask,
            seq_len=cfg.seq_len if truncate else None,
            bos_len=len(res.bos),
            eos_len=len(res.eos),
            truncation=cfg.truncation,
            span=res.image_span,
            # A chunk fits in memory by design; Polars 2's default streaming engine spent more CPU
            # on this plan (docs/design.md, Measured costs) and calls `encode` just as once.
        ).collect(engine="in-memory")
    with timings.timed("assemble"):
        built = assemble(plan, bos_ids=res.bos, eos_ids=res.eos, system_ids=res.system_ids, weights=res.weights,
                         untrained=res.image_span.ids if res.image_span else ())
        # The per-turn ids are in `built` now; without them the plan is a few numbers per turn
        # (the caller joins and writes it as `turns`, which would copy them again).
        plan = plan.drop(c.HEADER_IDS, c.REASONING_IDS, c.CONTENT_IDS, c.CALLS_IDS, c.END_IDS, c.SEP_IDS, c.REASONING,
                         c.CALLS, c.TOOLS_TEXT)
        return _examples(records, plan, built, res, truncate=truncate), plan
