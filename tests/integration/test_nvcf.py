"""NVCF past its poll window (issue 36): the lab speaks NVCF's protocol, and Gym's clients get
their real answer through the sidecar while, directly, they take the 202's metadata for it.

First the lab alone (an HTTP/2 client on the origin: the 202, the long-poll status, 404 after
the answer, the zip of a large result), then the real proxy started by the launcher between
the real OpenAI Python client, an aiohttp client shaped like NeMo Gym's ``NeMoGymAsyncOpenAI``,
and the lab origin behind an idle-dropping relay.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import ssl
import urllib.request
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import openai
import pytest
from helpers import sidecar_cli
from omegaconf import DictConfig

from sidecar_fsm.lab import H2Client, IdleRelay, NvcfLab, TlsH2Origin
from sidecar_fsm.launcher import H2PingSidecarManager

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


# --- as Gym calls it: through the real proxy the launcher starts ------------------------------

WINDOW = 2.0  # the lab's window when a request has no NVCF-POLL-SECONDS (NVCF's 60 s, scaled)
WORK = 2.5  # longer than both the lab's window and the sidecar's poll_window of 1 s


def _messages(label: str) -> list[Any]:
    """A chat whose body differs per request, so the lab's counts are per request."""
    return [{"role": "user", "content": f"judge rollout {label}"}]


@dataclass
class Nvcf:
    """The lab NVCF origin behind an idle-dropping relay, and the started sidecars in front."""

    origin: TlsH2Origin
    relay: IdleRelay
    manager: H2PingSidecarManager
    config: DictConfig
    log_dir: Path

    @property
    def lab(self) -> NvcfLab:
        return _lab(self.origin)

    def base_url(self, model: str) -> str:
        """The rewritten base URL of a model server (``follow``: the following sidecar,
        ``passthrough``: the one with ``nvcf.follow: false``, today's behaviour)."""
        return str(self.config.policy_model.responses_api_models[model].base_url)

    @property
    def direct_url(self) -> str:
        return f"https://localhost:{self.relay.port}/v1"


@pytest.fixture
def nvcf(
    make_tls_origin: Callable[..., TlsH2Origin],
    idle_relay: Callable[..., IdleRelay],
    instances_config: Callable[..., DictConfig],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
    log_dir: Path,
) -> Nvcf:
    """Two sidecars on the lab NVCF origin behind a relay that drops connections idle for 3 s:
    ``follow`` (``poll_window: 1s``) and ``passthrough`` (``nvcf.follow: false``)."""
    origin = make_tls_origin(nvcf=NvcfLab(window=WINDOW, token=TOKEN))
    relay = idle_relay(origin, idle=3.0)
    upstream = f"https://localhost:{relay.port}"
    config = instances_config(
        [
            {"name": "follow", "upstream": upstream},
            {"name": "passthrough", "upstream": origin.url, "nvcf": {"follow": False}},
        ],
        ping_interval="500ms",
        upstream_check="off",
        access_log=True,
        nvcf={"poll_window": "1s", "budget": "1m"},
    )
    models = config.policy_model.responses_api_models
    models["follow"] = models.pop("m")
    models["passthrough"] = {"base_url": origin.url + "/v1"}
    manager = start_manager(config)
    return Nvcf(origin, relay, manager, config, log_dir)


def _done_sha(content: str) -> str:
    """The request body's sha256 the lab's completion names (``done; request body sha256 X``)."""
    prefix = "done; request body sha256 "
    assert content.startswith(prefix), content
    return content[len(prefix) :]


def test_openai_client_gets_the_completion_through_the_sidecar_and_the_metadata_directly(
    nvcf: Nvcf,
) -> None:
    work = {"lab-work-seconds": str(WORK)}
    trust = ssl.create_default_context(cafile=str(nvcf.origin.ca_file))
    with httpx.Client(http2=True, verify=trust) as http2:
        direct = openai.OpenAI(base_url=nvcf.direct_url, api_key=TOKEN, max_retries=0, http_client=http2)
        metadata = direct.chat.completions.create(
            model="lab", messages=_messages("direct"), extra_headers=work
        )
    # What issue 36 found: no error, a "completion" without choices, the 202's request id.
    assert metadata.choices is None
    assert (metadata.model_extra or {}).get("status") == "in-progress"
    assert str(uuid.UUID((metadata.model_extra or {})["reqId"]))

    for model in ("passthrough", "follow"):
        client = openai.OpenAI(base_url=nvcf.base_url(model), api_key=TOKEN, max_retries=0, timeout=30)
        completion = client.chat.completions.create(
            model="lab", messages=_messages(model), extra_headers=work
        )
        if model == "passthrough":  # a proxy that passes the 202 through, as any proxy does
            assert completion.choices is None
            continue
        assert completion.choices is not None and completion.choices[0].finish_reason == "stop"
        sha = _done_sha(completion.choices[0].message.content or "")
        # Sent once; polled twice at the sidecar's 1 s window (202 at 1 s and 2 s, the answer at 2.5 s).
        assert (nvcf.lab.posts[sha], nvcf.lab.polls[sha]) == (1, 2)
    assert sum(nvcf.lab.posts.values()) == 3 and max(nvcf.lab.posts.values()) == 1


async def _gym_post(base_url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """A chat completion as NeMo Gym's ``NeMoGymAsyncOpenAI`` asks for one: aiohttp, raise only
    when ``not response.ok``, then ``.json()``."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/chat/completions", json=body, headers=headers) as response,
    ):
        if not response.ok:
            response.raise_for_status()
        return await response.json()


def test_gym_shaped_aiohttp_client_gets_the_completion_through_the_sidecar(nvcf: Nvcf) -> None:
    # aiohttp speaks HTTP/1.1 only and the lab origin HTTP/2 only (as the proxy's upstream
    # must), so "directly" for this client is through a proxy that passes the 202 through.
    headers = {"Authorization": f"Bearer {TOKEN}", "lab-work-seconds": str(WORK)}
    metadata = asyncio.run(_gym_post(nvcf.base_url("passthrough"), {"messages": _messages("p")}, headers))
    assert set(metadata) == {"reqId", "status"}
    body = {"model": "lab", "messages": _messages("follow")}
    answer = asyncio.run(_gym_post(nvcf.base_url("follow"), body, headers))
    sha = _done_sha(answer["choices"][0]["message"]["content"])
    assert sha == hashlib.sha256(json.dumps(body).encode()).hexdigest()  # aiohttp's json= body
    assert (nvcf.lab.posts[sha], nvcf.lab.polls[sha]) == (1, 2)
    assert sum(nvcf.lab.posts.values()) == 2 and nvcf.lab.answered == 1


def test_followed_202s_are_counted_and_no_header_value_is_kept(nvcf: Nvcf) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "lab-work-seconds": str(WORK)}
    answer = asyncio.run(_gym_post(nvcf.base_url("follow"), {"messages": _messages("counted")}, headers))
    assert answer["object"] == "chat.completion"
    ready = next(nvcf.log_dir.glob("h2ping-follow-*.ready"))
    metrics = _scrape(json.loads(ready.read_text())["metrics"])
    assert metrics["h2ping_nvcf_pending_total"] == 1
    assert metrics["h2ping_nvcf_polls_total"] == 2
    assert metrics['h2ping_nvcf_outcomes_total{outcome="answered"}'] == 1
    assert metrics["h2ping_requests_total"] == 1  # the client's request, not the polls
    nvcf.manager.stop()

    # The traffic record (what traffic_summary reads) and the access log say it too.
    record = json.loads(next(nvcf.log_dir.glob("h2ping-follow-*.traffic.json")).read_text())
    assert (record["nvcf_followed"], record["nvcf_polls"], record["nvcf_budget_exceeded"]) == (1, 2, 0)
    lines = next(nvcf.log_dir.glob("h2ping-follow-*.access.log")).read_text().splitlines()
    [line] = [json.loads(text) for text in lines]
    assert (line["status"], line["nvcf_polls"]) == (200, 2)
    assert str(uuid.UUID(line["nvcf_reqid"])) == line["nvcf_reqid"]
    assert line["duration_s"] >= WORK and line["ttfb_s"] >= WORK  # a 202 is not a first byte

    # Authorization reached the origin on the POST and every poll, and nowhere else.
    files = [path for path in nvcf.log_dir.rglob("*") if path.is_file()]
    assert any(path.suffix == ".db" for path in files)
    assert [str(path) for path in files if TOKEN.encode() in path.read_bytes()] == []


def _scrape(address: str) -> dict[str, float]:
    """``GET /metrics``: each sample's value by its name with labels, as the text shows it."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}


def test_a_large_result_comes_out_of_its_zip_fetched_without_authorization(nvcf: Nvcf) -> None:
    size = 6 << 20  # over NVCF's 5 MiB: a 302 to a zip; the lab refuses a fetch with Authorization
    headers = {"Authorization": f"Bearer {TOKEN}", "lab-result-bytes": str(size)}
    answer = asyncio.run(_gym_post(nvcf.base_url("follow"), {"messages": _messages("large")}, headers))
    assert _done_sha(answer["choices"][0]["message"]["content"])
    assert nvcf.lab.zip_downloads == 1


def test_past_the_budget_the_client_gets_504_naming_the_request_id(
    make_tls_origin: Callable[..., TlsH2Origin],
    instances_config: Callable[..., DictConfig],
    start_manager: Callable[[DictConfig], H2PingSidecarManager],
) -> None:
    origin = make_tls_origin(nvcf=NvcfLab(window=1.0, token=TOKEN))
    config = instances_config(
        [{"name": "short", "upstream": origin.url, "nvcf": {"budget": "2s"}}], upstream_check="off"
    )
    manager = start_manager(config)
    headers = {"Authorization": f"Bearer {TOKEN}", "lab-work-seconds": "30"}
    status, reqid, body = asyncio.run(
        _post_raw(str(config.policy_model.responses_api_models.m.base_url), headers)
    )
    assert status == 504
    assert str(uuid.UUID(reqid)) == reqid
    assert body.count(b"\n") <= 1 and reqid in json.dumps(json.loads(body))
    assert _lab(origin).posts.total() == 1
    manager.stop()


async def _post_raw(base_url: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """(status, NVCF-REQID, body) of one chat completion POST, whatever the status."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base_url}/chat/completions", json={"messages": _messages("budget")}, headers=headers
        ) as response,
    ):
        return response.status, response.headers.get("NVCF-REQID", ""), await response.read()


def test_probe_names_a_202_with_nvcf_reqid_for_what_it_is(
    nvcf_origin: TlsH2Origin, log_dir: Path, probe_env: dict[str, str]
) -> None:
    done = sidecar_cli(
        log_dir,
        "probe",
        nvcf_origin.url,
        "--ca-file",
        str(nvcf_origin.ca_file),
        "--for",
        "2s",
        "--ping-interval",
        "0.5s",
        "--request",
        "/v1/chat/completions",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--header",
        "lab-work-seconds: 5",
        env=probe_env,
        timeout=60,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("request "))
    assert re.fullmatch(
        r"request GET /v1/chat/completions: status 202 after 1\.\ds with NVCF-REQID: "
        r"NVCF's poll window passed \(the sidecar follows it\)",
        line,
    ), done.stdout + done.stderr
    assert TOKEN not in done.stdout + done.stderr
