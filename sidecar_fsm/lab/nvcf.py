"""NVCF's invocation protocol, as the lab origin speaks it: work longer than the poll window.

Owns ``NvcfLab``, the jobs behind the lab origin's NVCF endpoints and their counters, as
NVIDIA's invocation service answers them (NVIDIA/nvcf, ``http-invocation``'s ``post_pexec.rs``
and ``get_pexec.rs``, the worker's ``large.go``):

- ``POST /v1/chat/completions`` and ``POST /v2/nvcf/pexec/functions/{id}[/versions/{v}]`` (any
  method, as on a function's own host): a job that takes ``work`` seconds (``lab-work-seconds``
  header, else the lab's default). Held for the poll window: ``NVCF-POLL-SECONDS`` (whole
  seconds, 0 read as 1, over 3600 or not a number a 400), else the lab's ``window`` (NVCF's is
  60 s; tests and the demo scale it to about 1 s).
  Done within it: ``200`` with a chat completion naming the request body's sha256 (so a client
  can tell its own answer). Not done: ``202`` with ``NVCF-REQID``, ``NVCF-STATUS: in-progress``
  and ``{"reqId": ..., "status": "in-progress"}``. A client gone before any answer cancels the
  job; after a 202 it keeps running.
- ``GET /v2/nvcf/pexec/status/{reqid}``: long-polls the same way (202 again while pending). The
  final answer forgets the id, so a second fetch, like any unknown id, is a ``404`` problem; an
  id that is not a UUID is a ``400``.
- A result of ``lab-result-bytes`` over 5 MiB is a ``302`` (no body) to a zip this origin also
  serves (``/lab/large/{reqid}.zip``, as a pre-signed S3 URL would be): one deflated entry
  ``<reqid>.response`` holding the raw body; fetched with ``Authorization`` it is refused (400),
  as S3 refuses a foreign bearer.

With ``token`` set, every NVCF request needs ``Authorization: Bearer <token>`` (401 otherwise);
the value is compared, never kept. Counted for the tests' "never sent twice", by request body
sha256 (the bodies a test sends differ): POSTs (``posts``) and status polls (``polls``); and
202s sent, final answers, 404s, zip downloads.
Must not bind, start threads or store header values; it runs on the origin's loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import io
import json
import re
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

__all__ = ["LARGE_RESULT_BYTES", "BadQuery", "NvcfLab", "Responder", "float_arg"]

# The worker answers a body over this with a zip (NVCF's MaxDirectResponseSizeBytes).
LARGE_RESULT_BYTES = 5 << 20
_MAX_RESULT_BYTES = 64 << 20
_MAX_WORK_SECONDS = 3600.0
_STATUS_PREFIX = "/v2/nvcf/pexec/status/"
_LARGE_PREFIX = "/lab/large/"
_INVOKE = re.compile(r"/v1/chat/completions|/v2/nvcf/pexec/functions/[^/]+(/versions/[^/]+)?")


_Headers = list[tuple[str, str]]


class Responder(Protocol):
    """What the lab needs of the connection that received the request (``h2server``'s)."""

    async def respond(self, stream_id: int, status: int, headers: _Headers, body: bytes) -> None: ...


@dataclass
class _Job:
    """One invocation: its id, the request it answers and the answer it will be."""

    reqid: str
    body_sha256: str
    result_bytes: int
    accepted: bool = False  # a 202 was sent: the job outlives its client from then on
    done: asyncio.Event = field(default_factory=asyncio.Event)


class _Refused(Exception):
    """A request NVCF answers with an error of its own (400, 401, 404), before any work."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


class NvcfLab:
    """The NVCF endpoints' jobs and counters; see the module docstring. Counters are read from
    other threads: each changes by single operations on the loop thread, and a reader copies."""

    def __init__(self, *, window: float = 60.0, work: float = 0.0, token: str | None = None) -> None:
        self.window = window
        self.work = work
        self._token = token
        self._jobs: dict[str, _Job] = {}
        self._zips: dict[str, bytes] = {}
        self.posts: collections.Counter[str] = collections.Counter()
        self.polls: collections.Counter[str] = collections.Counter()
        # When each request body's result became ready (time.monotonic()), for the bench's
        # "result ready -> client has it" delay.
        self.ready_at: dict[str, float] = {}
        self.accepted = 0
        self.answered = 0
        self.not_found = 0
        self.zip_downloads = 0

    @staticmethod
    def serves(method: str | None, path: str) -> bool:
        """Whether ``method path`` is one of this lab's endpoints (an invocation path takes any
        method, as a function's own host passes every request to the function)."""
        if _INVOKE.fullmatch(path) is not None:
            return True
        return method == "GET" and path.startswith((_STATUS_PREFIX, _LARGE_PREFIX))

    @property
    def pending(self) -> int:
        """Jobs accepted and not yet answered in full."""
        return len(self._jobs)

    async def answer(
        self, conn: Responder, stream_id: int, request_headers: _Headers, body_sha256: str
    ) -> None:
        """Answer one request to an NVCF endpoint (``serves`` said yes) on ``conn``; ``request_headers``
        include the pseudo-headers (a 302 points back at the ``:authority`` it was reached at)."""
        headers = {name.lower(): value for name, value in request_headers}
        path = urlsplit(headers.get(":path", "/")).path
        try:
            if path.startswith(_LARGE_PREFIX):
                await self._download(conn, stream_id, path, headers)
                return
            self._check_auth(headers)
            window = self._window(headers)
            if path.startswith(_STATUS_PREFIX):
                job = self._find(path[len(_STATUS_PREFIX) :])
            else:
                job = self._start(headers, body_sha256)
            await self._hold(conn, stream_id, job, window, headers.get(":authority", "localhost"))
        except _Refused as refused:
            await _problem(conn, stream_id, refused.status, str(refused))
        except BadQuery as bad:
            await _problem(conn, stream_id, 400, str(bad))

    def _check_auth(self, headers: dict[str, str]) -> None:
        if self._token is None:
            return
        given = headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
            raise _Refused(401, "client is unauthorized")

    def _window(self, headers: dict[str, str]) -> float:
        raw = headers.get("nvcf-poll-seconds")
        if raw is None:
            return self.window
        if not raw.strip().isdigit():
            raise _Refused(400, "NVCF-POLL-SECONDS must be a whole number of seconds")
        seconds = int(raw)
        if seconds > 3600:
            raise _Refused(400, "NVCF-POLL-SECONDS must be <= 3600")
        return float(max(seconds, 1))

    def _start(self, headers: dict[str, str], body_sha256: str) -> _Job:
        work = float_arg(headers, "lab-work-seconds", self.work, upper=_MAX_WORK_SECONDS)
        size = int(float_arg(headers, "lab-result-bytes", 0, upper=_MAX_RESULT_BYTES))
        self.posts[body_sha256] += 1
        job = _Job(str(uuid.uuid4()), body_sha256, size)
        self._jobs[job.reqid] = job
        asyncio.get_running_loop().call_later(work, self._finish, job)
        return job

    def _finish(self, job: _Job) -> None:
        self.ready_at[job.body_sha256] = time.monotonic()
        job.done.set()

    def _find(self, reqid: str) -> _Job:
        try:
            uuid.UUID(reqid)
        except ValueError:
            raise _Refused(400, f"request id {reqid!r} is not a UUID") from None
        job = self._jobs.get(reqid)
        if job is None:
            self.not_found += 1
            raise _Refused(404, "request not found")
        self.polls[job.body_sha256] += 1
        return job

    async def _hold(self, conn: Responder, stream_id: int, job: _Job, window: float, authority: str) -> None:
        """Hold the request for up to ``window``: the result if it is ready by then, else a 202."""
        try:
            await asyncio.wait_for(job.done.wait(), window)
        except asyncio.TimeoutError:
            self.accepted += 1
            job.accepted = True
            body = json.dumps({"reqId": job.reqid, "status": "in-progress"}).encode()
            await conn.respond(stream_id, 202, [*_nvcf_headers(job, "in-progress"), *_json_type(body)], body)
            return
        except asyncio.CancelledError:
            if not job.accepted:  # gone before any answer: NVCF cancels the request
                self._jobs.pop(job.reqid, None)
            raise
        # The final answer purges the id (get_pexec.rs): a second fetch is a 404.
        self._jobs.pop(job.reqid, None)
        self.answered += 1
        result = _completion(job)
        if len(result) > LARGE_RESULT_BYTES:
            self._zips[job.reqid] = _zipped(job.reqid, result)
            location = f"https://{authority}{_LARGE_PREFIX}{job.reqid}.zip?X-Amz-Signature=lab"
            await conn.respond(
                stream_id, 302, [*_nvcf_headers(job, "fulfilled"), ("location", location)], b""
            )
            return
        await conn.respond(stream_id, 200, [*_nvcf_headers(job, "fulfilled"), *_json_type(result)], result)

    async def _download(self, conn: Responder, stream_id: int, path: str, headers: dict[str, str]) -> None:
        if "authorization" in headers:
            raise _Refused(400, "only one auth mechanism allowed; the URL is pre-signed")
        reqid = path[len(_LARGE_PREFIX) :].removesuffix(".zip")
        data = self._zips.pop(reqid, None)
        if data is None:
            raise _Refused(404, "no such object")
        self.zip_downloads += 1
        type_and_length = [("content-type", "application/zip"), ("content-length", str(len(data)))]
        await conn.respond(stream_id, 200, type_and_length, data)


class BadQuery(ValueError):
    """A number argument (a query's or a header's) is not a number in range; answered with a 400."""


def float_arg(args: dict[str, str], name: str, default: float, *, upper: float) -> float:
    raw = args.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadQuery(f"{name}: {raw!r} is not a number") from None
    if not 0 <= value <= upper:
        raise BadQuery(f"{name}: {raw!r} must be between 0 and {upper:g}")
    return value


def _nvcf_headers(job: _Job, status: str) -> _Headers:
    return [
        ("nvcf-reqid", job.reqid),
        ("nvcf-status", status),
        ("access-control-expose-headers", "nvcf-reqid"),
    ]


def _json_type(body: bytes) -> _Headers:
    return [("content-type", "application/json"), ("content-length", str(len(body)))]


def _completion(job: _Job) -> bytes:
    """The job's result: an OpenAI chat completion that names the request body it answers."""
    content = f"done; request body sha256 {job.body_sha256}"
    completion = {
        "id": f"chatcmpl-{job.reqid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "lab",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    body = json.dumps(completion).encode()
    if job.result_bytes > len(body):  # padded inside the JSON (whitespace), so it stays valid
        body = body[:-1] + b" " * (job.result_bytes - len(body)) + b"}"
    return body


def _zipped(reqid: str, body: bytes) -> bytes:
    """The worker's large-result zip: one entry ``<reqid>.response`` with the raw body."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{reqid}.response", body)
    return buffer.getvalue()


async def _problem(conn: Responder, stream_id: int, status: int, detail: str) -> None:
    titles = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
    problem = {
        "type": "about:blank",
        "title": titles.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    body = json.dumps(problem).encode()
    headers = [("content-type", "application/problem+json"), ("content-length", str(len(body)))]
    await conn.respond(stream_id, status, headers, body)
