"""Exports: an `etl run` output rewritten in another training framework's layout (`etl export`).

    episodes.py      the episode export: OUT/<split>/tokens.bin, mask.bin, episodes.idx
    episode_loader.py + training_xml.py   `EpisodeDataLoader` and its `<training>` XML block
    token_files.py   the bin/h5 export: OUT/<domain>/meta.json + int64 token files or HDF5
    shards.py, backends.py   how the bin/h5 export cuts a domain into shards and writes them
    run_stage.py     `etl run`'s export stage: a config's output.storage_format, written into DST

Names are imported lazily (PEP 562): `EpisodeDataLoader` needs torch, the exports do not.

    from etl.export import EpisodeDataLoader, TrainingConfig, export_episodes
"""

from __future__ import annotations

from etl.lazy import lazy_exports

_EXPORTS = {
    "EpisodeDataLoader": "episode_loader",
    "TrainingConfig": "training_xml",
    "export_episodes": "episodes",
    "export_storage": "token_files",
    "write_bin": "token_files",
    "write_h5": "token_files",
    "read_bin": "token_files",
    "read_meta": "token_files",
}

__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
