"""Render a Hugging Face `chat_template` with jinja2 the way `transformers` does, without transformers.

`transformers.apply_chat_template` compiles the template in an immutable sandboxed jinja2
environment with `trim_blocks`/`lstrip_blocks`, a `raise_exception` global, a `tojson` filter
that keeps non-ASCII text, `strftime_now`, loop controls and a `{% generation %}` block, and
renders it with `messages`, `tools`, `add_generation_prompt` and the special-token strings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from etl.errors import EtlError

CONFIG_FILE = "tokenizer_config.json"
# transformers passes `special_tokens_map` to the template; these are its string entries.
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)

Config = Mapping[str, Any]
Message = Mapping[str, Any]


def load_config(source: str | os.PathLike[str] | Config) -> dict[str, Any]:
    """`tokenizer_config.json` as a dict, from a dict, the file itself or its model directory."""
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    file = path / CONFIG_FILE if path.is_dir() else path
    if not file.is_file():
        raise EtlError(f"{source}: no {CONFIG_FILE} found; pass a Hugging Face model directory that has one")
    try:
        return json.loads(file.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EtlError(f"{file}: not valid JSON ({exc})") from exc


def token_string(config: Config, name: str) -> str | None:
    """A special token's text; old configs store it as a serialized AddedToken dict."""
    value = config.get(name)
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens_map(config: Config) -> dict[str, str]:
    """The special-token variables `transformers` passes to the template (unset ones are left out)."""
    return {name: tok for name in SPECIAL_TOKEN_NAMES if (tok := token_string(config, name)) is not None}


def chat_template_source(config: Config, *, where: str = "tokenizer_config.json") -> str:
    """The default chat template text; a list of named templates picks `default`."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        raise EtlError(
            f"{where} has no chat_template; use a preset template (--template chatml, phi3, llama3, ...) "
            "or a tokenizer directory whose tokenizer_config.json defines one"
        )
    return template


def _raise_exception(message: str) -> None:
    # jinja2: only when a chat_template is compiled
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own `tojson` HTML-escapes and forces ASCII; transformers overrides it with this.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _generation_extension() -> type:
    """`{% generation %}...{% endgeneration %}` renders its body (transformers tracks assistant spans)."""
    # jinja2: only when a chat_template is compiled
    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            # jinja2: only when a chat_template is compiled
            from jinja2 import nodes

            return nodes.Scope(body, lineno=lineno)

    return GenerationBlock


@lru_cache(maxsize=8)
def _compile_template(source: str) -> Any:
    """Compile once per template text (probing renders the same template a dozen times)."""
    # jinja2: only when a chat_template is compiled
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_generation_extension(), "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise EtlError(f"chat_template does not compile: {exc.message} (line {exc.lineno})") from exc


def render(
    source: str,
    messages: Sequence[Message],
    *,
    tokens: Mapping[str, str],
    add_generation_prompt: bool = False,
    tools: Sequence[Any] | None = None,
) -> str:
    """Render `messages` with the template text `source`, as `apply_chat_template(tokenize=False)`.

    Raises:
        jinja2.TemplateError: the template rejected the conversation (`raise_exception`) or failed.
    """
    return _compile_template(source).render(
        messages=[dict(m) for m in messages],
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **tokens,
    )
