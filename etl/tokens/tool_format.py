"""How a template renders tools, tool calls and tool results, as strings and then as ids.

The shape is Qwen2.5's and Qwen3's (and what `hf` finds in a chat_template of that shape):

* the tool list closes the system turn: system text + `system_glue`, then `tool_before` + the
  tool's JSON per tool, then `list_after`; without a system message the system content is
  `no_system` instead of system text + `system_glue` (Qwen2.5: its default prompt; Qwen3: none);
* each call of an assistant turn follows its content: a lead (`call_lead` after non-empty
  content and between calls, `call_lead_empty` first in an empty turn), then
  `call_open` + name + `call_mid` + `arguments | tojson` + `call_close`;
* consecutive `tool` messages share one turn: the first opens it with `result_first`, the next
  with `result_next`; each ends with `result_end`, the last with `result_last_end` + `result_sep`.

`resolve_tools` splits every string at the structure tokens the vocabulary has (`<tool_call>`
is a token of Qwen2.5, `<tool_response>` only of Qwen3): text that touches message content or
call data is *glued* to it and tokenized with it (`}\\n` is one Qwen token, so the newline
before `</tool_response>` must not be encoded alone); the rest becomes constant ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from etl.tokens.tokenizer import TextTokenizer, encode_template_text, split_on_specials

_LIST = ("You may call one or more functions to assist with the user query.\n\nYou are provided with "
         "function signatures within <tools></tools> XML tags:\n<tools>")
_AFTER = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
          "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
          "\"arguments\": <args-json-object>}\n</tool_call>")

# A turn's form (etl.pipeline.tools.mark_forms) picks its role's header/end variant: bits of a tool
# result's place in its run (both clear: mid-run), or a system turn listing tools / an assistant
# turn with calls. The role table has FORMS rows per role.
RESULT_FIRST, RESULT_LAST, WITH_TOOLS = 1, 2, 4
FORMS = 5


@dataclass(frozen=True)
class ToolFormat:
    """The strings of one tool rendering (see the module docstring for where each goes)."""

    system_glue: str = "\n\n# Tools\n\n" + _LIST
    no_system: str = "# Tools\n\n" + _LIST
    tool_before: str = "\n"
    list_after: str = _AFTER
    call_lead: str = "\n"
    call_lead_empty: str = ""
    call_open: str = '<tool_call>\n{"name": "'
    call_mid: str = '", "arguments": '
    call_close: str = "}\n</tool_call>"
    result_first: str = "<|im_start|>user\n<tool_response>\n"
    result_next: str = "\n<tool_response>\n"
    result_end: str = "\n</tool_response>"
    result_last_end: str = "\n</tool_response><|im_end|>"
    result_sep: str = "\n"
    structure: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


QWEN_TOOLS = ToolFormat()  # Qwen3's rendering; Qwen2.5's differs only in `no_system` (its default prompt)


@dataclass(frozen=True)
class ToolIds:
    """A `ToolFormat` resolved with one tokenizer: glue texts (tokenized with the data they
    touch) and constant ids. `None` fields of the text kind are never None; ids may be empty."""

    system_glue: str
    no_system: str
    tool_before: str
    list_glue: str  # after the last tool's JSON, tokenized with the list
    list_ids: list[int]  # the rest of `list_after`, before the system turn's end
    content_glue: str  # after non-empty content when the turn has calls
    lead_ids: list[int]  # between calls
    lead_empty_ids: list[int]  # before the first call of an empty turn
    call_prefix: list[int]  # structure part of `call_open`
    call_pre: str  # its text after the last structure token: glued before the name
    call_mid: str
    call_post: str  # text of `call_close` before its first structure token: glued after the arguments
    call_suffix: list[int]
    result_first: list[int]
    result_next: list[int]
    result_glue: str  # text of `result_end` before its first structure token: glued after the content
    result_end: list[int]
    result_last_end: list[int]
    result_sep: list[int]
    # `result_glue` of a result another follows: with the newlines that open `result_next` when only
    # text joins the two (Qwen2.5: `</tool_response>` + `\n<tool_response>`: `>\n` is one token)
    result_glue_mid: str = ""
    result_first_text: str = ""  # the header strings of a result (for `etl.tokens.joins`)
    result_next_text: str = ""


def _head_tail(text: str, tokens: list[str]) -> tuple[str, str]:
    """(text before the first structure token, the rest); all of it when there is none."""
    parts = split_on_specials(text, tokens)
    for i, (_piece, is_token) in enumerate(parts):
        if is_token:
            return "".join(p for p, _ in parts[:i]), "".join(p for p, _ in parts[i:])
    return text, ""


def _before_after(text: str, tokens: list[str]) -> tuple[str, str]:
    """(text through the last structure token, the text after it)."""
    parts = split_on_specials(text, tokens)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i][1]:
            return "".join(p for p, _ in parts[: i + 1]), "".join(p for p, _ in parts[i + 1:])
    return "", text


def resolve_tools(fmt: ToolFormat, tokenizer: TextTokenizer, specials: tuple[str, ...]) -> ToolIds:
    """Glue texts and ids of `fmt`: its structure tokens are control where the vocabulary has them."""
    tokens = [t for t in fmt.structure if tokenizer.special_id(t) is not None]
    control = list(specials) + tokens

    def enc(text: str) -> list[int]:
        return encode_template_text(tokenizer, text, control)

    list_glue, list_rest = _head_tail(fmt.list_after, control)
    open_ids, call_pre = _before_after(fmt.call_open, control)
    call_post, close_rest = _head_tail(fmt.call_close, control)
    result_glue, result_rest = _head_tail(fmt.result_end, control)
    last_glue, last_rest = _head_tail(fmt.result_last_end, control)
    if last_glue != result_glue:  # the same content is glued either way; else keep it all as ids
        result_glue, result_rest, last_rest = "", fmt.result_end, fmt.result_last_end
    # Between two results only text (no structure token): the next one's opening newlines go with the
    # previous run, so that each run ends after a newline run and the next starts at a mark (`<`).
    moved = ""
    if result_glue and not result_rest and not split_on_specials(fmt.result_next, control)[0][1]:
        moved = fmt.result_next[: len(fmt.result_next) - len(fmt.result_next.lstrip("\r\n"))]
    result_next = fmt.result_next[len(moved):]
    return ToolIds(
        system_glue=fmt.system_glue, no_system=fmt.no_system, tool_before=fmt.tool_before,
        list_glue=list_glue, list_ids=enc(list_rest),
        # The lead before a call that opens with a structure token is text touching the content.
        content_glue=fmt.call_lead if open_ids else "", lead_ids=enc(fmt.call_lead),
        lead_empty_ids=enc(fmt.call_lead_empty),
        call_prefix=enc(open_ids), call_pre=call_pre, call_mid=fmt.call_mid, call_post=call_post,
        call_suffix=enc(close_rest),
        result_first=enc(fmt.result_first), result_next=enc(result_next), result_glue=result_glue,
        result_glue_mid=result_glue + moved, result_first_text=fmt.result_first, result_next_text=result_next,
        result_end=enc(result_rest), result_last_end=enc(last_rest), result_sep=enc(fmt.result_sep),
    )


def form_header(fmt: ToolIds | None, role: str, form: int, plain: str) -> str:
    """The header string of `role` in `form` (`plain`: the role's own)."""
    if fmt is not None and role == "tool" and form < WITH_TOOLS:
        return fmt.result_first_text if form & RESULT_FIRST else fmt.result_next_text
    return plain


def glued_right(fmt: ToolIds | None, role: str, form: int) -> bool:
    """Whether the tool stages glue the text after this form's content (`etl.pipeline.tools`)."""
    return fmt is not None and (role == "tool" or form >= WITH_TOOLS)


def form_pieces(fmt: ToolIds | None, role: str, form: int, plain: tuple[list[int], list[int], list[int]]
                ) -> tuple[list[int], list[int], list[int]]:
    """(header, end, sep) ids of `role` in `form`; `plain` is the role's constant triple."""
    header, end, sep = plain
    if fmt is None:
        return plain
    if role == "tool" and form < WITH_TOOLS:
        last = bool(form & RESULT_LAST)
        return (fmt.result_first if form & RESULT_FIRST else fmt.result_next,
                fmt.result_last_end if last else fmt.result_end, fmt.result_sep if last else [])
    if role == "system" and form == WITH_TOOLS:
        return header, fmt.list_ids + end, sep
    return plain
