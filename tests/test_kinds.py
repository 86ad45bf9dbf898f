"""The kinds registry: every stage's table covers every kind, and the facts match the schemas."""

from __future__ import annotations

from etl import columns as c
from etl.formats.builders import BUILDERS
from etl.kinds import KINDS, PAIR_INPUT_TYPES, PREFERENCE, SFT, UNPAIRED, kind_of
from etl.output.parquet import KIND_SCHEMAS
from etl.pipeline.chunk import CHUNK_WRITERS


def test_every_stage_table_covers_every_kind():
    assert set(KIND_SCHEMAS) == set(CHUNK_WRITERS) == set(KINDS)


def test_the_input_type_decides_the_kind():
    assert [kind_of(t).name for t in ("chat", "text", "preference", "unpaired")] == [SFT, SFT, PREFERENCE, UNPAIRED]
    assert set(PAIR_INPUT_TYPES) <= set(BUILDERS)


def test_facts_agree_with_the_schemas():
    for kind in KINDS.values():
        names = KIND_SCHEMAS[kind.name].names
        assert set(kind.columns) <= set(names)
        assert {col for part in kind.parts for col in part if col} <= set(names)
        assert set(kind.sides) <= set(names) and (kind.label is None or kind.label in names)
    assert (KINDS[SFT].pair, KINDS[PREFERENCE].paired, KINDS[UNPAIRED].paired) == (False, True, False)
    assert KINDS[UNPAIRED].label == c.LABEL and KINDS[PREFERENCE].parts[0] == (c.PROMPT_IDS, None)
