"""The environment's HTTP settings for a requests session, read once instead of per request.

Left to itself (``trust_env``), requests looks up the proxy variables, ``~/.netrc`` and the
CA-bundle variables for every request it sends: reading them once took the Azure client
from 1.6 to 1.45 ms of CPU per small file here (bench/commit_latency.md). The daemon's
environment does not change while it runs, so :func:`read_env_once` resolves them when
the backend is built, with the meaning requests gives them: ``HTTPS_PROXY`` /
``HTTP_PROXY`` / ``ALL_PROXY`` unless ``NO_PROXY`` names the endpoint's host, and
``REQUESTS_CA_BUNDLE`` then ``CURL_CA_BUNDLE`` for TLS verification. ``~/.netrc`` is not
read: every request carries its own credential.
"""

from __future__ import annotations

import os

import requests

__all__ = ["ca_bundle", "read_env_once"]


def ca_bundle() -> str | None:
    """The CA bundle the environment names for TLS verification, if any."""
    return os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None


def read_env_once(session: requests.Session, endpoint: str) -> None:
    """Stop ``session`` reading the environment per request; give it the proxies the
    environment names for ``endpoint`` and the CA bundle, as requests would have."""
    session.trust_env = False
    session.proxies = requests.utils.get_environ_proxies(endpoint)
    bundle = ca_bundle()
    if bundle:
        session.verify = bundle
