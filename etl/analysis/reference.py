"""The reference side of `etl check-template`: a conversation as the tokenizer's chat_template tokenizes it.

The builder's messages become what `apply_chat_template` reads (`reasoning_content`, `tool_calls`,
`tools`, parsed by `etl.tokens.tool_json`; content with images as parts, `{"type": "image"}` where
each image goes). With transformers importable the reference is transformers itself, the ids a
trainer using it gets; without it, etl's jinja2 rendering of the same template
(`etl.tokens.chat_jinja`) encoded by raw `tokenizers`. Each image's one `<|image_pad|>` is then
expanded to the count transformers' own image processor gives for that image (`ImageTokens`).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import os
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from etl import columns as c
from etl.errors import EtlError
from etl.images.vision import PREPROCESSOR_CONFIG
from etl.pipeline.image_read import read_chunk_images
from etl.pipeline.resources import Resources
from etl.tokens.chat_jinja import render
from etl.tokens.tool_json import parse_call, parse_tools

TOOLS = "tools"  # the builder's tool-list column (JSON text); present when the template renders tools
NOT_LOCAL = "image_not_local"  # an image load_image cannot open offline (s3://...): counted, not checked
REFS = "reference_images"  # the builder's image references, kept beside what reading them gives
NO_TRUNCATION = 1 << 30  # S so large that no conversation is truncated or dropped
TRANSFORMERS_PATH = (
    "transformers {version} AutoTokenizer.apply_chat_template(messages, tools=tools, tokenize=True, "
    "return_dict=True)['input_ids'], one conversation at a time: the ids a trainer using transformers "
    "(TRL's SFTTrainer) gets"
)
JINJA2_PATH = (
    "jinja2 render of the whole conversation (transformers' sandboxed environment, `etl.tokens.chat_jinja`; "
    "transformers is not installed), encoded at once with tokenizers.Tokenizer.encode(text, "
    "add_special_tokens=False) (raw `tokenizers`)"
)


@dataclass(frozen=True)
class Conversation:
    """One conversation as `apply_chat_template` takes it: messages and the record's tools (None: none);
    `images`: what transformers' `load_image` opens for each of its images, in order."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    images: tuple[str, ...] = ()


def _content(text: str | None, image_at: Sequence[int] | None) -> Any:
    """A message's content as the chat template reads it: the text, or with images (at character
    offsets into the text) the text pieces and an image part at each offset, as TRL's data has them."""
    if not image_at:
        return text
    text = text or ""
    parts: list[dict[str, Any]] = []
    for i, (lo, hi) in enumerate(itertools.pairwise([0, *image_at, len(text)])):
        parts += [{"type": "image"}] * (i > 0) + [{"type": "text", "text": text[lo:hi]}] * (hi > lo)
    return parts


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A builder message (role, content, reasoning, calls) as a chat-template message.

    Keys are set only for values that are present: templates test `is defined`, and transformers
    drops keys whose value is None before rendering.
    """
    out: dict[str, Any] = {"role": message["role"]}
    if message.get("content") is not None or message.get("image_at"):
        out["content"] = _content(message.get("content"), message.get("image_at"))
    if message.get("reasoning") is not None:
        out["reasoning_content"] = message["reasoning"]
    if message.get("calls"):
        out["tool_calls"] = [{"type": "function", "function": parse_call(text)} for text in message["calls"]]
    return out


def conversation(messages: Sequence[Mapping[str, Any]], tools: str | None, images: Sequence[str] = ()) -> Conversation:
    """The builder's `messages` and `tools` text of one record as a `Conversation`; `images`: the
    files (or data URIs) of its images."""
    return Conversation([_chat_message(m) for m in messages], parse_tools(tools) if tools else None, tuple(images))


def tools_column(good: pa.Table) -> list[str | None]:
    """The builder output's tools text per row; all None when the builder has no such column."""
    if TOOLS not in good.column_names:
        return [None] * good.num_rows
    return good.column(TOOLS).to_pylist()


class _Renderer(Protocol):
    description: str

    def ids(self, conversations: Iterable[Conversation]) -> list[list[int]]: ...

    def ids_as_data(self, conversations: Iterable[Conversation]) -> list[list[int]] | None:
        """The ids with special-token text in messages encoded as text (etl's rule), None if unsupported."""
        ...


class _TransformersRenderer:
    """transformers' own `apply_chat_template`, tokenizer loaded once (a few seconds) per check."""

    def __init__(self, transformers: ModuleType, directory: Path) -> None:
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
        except Exception as exc:  # transformers raises many kinds (OSError, ValueError, KeyError)
            raise EtlError(f"transformers {transformers.__version__} cannot load the tokenizer in {directory} "
                           f"({exc}); check-template uses it as the reference") from exc
        self.description = TRANSFORMERS_PATH.format(version=transformers.__version__)

    def ids(self, conversations: Iterable[Conversation]) -> list[list[int]]:
        # One call per conversation (tools differ per record), as a trainer's map() does (its cost:
        # docs/design.md, Measured costs).
        return [list(self.tokenizer.apply_chat_template(conv.messages, tools=conv.tools or None, tokenize=True,
                                                        return_dict=True)["input_ids"])
                for conv in conversations]

    def ids_as_data(self, conversations: Iterable[Conversation]) -> list[list[int]] | None:
        # transformers' own switch for etl's rule (content is data): `sanitize_control_tokens`.
        try:
            return [list(self.tokenizer.apply_chat_template(conv.messages, tools=conv.tools or None, tokenize=True,
                                                            return_dict=True, sanitize_control_tokens=True)["input_ids"])
                    for conv in conversations]
        except TypeError:  # a transformers without the option
            return None


class Jinja2Renderer:
    """etl's jinja2 rendering of the chat_template, the whole text encoded by raw `tokenizers`."""

    description = JINJA2_PATH

    def __init__(self, source: str, tokens: Mapping[str, str], raw: Any) -> None:
        self.source, self.tokens, self.raw = source, tokens, raw

    def ids(self, conversations: Iterable[Conversation]) -> list[list[int]]:
        texts = [render(self.source, conv.messages, tokens=self.tokens, tools=conv.tools or None)
                 for conv in conversations]
        return [e.ids for e in self.raw.encode_batch(texts, add_special_tokens=False)]

    def ids_as_data(self, conversations: Iterable[Conversation]) -> list[list[int]] | None:
        return None


def load_renderer(directory: Path, *, source: str, tokens: Mapping[str, str], raw: Any) -> _Renderer:
    """transformers' `apply_chat_template` when transformers is importable, else etl's jinja2 path.

    Args:
        directory: the tokenizer directory (tokenizer.json, tokenizer_config.json).
        source, tokens: the chat_template text and special-token strings, for the jinja2 path.
        raw: the raw `tokenizers.Tokenizer` (special tokens parsed), for the jinja2 path.
    """
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        return Jinja2Renderer(source, tokens, raw)
    return _TransformersRenderer(transformers, directory)


class ImageTokens:
    """Each image's `<|image_pad|>` count as transformers gives it: its image processor class of the
    folder's preprocessor_config.json (the PIL one where transformers has it: the same grid, no
    torch), loaded with the run's pixel bounds, on the image `load_image` opens."""

    def __init__(self, folder: Path, *, pad_id: int | None, min_pixels: int | None, max_pixels: int | None) -> None:
        self.folder, self.pad_id = folder, pad_id
        self.bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
        self.counts: dict[str, int] = {}  # by image: records often share one

    @functools.cached_property
    def processor(self) -> Any:
        """The image processor, loaded at the first image: a check of text needs no transformers."""
        try:
            transformers = importlib.import_module("transformers")
        except ImportError as exc:
            raise EtlError("check-template checks images with transformers' image processor: install "
                           "transformers") from exc
        kind = str(_processor_config(self.folder).get("image_processor_type", ""))
        name = kind.removesuffix("Fast").removesuffix("Pil")
        cls = getattr(transformers, name + "Pil", None) or getattr(transformers, name, None)
        if cls is None:
            raise EtlError(f"transformers {transformers.__version__} has no image processor {kind!r} "
                           f"({self.folder / PREPROCESSOR_CONFIG}); check-template needs it for the reference")
        return cls.from_pretrained(str(self.folder), **self.bounds)

    @property
    def description(self) -> str:
        shown = "".join(f", {k}={v}" for k, v in self.bounds.items())
        return (f"each image's <|image_pad|> repeated image_grid_thw.prod() // merge_size**2 times, from "
                f"transformers' {type(self.processor).__name__}.from_pretrained({str(self.folder)!r}{shown}) "
                "on transformers.image_utils.load_image(file)")

    def expand_all(self, ids: list[list[int]], conversations: Sequence[Conversation]) -> list[list[int]]:
        return [self.expand(one, conv.images) for one, conv in zip(ids, conversations, strict=True)]

    def expand(self, ids: list[int], images: Sequence[str]) -> list[int]:
        """`ids` with the k-th pad repeated as many times as the processor gives image k; as they are
        when the template did not write one pad per image (then they differ, as they should)."""
        at = [i for i, t in enumerate(ids) if t == self.pad_id]
        if not images or len(at) != len(images):
            return ids
        out: list[int] = []
        for start, stop, source in zip([-1, *at[:-1]], at, images, strict=True):
            out += ids[start + 1:stop] + [self.pad_id] * self._count(source)
        return out + ids[at[-1] + 1:]

    def _count(self, source: str) -> int:
        if source not in self.counts:
            processor = self.processor  # first: it says when transformers is missing
            from transformers.image_utils import load_image

            grid = processor(images=[load_image(source)], return_tensors="np")["image_grid_thw"][0]
            self.counts[source] = int(grid.prod()) // processor.merge_size ** 2
        return self.counts[source]


def _processor_config(folder: Path) -> dict[str, Any]:
    try:
        found = json.loads((folder / PREPROCESSOR_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EtlError(f"{folder / PREPROCESSOR_CONFIG}: cannot read it ({exc}); the reference loads the "
                       "image processor from it") from exc
    return found if isinstance(found, dict) else {}


def _local(ref: str) -> str | None:
    """A path or `file://` URI as a path; None for another URI (`load_image` reads no s3://...)."""
    if ref.startswith("file://"):
        return urllib.request.url2pathname(urllib.parse.urlsplit(ref).path)
    return None if "://" in ref[:16] else ref


def image_sources(refs: Sequence[str] | None, *, base: str, root: str | None) -> list[str] | None:
    """What `load_image` opens for each image reference (JSON text), found as `etl run` finds it: a
    relative path under `root`, else `base` (the data file's folder); None when one is neither a
    local file nor a data URI (`load_image` reads nothing else offline)."""
    folder, out = _local(base if root is None else root), []
    for text in refs or ():
        ref = json.loads(text)
        if isinstance(ref, Mapping):  # Hugging Face datasets' Image: its bytes (a data URI) win
            ref = ref.get("bytes") or ref.get("path")
        if isinstance(ref, str) and ref.startswith("data:"):
            out.append(ref)
            continue
        path = _local(ref) if isinstance(ref, str) else None
        if path is not None and not os.path.isabs(path):
            path = None if folder is None else os.path.join(folder, path)
        if path is None:
            return None
        out.append(path)
    return out


def image_chunks(good: pa.Table, source_path: str, ctx: Resources,
                 rejected: dict[str, int]) -> Iterator[tuple[pa.Table, list[list[str]] | None]]:
    """(records, the files of each one's images) of a parsed chunk: its images read as `etl run` reads
    them (the records it would reject counted in `rejected`, not checked), and those whose images the
    reference cannot open counted as NOT_LOCAL; the records as they are when the builder reads no images."""
    if c.IMAGES not in good.column_names:
        yield good, None
        return
    good = good.append_column(REFS, good.column(c.IMAGES))
    base = source_path.rpartition("/")[0] or "."  # the data file's folder, as `etl run` joins it
    for kept, rejects in read_chunk_images(good, source_path=source_path, rule=ctx.vision, root=ctx.config.image_root,
                                           embed=False, seq_len=NO_TRUNCATION):
        for item in [] if rejects is None else pc.value_counts(rejects.column(c.REASON)).to_pylist():
            rejected[item["values"]] = rejected.get(item["values"], 0) + item["counts"]
        files = [image_sources(refs, base=base, root=ctx.config.image_root) for refs in kept.column(REFS).to_pylist()]
        if None in files:
            rejected[NOT_LOCAL] = rejected.get(NOT_LOCAL, 0) + files.count(None)
            kept = kept.filter(pa.array([f is not None for f in files]))
        yield kept, [f for f in files if f is not None]
