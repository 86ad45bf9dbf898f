"""SRC and DST given as URIs on Ray: the same rules as the local engine (`etl.ingest.location`).

SRC may be a path, a `file://` URI (its path) or any URI pyarrow's filesystems read (`s3://`,
`gs://`, `hdfs://`, ...): the driver lists it, and each worker opens its files itself from the URI
a `Source` carries (`etl.ingest.discover.ObjectPath`), with the credentials it finds on its node.
DST must be a path or a `file://` URI that every node sees at the same place (shared storage): an
object store cannot hold DST's lock, renames and manifest-last commit, so it is refused with that
advice (write to shared storage, then upload). The function lives in `etl.ingest.location`,
which the local engine uses too; this name stays for the Ray driver.
"""

from __future__ import annotations

from etl.ingest.location import local_path

__all__ = ["local_path"]
