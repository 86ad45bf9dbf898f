"""`etl check-template`: do the pipeline's ids equal the tokenizer's own chat template, tokenized whole?

The reference for each example is the real `chat_template` applied to everything the pipeline read
(content, reasoning, tool calls, the record's tools; see `etl.analysis.reference`): by transformers'
`apply_chat_template` when it is installed, else by etl's jinja2 rendering encoded by raw `tokenizers`.
Records with images have them read as `etl run` reads them (its rejects counted, not checked), and the
reference's image parts expanded to transformers' image processor's count for each image.
This is a diagnostic: it loops over examples in Python (a few hundred per second is plenty).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from etl import columns as c
from etl.analysis.reference import (
    NO_TRUNCATION,
    Conversation,
    ImageTokens,
    conversation,
    image_chunks,
    load_renderer,
    tools_column,
)
from etl.config.run_config import RunConfig
from etl.errors import EtlError
from etl.formats.base import record_keys
from etl.formats.builders import BuilderQuery, run_builder
from etl.ingest.discover import UnreadableFile, discover
from etl.ingest.reader import read_chunks
from etl.pipeline.build import build_examples, records_frame
from etl.pipeline.resources import Resources, build_resources
from etl.tokens.chat_jinja import chat_template_source, special_tokens_map, token_string
from etl.tokens.hf_pipeline import as_transformers
from etl.tokens.hf_template import HF, resolve_template_name
from etl.tokens.tool_json import BadToolJson

BAD_TOOL_JSON = "bad_tool_json"  # a call or tool list the reference cannot parse: counted, not checked
WINDOW_BEFORE, WINDOW_AFTER = 4, 8  # rows shown before / after the first difference
ALIGN_SPAN = 64  # tokens after it that difflib aligns (quadratic at worst: keep it small)


@dataclass(frozen=True)
class _Diff:
    """The first differing example: where the ids part and the aligned token pieces around it."""

    id: str
    position: int
    pipeline_tokens: int
    reference_tokens: int
    rows: list[dict[str, Any]]


@dataclass
class CheckReport:
    """Counts over the examples checked; `identical_loose` ignores bos/eos/trailing whitespace.

    `template_default_system` is the system text the tokenizer's chat_template inserts itself
    (None when it inserts none or cannot be derived); `record_keys` the top-level keys of the
    first record rejected for a missing key, which hint at the input type the data needs.
    """

    template: str
    tokenizer: str
    reference: str
    default_system: str | None
    template_notes: str
    input_type: str = "chat"
    template_default_system: str | None = None
    examples: int = 0
    identical: int = 0
    identical_loose: int = 0
    differ_with_special_text: int = 0
    # Of those, identical to transformers' apply_chat_template(sanitize_control_tokens=True), which
    # encodes special-token text in messages as text as etl does (None: reference cannot say).
    identical_as_data: int | None = None
    rejected: dict[str, int] = field(default_factory=dict)
    record_keys: list[str] = field(default_factory=list)
    first_diff: _Diff | None = None
    images: int = 0  # images in the examples checked
    differ_image_tokens: int = 0  # differing examples whose image tokens are not as many as the reference's
    image_reference: str | None = None  # how the reference counts an image's tokens

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        n = max(self.examples, 1)
        out["share_identical"] = self.identical / n
        out["share_identical_loose"] = self.identical_loose / n
        return out


class TemplateReference:
    """The tokenizer's own chat template (see `load_renderer`) and a raw `tokenizers` decoder for pieces."""

    def __init__(self, ctx: Resources, processor: Path | None = None) -> None:
        # tokenizers: only when the reference tokenizer loads
        from tokenizers import Tokenizer

        path = getattr(ctx.tokenizer, "path", None)
        config = getattr(ctx.tokenizer, "config", None) or {}
        if not path:
            raise EtlError("check-template needs --tokenizer DIR: a Hugging Face tokenizer directory "
                           "with a chat_template")
        source = chat_template_source(config, where=str(Path(path).with_name("tokenizer_config.json")))
        # encode_special_tokens stays False here: the template's special tokens are control.
        # Rebuilt as transformers builds it (etl.tokens.hf_pipeline): the ids a trainer gets.
        self.raw = as_transformers(Tokenizer.from_file(path), config, whole=True)
        self.renderer = load_renderer(Path(path).parent, source=source, tokens=special_tokens_map(config),
                                      raw=self.raw)
        # Every added token, special or not: etl encodes all of them as text in content.
        self.specials = tuple(t.content for t in self.raw.get_added_tokens_decoder().values())
        ends = [token_string(config, "eos_token"), token_string(config, "pad_token"), ctx.template.template.eos]
        self.edge_ids = {i for t in ends if t and (i := self.raw.token_to_id(t)) is not None}
        bos = token_string(config, "bos_token")
        self.bos_id = self.raw.token_to_id(bos) if bos else None
        # Images: the image processor of `processor` (default the tokenizer's folder), with the run's pixel
        # bounds (a trainer sets them on its processor too).
        self.images = None if ctx.vision is None else ImageTokens(
            processor or Path(path).parent, pad_id=self.raw.token_to_id(ctx.vision.image_token),
            min_pixels=ctx.config.min_pixels, max_pixels=ctx.config.max_pixels)

    def encode(self, conversations: list[Conversation]) -> list[list[int]]:
        # The template renders one conversation at a time (a diagnostic, not a hot path): show progress.
        rendering = tqdm(conversations, desc="check-template", unit="ex", disable=None, leave=False)
        ids = self.renderer.ids(rendering)
        return ids if self.images is None else self.images.expand_all(ids, conversations)

    def ids_as_data(self, conv: Conversation) -> list[int] | None:
        """transformers' ids with special-token text in content encoded as text (None: unsupported)."""
        ids = self.renderer.ids_as_data([conv])
        return None if ids is None else (ids if self.images is None else self.images.expand_all(ids, [conv]))[0]

    def loose(self, ids: list[int]) -> list[int]:
        """Ids without a leading bos and trailing eos/pad/whitespace-only tokens."""
        lo, hi = (1 if ids and ids[0] == self.bos_id else 0), len(ids)
        while hi > lo and (ids[hi - 1] in self.edge_ids or self.raw.decode([ids[hi - 1]]).isspace()):
            hi -= 1
        return ids[lo:hi]

    def has_special_text(self, conv: Conversation) -> bool:
        texts = [m.get(key) or "" for m in conv.messages for key in ("content", "reasoning_content")]
        texts = [t for text in texts for t in ([p.get("text") or "" for p in text] if isinstance(text, list) else [text])]
        return any(s in text for text in texts for s in self.specials)

    def diff(self, example_id: str, ours: list[int], theirs: list[int]) -> _Diff:
        """Token rows around the first difference, aligned by difflib so an extra token shows as a gap."""
        common = min(len(ours), len(theirs))
        pos = next((i for i in range(common) if ours[i] != theirs[i]), common)
        lo = max(0, pos - WINDOW_BEFORE)
        a, b = ours[lo : pos + ALIGN_SPAN], theirs[lo : pos + ALIGN_SPAN]
        rows: list[dict[str, Any]] = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
            for i, j in itertools.zip_longest(range(i1, i2), range(j1, j2)):
                rows.append(self._row(None if i is None else lo + i, a[i] if i is not None else None,
                                      None if j is None else lo + j, b[j] if j is not None else None, tag))
        first = next((k for k, r in enumerate(rows) if r["differs"]), len(rows))
        return _Diff(example_id, pos, len(ours), len(theirs), rows[: first + WINDOW_AFTER + 1])

    def _row(self, i: int | None, a: int | None, j: int | None, b: int | None, tag: str) -> dict[str, Any]:
        return {"pipeline_index": i, "pipeline_id": a, "pipeline_piece": self._piece(a),
                "reference_index": j, "reference_id": b, "reference_piece": self._piece(b),
                "differs": tag != "equal"}

    def _piece(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.raw.id_to_token(token_id)


def _own_default_system(ctx: Resources) -> str | None:
    """The system text the tokenizer's chat_template inserts when a conversation has none.

    With a preset template (`--template chatml`) it is derived from the chat_template as `hf`
    would; a chat_template `hf` cannot express gives None: this only feeds a hint.
    """
    if ctx.config.template == HF:
        return getattr(ctx.template.template, "default_system", None)
    try:
        return resolve_template_name(HF, ctx.tokenizer).default_system
    except EtlError:
        return None


def good_rows(raw: pa.Table, ctx: Resources, query: BuilderQuery, report: CheckReport, *,
               room: int | None) -> pa.Table:
    """Parse a chunk with the run's builder query (built once per check: its warnings come once);
    count rejects up to the last good row kept (`room`)."""
    parsed = run_builder(ctx.con, raw, query)
    good = parsed.filter(parsed.column(c.REASON).is_null())
    if room is not None and good.num_rows > room:
        good = good.slice(0, room)
        last = good.column(c.SOURCE_LINE)[-1].as_py() if room else -1
        parsed = parsed.filter(pc.less_equal(parsed.column(c.SOURCE_LINE), last))
    if not report.record_keys:
        missing = parsed.filter(pc.equal(parsed.column(c.REASON), "missing_key"))
        report.record_keys = record_keys(missing.column(c.DETAIL)[0].as_py()) if missing.num_rows else []
    # Builder rejects and builder drops ("drop:..." reasons) alike: neither reaches the pipeline.
    for item in pc.value_counts(parsed.column(c.REASON).drop_null()).to_pylist():
        report.rejected[item["values"]] = report.rejected.get(item["values"], 0) + item["counts"]
    return good


def conversations_of(records: pl.DataFrame, tools: list[str | None], plan: pl.DataFrame,
                   default_system: str | None, images: list[list[str]] | None = None) -> list[Conversation | None]:
    """Everything the pipeline read per record, its injected default system message included;
    `images`: per record the files its images are (`image_sources`; None: no record has images).

    None for a record whose tool calls or tool list are not JSON a template can render.
    """
    injected = set(plan.filter(pl.col(c.INJECTED))[c.CONV].to_list())
    convs: list[Conversation | None] = []
    for conv, messages, tool_text, files in zip(records[c.CONV].to_list(), records["messages"].to_list(), tools,
                                                images or [[]] * records.height, strict=True):
        try:
            item = conversation(messages, tool_text, files)
        except BadToolJson:
            convs.append(None)
            continue
        # The run's default system prompt is a message etl adds; a system turn etl opened only
        # to list tools is the template's own doing, which the reference renders by itself.
        if conv in injected and default_system is not None:
            item.messages.insert(0, {"role": "system", "content": default_system})
        convs.append(item)
    return convs


def compare_chunk(records: pl.DataFrame, tools: list[str | None], ctx: Resources, ref: TemplateReference,
                  report: CheckReport, images: list[list[str]] | None = None) -> None:
    """Run the pipeline on one chunk of records and compare every example with the reference.

    `tools` is the builder's tool-list text per record (all None when the template does not render tools);
    `images` the files of each record's images (None: no record has images).
    """
    examples, plan = build_examples(records, ctx)
    ours_by_conv = dict(zip(examples[c.CONV].to_list(), examples[c.INPUT_IDS].to_list(), strict=True))
    convs = conversations_of(records, tools, plan, ctx.config.default_system, images)
    rows = [(conv, example_id, item) for conv, example_id, item
            in zip(records[c.CONV].to_list(), records[c.ID].to_list(), convs, strict=True) if item is not None]
    if len(rows) < records.height:
        report.rejected[BAD_TOOL_JSON] = report.rejected.get(BAD_TOOL_JSON, 0) + records.height - len(rows)
    theirs = ref.encode([item for _, _, item in rows])
    if ref.images is not None and any(item.images for _, _, item in rows):
        report.image_reference = ref.images.description
    for (conv, example_id, item), ref_ids in zip(rows, theirs, strict=True):
        ours = ours_by_conv.get(conv, [])
        report.examples += 1
        report.images += len(item.images)
        if ours == ref_ids:
            report.identical += 1
            report.identical_loose += 1
            continue
        report.identical_loose += ref.loose(ours) == ref.loose(ref_ids)
        if item.images and ref.images is not None:
            report.differ_image_tokens += ours.count(ref.images.pad_id) != ref_ids.count(ref.images.pad_id)
        if ref.has_special_text(item):
            report.differ_with_special_text += 1
            as_data = ref.ids_as_data(item)
            if as_data is not None:
                report.identical_as_data = (report.identical_as_data or 0) + (as_data == ours)
        if report.first_diff is None:
            report.first_diff = ref.diff(example_id, ours, ref_ids)


def check_template(src: str, config: RunConfig, *, limit: int | None = None,
                   processor: str | None = None) -> CheckReport:
    """Compare the pipeline's `input_ids` with the whole-conversation reference on SRC.

    Args:
        src: input file, directory or glob (any input type the config's builder reads).
        config: run settings, resolved as `etl run` resolves them (`template: auto`, the
            template's own default system prompt unless given); `seq_len` is raised so that
            nothing is truncated.
        limit: check at most this many good records.
        processor: the folder of the image processor the reference loads (default the tokenizer's).
    """
    config = config.replace(seq_len=NO_TRUNCATION)
    ctx = build_resources(config)
    ref = TemplateReference(ctx, Path(processor) if processor else None)
    template = ctx.template.template
    report = CheckReport(template=template.name, tokenizer=ctx.tokenizer.name, reference=ref.renderer.description,
                         default_system=ctx.config.default_system, template_notes=template.notes,
                         input_type=config.input_type, template_default_system=_own_default_system(ctx))
    query = ctx.builder_query()
    for source in discover(src):
        try:
            for raw in read_chunks(source, chunk_bytes=config.chunk_bytes):
                good = good_rows(raw, ctx, query, report, room=None if limit is None else limit - report.examples)
                for kept, images in image_chunks(good, str(source.path), ctx, report.rejected) if good.num_rows else ():
                    if kept.num_rows:
                        compare_chunk(records_frame(source.name, kept), tools_column(kept), ctx, ref, report, images)
                if limit is not None and report.examples >= limit:
                    return report
        except UnreadableFile as exc:  # counted like `etl run` counts it: one reject, and go on
            report.rejected[exc.reason] = report.rejected.get(exc.reason, 0) + 1
    return report
