"""Mask options and truncation policies, against ids and masks worked out by hand.

Byte tokenizer + ngpt template: SYS=256 USR=257 ASST=258 EOT=259, "a"=97 ... "d"=100.
Without the default system message, [user a, assistant b, user c, assistant d] serializes as
    U a E | A b E | U c E | A d E
    257 97 259 258 98 259 257 99 259 258 100 259
"""

from __future__ import annotations

from pathlib import Path

import pytest

from etl.config.run_config import MaskOptions, RunConfig
from tests.helpers import pipeline_examples

U, A, E, SYS = 257, 258, 259, 256
IDS = [U, 97, E, A, 98, E, U, 99, E, A, 100, E]
F, T = False, True
CONV = [
    {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
    {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
]


def run(tmp: Path, conv: list[dict[str, object]] = CONV, **cfg: object) -> dict[str, object]:
    cfg.setdefault("default_system", None)
    examples, _, _ = pipeline_examples([conv], RunConfig(template="ngpt", **cfg), tmp)  # type: ignore[arg-type]
    return examples.row(0, named=True)


@pytest.mark.parametrize(
    "options, mask",
    [
        (MaskOptions(), [F, F, F, F, T, T, F, F, F, F, T, T]),
        (MaskOptions(train_header=True), [F, F, F, T, T, T, F, F, F, T, T, T]),
        (MaskOptions(eot="last"), [F, F, F, F, T, F, F, F, F, F, T, T]),
        (MaskOptions(eot="none"), [F, F, F, F, T, F, F, F, F, F, T, F]),
        (MaskOptions(eot="all"), [F, F, T, F, T, T, F, F, T, F, T, T]),
        (MaskOptions(last_assistant_only=True), [F, F, F, F, F, F, F, F, F, F, T, T]),
        (MaskOptions(train_roles=("user", "assistant")), [F, T, T, F, T, T, F, T, T, F, T, T]),
    ],
    ids=["default", "train_header", "eot_last", "eot_none", "eot_all", "last_assistant_only", "train_user"],
)
def test_mask_options(tmp_path: Path, options: MaskOptions, mask: list[bool]) -> None:
    row = run(tmp_path, mask=options)
    assert row["input_ids"] == IDS
    assert row["loss_mask"] == mask
    assert row["num_trained"] == sum(mask)


def test_per_message_train_overrides_role_rules(tmp_path: Path) -> None:
    conv = [dict(m) for m in CONV]
    conv[0]["train"] = True  # a user turn the record asks to train
    conv[1]["train"] = False  # an assistant turn it asks not to
    row = run(tmp_path, conv=conv)
    assert row["loss_mask"] == [F, T, T, F, F, F, F, F, F, F, T, T]


def test_per_message_weight_becomes_loss_weight(tmp_path: Path) -> None:
    conv = [dict(m) for m in CONV]
    conv[1]["weight"] = 0.5
    row = run(tmp_path, conv=conv, input_options={"weight_key": "weight"})
    assert row["loss_weight"] == [0, 0, 0, 0, 0.5, 0.5, 0, 0, 0, 0, 1, 1]


def test_weight_zero_means_not_trained(tmp_path: Path) -> None:
    conv = [dict(m) for m in CONV]
    conv[1]["weight"] = 0.0
    row = run(tmp_path, conv=conv, input_options={"weight_key": "weight"})
    assert row["loss_mask"] == [F, F, F, F, F, F, F, F, F, F, T, T]
    assert row["num_trained"] == 2 and row["loss_weight"] == [0] * 10 + [1, 1]


def test_default_system_is_inserted(tmp_path: Path) -> None:
    row = run(tmp_path, default_system="s")
    assert row["input_ids"] == [SYS, 115, E] + IDS


@pytest.mark.parametrize(
    "policy, seq_len, ids, mask, dropped_turns",
    [
        ("drop_oldest_turns", 9, [U, 99, E, A, 100, E], [F, F, F, F, T, T], 2),
        ("keep_prefix", 9, [U, 97, E, A, 98, E], [F, F, F, F, T, T], 2),
        ("right", 9, [U, 97, E, A, 98, E, U, 99, E], [F, F, F, F, T, T, F, F, F], 1),
        # drop_oldest_turns then a hard cut that ends at the final end-of-turn; the second user
        # turn keeps only its end-of-turn, so it still counts as kept
        ("drop_oldest_turns", 4, [E, A, 100, E], [F, F, T, T], 2),
    ],
)
def test_truncation_policies(tmp_path: Path, policy: str, seq_len: int, ids: list[int], mask: list[bool], dropped_turns: int) -> None:
    row = run(tmp_path, truncation=policy, seq_len=seq_len)
    assert row["input_ids"] == ids
    assert row["loss_mask"] == mask
    assert row["num_turns_dropped"] == dropped_turns
    assert row["truncated"] is True and row["drop_reason"] is None


@pytest.mark.parametrize("policy, seq_len, reason", [("drop", 11, "too_long"), ("keep_prefix", 5, "first_pair_too_long")])
def test_policies_that_drop_the_conversation(tmp_path: Path, policy: str, seq_len: int, reason: str) -> None:
    assert run(tmp_path, truncation=policy, seq_len=seq_len)["drop_reason"] == reason


def test_system_turn_survives_whole_turn_dropping(tmp_path: Path) -> None:
    conv = [{"role": "system", "content": "s"}] + CONV
    row = run(tmp_path, conv=conv, seq_len=9)
    assert row["input_ids"] == [SYS, 115, E, U, 99, E, A, 100, E]


def test_require_complete_user_masks_an_assistant_after_a_cut_user(tmp_path: Path) -> None:
    conv = [{"role": "user", "content": "aaaa"}, {"role": "assistant", "content": "b"}]
    # U aaaa E A b E is 9 tokens; S = 8 cuts the user marker away.
    plain = run(tmp_path, conv=conv, seq_len=8)
    assert plain["input_ids"] == [97, 97, 97, 97, E, A, 98, E] and plain["num_trained"] == 2
    strict = run(tmp_path, conv=conv, seq_len=8, mask=MaskOptions(require_complete_user=True))
    assert strict["num_trained"] == 0
    whole = run(tmp_path, conv=conv, seq_len=9, mask=MaskOptions(require_complete_user=True))
    assert whole["num_trained"] == 2


def test_post_training_template_trains_the_marker_and_appends_eos(tmp_path: Path) -> None:
    # post_training: SYSTEM=256 USER=257 ASSISTANT=258 END=259 EOS=260
    conv = CONV[:2]
    examples, _, _ = pipeline_examples([conv], RunConfig(template="post_training", default_system=None), tmp_path)
    row = examples.row(0, named=True)
    assert row["input_ids"] == [257, 97, 259, 258, 98, 259, 260]
    assert row["loss_mask"] == [F, F, F, T, T, T, F]


def test_a_trailing_user_turn_does_not_cost_an_older_pair(tmp_path: Path) -> None:
    # U a E A b E U c E A d E | U eeeeeeee E: 22 tokens, S = 12. Everything up to the final
    # assistant end-of-turn fits, so no pair is dropped; the trailing (untrained) turn is cut.
    conv = [*CONV, {"role": "user", "content": "e" * 8}]
    row = run(tmp_path, conv=conv, seq_len=12)
    assert row["input_ids"] == IDS
    assert row["loss_mask"] == [F, F, F, F, T, T, F, F, F, F, T, T]
    assert row["num_turns_dropped"] == 1 and row["truncated"] is True
