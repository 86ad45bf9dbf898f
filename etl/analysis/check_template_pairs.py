"""`etl check-template --input-type preference`: etl's pairs against TRL's own tokenization.

Each chunk's pairs go through etl's pair stage in memory (`write_pairs`, its parts collected
instead of written) and through TRL's `DPOTrainer._prepare_dataset` (`etl.analysis.trl_pairs`) on
the same conversations as etl's builder read them (hh transcripts cut by the transcript parser, the
run's default system message inserted where etl inserts it). A pair is equal when its prompt,
chosen and rejected ids all are; otherwise it is counted by the reason `trl_pairs.classify` finds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np
import pyarrow as pa

from etl import columns as c
from etl.analysis.check_template import NO_TRUNCATION, CheckReport, TemplateReference, good_rows
from etl.analysis.reference import conversation, tools_column
from etl.analysis.trl_pairs import (
    EQUAL,
    REASONS,
    TRL_ERROR,
    TRL_PATH,
    Pair,
    classify,
    pairs_by_line,
    trl_rows,
)
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.ingest.discover import UnreadableFile, discover
from etl.ingest.preprocess import domains, splits
from etl.ingest.reader import read_chunks
from etl.kinds import PREFERENCE
from etl.pipeline.accounting import Counts, Timings
from etl.pipeline.pairs import write_pairs
from etl.pipeline.resources import Resources, build_resources

TRIPLE = (c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS)


@dataclass
class PairCheckReport:
    """Counts over the pairs checked: `equal` to TRL's tokenization, `differ` by reason, `trl_warns`
    (pairs whose TRL cut is shorter than the prompt rendered alone); `rejected` as `CheckReport`'s."""

    template: str
    tokenizer: str
    reference: str
    input_type: str = PREFERENCE
    kind: str = PREFERENCE
    examples: int = 0
    equal: int = 0
    trl_warns: int = 0
    differ: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    rejected: dict[str, int] = field(default_factory=dict)
    record_keys: list[str] = field(default_factory=list)
    first_diff: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["share_equal"] = self.equal / max(self.examples, 1)
        return out


class _Collect:
    """A `PartWriter` stand-in: keeps the `data` tables the pair stage writes."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def write(self, name: str, table: pa.Table) -> None:
        if name.startswith(c.DATA_DIR):
            self.tables.append(table)


def _etl_pairs(source_name: str, good: pa.Table, ctx: Resources, report: PairCheckReport) -> dict[int, Pair]:
    """etl's (prompt, chosen, rejected) ids per source line; its own rejects counted."""
    parts, counts = _Collect(), Counts()
    write_pairs(source_name, good, domains(good), splits(np.zeros(good.num_rows), 0.0), res=ctx, counts=counts,
                parts=parts, timings=Timings())  # type: ignore[arg-type]
    for reason, n in (counts.rejected + counts.dropped).items():
        report.rejected[reason] = report.rejected.get(reason, 0) + n
    out: dict[int, Pair] = {}
    for table in parts.tables:
        out |= pairs_by_line(table)
    return out


def _trl_records(good: pa.Table, default_system: str | None) -> list[dict[str, Any]]:
    """The pairs as TRL's implicit conversational records, with etl's default system message."""
    records = []
    for chosen, rejected, tools in zip(good.column("messages").to_pylist(), good.column("rejected").to_pylist(),
                                       tools_column(good), strict=True):
        sides = [conversation(messages, tools) for messages in (chosen, rejected)]
        for side in sides:
            if default_system is not None and side.messages[0]["role"] != "system":
                side.messages.insert(0, {"role": "system", "content": default_system})
        record: dict[str, Any] = {"chosen": sides[0].messages, "rejected": sides[1].messages}
        records.append(record | ({"tools": sides[0].tools} if sides[0].tools else {}))
    return records


def _compare_chunk(source_name: str, good: pa.Table, ctx: Resources, ref: TemplateReference, report: PairCheckReport) -> None:
    ours = _etl_pairs(source_name, good, ctx, report)
    tokenizer = ref.renderer.tokenizer  # type: ignore[attr-defined]
    rows = trl_rows(_trl_records(good, ctx.config.default_system), tokenizer)
    for line, row in zip(good.column(c.SOURCE_LINE).to_pylist(), rows, strict=True):
        pair = ours.get(line)
        if pair is None:
            continue
        report.examples += 1
        if row is None:
            report.differ[TRL_ERROR] += 1
            continue
        verdict, warned = classify(tokenizer, row, pair)
        report.trl_warns += warned
        if verdict == EQUAL:
            report.equal += 1
            continue
        report.differ[verdict] += 1
        if report.first_diff is None:
            part = next(k for k, name in enumerate(TRIPLE) if list(pair[k]) != list(row[name]))
            diff = ref.diff(f"{source_name}:{line}", list(pair[part]), list(row[TRIPLE[part]]))
            report.first_diff = {**dataclasses.asdict(diff), "reason": verdict, "part": TRIPLE[part]}


def check_pairs(src: str, config: RunConfig, *, limit: int | None = None) -> PairCheckReport:
    """Compare etl's preference pairs on SRC with TRL's `_prepare_dataset` on the same pairs.

    Trade-off: TRL's own code, at its speed (docs/design.md, Measured costs), plus one more render
    per pair to tell whether TRL warned. Nothing is truncated (`seq_len` raised, as for conversations).

    Raises:
        EtlError: transformers or trl is not installed (the reference is TRL itself).
    """
    config = config.replace(seq_len=NO_TRUNCATION)
    ctx = build_resources(config)
    ref = TemplateReference(ctx)
    if not hasattr(ref.renderer, "tokenizer"):
        raise EtlError("check-template on preference pairs compares with TRL, which needs transformers: "
                       "`pip install transformers trl datasets` (or etl's `hf` extra)")
    try:
        version = metadata.version("trl")
    except metadata.PackageNotFoundError as exc:
        raise EtlError("check-template on preference pairs compares with TRL's DPOTrainer: "
                       "`pip install trl datasets` (or etl's `hf` extra)") from exc
    report = PairCheckReport(template=ctx.template.template.name, tokenizer=ctx.tokenizer.name,
                             reference=TRL_PATH.format(version=version))
    query = ctx.builder_query()
    stand_in = CheckReport("", "", "", None, "")  # `good_rows` counts rejects and record keys here
    for source in discover(src):
        try:
            for raw in read_chunks(source, chunk_bytes=config.chunk_bytes):
                room = None if limit is None else limit - report.examples
                good = good_rows(raw, ctx, query, stand_in, room=room)
                if good.num_rows:
                    _compare_chunk(source.name, good, ctx, ref, report)
                if limit is not None and report.examples >= limit:
                    break
        except UnreadableFile as exc:
            stand_in.rejected[exc.reason] = stand_in.rejected.get(exc.reason, 0) + 1
        if limit is not None and report.examples >= limit:
            break
    for reason, n in stand_in.rejected.items():
        report.rejected[reason] = report.rejected.get(reason, 0) + n
    report.record_keys = stand_in.record_keys
    return report
