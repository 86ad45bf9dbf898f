"""Property tests: the vectorized pipeline equals the seed-000 reference in `etl/sft.py`."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etl import sft
from etl.columns import DEFAULT_SYSTEM_TEXT
from etl.config.run_config import RunConfig
from etl.tokens.templates import NGPT_ASST, NGPT_EOT, NGPT_SYS, NGPT_USR, get_template
from etl.tokens.tokenizer import ByteTokenizer
from tests.helpers import pipeline_examples

TRICKY = ["", " ", "<|im_end|>", NGPT_EOT, NGPT_ASST, "<|endoftext|>", "héllo wörld", "日本語", "a\nb", "🙂"]
content = st.one_of(st.text(max_size=25), st.sampled_from(TRICKY))
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": content})
conversation = st.lists(message, min_size=1, max_size=12)
seq_len = st.one_of(st.integers(2, 64), st.integers(64, 400), st.just(100_000))


def reference(conv: list[dict[str, str]], S: int) -> tuple[list[int], list[bool]]:
    tok = ByteTokenizer(get_template("ngpt").special_tokens)
    ids_of = {name: tok.token_to_id(t) for name, t in
              (("sys_id", NGPT_SYS), ("usr_id", NGPT_USR), ("asst_id", NGPT_ASST), ("eot_id", NGPT_EOT))}
    ids = sft.serialize_chat_to_ids({"messages": conv}, tokenizer=tok, default_system_text=DEFAULT_SYSTEM_TEXT)
    mask = sft.sft_loss_mask_for_ids(ids, **ids_of)
    return sft.pack_sft_ids_and_mask(ids, mask, S=S, pad_id=ids_of["eot_id"], **ids_of)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(convs=st.lists(conversation, min_size=1, max_size=5), S=seq_len)
def test_pipeline_matches_reference(convs: list[list[dict[str, str]]], S: int, tmp_path: Path) -> None:
    examples, _, ctx = pipeline_examples(convs, RunConfig(template="ngpt", seq_len=S), tmp_path)
    assert examples.height == len(convs)
    pad = ctx.template.eot_id
    for conv, row in zip(convs, examples.iter_rows(named=True)):
        ref_ids, ref_mask = reference(conv, S)
        n = row["num_tokens"]
        assert row["input_ids"] == ref_ids[:n]
        assert row["loss_mask"] == ref_mask[:n]
        assert ref_ids[n:] == [pad] * (S - n) and not any(ref_mask[n:])
        assert row["num_trained"] == sum(ref_mask)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(convs=st.lists(conversation, min_size=1, max_size=4), S=seq_len)
def test_turn_spans_tile_each_example(convs: list[list[dict[str, str]]], S: int, tmp_path: Path) -> None:
    examples, plan, _ = pipeline_examples(convs, RunConfig(template="chatml", seq_len=S), tmp_path)
    for row in examples.iter_rows(named=True):
        turns = plan.filter(plan["conv"] == row["conv"]).sort("turn_index")
        kept = turns.filter(turns["kept"])
        spans = list(zip(kept["start"].to_list(), kept["end"].to_list()))
        # Kept turns tile [0, num_tokens) in order; dropped turns have -1 spans.
        assert spans and spans[0][0] == 0 and spans[-1][1] == row["num_tokens"]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        dropped = turns.filter(~turns["kept"])
        assert set(dropped["start"].to_list()) <= {-1} and row["num_turns_dropped"] == dropped.height
        assert row["num_tokens"] <= S
