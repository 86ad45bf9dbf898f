"""Template `hf`: per-role header / end / separator strings derived from a tokenizer's `chat_template`.

The chat_template is rendered (jinja2, as `transformers` does) on probe conversations of unique
marker contents (`etl.tokens.hf_probe`); the text around the markers becomes bos, per-role headers,
ends and separators, and eos. A default system prompt the template injects is exposed as
`default_system`, never folded into a header. `resolve_template_name` is the one entry point
that turns a `--template` name (`auto`, a preset or `hf`) into a `Template`; `auto_template` says
which one `auto` is for a tokenizer, and `own_default_system` the system prompt a template writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from etl.columns import AUTO_TEMPLATE, DEFAULT_SYSTEM_TEXT
from etl.errors import EtlError
from etl.tokens.chat_jinja import (
    CONFIG_FILE,
    Config,
    chat_template_source,
    load_config,
    special_tokens_map,
    token_string,
)
from etl.tokens.hf_probe import (
    AddedToken,
    Probe,
    Roles,
    Unsupported,
    added_tokens,
    derive_roles,
    derive_tool,
    split_tail,
    whitespace_rules,
)
from etl.tokens.hf_reasoning import block_remover, derive_reasoning
from etl.tokens.hf_strip import content_strips
from etl.tokens.hf_tools import derive_tool_format
from etl.tokens.loading import has_chat_template, load_tokenizer
from etl.tokens.templates import (
    HF,
    NGPT,
    NGPT_MARKERS,
    ReasoningFormat,
    RoleFormat,
    Template,
    preset,
)
from etl.tokens.tokenizer import TextTokenizer
from etl.tokens.tool_format import ToolFormat


@dataclass(frozen=True)
class _HFTemplate(Template):
    """A `Template` derived from a chat_template, plus the system prompt the template injects.

    `default_system` is the text the template inserts as system content when a conversation has
    no system message (Qwen2.5: "You are Qwen, created by Alibaba Cloud. ..."), or None. It is
    never part of a header; a caller may use it as the run's default system text.
    """

    default_system: str | None = None
    # role -> (characters stripped from the start, from the end) of its content (etl.tokens.hf_strip)
    content_strip: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def template_from_hf(tokenizer_dir_or_config: str | os.PathLike[str] | Config, *,
                     tokenizer: TextTokenizer) -> _HFTemplate:
    """Derive the `hf` template from a tokenizer_config.json (a dict, the file, or its directory).

    Args:
        tokenizer_dir_or_config: where the `chat_template` and the bos/eos token names come from.
        tokenizer: the loaded tokenizer; its tokenizer.json `added_tokens` decide which strings
            are special tokens and which whitespace the tokenizer absorbs (lstrip/rstrip).

    Raises:
        EtlError: no chat_template, or the template cannot be written as constant per-role
            header/end strings (the message names the role and the reason).
    """
    config = load_config(tokenizer_dir_or_config)
    where = CONFIG_FILE if isinstance(tokenizer_dir_or_config, Mapping) else str(tokenizer_dir_or_config)
    source = chat_template_source(config, where=where)
    added = added_tokens(tokenizer)
    probe = Probe(source, special_tokens_map(config), token_string(config, "bos_token") or "",
                  token_string(config, "eos_token") or "", whitespace_rules(added))
    notes = [f"derived from chat_template sha256 {hashlib.sha256(source.encode()).hexdigest()[:16]}"]
    try:
        reasoning = derive_reasoning(probe, [t.content for t in added])
        if reasoning is None:
            notes.append("the template renders no reasoning_content: reasoning is dropped, as it drops it")
        else:  # the blocks it adds by position are etl's reasoning piece, not part of a header
            probe = dataclasses.replace(probe, strip=block_remover(reasoning))
        roles = derive_roles(probe)
        tools = _tools(probe, roles, added, notes)
        strips = content_strips(probe)
        template = _assemble(roles, probe, added=added, notes=notes + _content_notes(strips, probe, added))
        return dataclasses.replace(template, reasoning=reasoning or ReasoningFormat(keep="none"), tools=tools,
                                   content_strip={r: s for r, s in strips.items() if any(s)})
    except Unsupported as exc:
        raise EtlError(f"template hf: the chat_template of {where} is not expressible as constant "
                       f"per-role header/end strings: {exc}") from exc


def _tools(probe: Probe, roles: Roles, added: Sequence[AddedToken], notes: list[str]) -> ToolFormat | None:
    """The template's tool format; else a constant tool role; else none (tool messages rejected).

    With a tool format the tool role's own strings are those of a lone result (its forms vary
    them, etl.pipeline.tools); without one, calls and tool lists stay JSON text.
    """
    specials = [t.content for t in added if t.special]
    try:
        fmt = derive_tool_format(probe, roles, specials=specials, added=[t.content for t in added])
        roles.header["tool"], roles.tail["tool"] = fmt.result_first, fmt.result_last_end + fmt.result_sep
        notes.append("tools, tool calls and tool results rendered as the template renders them")
        return fmt
    except Unsupported as why:
        notes.append(f"no tool format ({why}): tool lists and calls are written as JSON text")
    try:
        roles.header["tool"], roles.tail["tool"] = derive_tool(probe, roles)
    except Unsupported as exc:
        notes.append(f"tool role left out ({exc}); records with tool messages are rejected")
    return None


def _content_notes(strips: dict[str, tuple[str, str]], probe: Probe, added: Sequence[AddedToken]) -> list[str]:
    """What the template does to content that etl reproduces (strips, whitespace the tokenizer absorbs)."""
    notes = []
    if stripped := sorted(role for role, sides in strips.items() if any(sides)):
        notes.append(f"the template strips whitespace around {', '.join(stripped)} content (e.g. trim); "
                     "etl strips the same")
    text = probe.text(("system", "user", "assistant"), pad=" \n")
    stripped = [t.content for t in added if (t.rstrip or t.lstrip) and t.content in text]
    if stripped:
        notes.append(f"whitespace next to {', '.join(stripped)} dropped: the tokenizer absorbs it "
                     "(lstrip/rstrip)")
    return notes


def _assemble(roles: Roles, probe: Probe, *, added: Sequence[AddedToken], notes: list[str]) -> _HFTemplate:
    specials = [t.content for t in added if t.special]
    formats, eot = {}, ""
    for role, head in roles.header.items():
        end, sep, token = split_tail(roles.tail[role], specials, role=role)
        formats[role] = RoleFormat(head, end, sep)
        eot = token if role == "assistant" and token else eot
    bos, eos = (probe.bos if roles.has_bos else ""), (probe.eos if roles.has_eos else "")
    texts = [bos, eos] + [s for f in formats.values() for s in (f.header, f.end, f.sep)]
    used = tuple(s for s in specials if any(s in t for t in texts))
    if roles.default_system is not None:
        notes.append(f"the template injects a default system prompt: {roles.default_system!r}")
    return _HFTemplate(name=HF, roles=formats, special_tokens=used, eot=eot, bos=bos, eos=eos,
                      notes="; ".join(notes), default_system=roles.default_system)


def carries_ngpt(tokenizer: TextTokenizer) -> bool:
    """Whether the vocabulary has all four ngpt markers (a tokenizer trained with etl's own format).
    A marker whose string is nowhere in tokenizer.json answers without parsing it (Qwen2.5's 7 MB:
    ~0.27 s, which then runs beside the first chunk's parse instead of before it)."""
    absent = getattr(tokenizer, "surely_absent", None)
    if absent is not None and any(absent(marker) for marker in NGPT_MARKERS):
        return False
    return all(tokenizer.special_id(marker) is not None for marker in NGPT_MARKERS)


def auto_template(tokenizer: TextTokenizer) -> str:
    """The template `auto` picks for a loaded tokenizer: `hf` when it has a chat_template and lacks
    the ngpt markers (the model's own format, so the ids equal `apply_chat_template`), else `ngpt`
    (`bytes`, a tokenizer trained with the markers, or one without a chat_template)."""
    if has_chat_template(getattr(tokenizer, "path", None)) and not carries_ngpt(tokenizer):
        return HF
    return NGPT


def own_default_system(template: Template) -> str | None:
    """The system prompt a template writes where a conversation has none: for `hf` the one its
    chat_template injects (Qwen2.5: "You are Qwen, ...", Qwen3: none), for a preset etl's
    DEFAULT_SYSTEM_TEXT. A run uses it unless `default_system` is given."""
    if isinstance(template, _HFTemplate):
        return template.default_system
    return DEFAULT_SYSTEM_TEXT


def resolve_template_name(name: str, tokenizer: TextTokenizer) -> Template:
    """`PRESETS[name]` for a preset; for `hf` the template derived from the tokenizer's chat_template;
    for `auto` the one `auto_template` picks.

    Raises:
        EtlError: unknown name, `hf` with a tokenizer that has no tokenizer_config.json next to
            its tokenizer.json, or a chat_template `hf` cannot express.
    """
    if name == AUTO_TEMPLATE:
        name = auto_template(tokenizer)
    if name != HF:
        return preset(name)
    path = getattr(tokenizer, "path", None)
    config = Path(path).with_name(CONFIG_FILE) if path else None
    if config is None or not config.is_file():
        raise EtlError(f"template hf needs a Hugging Face tokenizer directory (tokenizer.json + "
                       f"{CONFIG_FILE} with a chat_template); got tokenizer {tokenizer.name}")
    return template_from_hf(config, tokenizer=tokenizer)


def load_template_and_tokenizer(
    name: str, *, tokenizer_spec: str, lazy: bool = False, backend: str = "auto"
) -> tuple[Template, TextTokenizer]:
    """Tokenizer first for `hf` (the template comes from it), template first for presets; `auto`
    is `ngpt` without a chat_template (decided from tokenizer_config.json alone), else decided
    by the loaded tokenizer (`auto_template`). The returned template's name is the one chosen.

    The built-in `bytes` tokenizer registers a preset's special tokens when it is created, so a
    preset must be known before the tokenizer is loaded; `hf` reads the tokenizer's own files.
    """
    if name == AUTO_TEMPLATE and not has_chat_template(tokenizer_spec):
        name = NGPT
    if name in (HF, AUTO_TEMPLATE):  # auto with a chat_template: hf unless the vocabulary has ngpt's markers
        tokenizer = load_tokenizer(tokenizer_spec, lazy=lazy, backend=backend)
        return resolve_template_name(name, tokenizer), tokenizer
    template = preset(name)
    return template, load_tokenizer(tokenizer_spec, special_tokens=template.special_tokens, lazy=lazy,
                                    backend=backend)
