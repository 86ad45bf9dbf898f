"""`etl check-template SRC --tokenizer DIR`: pipeline ids vs. the tokenizer's chat_template, on real data."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NAME = "check-template"
HELP = "compare the pipeline's ids with the tokenizer's own chat_template tokenized whole"
DESCRIPTION = """\
Run the etl pipeline in memory on SRC (no truncation) and compare each example's input_ids
with the reference: the tokenizer's chat_template applied to the same conversation (content,
reasoning as reasoning_content, tool calls as tool_calls, the record's tools, the pipeline's
inserted default system message) by transformers' apply_chat_template(tokenize=True), the ids
a trainer using transformers gets; without transformers installed, etl's jinja2 rendering of
the template encoded whole by the raw `tokenizers` library (for Phi-3 the two paths differ
after special tokens). Special-token text in content is control to the reference and text to
etl, on purpose: such examples are counted apart. Prints a table: identical examples, those
equal after ignoring a leading bos and trailing eos/pad/whitespace, records rejected before the
check; a one-line verdict; the reference used; hints (the input type the records' keys suggest,
the chat_template's own default system prompt); and the first differing example as aligned
token pieces.

examples:
  etl check-template chats.jsonl --tokenizer ../shared/data/qwen2.5-tokenizer
  etl check-template chats.jsonl --tokenizer ../shared/data/phi3-tokenizer --template phi3 --limit 200
  etl check-template data/ --tokenizer DIR --config sharegpt.json --format json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `etl check-template`; --template and --input-type as `etl run` declares them."""
    from etl.config.flags import add_flags

    p.add_argument("src", metavar="SRC", help="input file, directory or glob")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory with a chat_template")
    add_flags(p, ("template",), template="hf")
    p.add_argument("--limit", type=int, metavar="N", help="check at most N records")
    p.add_argument("--config", help="JSON or TOML run config (input type, default system, ...)")
    add_flags(p, ("input_type",))
    p.add_argument("--no-default-system", action="store_true",
                   help="do not insert etl's default system message (the template may insert its own)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")


def run(args: argparse.Namespace) -> int:
    """Run the check and print the report; exit 0 whatever the share (it is a measurement)."""
    from etl.analysis.check_template import check_template
    from etl.config.from_file import config_from_args
    from etl.errors import EtlError

    if args.limit is not None and args.limit < 1:
        raise EtlError(f"--limit must be 1 or more, got {args.limit}")
    args.seq_len = None  # check_template lifts seq_len itself: nothing may be truncated
    report = check_template(args.src, config_from_args(args), limit=args.limit)
    if report.examples == 0:
        why = input_type_hint(report.to_json()) or "`etl run SRC DST` writes each with its reason to DST/_rejects"
        raise EtlError(f"no usable records in {args.src}: rejected {_reasons(report.rejected)}; {why}")
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report.to_json()))
    return 0


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text: a table of counts, a verdict, hints, then the first difference."""
    n = report["examples"]
    rows = [
        ("examples checked", f"{n:,}", ""),
        ("identical ids", f"{report['identical']:,}", f"{report['share_identical']:.1%}"),
        ("identical ignoring bos/eos/trailing whitespace", f"{report['identical_loose']:,}",
         f"{report['share_identical_loose']:.1%}"),
    ]
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
        f"verdict: {verdict(report)}",
        (f"default system: etl inserts {_text(report['default_system'])}; the chat_template's own is "
         f"{_text(report['template_default_system'])}"),
        f"reference: {report['reference']}",
    ]
    if report["template_notes"]:
        lines.append(f"template notes: {report['template_notes']}")
    lines += [f"hint: {h}" for h in hints(report)]
    diff = report["first_diff"]
    if diff:
        lines += [
            "",
            (f"first difference: example {diff['id']} at token {diff['position']} "
             f"(pipeline {diff['pipeline_tokens']} tokens, reference {diff['reference_tokens']})"),
            f"  {'pipeline':<36} {'reference':<36}",
        ]
        for row in diff["rows"]:
            mark = "!" if row["differs"] else " "
            lines.append(f"{mark} {_cell(row['pipeline_index'], row['pipeline_id'], row['pipeline_piece'])} "
                         f"{_cell(row['reference_index'], row['reference_id'], row['reference_piece'])}")
    return "\n".join(lines) + "\n"


def verdict(report: dict[str, Any]) -> str:
    """One line: does the template reproduce the chat_template, and if not, what explains it."""
    differ = report["examples"] - report["identical"]
    if not differ:
        return f"template {report['template']} gives the chat_template's ids on every example"
    if report["identical_loose"] == report["examples"]:
        return "the ids differ only in a leading bos or trailing eos/pad/whitespace tokens"
    if report["default_system"] is None and report["template_default_system"] is not None:
        return ("etl inserts no system prompt (--no-default-system) where the chat_template inserts its "
                "own, which explains differences in conversations without one: see the hint below")
    if report["differ_with_special_text"] == differ:
        return ("every differing example has special-token text in its content, which etl encodes as "
                "text on purpose (content is data, never control); the reference parses it as control")
    return (f"{differ:,} examples differ: see the first difference below; "
            "try another --template or check the template notes")


def hints(report: dict[str, Any]) -> list[str]:
    """What to change: the input type the rejected records suggest, the template's own system text."""
    input_type = input_type_hint(report)
    out = [input_type] if input_type else []
    own = report["template_default_system"]
    if own is not None and own != report["default_system"]:
        out.append(f"to insert the chat_template's own system prompt where a conversation has none, set "
                   f"\"default_system\": {json.dumps(own, ensure_ascii=False)} in a --config file")
    if report["rejected"] and not input_type:
        out.append("rejected records are not checked; `etl run SRC DST` writes each one with its reason "
                   "and line to DST/_rejects")
    return out


def input_type_hint(report: dict[str, Any]) -> str | None:
    """When most records lack the keys the input type reads, the type their keys suggest."""
    from etl.commands.run import KEY_HINTS

    missing = report["rejected"].get("missing_key", 0)
    if missing * 2 < report["examples"] + sum(report["rejected"].values()):
        return None
    current, keys = report["input_type"], set(report["record_keys"])
    kind = next((kind for key, kind in KEY_HINTS if key in keys and kind != current), None)
    if kind is None:
        return None
    return (f"{missing:,} records lack the keys input type {current!r} reads; they have "
            f"{sorted(keys)}: try --input-type {kind} (options in --config)")


def _text(system: str | None) -> str:
    return "none" if system is None else repr(system)


def _reasons(counts: dict[str, int]) -> str:
    detail = ", ".join(f"{reason} {n:,}" for reason, n in counts.items())
    return f"{sum(counts.values()):,} ({detail})" if detail else "none"


def _cell(index: int | None, token_id: int | None, piece: str | None) -> str:
    if token_id is None:
        return f"{'-':<36}"
    return f"{index:>6} {token_id:>7} {piece!r:<21}"
