"""NVCF past its poll window (issue 36): the lab speaks NVCF's protocol, and Gym's clients get
their real answer through the sidecar while, directly, they take the 202's metadata for it.

First the lab alone (an HTTP/2 client on the origin: the 202, the long-poll status, 404 after
the answer, the zip of a large result), then the real proxy started by the launcher between
the real OpenAI Python client, an aiohttp client shaped like NeMo Gym's ``NeMoGymAsyncOpenAI``,
and the lab origin behind an idle-dropping relay.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
import zipfile
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from sidecar_fsm.lab import H2Client, NvcfLab, TlsH2Origin

TOKEN = "nvapi-lab-secret-token"
AUTH = ("authorization", f"Bearer {TOKEN}")
STATUS = "/v2/nvcf/pexec/status/"
BODY = json.dumps({"model": "lab", "messages": [{"role": "user", "content": "judge this"}]}).encode()
SHA = hashlib.sha256(BODY).hexdigest()


def _headers(response_headers: list[tuple[str, str]]) -> dict[str, str]:
    return dict(response_headers)


@pytest.fixture
def nvcf_origin(make_tls_origin: Callable[..., TlsH2Origin]) -> TlsH2Origin:
    """The lab origin speaking NVCF, holding requests for 1 s by default, wanting ``TOKEN``."""
    return make_tls_origin(nvcf=NvcfLab(window=1.0, token=TOKEN))


def _client(origin: TlsH2Origin) -> H2Client:
    return H2Client("127.0.0.1", origin.port, origin.ca_file, timeout=20)


def _lab(origin: TlsH2Origin) -> NvcfLab:
    assert origin.nvcf is not None
    return origin.nvcf


# --- the lab alone ------------------------------------------------------------------------------


def test_lab_answers_202_then_long_polls_then_forgets_the_id(nvcf_origin: TlsH2Origin) -> None:
    lab = _lab(nvcf_origin)
    with _client(nvcf_origin) as client:
        first = client.request(
            "/v1/chat/completions",
            method="POST",
            body=BODY,
            headers=[AUTH, ("nvcf-poll-seconds", "1"), ("lab-work-seconds", "2.5")],
        )
        head = _headers(first.headers)
        assert (first.status, head["nvcf-status"]) == (202, "in-progress")
        reqid = head["nvcf-reqid"]
        assert str(uuid.UUID(reqid)) == reqid
        assert json.loads(first.body) == {"reqId": reqid, "status": "in-progress"}
        polls = [client.request(STATUS + reqid, headers=[AUTH, ("nvcf-poll-seconds", "1")]) for _ in range(2)]
        assert [p.status for p in polls] == [202, 200]
        answer = json.loads(polls[1].body)
        assert answer["choices"][0]["message"]["content"] == f"done; request body sha256 {SHA}"
        assert _headers(polls[1].headers)["nvcf-status"] == "fulfilled"
        assert client.request(STATUS + reqid, headers=[AUTH]).status == 404
        assert client.request(STATUS + "not-a-uuid", headers=[AUTH]).status == 400
    assert (lab.posts[SHA], lab.polls[SHA], lab.accepted, lab.answered) == (1, 2, 2, 1)


def test_lab_refuses_as_nvcf_does(nvcf_origin: TlsH2Origin) -> None:
    with _client(nvcf_origin) as client:
        post = "/v2/nvcf/pexec/functions/fn-1"
        assert client.request(post, method="POST", body=BODY).status == 401
        wrong = client.request(post, method="POST", body=BODY, headers=[("authorization", "Bearer no")])
        assert wrong.status == 401 and TOKEN not in wrong.body.decode()
        too_long = client.request(
            post, method="POST", body=BODY, headers=[AUTH, ("nvcf-poll-seconds", "3601")]
        )
        assert too_long.status == 400 and b"<= 3600" in too_long.body
        assert client.request(STATUS + str(uuid.uuid4()), headers=[AUTH]).status == 404
    assert _lab(nvcf_origin).posts[SHA] == 0


def test_lab_large_result_is_a_302_to_a_zip_fetched_without_authorization(nvcf_origin: TlsH2Origin) -> None:
    size = 6 << 20
    with _client(nvcf_origin) as client:
        moved = client.request(
            "/v1/chat/completions", method="POST", body=BODY, headers=[AUTH, ("lab-result-bytes", str(size))]
        )
        assert (moved.status, moved.body) == (302, b"")
        location = urlsplit(_headers(moved.headers)["location"])
        path = f"{location.path}?{location.query}"
        assert client.request(path, headers=[AUTH]).status == 400  # S3 refuses a foreign bearer
        zipped = client.request(path)
    assert zipped.status == 200 and len(zipped.body) < size // 10
    reqid = _headers(moved.headers)["nvcf-reqid"]
    with zipfile.ZipFile(io.BytesIO(zipped.body)) as archive:
        assert archive.namelist() == [f"{reqid}.response"]
        result = archive.read(f"{reqid}.response")
    assert len(result) == size
    assert json.loads(result)["choices"][0]["message"]["content"].endswith(SHA)


def test_lab_client_gone_before_any_answer_cancels_the_job(
    nvcf_origin: TlsH2Origin, wait_until: Callable[..., object]
) -> None:
    lab = _lab(nvcf_origin)
    with _client(nvcf_origin) as client:
        stream = client.start_request(
            "/v1/chat/completions", method="POST", body=BODY, headers=[AUTH, ("lab-work-seconds", "30")]
        )
        wait_until(lambda: lab.pending == 1, 5, "the job never started")
        client.reset(stream)
        wait_until(lambda: lab.pending == 0, 5, "the job outlived its client before any answer")
