"""`etl run`: stream every input file chunk by chunk through the pipeline and write DST.

Per chunk: parse + validate (DuckDB) -> plan turns (Polars lazy, collected once) ->
assemble token lists (numpy) -> write `data`, `turns`, `_rejects` parts. The manifest,
with the counts that must add up, is written last.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from etl import __version__
from etl import columns as c
from etl import stages as st
from etl.assemble import Assembled, assemble
from etl.builders import BUILDERS, run_builder
from etl.config import RunConfig
from etl.errors import EtlError
from etl.manifest import write_manifest
from etl.progress import Progress
from etl.reader import Source, UnreadableFile, discover, read_chunks
from etl.templates import TemplateIds, get_template, resolve_template
from etl.tokenizer import TextTokenizer, load_tokenizer
from etl.writer import (
    DATA_SCHEMA,
    REJECTS_SCHEMA,
    TURNS_SCHEMA,
    clear_previous_output,
    conform,
    write_part,
)

NO_TRAINED = "no_trained_tokens"


@dataclass
class Counts:
    """Accounting of one run: read == written + sum(dropped) + sum(rejected)."""

    read: int = 0
    written: int = 0
    truncated: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "written": self.written,
            "truncated": self.truncated,
            "dropped": dict(sorted(self.dropped.items())),
            "rejected": dict(sorted(self.rejected.items())),
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
        }


@dataclass
class Context:
    """What every chunk needs: resolved config, tokenizer, template ids, a DuckDB connection."""

    config: RunConfig
    dst: Path
    tokenizer: TextTokenizer
    template: TemplateIds
    system_ids: list[int] | None
    con: duckdb.DuckDBPyConnection
    counts: Counts = field(default_factory=Counts)
    parts: int = 0
    files: list[str] = field(default_factory=list)


def _rejects_table(source: Source, table: pa.Table) -> pa.Table:
    n = table.num_rows
    return conform(
        table.append_column(c.SOURCE_FILE, pa.array([source.name] * n, pa.string())), REJECTS_SCHEMA
    )


def _conversation_summary(plan: pl.DataFrame, seq_len: int, bos_eos: int) -> pl.DataFrame:
    return plan.group_by(st.CONV, maintain_order=True).agg(
        pl.len().cast(pl.Int32).alias(c.NUM_TURNS),
        (~pl.col(c.KEPT)).sum().cast(pl.Int32).alias(c.NUM_TURNS_DROPPED),
        ((pl.col(st.TURN_LEN).sum() + bos_eos) > seq_len).alias(c.TRUNCATED),
    )


def _examples(records: pl.DataFrame, plan: pl.DataFrame, built: Assembled, ctx: Context) -> pl.DataFrame:
    seq_len = ctx.config.seq_len
    bos_eos = len(ctx.template.bos) + len(ctx.template.eos)
    input_ids, loss_mask = built.list_arrays()
    tokens = pl.from_arrow(
        pa.table(
            {
                st.CONV: pa.array(built.conv),
                c.INPUT_IDS: input_ids,
                c.LOSS_MASK: loss_mask,
                c.NUM_TOKENS: pa.array(np.diff(built.offsets).astype(np.int32)),
                c.NUM_TRAINED: pa.array(built.num_trained()),
            }
        )
    )
    return (
        records.select(st.CONV, c.ID, c.SOURCE_FILE, c.SOURCE_LINE, c.DOMAIN, c.SPLIT)
        .join(tokens, on=st.CONV, how="inner", maintain_order="left")
        .join(_conversation_summary(plan, seq_len, bos_eos), on=st.CONV, how="left", maintain_order="left")
    )


def records_frame(source_name: str, good: pa.Table) -> pl.DataFrame:
    """Canonical per-conversation rows of one chunk: conv number, id, source, domain, split."""
    return (
        pl.from_arrow(good.select([c.SOURCE_LINE, "messages"]))
        .with_row_index(st.CONV)
        .with_columns(
            pl.lit(source_name).alias(c.SOURCE_FILE),
            pl.concat_str([pl.lit(source_name + ":"), pl.col(c.SOURCE_LINE).cast(pl.String)]).alias(c.ID),
            pl.lit(c.DEFAULT_DOMAIN).alias(c.DOMAIN),
            pl.lit("train").alias(c.SPLIT),
        )
    )


def build_examples(records: pl.DataFrame, ctx: Context) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Examples (one row per conversation, all columns of `data`) and the per-turn plan.

    Conversations with no trained token are still in the result (num_trained == 0); the
    caller drops them with a reason.
    """
    cfg = ctx.config
    plan = st.plan_turns(
        records.lazy(),
        encode=ctx.tokenizer.encode_texts,
        role_table=ctx.template.role_table(),
        system_ids=ctx.system_ids,
        mask=cfg.mask,
        seq_len=cfg.seq_len,
        bos_len=len(ctx.template.bos),
        eos_len=len(ctx.template.eos),
    ).collect()
    built = assemble(plan, bos_ids=ctx.template.bos, eos_ids=ctx.template.eos)
    return _examples(records, plan, built, ctx), plan


def process_chunk(source: Source, raw: pa.Table, ctx: Context) -> None:
    """Parse, plan, assemble and write one chunk of one file; update the counts."""
    cfg = ctx.config
    query = BUILDERS[cfg.input_type](roles=list(ctx.template.header), messages_key=cfg.messages_key)
    parsed = run_builder(ctx.con, raw, query)
    ctx.counts.read += parsed.num_rows
    bad = parsed.filter(parsed.column(c.REASON).is_valid())
    good = parsed.filter(parsed.column(c.REASON).is_null())
    part = f"part-{ctx.parts:05d}.parquet"
    ctx.parts += 1
    if bad.num_rows:
        ctx.counts.rejected.update(bad.column(c.REASON).to_pylist())
        write_part(_rejects_table(source, bad), ctx.dst / c.REJECTS_DIR / part)
    if good.num_rows == 0:
        return
    records = records_frame(source.name, good)
    examples, plan = build_examples(records, ctx)
    ctx.counts.dropped[NO_TRAINED] += int((examples[c.NUM_TRAINED] == 0).sum())
    _write_examples(examples.filter(pl.col(c.NUM_TRAINED) > 0), plan, part, ctx)


def _write_examples(examples: pl.DataFrame, plan: pl.DataFrame, part: str, ctx: Context) -> None:
    counts = ctx.counts
    counts.written += examples.height
    counts.truncated += int(examples[c.TRUNCATED].sum())
    counts.tokens += int(examples[c.NUM_TOKENS].sum())
    counts.trained_tokens += int(examples[c.NUM_TRAINED].sum())
    turns = plan.join(examples.select(st.CONV, c.ID, c.SPLIT), on=st.CONV, how="inner", maintain_order="left")
    turns = turns.with_columns(pl.col(st.TURN_LEN).alias(c.NUM_TOKENS))
    for split in sorted(examples[c.SPLIT].unique().to_list()):
        data_part = ctx.dst / c.DATA_DIR / split / part
        write_part(conform(examples.filter(pl.col(c.SPLIT) == split).to_arrow(), DATA_SCHEMA), data_part)
        turns_part = ctx.dst / c.TURNS_DIR / split / part
        write_part(conform(turns.filter(pl.col(c.SPLIT) == split).to_arrow(), TURNS_SCHEMA), turns_part)
        ctx.files += [str(data_part.relative_to(ctx.dst)), str(turns_part.relative_to(ctx.dst))]


def _reject_file(source: Source, exc: UnreadableFile, ctx: Context) -> None:
    """A file that cannot be parsed at all counts as one rejected record (line -1)."""
    ctx.counts.read += 1
    ctx.counts.rejected["unreadable_file"] += 1
    table = pa.table(
        {
            c.SOURCE_LINE: pa.array([-1], pa.int64()),
            c.REASON: ["unreadable_file"],
            c.DETAIL: [str(exc)],
            c.RAW: [None],
        }
    )
    write_part(_rejects_table(source, table), ctx.dst / c.REJECTS_DIR / f"part-{ctx.parts:05d}.parquet")
    ctx.parts += 1


def build_context(config: RunConfig, dst: Path) -> Context:
    """Resolve tokenizer and template once per run."""
    if config.input_type not in BUILDERS:
        raise EtlError(f"input type {config.input_type!r} is not one of {', '.join(sorted(BUILDERS))}")
    template = get_template(config.template)
    tokenizer = load_tokenizer(config.tokenizer, special_tokens=template.special_tokens)
    ids = resolve_template(template, tokenizer)
    system_ids = None
    if config.default_system is not None:
        system_ids = tokenizer.encode_texts(pa.array([config.default_system]))[0].as_py()
    return Context(config=config, dst=dst, tokenizer=tokenizer, template=ids, system_ids=system_ids, con=duckdb.connect())


def manifest_for(ctx: Context, sources: list[Source], seconds: float) -> dict[str, Any]:
    tok = ctx.tokenizer
    return {
        "format_version": 1,
        "etl_version": __version__,
        "config": ctx.config.to_json(),
        "inputs": [s.name for s in sources],
        "seq_len": ctx.config.seq_len,
        "tokenizer": {"name": tok.name, "path": tok.path, "sha256": tok.sha256, "vocab_size": tok.vocab_size},
        "template": ctx.template.to_json(),
        "special_ids": ctx.template.special_ids,
        "pad_id": ctx.template.eot_id,
        "eot_id": ctx.template.eot_id,
        "bos_ids": ctx.template.bos,
        "eos_ids": ctx.template.eos,
        "default_system_ids": ctx.system_ids,
        "counts": ctx.counts.to_json(),
        "files": sorted(ctx.files),
    }


def run(src: str, dst: str, config: RunConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the whole pipeline from SRC to DST; returns the manifest it wrote."""
    sources = discover(src)
    out = Path(dst)
    ctx = build_context(config, out)
    out.mkdir(parents=True, exist_ok=True)
    clear_previous_output(out)
    started = time.perf_counter()
    with Progress(total_bytes=sum(s.path.stat().st_size for s in sources), enabled=progress) as bar:
        for source in sources:
            try:
                for raw in read_chunks(source, chunk_bytes=config.chunk_bytes):
                    process_chunk(source, raw, ctx)
                    bar.update(ctx.counts.read, ctx.counts.tokens)
            except UnreadableFile as exc:
                _reject_file(source, exc, ctx)
            bar.file_done(source.path.stat().st_size)
    counts = ctx.counts
    assert counts.read == counts.written + sum(counts.dropped.values()) + sum(counts.rejected.values())
    manifest = manifest_for(ctx, sources, time.perf_counter() - started)
    write_manifest(out, manifest)
    return manifest
