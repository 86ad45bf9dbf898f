"""SRC and DST given as URIs: `file://` URIs and plain paths are local (or shared) paths.

pyarrow's filesystems (`pyarrow.fs.FileSystem.from_uri`) name every scheme etl could read; the
Ray engine resolves SRC and DST through them so a `file://` URI is the path it names. Object
stores (s3://, gs://) are refused with a clear error for now: etl's reader, its lock and its
renames work on files (see README "Running on Ray": put the data on shared storage).
"""

from __future__ import annotations

from etl.errors import EtlError


def local_path(location: str, *, what: str) -> str:
    """The filesystem path of `location` (a path or a file:// URI)."""
    if "://" not in location:
        return location
    from pyarrow.fs import FileSystem, LocalFileSystem

    try:
        fs, path = FileSystem.from_uri(location)
    except (ValueError, OSError) as exc:
        raise EtlError(f"{what} {location}: not a location pyarrow can open ({exc})") from exc
    if not isinstance(fs, LocalFileSystem):
        raise EtlError(
            f"{what} {location}: {fs.type_name} URIs are not supported yet; mount the bucket on every "
            "node (e.g. s3fs, gcsfuse, a shared filesystem) and pass its path"
        )
    return path
