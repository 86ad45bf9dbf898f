"""Which `sql/` queries describe an output of each kind: SFT examples, preference pairs, unpaired.

The manifest's `kind` (absent in outputs written before preference data: "sft") picks the query
set. Preference and unpaired outputs have no `turns/` parts and other `data` columns, so they get
their own queries in `sql/preference/` (lengths of prompt / chosen / rejected, the length bias,
score ties, truncation, label balance), plus the SFT queries that read only columns every kind
writes (`drops`, `rejects`, `packing`: `num_tokens` is what a packer bins).
"""

from __future__ import annotations

from typing import Any

from etl import columns as C
from etl.errors import EtlError

SFT = "sft"
PAIR_FOLDER = "preference"  # sql/preference/: the queries of both pair kinds

# Display order of `etl stats` and the report per pair kind: summaries first, manifest counts last.
QUERIES = {
    "preference": (
        "pairs",
        "part_lengths",
        "part_length_histogram",
        "length_bias",
        "length_difference",
        "scores",
        "truncation",
        "drops",
        "rejects",
        "packing",
    ),
    "unpaired": ("labels", "part_lengths", "part_length_histogram", "drops", "rejects", "packing"),
}
SHARED = ("drops", "rejects", "packing")  # sql/<name>.sql, the SFT queries every kind can run


def output_kind(manifest: dict[str, Any]) -> str:
    """The manifest's `kind`: "sft" when absent (outputs written before preference data).

    Raises:
        EtlError: an unknown kind (an output of a newer etl): says which ones this etl reads.
    """
    kind = manifest.get(C.MANIFEST_KIND) or SFT
    if kind not in C.KINDS:
        raise EtlError(
            f"the manifest's kind {kind!r} is not one this etl reads ({', '.join(C.KINDS)}): "
            "upgrade etl to the version that wrote the output"
        )
    return str(kind)


def pair_query_names(kind: str) -> list[str]:
    """The queries of a pair kind ("preference", "unpaired"), in display order."""
    return list(QUERIES[kind])


def query_file(name: str) -> str:
    """Where pair-kind query `name` lies, relative to the `sql/` folder."""
    return f"{name}.sql" if name in SHARED else f"{PAIR_FOLDER}/{name}.sql"
