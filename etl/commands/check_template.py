"""`etl check-template SRC --tokenizer DIR`: pipeline ids vs. the tokenizer's chat_template, on real data."""

from __future__ import annotations

import argparse
import json
import sys

from etl.errors import EtlError

NAME = "check-template"
HELP = "compare the pipeline's ids with the tokenizer's own chat_template tokenized whole"
DESCRIPTION = """\
Run the etl pipeline in memory on SRC (no truncation), with the run's config (its template,
default auto: hf for a tokenizer with a chat_template; its default system prompt, default the
template's own), and compare each example's input_ids with the reference: the tokenizer's
chat_template applied to the same conversation (content, reasoning as reasoning_content, tool
calls as tool_calls, the record's tools, the pipeline's inserted default system message) by
transformers' apply_chat_template(tokenize=True), the ids a trainer using transformers gets;
without transformers installed, etl's jinja2 rendering of the template encoded whole by the raw
`tokenizers` library (for Phi-3 the two paths differ after special tokens). Special-token text
in content is control to the reference and text to etl, on purpose: such examples are counted
apart. Prints a table: identical examples, those
equal after ignoring a leading bos and trailing eos/pad/whitespace, records rejected before the
check; a one-line verdict; the reference used; hints (the input type the records' keys suggest,
the chat_template's own default system prompt); and the first differing example as aligned
token pieces. With --input-type preference the reference is TRL's DPOTrainer._prepare_dataset on
the same pairs (needs trl): pairs equal to TRL's prompt/chosen/rejected ids, and the others by
reason (the prompt rendered alone differs from inside the conversation; tokens merge across the
prompt/completion join); etl's rule is the conversation's rendering.

Records with images (a --tokenizer folder with a preprocessor_config.json) have them read as
`etl run` reads them (relative to the data file's folder or --image-root; its rejects counted,
not checked); the reference renders each image as an image part and repeats its <|image_pad|>
as many times as transformers' image processor (from --processor, default the --tokenizer
folder, with --max-pixels / --min-pixels) gives for the image load_image opens.

examples:
  etl check-template chats.jsonl --tokenizer ../shared/data/qwen2.5-tokenizer
  etl check-template chats.jsonl --tokenizer ../shared/data/phi3-tokenizer --template phi3 --limit 200
  etl check-template data/ --tokenizer DIR --config sharegpt.json --format json
  etl check-template hh.jsonl.gz --tokenizer ../shared/data/qwen2.5-tokenizer --input-type preference
  etl check-template ../shared/data/images/llamafactory-mllm-demo/mllm_demo.json \
      --tokenizer ../shared/data/qwen2.5-vl-processor
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `etl check-template`; --template and --input-type as `etl run` declares them."""
    # pydantic: only the chosen command's flags are built (docs/design.md, Imports)
    from etl.config.build import add_flags

    p.add_argument("src", metavar="SRC", help="input file, directory or glob")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory with a chat_template")
    add_flags(p, ("template",))
    p.add_argument("--limit", type=int, metavar="N", help="check at most N records")
    p.add_argument("--config", help="JSON or TOML run config (input type, default system, ...)")
    add_flags(p, ("input_type",))
    p.add_argument("--no-default-system", action="store_true",
                   help="insert no system message where a conversation has none (default: the "
                   "template's own; with this flag the reference's chat_template may still write its own)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default text)")
    add_flags(p, ("image_root", "max_pixels", "min_pixels"))
    p.add_argument("--processor", metavar="DIR", help="the folder whose preprocessor_config.json the reference's "
                   "image processor loads (default the --tokenizer folder): another config than etl's shows "
                   "which images it would give other token counts")


def run(args: argparse.Namespace) -> int:
    """Run the check and print the report; exit 0 whatever the share (it is a measurement)."""
    # tokenizers/polars/duckdb: only when run, not for --help
    from etl.analysis.check_template import check_template
    from etl.analysis.check_template_pairs import check_pairs
    from etl.analysis.check_template_report import nothing_checked, render_text
    from etl.config.build import config_from_args
    from etl.kinds import PREFERENCE, SFT, kind_of

    if args.limit is not None and args.limit < 1:
        raise EtlError(f"--limit must be 1 or more, got {args.limit}")
    args.seq_len = None  # check_template lifts seq_len itself: nothing may be truncated
    config = config_from_args(args)
    # The reference of each kind: transformers' chat_template, or TRL's DPOTrainer for pairs.
    check = {SFT: check_template, PREFERENCE: check_pairs}.get(kind_of(config.input_type).name)
    if check is None:
        raise EtlError("check-template compares conversations (with the chat_template) or preference pairs "
                       "(--input-type preference, with TRL's DPOTrainer); not unpaired completions")
    if args.processor and check is not check_template:
        raise EtlError("--processor checks images of conversations; preference pairs have none")
    options = {"processor": args.processor} if args.processor else {}
    report = check(args.src, config, limit=args.limit, **options).to_json()
    if report["examples"] == 0:
        raise EtlError(nothing_checked(report, args.src))
    if args.format == "json":
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    return 0
