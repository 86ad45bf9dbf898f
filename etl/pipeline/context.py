"""What one `etl run` resolves once and carries through every chunk: config, tokenizer, template, counts."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from etl import __version__
from etl import columns as c
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.formats.registry import BUILDERS
from etl.ingest.preprocess import Deduplicator
from etl.ingest.reader import Source
from etl.output.ownership import OutputWriter
from etl.output.parquet import write_part
from etl.pipeline import stages as st
from etl.tokens.templates import TemplateIds, resolve_template
from etl.tokens.tokenizer import TextTokenizer, encode_template_text


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
    timings: Counter[str] = field(default_factory=Counter)
    warned_weights: bool = False
    output: OutputWriter | None = None
    _pool: ThreadPoolExecutor | None = None
    _pending: list[Future[None]] = field(default_factory=list)
    parts: Counter[str] = field(default_factory=Counter)
    # Records read per input file, for the warning that says how much of a damaged file was kept.
    read_per_file: Counter[str] = field(default_factory=Counter)
    incomplete: list[dict[str, Any]] = field(default_factory=list)

    def part_path(self, folder: str) -> Path:
        """The next part file of a folder of DST, numbered densely from part-00000 per folder,
        journaled (`OutputWriter.reserve`) before anything creates it.

        Dense numbering means `data/train/part-00000.parquet` exists whenever the split has
        rows, whichever chunk they came from.
        """
        number = self.parts[folder]
        self.parts[folder] += 1
        path = self.dst / folder / f"part-{number:05d}.parquet"
        return self.output.reserve(path) if self.output is not None else path

    @contextlib.contextmanager
    def writer(self) -> Iterator[None]:
        """Write parts on one background thread while the next chunk is parsed and tokenized.

        pyarrow releases the GIL while it encodes and compresses, so the write of chunk k
        overlaps the work on chunk k+1. At most one write is pending (bounded memory); leaving
        the block waits for it and re-raises its error.
        """
        with ThreadPoolExecutor(max_workers=1) as pool:
            self._pool = pool
            try:
                yield
            finally:
                self._pool = None
                for future in self._pending:
                    future.result()
                self._pending.clear()

    def _write_now(self, table: pa.Table, path: Path) -> None:
        write_part(table, path)
        if self.output is not None:
            self.output.add(path, rows=table.num_rows)

    def write(self, table: pa.Table, path: Path) -> None:
        """Write a part file (listed in the manifest), in the background inside `writer()`."""
        if self._pool is None:
            self._write_now(table, path)
            return
        while len(self._pending) > 1:  # keep memory bounded: wait for the older writes
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write_now, table, path))

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the block to `timings[stage]` (shown by `etl run --timings`)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[stage] += time.perf_counter() - started

    def timed_encode(self, texts: pa.Array) -> pa.LargeListArray:
        """The tokenizer's batched call, timed on its own (it runs inside the Polars plan); the
        tokenizer adds the part spent copying ids out of it as `tokenizer_ids`."""
        with self.timed("tokenizer"):
            return self.tokenizer.encode_texts(texts, timings=self.timings)

    @property
    def mask(self) -> st.MaskOptions:
        """Mask options with the template's default for training the assistant header."""
        if self.config.mask.train_header is not None:
            return self.config.mask
        return dataclasses.replace(
            self.config.mask, train_header=self.template.template.train_header
        )

    @property
    def weights(self) -> bool:
        """Per-message weights are written (`loss_weight`) when the input names a weight key."""
        return bool(self.config.input_options.get("weight_key"))


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
        raise EtlError(
            f"input type {config.input_type!r} is not one of {', '.join(sorted(BUILDERS))}"
        )
    from etl.tokens.hf_template import load_template_and_tokenizer

    template, tokenizer = load_template_and_tokenizer(config.template, tokenizer_spec=config.tokenizer)
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
        config=config,
        dst=dst,
        tokenizer=tokenizer,
        template=ids,
        system_ids=system_ids,
        con=duckdb.connect(),
        bos=bos,
        eos=eos,
    )


def manifest_for(ctx: Context, sources: list[Source], seconds: float) -> dict[str, Any]:
    tok = ctx.tokenizer
    return {
        "format_version": c.MANIFEST_FORMAT_VERSION,
        "etl_version": __version__,
        "config": ctx.config.to_json(),
        "inputs": [s.name for s in sources],
        "seq_len": ctx.config.seq_len,
        "tokenizer": {
            "name": tok.name,
            "path": tok.path,
            "sha256": tok.sha256,
            "vocab_size": tok.vocab_size,
        },
        "template": ctx.template.to_json(),
        "special_ids": ctx.template.special_ids,
        "pad_id": ctx.template.eot_id,
        "eot_id": ctx.template.eot_id,
        "bos_ids": ctx.bos,
        "eos_ids": ctx.eos,
        "default_system_ids": ctx.system_ids,
        "counts": ctx.counts.to_json(),
        "incomplete_inputs": ctx.incomplete,
    }
