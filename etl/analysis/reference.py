"""The reference side of `etl check-template`: a conversation as the tokenizer's chat_template tokenizes it.

The builder's messages become what `apply_chat_template` reads (`reasoning_content`, `tool_calls`,
`tools`, parsed by `etl.tokens.tool_json`). With transformers importable the reference is
transformers itself, the ids a trainer using it gets; without it, etl's jinja2 rendering of the
same template (`etl.tokens.chat_jinja`) encoded by raw `tokenizers`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pyarrow as pa

from etl.errors import EtlError
from etl.tokens.chat_jinja import render
from etl.tokens.tool_json import parse_call, parse_tools

TOOLS = "tools"  # the builder's tool-list column (JSON text); present when the template renders tools
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
    """One conversation as `apply_chat_template` takes it: messages and the record's tools (None: none)."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A builder message (role, content, reasoning, calls) as a chat-template message.

    Keys are set only for values that are present: templates test `is defined`, and transformers
    drops keys whose value is None before rendering.
    """
    out: dict[str, Any] = {"role": message["role"]}
    if message.get("content") is not None:
        out["content"] = message["content"]
    if message.get("reasoning") is not None:
        out["reasoning_content"] = message["reasoning"]
    if message.get("calls"):
        out["tool_calls"] = [{"type": "function", "function": parse_call(text)} for text in message["calls"]]
    return out


def conversation(messages: Sequence[Mapping[str, Any]], tools: str | None) -> Conversation:
    """The builder's `messages` and `tools` text of one record as a `Conversation`."""
    return Conversation([_chat_message(m) for m in messages], parse_tools(tools) if tools else None)


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

