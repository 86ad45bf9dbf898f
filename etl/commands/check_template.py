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
with the reference: the tokenizer's chat_template rendered with jinja2 (as transformers does)
on the same messages, the pipeline's inserted default system message included, and the whole
text encoded at once by the raw `tokenizers` library (not transformers: for Phi-3 the two
paths differ after special tokens). Reports the share of identical examples, the share equal
after ignoring a leading bos and trailing eos/pad/whitespace, and the first differing example
as aligned token pieces.

examples:
  etl check-template chats.jsonl --tokenizer ../shared/data/qwen2.5-tokenizer
  etl check-template chats.jsonl --tokenizer ../shared/data/phi3-tokenizer --template phi3 --limit 200
  etl check-template data/ --tokenizer DIR --config sharegpt.json --format json
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `etl check-template`."""
    p.add_argument("src", metavar="SRC", help="input file, directory or glob")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory with a chat_template")
    p.add_argument("--template", default="hf",
                   help="hf (default: derived from the chat_template) or a preset name")
    p.add_argument("--limit", type=int, metavar="N", help="check at most N records")
    p.add_argument("--config", help="JSON or TOML run config (input type, default system, ...)")
    p.add_argument("--no-default-system", action="store_true",
                   help="do not insert etl's default system message (the template may insert its own)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")


def run(args: argparse.Namespace) -> int:
    """Run the check and print the report; exit 0 whatever the share (it is a measurement)."""
    from etl.check_template import check_template
    from etl.errors import EtlError
    from etl.settings import config_from_args

    if args.limit is not None and args.limit < 1:
        raise EtlError(f"--limit must be 1 or more, got {args.limit}")
    args.seq_len = None  # check_template lifts seq_len itself: nothing may be truncated
    report = check_template(args.src, config_from_args(args), limit=args.limit)
    if report.examples == 0:
        raise EtlError(f"no usable records in {args.src} (rejected: {report.rejected or 'none'})")
    if args.format == "json":
        json.dump(report.to_json(), sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report.to_json()))
    return 0


def render_text(report: dict[str, Any]) -> str:
    """The report as plain text: counts, then the first difference as aligned token pieces."""
    n = report["examples"]
    lines = [
        f"template {report['template']} vs the chat_template of {report['tokenizer']}",
        f"reference: {report['reference']}",
        f"default system inserted by etl: {report['default_system']!r}",
        f"examples: {n:,}" + (f"  (rejected records: {report['rejected']})" if report["rejected"] else ""),
        f"identical ids: {report['identical']:,} ({report['share_identical']:.1%})",
        (f"identical ignoring bos/eos/trailing whitespace: {report['identical_loose']:,} "
         f"({report['share_identical_loose']:.1%})"),
    ]
    if report["differ_with_special_text"]:
        lines.append(f"differing examples whose content contains special-token text (encoded as text by etl, "
                     f"on purpose): {report['differ_with_special_text']:,}")
    if report["template_notes"]:
        lines.append(f"template notes: {report['template_notes']}")
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


def _cell(index: int | None, token_id: int | None, piece: str | None) -> str:
    if token_id is None:
        return f"{'-':<36}"
    return f"{index:>6} {token_id:>7} {piece!r:<21}"
