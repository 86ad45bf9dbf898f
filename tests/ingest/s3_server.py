"""A local S3 server for tests: moto's, on 127.0.0.1 only, with the environment pyarrow reads it by.

The environment names fake credentials and turns off every other place the AWS SDK looks
(profiles, the EC2 metadata address), so no request leaves the loopback interface.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from etl.ingest.location import filesystem

HOST = "127.0.0.1"


@dataclass(frozen=True)
class S3:
    """A running server and one bucket of its own (moto's backend is shared by the process)."""

    port: int
    bucket: str

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.port}"

    def uri(self, key: str, **options: str) -> str:
        """`s3://bucket/key` with pyarrow's options for this server in the query."""
        query = "&".join(f"{k}={v}" for k, v in {"endpoint_override": self.endpoint, "scheme": "http",
                                                   **options}.items())
        return f"s3://{self.bucket}/{key}?{query}"

    def upload(self, folder: Path, key: str) -> None:
        """Every file under `folder` to `bucket/key/...` (pyarrow's own S3 client)."""
        from pyarrow import fs

        s3 = fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", allow_bucket_creation=True)
        if s3.get_file_info(self.bucket).type == fs.FileType.NotFound:
            s3.create_dir(self.bucket)
        fs.copy_files(str(folder), f"{self.bucket}/{key}", source_filesystem=fs.LocalFileSystem(),
                      destination_filesystem=s3)


def s3_environment(tmp: Path) -> dict[str, str]:
    """What pyarrow's AWS SDK reads: fake credentials, a region, no profile files, no EC2 metadata."""
    return {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask 169.254.169.254 for credentials or a region
        "AWS_CONFIG_FILE": str(tmp / "no-aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-creds"),
    }


@contextmanager
def s3_server(tmp: Path) -> Iterator[S3]:
    """A moto S3 server on a free loopback port, with `s3_environment` set; skips without moto."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = server_module.ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.delenv(name, raising=False)
        for name, value in s3_environment(tmp).items():
            env.setenv(name, value)
        filesystem.cache_clear()  # clients made with other credentials
        server.start()
        try:
            _, port = server.get_host_and_port()
            yield S3(port=port, bucket=f"etl-test-{uuid.uuid4().hex[:12]}")
        finally:
            server.stop()
            filesystem.cache_clear()
