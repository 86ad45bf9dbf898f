"""Which `sql/` queries describe an output of each kind: SFT examples, preference pairs, unpaired.

The manifest's `kind` (absent in outputs written before preference data: "sft") picks the query
set (its `queries` in etl.kinds.KINDS). Preference and unpaired outputs have no `turns/` parts and other `data` columns, so they get
their own queries in `sql/preference/` (lengths of prompt / chosen / rejected, the length bias,
score ties, truncation, label balance), plus the SFT queries that read only columns every kind
writes (`drops`, `rejects`, `packing`: `num_tokens` is what a packer bins).
"""

from __future__ import annotations

from typing import Any

from etl import columns as C
from etl.errors import EtlError
from etl.kinds import KINDS, SFT, shared_query

PAIR_FOLDER = "preference"  # sql/preference/: the queries of both pair kinds


def output_kind(manifest: dict[str, Any]) -> str:
    """The manifest's `kind`: "sft" when absent (outputs written before preference data).

    Raises:
        EtlError: an unknown kind (an output of a newer etl): says which ones this etl reads.
    """
    kind = manifest.get(C.MANIFEST_KIND) or SFT
    if kind not in KINDS:
        raise EtlError(
            f"the manifest's kind {kind!r} is not one this etl reads ({', '.join(KINDS)}): "
            "upgrade etl to the version that wrote the output"
        )
    return str(kind)


def query_file(name: str, kind: str) -> str:
    """Where query `name` of an output of `kind` lies, relative to the `sql/` folder."""
    return f"{name}.sql" if not KINDS[kind].pair or shared_query(name) else f"{PAIR_FOLDER}/{name}.sql"
