"""`etl check-template`'s report in words: a table of counts, a verdict, hints, the first difference.

Reads the report's JSON form (`CheckReport.to_json`, what `--format json` prints).
"""

from __future__ import annotations

import json
from typing import Any

from etl.analysis.run_summary import by_reason
from etl.analysis.trl_pairs import CONVERSATION, OTHER, REASON_TEXT
from etl.formats.layout_hint import input_type_hint
from etl.kinds import KINDS, SFT


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text: a table of counts, a verdict, hints, then the first difference."""
    if KINDS[report.get("kind") or SFT].pair:
        return _render_pairs(report)
    n = report["examples"]
    rows = [
        ("examples checked", f"{n:,}", ""),
        ("identical ids", f"{report['identical']:,}", f"{report['share_identical']:.1%}"),
        ("identical ignoring bos/eos/trailing whitespace", f"{report['identical_loose']:,}",
         f"{report['share_identical_loose']:.1%}"),
    ]
    if report.get("images"):
        rows.append(("images in them", f"{report['images']:,}", "read as etl run reads them"))
    if report.get("differ_image_tokens"):
        rows.append(("differing, other image token counts", f"{report['differ_image_tokens']:,}",
                     "etl's image processor settings and the reference's disagree"))
    if report["differ_with_special_text"]:
        rows.append(("differing, content has special-token text", f"{report['differ_with_special_text']:,}",
                     "etl encodes it as text, on purpose"))
    if report.get("identical_as_data") is not None:
        rows.append(("  of which identical with sanitize_control_tokens", f"{report['identical_as_data']:,}",
                     "transformers encoding special-token text in messages as text, as etl does"))
    if report["rejected"]:
        rows.append(("records rejected, not checked", f"{sum(report['rejected'].values()):,}",
                     ", ".join(f"{reason} {k:,}" for reason, k in report["rejected"].items())))
    label, count = (max(len(r[i]) for r in rows) for i in (0, 1))
    lines = [
        f"template {report['template']} vs the chat_template of {report['tokenizer']}",
        "",
        *(f"  {name:<{label}}  {value:>{count}}  {extra}".rstrip() for name, value, extra in rows),
        "",
        f"verdict: {_verdict(report)}",
        (f"default system: etl inserts {_text(report['default_system'])}; the chat_template's own is "
         f"{_text(report['template_default_system'])}"),
        f"reference: {report['reference']}",
        *([f"image tokens: {report['image_reference']}"] if report.get("image_reference") else []),
    ]
    if report["template_notes"]:
        lines.append(f"template notes: {report['template_notes']}")
    lines += [f"hint: {h}" for h in _hints(report)]
    return "\n".join(lines + _diff_lines(report["first_diff"])) + "\n"


def _diff_lines(diff: dict[str, Any] | None) -> list[str]:
    """The first differing example as aligned token pieces, pipeline beside reference."""
    if not diff:
        return []
    where = f" in {diff['part']} ({diff['reason']})" if "part" in diff else ""
    lines = [
        "",
        (f"first difference: example {diff['id']}{where} at token {diff['position']} "
         f"(pipeline {diff['pipeline_tokens']} tokens, reference {diff['reference_tokens']})"),
        f"  {'pipeline':<36} {'reference':<36}",
    ]
    for row in diff["rows"]:
        mark = "!" if row["differs"] else " "
        lines.append(f"{mark} {_cell(row['pipeline_index'], row['pipeline_id'], row['pipeline_piece'])} "
                     f"{_cell(row['reference_index'], row['reference_id'], row['reference_piece'])}")
    return lines


def _render_pairs(report: dict[str, Any]) -> str:
    """Preference pairs: how many equal TRL's tokenization, how many differ and why, then the first one."""
    n = report["examples"]
    rows = [("pairs checked", f"{n:,}", ""),
            ("equal to TRL (prompt, chosen, rejected ids)", f"{report['equal']:,}", f"{report['share_equal']:.1%}"),
            ("TRL warns (its cut is shorter than the prompt alone)", f"{report['trl_warns']:,}", "")]
    rows += [(f"differ: {reason}", f"{k:,}", REASON_TEXT[reason]) for reason, k in report["differ"].items() if k]
    if report["rejected"]:
        rows.append(("pairs rejected, not checked", f"{sum(report['rejected'].values()):,}",
                     ", ".join(f"{reason} {k:,}" for reason, k in report["rejected"].items())))
    label, count = (max(len(r[i]) for r in rows) for i in (0, 1))
    unexplained, whole = report["differ"].get(OTHER, 0), report["differ"].get(CONVERSATION, 0)
    verdict = (f"{unexplained:,} pairs differ from TRL for no known reason: see the first difference below"
               if unexplained else f"{whole:,} pairs differ because etl's conversation ids differ from "
               "apply_chat_template's: check-template with the conversations' input type (chat, transcript) "
               "shows why" if whole else "every pair equals TRL's tokenization or differs for a known reason "
               "(etl's rule is the conversation's rendering)")
    lines = [f"template {report['template']} vs TRL's DPOTrainer tokenization with {report['tokenizer']}", "",
             *(f"  {name:<{label}}  {value:>{count}}  {extra}".rstrip() for name, value, extra in rows), "",
             f"verdict: {verdict}", f"reference: {report['reference']}"]
    hint = _input_type_hint(report)
    lines += [f"hint: {hint}"] if hint else []
    return "\n".join(lines + _diff_lines(report["first_diff"])) + "\n"


def _verdict(report: dict[str, Any]) -> str:
    """One line: does the template reproduce the chat_template, and if not, what explains it."""
    differ = report["examples"] - report["identical"]
    if not differ:
        return f"template {report['template']} gives the chat_template's ids on every example"
    if report["identical_loose"] == report["examples"]:
        return "the ids differ only in a leading bos or trailing eos/pad/whitespace tokens"
    if report["default_system"] is None and report["template_default_system"] is not None:
        return ("etl inserts no system prompt (--no-default-system) where the chat_template inserts its "
                "own, which explains differences in conversations without one: see the hint below")
    if report.get("differ_image_tokens") == differ:
        return ("every differing example has another number of image tokens than the reference's processor "
                "gives: etl's image settings (the tokenizer folder's preprocessor_config.json, --max-pixels, "
                "--min-pixels) and the reference's disagree (see image tokens below)")
    if report["differ_with_special_text"] == differ:
        return ("every differing example has special-token text in its content, which etl encodes as "
                "text on purpose (content is data, never control); the reference parses it as control")
    return (f"{differ:,} examples differ: see the first difference below; "
            "try another --template or check the template notes")


def _hints(report: dict[str, Any]) -> list[str]:
    """What to change: the input type the rejected records suggest, the template's own system text."""
    input_type = _input_type_hint(report)
    out = [input_type] if input_type else []
    own = report["template_default_system"]
    if own is not None and own != report["default_system"]:
        out.append("to insert the chat_template's own system prompt where a conversation has none, use "
                   "template hf (auto's choice for this tokenizer) and leave default_system unset, or set "
                   f"\"default_system\": {json.dumps(own, ensure_ascii=False)} in a --config file")
    if report["rejected"] and not input_type:
        out.append("rejected records are not checked; `etl run SRC DST` writes each one with its reason "
                   "and line to DST/_rejects")
    return out


def _input_type_hint(report: dict[str, Any]) -> str | None:
    """When most records lack the keys the input type reads, the type their keys suggest."""
    missing = report["rejected"].get("missing_key", 0)
    if missing * 2 < report["examples"] + sum(report["rejected"].values()):
        return None
    return input_type_hint(missing, report["record_keys"], report["input_type"])


def nothing_checked(report: dict[str, Any], src: str) -> str:
    """The error when no record of SRC could be checked: how many were rejected, and why."""
    why = _input_type_hint(report) or "`etl run SRC DST` writes each with its reason to DST/_rejects"
    return f"no usable records in {src}: rejected {by_reason(report['rejected'], none='none')}; {why}"


def _text(system: str | None) -> str:
    return "none" if system is None else repr(system)


def _cell(index: int | None, token_id: int | None, piece: str | None) -> str:
    if token_id is None:
        return f"{'-':<36}"
    return f"{index:>6} {token_id:>7} {piece!r:<21}"
