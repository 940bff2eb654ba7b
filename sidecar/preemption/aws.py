"""AWS: the spot interruption notice and the rebalance recommendation, over IMDSv2.

Each poll asks ``spot/instance-action`` (404 until AWS decides to interrupt, then
``{"action": "terminate|stop|hibernate", "time": RFC 3339}``; deadline = ``time``) and, when
nothing is there, ``events/recommendations/rebalance`` (``{"noticeTime": ...}``), an early
warning delivered with ``drain=False``. A JSON object on ``spot/instance-action`` is always
a notice: one without a readable ``action`` or ``time`` gives kind ``unknown`` or
``default_deadline_seconds`` as needed, one notice per distinct body, logged with the reason
(``preemption.malformed_event``); a body that is not a JSON object (an HTML page from
something that is not the metadata service) is an error, never a notice. Requests carry an
IMDSv2 session token, fetched with ``PUT /latest/api/token``, renewed before it expires and
again on any 401.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any

import structlog

from sidecar.model import Notice
from sidecar.preemption.base import MetadataHttp, SourceError, make_notice, parse_rfc3339
from sidecar.preemption.options import AwsMetadataOptions

__all__ = ["HOP_LIMIT_FIX", "AwsSpotSource", "endpoint_from"]

DEFAULT_ENDPOINT = "http://169.254.169.254"
IPV6_ENDPOINT = "http://[fd00:ec2::254]"
TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a URL path, not a secret)
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105 (a header name)

log = structlog.get_logger()

HOP_LIMIT_FIX = (
    "from a container, the token answer is dropped when the instance's metadata hop limit "
    "is 1: run `aws ec2 modify-instance-metadata-options --instance-id <id> "
    "--http-put-response-hop-limit 2` (or set MetadataOptions.HttpPutResponseHopLimit: 2 in "
    "the launch template), or give this container the host network"
)


def endpoint_from(opts: AwsMetadataOptions, env: Mapping[str, str]) -> str:
    """The IMDS base URL: the option, else what botocore would use from ``env``."""
    if opts.endpoint:
        return opts.endpoint
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT"):
        return env["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    if env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "").lower() == "ipv6":
        return IPV6_ENDPOINT
    return DEFAULT_ENDPOINT


class AwsSpotSource:
    """Polls IMDSv2 every ``opts.interval_seconds``; see the module docstring."""

    name = "aws"

    def __init__(self, opts: AwsMetadataOptions, endpoint: str) -> None:
        self.interval = opts.interval_seconds
        self._opts = opts
        self._http = MetadataHttp(endpoint, opts.timeout_seconds)
        self._token: str | None = None
        self._renew_at = 0.0
        self._reported: set[str] = set()

    def poll(self) -> Notice | None:
        body = self._get(ACTION_PATH)
        if body is not None:
            return self._interruption(body)
        if self._opts.rebalance:
            body = self._get(REBALANCE_PATH)
            if body is not None:
                return self._rebalance(body)
        return None

    def acknowledge(self, notice: Notice) -> bool:
        """Nothing to acknowledge on AWS."""
        return False

    def close(self) -> None:
        self._http.close()

    def _interruption(self, body: bytes) -> Notice:
        doc = _json_object(body, ACTION_PATH)  # not JSON: likely not the metadata service
        action, when = doc.get("action"), doc.get("time")
        action = action if isinstance(action, str) and action else None
        when = when if isinstance(when, str) else ""
        deadline = parse_rfc3339(when)
        if action is not None and deadline is not None:
            event_id = f"aws:instance-action:{action}:{when}"
        else:
            event_id = f"aws:instance-action:sha256:{hashlib.sha256(body).hexdigest()[:32]}"
            self._report(event_id, body, doc, action, deadline)
        return make_notice(
            "aws",
            action or "unknown",
            event_id,
            deadline=deadline,
            seconds_left=self._opts.default_deadline_seconds,
            detail={"time": when, "endpoint": self._http.base_url},
        )

    def _report(
        self,
        event_id: str,
        body: bytes,
        doc: dict[str, Any],
        action: str | None,
        deadline: float | None,
    ) -> None:
        """Log once per distinct body why an instance-action answer is not as documented."""
        if event_id in self._reported:
            return
        self._reported.add(event_id)
        missing = [k for k, v in (("action", action), ("time", deadline)) if v is None]
        reason = "no readable " + " or ".join(repr(k) for k in missing)
        log.warning(
            "preemption.malformed_event",
            source=self.name,
            path=ACTION_PATH,
            reason=reason,
            body=f"{body[:200]!r}",
            kind=action or "unknown",
            default_deadline_seconds=None
            if deadline is not None
            else self._opts.default_deadline_seconds,
        )

    def _rebalance(self, body: bytes) -> Notice:
        when = str(_json_object(body, REBALANCE_PATH).get("noticeTime") or "")
        return make_notice(
            "aws",
            "rebalance",
            f"aws:rebalance:{when}",
            seconds_left=self._opts.rebalance_horizon_seconds,
            drain=False,
            detail={"notice_time": when, "endpoint": self._http.base_url},
        )

    def _get(self, path: str) -> bytes | None:
        """The body on 200, ``None`` on 404; one new token and one retry on 401."""
        for attempt in (1, 2):
            resp = self._http.request("GET", path, {TOKEN_HEADER: self._session_token()})
            if resp.status == 200:
                return resp.body
            if resp.status == 404:
                return None
            if resp.status == 401 and attempt == 1:
                self._token = None
                continue
            raise SourceError(f"http_{resp.status}", f"GET {path}: HTTP {resp.status}")
        raise AssertionError("unreachable")

    def _session_token(self) -> str:
        now = time.monotonic()
        if self._token is not None and now < self._renew_at:
            return self._token
        ttl = self._opts.token_ttl_seconds
        url = self._http.base_url + TOKEN_PATH
        try:
            resp = self._http.request("PUT", TOKEN_PATH, {TTL_HEADER: str(ttl)})
        except SourceError as e:
            if e.kind != "timeout":
                raise
            raise SourceError(
                "token_timeout",
                f"IMDSv2 token request PUT {url} got no answer in {self._opts.timeout_seconds} s",
                fix=HOP_LIMIT_FIX,
            ) from None
        if resp.status != 200:
            fix = None
            if resp.status == 403:
                fix = "the metadata service may be disabled: `aws ec2 modify-instance-metadata-"
                fix += "options --instance-id <id> --http-endpoint enabled`"
            raise SourceError(
                f"token_http_{resp.status}", f"PUT {url}: HTTP {resp.status}", fix=fix
            )
        granted = resp.headers.get(TTL_HEADER, "")
        ttl = int(granted) if granted.isdigit() else ttl
        self._token = resp.body.decode("ascii", "replace").strip()
        self._renew_at = now + ttl - min(60.0, ttl / 2)
        return self._token


def _json_object(body: bytes, path: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SourceError("bad_response", f"{path}: not a JSON object: {body[:200]!r}")
    return doc
