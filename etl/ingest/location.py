"""SRC and DST given as URIs, for both engines: the filesystem a URI names, and its errors.

`pyarrow.fs.FileSystem.from_uri` resolves each scheme etl reads (`s3://`, `gs://`, `hdfs://`, ...)
with the options pyarrow takes in the URI; a `file://` URI is its path (the local fast path).
DST must be a path or `file://`: its contract (a lock, renames, the manifest last) needs a filesystem.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from etl.errors import EtlError
from etl.ingest.discover import is_uri

if TYPE_CHECKING:
    # pyarrow.fs: only for URI inputs
    from pyarrow.fs import FileSystem

# What to check when a URI cannot be listed or opened, by scheme; pyarrow reads the same
# environment variables as the cloud SDKs (and ~/.aws/credentials, instance roles, ...).
CHECKS = {
    "s3": "that the bucket and key exist, the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
          "or AWS_PROFILE), the region (AWS_DEFAULT_REGION or ?region=...) and, for a store other "
          "than AWS, its endpoint (?endpoint_override=HOST:PORT&scheme=http)",
    "gs": "that the bucket and object exist and the credentials (GOOGLE_APPLICATION_CREDENTIALS, or "
          "`gcloud auth application-default login`)",
    "hdfs": "that the path exists, libhdfs and a JVM are installed (ARROW_LIBHDFS_DIR, JAVA_HOME) and "
            "the namenode's host:port",
}
CHECKS["gcs"] = CHECKS["gs"]
CHECKS["file"] = "that it reads file:///absolute/path (three slashes: no host)"
DEFAULT_CHECK = "that the scheme is one pyarrow.fs.FileSystem.from_uri reads, with options it accepts"
LOCAL_SCHEME = "file"
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


def scheme(uri: str) -> str:
    """`s3` of `s3://bucket/key`."""
    return uri.split("://", 1)[0].lower()


def display(uri: str) -> str:
    """The URI for messages and logs, without a `user:secret@` part pyarrow would accept."""
    return _USERINFO.sub(r"\1***@", uri)


def checks(uri: str) -> str:
    """What to check when `uri` fails, for its scheme."""
    return CHECKS.get(scheme(uri), DEFAULT_CHECK)


def failure(what: str, uri: str, exc: BaseException, *, doing: str) -> EtlError:
    """One line: the URI, pyarrow's reason (its first line; libhdfs lists every path it tried),
    and what to check."""
    reason = display((str(exc).strip().splitlines() or [type(exc).__name__])[0])
    return EtlError(f"{what} {display(uri)}: cannot {doing} ({reason}); check {checks(uri)}")


@functools.lru_cache(maxsize=16)
def filesystem(uri: str, *, what: str = "SRC") -> tuple[FileSystem, str]:
    """(filesystem, path inside it) of a URI, made once per process: a worker opens many files of
    one SRC, and making an S3 client costs pyarrow's S3 setup each time (docs/design.md,
    Measured costs)."""
    # pyarrow.fs: only for URI inputs
    from pyarrow.fs import FileSystem

    try:
        return FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError: unknown scheme or option
        raise failure(what, uri, exc, doing="resolve it") from exc


def local_or_none(location: str, *, what: str = "SRC") -> str | None:
    """The path a `file://` URI names; None for any other scheme (read through pyarrow)."""
    if scheme(location) != LOCAL_SCHEME:
        return None
    return filesystem(location, what=what)[1]  # pyarrow's parsing: file:///a%20b is `/a b`


def local_path(location: str, *, what: str) -> str:
    """The filesystem path of `location` (a path or a file:// URI); any other URI is refused
    without a request (resolving an s3:// URI can ask AWS for the bucket's region).

    Used for DST, whose contract an object store cannot keep: `flock` on `DST/_lock` (one writer),
    parts renamed from temporary names (S3 and GCS have no rename: a copy and a delete, seen half
    done), and a journal appended before each file is made.
    """
    if not is_uri(location):
        return location
    path = local_or_none(location, what=what)
    if path is None:
        raise EtlError(
            f"{what} {display(location)}: etl writes {what} under an exclusive lock, with temporary "
            "names renamed into place and the manifest last, which needs a local or mounted filesystem "
            "(object stores have no locks and no atomic renames); write to a local or shared path, then "
            "upload that folder (`aws s3 sync DST s3://...`, `gcloud storage rsync -r DST gs://...`)"
        )
    return path
