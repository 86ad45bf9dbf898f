"""Chat templates: per role a header, an end-of-turn and a separator, plus preset names.

A `Template` is strings; `resolve_template` turns it into ids with a tokenizer once per run
(headers and ends are constant per role, so each is tokenized once), giving the small role table
the pipeline joins onto its per-turn rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from etl.columns import AUTO_TEMPLATE
from etl.errors import EtlError
from etl.tokens.joins import NO_JOIN, Join, lead_of, trail_of
from etl.tokens.tokenizer import TextTokenizer, encode_template_text
from etl.tokens.tool_format import (
    FORMS,
    QWEN_TOOLS,
    ToolFormat,
    ToolIds,
    form_header,
    form_pieces,
    glued_right,
    resolve_tools,
)

if TYPE_CHECKING:
    import polars as pl

ROLES = ("system", "user", "assistant", "tool")

NGPT_SUFFIX = "84a5023f67d74cf29cc4001becde983c"
NGPT_SYS = f"<|ngpt_sys_{NGPT_SUFFIX}|>"
NGPT_USR = f"<|ngpt_usr_{NGPT_SUFFIX}|>"
NGPT_ASST = f"<|ngpt_asst_{NGPT_SUFFIX}|>"
NGPT_EOT = f"<|ngpt_eot_{NGPT_SUFFIX}|>"
NGPT = "ngpt"  # the token-native format: the default for `bytes` and for a tokenizer without a chat_template
NGPT_MARKERS = (NGPT_SYS, NGPT_USR, NGPT_ASST, NGPT_EOT)


@dataclass(frozen=True)
class RoleFormat:
    """How one role's turn is serialized: header + content + end + sep."""

    header: str
    end: str
    sep: str = ""


@dataclass(frozen=True)
class ReasoningFormat:
    """How an assistant turn's reasoning is rendered before its content: open + pre + R + post + close + after.

    `open`/`close` are structure (a token where the vocabulary has it: Qwen3's `<think>`);
    pre/post/after are plain text. pre + R + post is tokenized as one text, so a reasoning
    ending in "." still gets the tokenizer's ".\n" token as whole-text encoding does; `after`
    is encoded alone (a blank line before the content splits there in byte-level BPE).
    `keep` is the template's rule for which turns keep it: all, last (after the last user
    turn, Qwen3) or none; `empty_last`: a final assistant turn without reasoning gets an empty
    block (Qwen3). The reasoning text is written without its leading/trailing newlines;
    `content_lstrip`: characters the template strips from the start of a content after a block
    (Qwen3: `content.lstrip('\n')`).
    """

    open: str = "<think>"
    pre: str = "\n"
    post: str = "\n"
    close: str = "</think>"
    after: str = "\n\n"
    keep: str = "all"
    empty_last: bool = False
    content_lstrip: str = ""


THINK = ReasoningFormat()  # Qwen3 / DeepSeek-R1: <think>\nR\n</think>\n\n before the content


@dataclass(frozen=True)
class Template:
    """A chat format. `eot` is the end-of-turn token (the default pad id of the collate).

    `bos`/`eos` are added once per conversation (llama3's `<|begin_of_text|>`, post_training's
    `<|EOS|>` record separator); they are never trained. `train_header` is the template's
    default for training the assistant header marker (post_training trains `<|ASSISTANT|>`).
    """

    name: str
    roles: dict[str, RoleFormat]
    special_tokens: tuple[str, ...]
    eot: str
    bos: str = ""
    eos: str = ""
    train_header: bool = False
    notes: str = ""
    reasoning: ReasoningFormat = THINK
    tools: ToolFormat | None = None  # None: calls stay JSON text after the content (the builder's)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _per_role(header: str, end: str, sep: str = "", roles: tuple[str, ...] = ROLES) -> dict[str, RoleFormat]:
    return {r: RoleFormat(header.format(role=r), end, sep) for r in roles}


PRESETS: dict[str, Template] = {
    NGPT: Template(
        name=NGPT,
        roles={
            "system": RoleFormat(NGPT_SYS, NGPT_EOT),
            "user": RoleFormat(NGPT_USR, NGPT_EOT),
            "assistant": RoleFormat(NGPT_ASST, NGPT_EOT),
        },
        special_tokens=NGPT_MARKERS,
        eot=NGPT_EOT,
        notes="token-native role markers, EOT is the only stop boundary",
    ),
    "post_training": Template(
        name="post_training",
        roles={
            "system": RoleFormat("<|SYSTEM|>", "<|END|>"),
            "user": RoleFormat("<|USER|>", "<|END|>"),
            "assistant": RoleFormat("<|ASSISTANT|>", "<|END|>"),
        },
        special_tokens=("<|SYSTEM|>", "<|USER|>", "<|ASSISTANT|>", "<|END|>", "<|EOS|>"),
        eot="<|END|>",
        eos="<|EOS|>",
        train_header=True,
        notes="post-training format: <|ASSISTANT|> ... <|END|> trained inclusive; <|EOS|> ends each record",
    ),
    "chatml": Template(
        name="chatml",
        roles=_per_role("<|im_start|>{role}\n", "<|im_end|>", "\n"),
        special_tokens=("<|im_start|>", "<|im_end|>"),
        eot="<|im_end|>",
        notes="Qwen / OpenAI ChatML; tools, calls and results as Qwen3 renders them",
        tools=QWEN_TOOLS,
    ),
    "llama3": Template(
        name="llama3",
        roles=_per_role("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>", "", ROLES[:3] + ("ipython",)),
        special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        eot="<|eot_id|>",
        bos="<|begin_of_text|>",
        notes="Llama 3 instruct",
    ),
    "phi3": Template(
        name="phi3",
        roles=_per_role("<|{role}|>\n", "<|end|>", "\n", ROLES[:3]),
        special_tokens=("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"),
        eot="<|end|>",
        eos="<|endoftext|>",
        notes="Phi-3 / Phi-3.5 mini: the chat template appends eos_token after the last turn",
    ),
}


HF = "hf"  # the template derived from a tokenizer's chat_template (`etl.tokens.hf_template`)


def get_template(name: str) -> Template:
    """Look up a preset by name (the `hf` template is derived from a tokenizer instead)."""
    if name not in PRESETS:
        raise EtlError(f"unknown template {name!r}; choose one of: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def preset(name: str) -> Template:
    """`get_template`, with `hf` and `auto` among the names an error lists (`--template` choices)."""
    if name not in PRESETS:
        raise EtlError(f"unknown template {name!r}; choose one of: {', '.join(sorted([*PRESETS, HF, AUTO_TEMPLATE]))}")
    return get_template(name)


@dataclass(frozen=True)
class TemplateIds:
    """A template resolved to ids with one tokenizer."""

    template: Template
    header: dict[str, list[int]]
    end: dict[str, list[int]]
    sep: dict[str, list[int]]
    bos: list[int]
    eos: list[int]
    eot_id: int
    special_ids: dict[str, int] = field(default_factory=dict)
    reasoning_prefix: list[int] = field(default_factory=list)  # open, before the reasoning text
    reasoning_suffix: list[int] = field(default_factory=list)  # close + after, behind it
    tools: ToolIds | None = None
    # (lead, trail) joins of each role table row (role_number order) and the lead after a think
    # block: the template text tokenized with the content (etl.tokens.joins).
    joins: tuple[tuple[Join, Join], ...] = ()
    reasoning_join: Join = NO_JOIN

    def role_table(self) -> pl.DataFrame:
        """FORMS rows per role (row role_number * FORMS + form) with the header/end/separator ids
        of that form; every form of a role is its constant triple unless the tool format varies it."""
        import polars as pl  # here, not at the top: `etl run` reads templates before Polars loads

        roles = sorted(self.header)
        rows = [form_pieces(self.tools, r, f, (self.header[r], self.end[r], self.sep[r]))
                for r in roles for f in range(FORMS)]
        ids = pl.List(pl.Int32)
        return pl.DataFrame(
            {
                "role": [r for r in roles for _ in range(FORMS)],
                "header_ids": pl.Series([h for h, _, _ in rows], dtype=ids),
                "end_ids": pl.Series([e for _, e, _ in rows], dtype=ids),
                "sep_ids": pl.Series([s for _, _, s in rows], dtype=ids),
            }
        )

    def to_json(self) -> dict[str, Any]:
        fmt = {"text": RoleFormat("", "", ""), **self.template.roles}
        roles = {
            r: {**asdict(fmt[r]), "header_ids": self.header[r],
                "end_ids": self.end[r], "sep_ids": self.sep[r]}
            for r in sorted(self.header)
        }
        return {"name": self.template.name, "roles": roles, "bos": self.template.bos,
                "eos": self.template.eos, "eot": self.template.eot, "bos_ids": self.bos,
                "eos_ids": self.eos, "train_header": self.template.train_header,
                "reasoning": {**asdict(self.template.reasoning), "prefix_ids": self.reasoning_prefix,
                              "suffix_ids": self.reasoning_suffix},
                "tools": None if self.tools is None else {**self.template.tools.to_json(),  # type: ignore[union-attr]
                                                          "resolved": asdict(self.tools)}}


def resolve_template(template: Template, tokenizer: TextTokenizer) -> TemplateIds:
    """Encode every template string once; a missing special token is a clear `EtlError`."""
    specials = template.special_tokens
    used = "".join(f.header + f.end + f.sep for f in template.roles.values()) + template.bos + template.eos
    missing = [tok for tok in specials if tok in used and tokenizer.special_id(tok) is None]
    if missing:
        why = (" (ngpt is the default for a tokenizer with no chat_template in its tokenizer_config.json)"
               if template.name == NGPT else "")
        raise EtlError(
            f"template {template.name}: {', '.join(missing)} not in the vocabulary of tokenizer "
            f"{tokenizer.name}{why}; pass the template this tokenizer was trained with: --template "
            "chatml|llama3|phi3|post_training, or hf to derive it from a chat_template; or use "
            "--tokenizer bytes"
        )

    def enc(text: str) -> list[int]:
        return encode_template_text(tokenizer, text, specials)

    # Structure tokens of the think format are control where the vocabulary has them (Qwen3's
    # <think> is a non-special added token), plain text otherwise (Qwen2.5, the byte tokenizer).
    think = template.reasoning
    think_tokens = [t for t in (think.open, think.close) if t and tokenizer.special_id(t) is not None]

    tools = None if template.tools is None else resolve_tools(template.tools, tokenizer, specials)
    eot = enc(template.eot)
    if len(eot) != 1:
        raise EtlError(f"template {template.name}: end-of-turn {template.eot!r} must be one token, got {eot}")
    special_ids = {tok: tid for tok in specials if (tid := tokenizer.special_id(tok)) is not None}
    # `text` (pretraining input of the config file) is bare content in every template.
    roles = {"text": RoleFormat("", "", ""), **template.roles}
    return TemplateIds(
        template=template,
        header={r: enc(f.header) for r, f in roles.items()},
        end={r: enc(f.end) for r, f in roles.items()},
        # The separator is encoded after its end-of-turn so that an end token that swallows
        # whitespace on its right (Phi-3's <|end|>) swallows the separator's newline too.
        sep={r: enc(f.end + f.sep)[len(enc(f.end)) :] for r, f in roles.items()},
        bos=enc(template.bos),
        eos=enc(template.eos),
        eot_id=eot[0],
        special_ids=special_ids,
        reasoning_prefix=encode_template_text(tokenizer, think.open, think_tokens),
        reasoning_suffix=(encode_template_text(tokenizer, think.close, think_tokens)
                          + encode_template_text(tokenizer, think.after, think_tokens)),
        tools=tools,
        joins=_joins(template, roles, tokenizer, tools),
        reasoning_join=_reasoning_join(think, specials, think_tokens, tokenizer),
    )


def _reasoning_join(think: ReasoningFormat, specials: tuple[str, ...], think_tokens: list[str],
                    tokenizer: TextTokenizer) -> Join:
    """The lead of a content after a think block: the text after its close token (Qwen3: `\n\n`)."""
    join = lead_of(think.close + think.after, [*specials, *think_tokens], tokenizer, template_strip=think.content_lstrip)
    suffix = (encode_template_text(tokenizer, think.close, think_tokens)
              + encode_template_text(tokenizer, think.after, think_tokens))
    # A close that is text (no token for it) is encoded apart from `after` in the suffix: no lead then.
    if join.ids and tuple(suffix[-len(join.ids):]) != join.ids:
        return Join(strip=join.strip)
    return join


def _joins(template: Template, roles: dict[str, RoleFormat], tokenizer: TextTokenizer,
           fmt: ToolIds | None) -> tuple[tuple[Join, Join], ...]:
    """(lead, trail) per role table row: FORMS rows per role, roles sorted (`TemplateIds.role_table`)."""
    structure = template.tools.structure if template.tools else ()
    control = [*template.special_tokens, *(t for t in structure if tokenizer.special_id(t) is not None)]
    strips: dict[str, tuple[str, str]] = getattr(template, "content_strip", None) or {}  # `hf`: the template's
    rows = []
    for role in sorted(roles):
        left, right = strips.get(role, ("", ""))
        for form in range(FORMS):
            lead = lead_of(form_header(fmt, role, form, roles[role].header), control, tokenizer, template_strip=left)
            trail = (NO_JOIN if glued_right(fmt, role, form)
                     else trail_of(roles[role].end, control, tokenizer, template_strip=right))
            rows.append((lead, trail))
    return tuple(rows)
