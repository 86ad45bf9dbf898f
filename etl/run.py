"""`etl run`: stream every input file chunk by chunk through the pipeline and write DST.

Per chunk: parse + validate (DuckDB) -> plan turns (Polars lazy, collected once) ->
assemble token lists (numpy) -> write `data`, `turns`, `_rejects` parts. The manifest,
with the counts that must add up, is written last.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from etl import __version__
from etl import columns as c
from etl import stages as st
from etl.assemble import Assembled, assemble
from etl.builders import BUILDERS, run_builder
from etl.config import RunConfig
from etl.errors import EtlError
from etl.manifest import write_manifest
from etl.preprocess import Deduplicator, domains, record_keys, splits
from etl.progress import Progress
from etl.reader import Source, UnreadableFile, discover, read_chunks
from etl.templates import TemplateIds, get_template, resolve_template
from etl.tokenizer import TextTokenizer, encode_template_text, load_tokenizer
from etl.writer import (
    data_schema,
    REJECTS_SCHEMA,
    TURNS_SCHEMA,
    clear_previous_output,
    conform,
    write_part,
)

NO_TRAINED = "no_trained_tokens"
DUPLICATE = "duplicate"
DROP_PREFIX = "drop:"  # builder reasons that are drops (e.g. text too short), not rejects


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
            "dropped": {k: v for k, v in sorted(self.dropped.items()) if v},
            "rejected": {k: v for k, v in sorted(self.rejected.items()) if v},
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
    bos: list[int] = field(default_factory=list)
    eos: list[int] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    dedup: Deduplicator = field(default_factory=Deduplicator)
    parts: int = 0
    files: list[str] = field(default_factory=list)

    @property
    def mask(self) -> st.MaskOptions:
        """Mask options with the template's default for training the assistant header."""
        if self.config.mask.train_header is not None:
            return self.config.mask
        return dataclasses.replace(self.config.mask, train_header=self.template.template.train_header)

    @property
    def weights(self) -> bool:
        """Per-message weights are written (`loss_weight`) when the input names a weight key."""
        return "weight_key" in self.config.input_options


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
        pl.col(st.DROP_REASON).first(),
    )


def _examples(records: pl.DataFrame, plan: pl.DataFrame, built: Assembled, ctx: Context) -> pl.DataFrame:
    seq_len = ctx.config.seq_len
    bos_eos = len(ctx.bos) + len(ctx.eos)
    input_ids, loss_mask = built.list_arrays()
    columns = {
        st.CONV: pa.array(built.conv),
        c.INPUT_IDS: input_ids,
        c.LOSS_MASK: loss_mask,
        c.NUM_TOKENS: pa.array(np.diff(built.offsets).astype(np.int32)),
        c.NUM_TRAINED: pa.array(built.num_trained()),
    }
    if built.weight is not None:
        columns[c.LOSS_WEIGHT] = built.weight_array()
    tokens = pl.from_arrow(pa.table(columns))
    return (
        records.select(st.CONV, c.ID, c.SOURCE_FILE, c.SOURCE_LINE, c.DOMAIN, c.SPLIT)
        # left join: a conversation whose every turn was dropped (keep_prefix) has no tokens
        # but must still be counted with its drop reason
        .join(tokens, on=st.CONV, how="left", maintain_order="left")
        .with_columns(pl.col(c.NUM_TOKENS, c.NUM_TRAINED).fill_null(0))
        .join(_conversation_summary(plan, seq_len, bos_eos), on=st.CONV, how="left", maintain_order="left")
    )


def records_frame(
    source_name: str, good: pa.Table, *, domain: pa.Array | None = None, split: pa.Array | None = None
) -> pl.DataFrame:
    """Canonical per-conversation rows of one chunk: conv number, id, source, domain, split."""
    n = good.num_rows
    return (
        pl.from_arrow(good.select([c.SOURCE_LINE, "messages"]))
        .with_row_index(st.CONV)
        .with_columns(
            pl.lit(source_name).alias(c.SOURCE_FILE),
            pl.concat_str([pl.lit(source_name + ":"), pl.col(c.SOURCE_LINE).cast(pl.String)]).alias(c.ID),
            pl.Series(c.DOMAIN, domain if domain is not None else [c.DEFAULT_DOMAIN] * n, dtype=pl.String),
            pl.Series(c.SPLIT, split if split is not None else ["train"] * n, dtype=pl.String),
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
        mask=ctx.mask,
        seq_len=cfg.seq_len,
        bos_len=len(ctx.bos),
        eos_len=len(ctx.eos),
        truncation=cfg.truncation,
    ).collect()
    built = assemble(plan, bos_ids=ctx.bos, eos_ids=ctx.eos, weights=ctx.weights)
    return _examples(records, plan, built, ctx), plan


def _tally(counter: Counter[str], reasons: pa.Array | pa.ChunkedArray) -> None:
    """Add a column of reasons to a counter (value_counts in C, not a loop over rows)."""
    for item in pc.value_counts(reasons).to_pylist():
        counter[item["values"]] += item["counts"]


def _split_parsed(parsed: pa.Table, ctx: Context, source: Source, part: str) -> pa.Table:
    """Count and write rejects, count builder drops; return the good rows."""
    reason = parsed.column(c.REASON)
    is_drop = pc.fill_null(pc.starts_with(reason, DROP_PREFIX), False)
    bad = parsed.filter(pc.and_(reason.is_valid(), pc.invert(is_drop)))
    _tally(ctx.counts.dropped, pc.utf8_slice_codeunits(parsed.filter(is_drop).column(c.REASON), len(DROP_PREFIX)))
    if bad.num_rows:
        _tally(ctx.counts.rejected, bad.column(c.REASON))
        write_part(_rejects_table(source, bad), ctx.dst / c.REJECTS_DIR / part)
    return parsed.filter(reason.is_null())


def process_chunk(source: Source, raw: pa.Table, ctx: Context) -> None:
    """Parse, preprocess, plan, assemble and write one chunk of one file; update the counts."""
    cfg = ctx.config
    roles = [r for r in ctx.template.header if r != "text" or cfg.input_type == "text"]
    parsed = run_builder(ctx.con, raw, BUILDERS[cfg.input_type](roles=roles, **cfg.input_options))
    ctx.counts.read += parsed.num_rows
    part = f"part-{ctx.parts:05d}.parquet"
    ctx.parts += 1
    good = _split_parsed(parsed, ctx, source, part)
    if good.num_rows == 0:
        return
    keys, draws = record_keys(ctx.con, good, source=source.name, exact=cfg.dedup_mode == "exact", split_seed=cfg.split_seed)
    if cfg.deduplicate:
        fresh = ctx.dedup.keep(keys)
        ctx.counts.dropped[DUPLICATE] += int((~fresh).sum())
        good, draws = good.filter(pa.array(fresh)), draws[fresh]
        if good.num_rows == 0:
            return
    records = records_frame(source.name, good, domain=domains(good), split=splits(draws, cfg.val_fraction))
    examples, _plan = build_examples(records, ctx)
    dropped = examples.with_columns(
        pl.coalesce(pl.col(st.DROP_REASON), pl.when(pl.col(c.NUM_TRAINED) == 0).then(pl.lit(NO_TRAINED))).alias("why")
    )
    _tally(ctx.counts.dropped, dropped["why"].drop_nulls().to_arrow())
    _write_examples(dropped.filter(pl.col("why").is_null()), _plan, part, ctx)


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
        write_part(conform(examples.filter(pl.col(c.SPLIT) == split).to_arrow(), data_schema(weights=ctx.weights)), data_part)
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


def _extra_special(tokenizer: TextTokenizer, key: str, template_value: str) -> str:
    """The BOS/EOS string for `add_bos`/`add_eos`: the template's, else tokenizer_config's."""
    if template_value:
        return template_value
    value = getattr(tokenizer, "config", {}).get(f"{key}_token")
    value = value.get("content") if isinstance(value, dict) else value
    if not value:
        raise EtlError(
            f"preprocessing.add_{key} is set but neither the template nor the tokenizer's "
            f"tokenizer_config.json names a {key.upper()} token; unset add_{key} or use a tokenizer that has one"
        )
    return value


def build_context(config: RunConfig, dst: Path) -> Context:
    """Resolve tokenizer, template, BOS/EOS and the default system ids once per run."""
    if config.input_type not in BUILDERS:
        raise EtlError(f"input type {config.input_type!r} is not one of {', '.join(sorted(BUILDERS))}")
    template = get_template(config.template)
    tokenizer = load_tokenizer(config.tokenizer, special_tokens=template.special_tokens)
    ids = resolve_template(template, tokenizer)
    bos, eos = list(ids.bos), list(ids.eos)
    if config.add_bos and not bos:
        token = _extra_special(tokenizer, "bos", template.bos)
        bos = encode_template_text(tokenizer, token, [token])
    if config.add_eos and not eos:
        token = _extra_special(tokenizer, "eos", template.eos)
        eos = encode_template_text(tokenizer, token, [token])
    system_ids = None
    if config.default_system is not None and config.input_type != "text":
        system_ids = tokenizer.encode_texts(pa.array([config.default_system]))[0].as_py()
    return Context(
        config=config, dst=dst, tokenizer=tokenizer, template=ids, system_ids=system_ids,
        con=duckdb.connect(), bos=bos, eos=eos,
    )


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
        "bos_ids": ctx.bos,
        "eos_ids": ctx.eos,
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
            if config.max_items is not None and ctx.counts.read >= config.max_items:
                break
            try:
                for raw in read_chunks(source, chunk_bytes=config.chunk_bytes):
                    if config.max_items is not None:  # preprocessing.max_items: stop reading there
                        raw = raw.slice(0, max(config.max_items - ctx.counts.read, 0))
                        if raw.num_rows == 0:
                            break
                    process_chunk(source, raw, ctx)
                    bar.update(ctx.counts.read, ctx.counts.tokens)
            except UnreadableFile as exc:
                _reject_file(source, exc, ctx)
            bar.file_done(source.path.stat().st_size)
    counts = ctx.counts
    assert counts.read == counts.written + sum(counts.dropped.values()) + sum(counts.rejected.values())
    manifest = manifest_for(ctx, sources, time.perf_counter() - started)
    if config.storage_format != "parquet":
        manifest["storage"] = _export_storage(out, manifest, config)
    write_manifest(out, manifest)
    return manifest


def _export_storage(out: Path, manifest: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """seed 004 `output.storage_format`: per-domain bin/h5 next to the Parquet.

    train goes to DST/<domain>/ as the seed lays it out; val, when there is one, to
    DST/_val/<domain>/ (underscore-prefixed like `_rejects`, so no domain name can clash).
    """
    from etl.storage import export_storage

    written = {}
    for split, target in (("train", out), ("val", out / "_val")):
        if (out / c.DATA_DIR / split).is_dir():
            written[split] = export_storage(
                out, target, storage_format=config.storage_format, split=split,
                max_tokens_per_shard=config.max_tokens_per_shard, manifest=manifest,
            )
    return {"format": config.storage_format, "domains": written}
