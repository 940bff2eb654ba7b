"""A run's prefix in a SeaweedFS bucket, read from outside the daemon with a plain client."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sidecar.manifest import MANIFEST_PREFIX, Manifest, parse
from sidecar.storage.checksum import crc32c_of_bytes
from tests.servers.seaweedfs import S3Server


@dataclass
class Remote:
    """Reads go through one client, made on first use (making one costs about 0.5 s of
    CPU: botocore loads the S3 model) and closed by :meth:`close`."""

    server: S3Server
    bucket: str
    prefix: str = "run-1"

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def env(self, endpoint_url: str | None = None) -> dict[str, str]:
        """The daemon's environment: credentials, and the store (or a proxy in front of it)."""
        env = self.server.env()
        if endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = endpoint_url
        return env

    @cached_property
    def client(self) -> Any:
        return self.server.client()

    def close(self) -> None:
        if "client" in self.__dict__:
            self.client.close()

    def keys(self) -> set[str]:
        """Every object key of the prefix, relative to it."""
        out: set[str] = set()
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + "/"
        )
        for page in pages:
            out.update(o["Key"][len(self.prefix) + 1 :] for o in page.get("Contents", []))
        return out

    def read(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"]
        return bytes(body.read())

    def manifests(self) -> list[Manifest]:
        keys = sorted(k for k in self.keys() if k.startswith(MANIFEST_PREFIX))
        return [parse(self.read(k), where=k) for k in keys]

    def assert_invariant(self) -> list[Manifest]:
        """Every manifest names only objects that exist with the recorded size and CRC32C
        (read back byte for byte), and no checkpoint is committed twice."""
        found = self.manifests()
        present = self.keys()
        for m in found:
            for f in m.files:
                assert f.key in present, f"{m.key} names missing object {f.key}"
                data = self.read(f.key)
                assert len(data) == f.size, f"{f.key}: size differs from {m.key}"
                assert crc32c_of_bytes(data) == f.crc32c, f"{f.key}: CRC32C differs from {m.key}"
        names = [m.name for m in found]
        assert len(names) == len(set(names)), f"a checkpoint committed twice: {sorted(names)}"
        return found
