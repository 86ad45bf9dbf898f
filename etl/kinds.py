"""What one `data` row is, per kind, in one registry (`KINDS`), as BUILDERS and PACKERS are.

The input type decides the kind (`kind_of`) and the manifest records it (`kind`). A stage asks the
row's `Kind` what differs (its columns, its parts, its label, which truncation rules and queries
apply, how the card and a refusal name its rows) instead of comparing names. Behaviour lives in
each stage's own table keyed by these names, beside the code it calls (a test keeps each equal to
`KINDS`): the chunk writer (`etl.pipeline.chunk.CHUNK_WRITERS`), the row schema
(`etl.output.parquet.KIND_SCHEMAS`), the template check (`etl.commands.check_template`) and the
loader's sampler and collate (`etl.loader.dataset`). Kept free of pyarrow and numpy: `etl run
--help` reads it.
"""

from __future__ import annotations

from typing import NamedTuple

from etl import columns as c

SFT, PREFERENCE, UNPAIRED = "sft", "preference", "unpaired"
# The turn policies of conversations (whole turns dropped or a cut at S); pairs take
# `keep_start` / `keep_end` (etl.pipeline.pair_truncation, which also reads `right` as keep_start).
SFT_POLICIES = ("drop_oldest_turns", "keep_prefix", "right", "drop")


class Card(NamedTuple):
    """The dataset card's words for a kind (etl.output.card)."""

    what: str  # "Tokenized {what} written by `etl run`"
    rows: str  # "wrote {n} {rows}"; its singular is the load line's "one row per ..."
    use: tuple[str, ...]  # how TRL takes it ({seq_len} filled in)
    masks: str = ""  # a pair kind: its mask columns, in the Columns section


class Kind(NamedTuple):
    """One kind of `data` row.

    Attributes:
        name: the manifest's `kind`.
        input_type: the input type whose records give it; None: every other input type.
        columns: the id (and mask) columns a reader needs in every part file.
        parts: a pair kind's (ids, mask) columns in layout order, the prompt first (no mask: never
            trained; a missing mask column reads as all trained); () for SFT's one token stream.
        sides: the completions' token counts; a row's length as S measures it is the prompt's plus
            the longest side's (SFT: `num_tokens`).
        label: the bool column saying a completion is desirable (KTO), or None.
        queries: `etl stats` / report queries in display order; (): every `sql/*.sql` (SFT).
        rows: its rows as a refusal names them.
        card: the dataset card's words.
    """

    name: str
    input_type: str | None
    columns: tuple[str, ...]
    parts: tuple[tuple[str, str | None], ...]
    sides: tuple[str, ...]
    label: str | None
    queries: tuple[str, ...]
    rows: str
    card: Card

    @property
    def pair(self) -> bool:
        """Rows of a prompt and its completion(s) (TRL's columns), not one token stream with turns:
        no `turns/`, no pack index, no bin/h5 export."""
        return bool(self.parts)

    @property
    def paired(self) -> bool:
        """A chosen and a rejected completion of one prompt (DPO)."""
        return len(self.sides) == 2


_SFT_USE = (
    "`ds[\"train\"]` goes to TRL's `SFTTrainer` as is: TRL builds the labels from `assistant_masks`",
    "(a copy of `loss_mask`), so exactly the tokens etl marks are trained. Pass",
    "`SFTConfig(max_length={seq_len})`: TRL's default of 1024 would cut longer examples.")
_PAIR_USE = (
    "Rows carry TRL's `prompt_ids`, `chosen_ids`, `rejected_ids` (`prompt_ids + chosen_ids` is the",
    "whole chosen conversation as the template renders it): TRL's `DataCollatorForPreference` batches",
    "them as they are. etl's loader also packs them with the prompt shared (docs/preference.md).")
_SHARED_QUERIES = ("drops", "rejects", "packing")  # sql/<name>.sql: read only columns every kind writes

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind(SFT, None, (c.INPUT_IDS, c.LOSS_MASK), (), (), None, (), "examples",
         Card("SFT examples", "examples", _SFT_USE)),
    Kind(PREFERENCE, "preference", (c.PROMPT_IDS, c.CHOSEN_IDS, c.REJECTED_IDS),
         ((c.PROMPT_IDS, None), (c.CHOSEN_IDS, c.CHOSEN_MASK), (c.REJECTED_IDS, c.REJECTED_MASK)),
         (c.NUM_CHOSEN_TOKENS, c.NUM_REJECTED_TOKENS), None,
         ("pairs", "part_lengths", "part_length_histogram", "length_bias", "length_difference", "scores",
          "truncation", *_SHARED_QUERIES),
         "preference pairs (prompt, chosen, rejected)",
         Card("preference pairs", "pairs", _PAIR_USE, "`chosen_mask` / `rejected_mask`")),
    Kind(UNPAIRED, "unpaired", (c.PROMPT_IDS, c.COMPLETION_IDS),
         ((c.PROMPT_IDS, None), (c.COMPLETION_IDS, c.COMPLETION_MASK)), (c.NUM_COMPLETION_TOKENS,), c.LABEL,
         ("labels", "part_lengths", "part_length_histogram", *_SHARED_QUERIES), "unpaired rows",
         Card("unpaired completions (KTO)", "rows",
              ("Rows carry TRL's `prompt_ids`, `completion_ids` and a bool `label` (desirable or not).",),
              "`completion_mask`")),
)}
PAIR_INPUT_TYPES = tuple(k.input_type for k in KINDS.values() if k.input_type)


def kind_of(input_type: str) -> Kind:
    """The kind of row an input type's records give (SFT unless a kind names the type)."""
    return next((k for k in KINDS.values() if k.input_type == input_type), KINDS[SFT])


def shared_query(name: str) -> bool:
    """A query every kind runs from `sql/<name>.sql` (a pair kind's others lie in `sql/preference/`)."""
    return name in _SHARED_QUERIES
