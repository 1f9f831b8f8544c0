"""The operator is no SSRF proxy and trusts no Prometheus reply blindly (issue 11 items 3
and 8). Real HTTP(S) servers on loopback play a Prometheus that redirects, sends a huge or
secret-bearing body, trickles, refuses without a token, or answers garbage."""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvtune.operator.prometheus import prom_http
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus.profiling import ProfilingSettings, profile_from_prometheus
from kvtune.operator.prometheus.prom_http import (
    AllowedEndpoint,
    PrometheusAccess,
    PrometheusNotAllowed,
    PrometheusUnavailable,
)
from kvtune.operator.prometheus.prom_replies import PrometheusDataInvalid, Sample
from kvtune.operator.retune import retune_handlers

SECRET = "s3cr3t-token-from-the-metadata-service"
Handler = Callable[[BaseHTTPRequestHandler], None]


class Served(str):
    """The server's URL; ``hits``: the paths it was asked for."""

    hits: list[str]


@contextmanager
def serving(handle: Handler, tls: tuple[Path, Path] | None = None) -> Iterator[Served]:
    """An HTTP(S) server on 127.0.0.1 answering every GET with ``handle``."""
    hits: list[str] = []

    class _Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            handle(self)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served = Served(f"{scheme}://127.0.0.1:{server.server_address[1]}")
    served.hits = hits
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


def _send(h: BaseHTTPRequestHandler, status: int, body: bytes,
          headers: dict[str, str] | None = None) -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    if "Content-Length" not in (headers or {}):
        h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _vector(*samples: tuple[dict[str, str], str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1.0, v]} for m, v in samples]}}).encode()


LOOPBACK = PrometheusAccess(allowed=(AllowedEndpoint.parse("http://127.0.0.1:*"),),
                            timeout_seconds=2.0, max_response_bytes=256 * 1024)


def _query(url: str, access: PrometheusAccess = LOOPBACK) -> Any:
    return prom_http.query(url, "up", at_unix_seconds=1.0, access=access, name="requests")


# --- SSRF: the allow-list, redirects, size, time, TLS, auth ---------------------------------


def test_a_url_off_the_allow_list_is_never_requested() -> None:
    with serving(lambda h: _send(h, 200, _vector())) as url:
        port = int(url.rsplit(":", 1)[1])
        only_other = PrometheusAccess(allowed=(AllowedEndpoint.parse(
            f"http://127.0.0.1:{port + 1}"),))
        with pytest.raises(PrometheusNotAllowed, match="not on the operator's allow-list"):
            _query(url, only_other)
        with pytest.raises(PrometheusNotAllowed, match="allow-list"):
            _query(url, PrometheusAccess())  # nothing configured: nothing allowed
        with pytest.raises(PrometheusNotAllowed, match="user info"):
            _query(url.replace("http://", "http://admin:pw@"), LOOPBACK)
        assert url.hits == []
    # A path prefix is a prefix of whole segments.
    api = AllowedEndpoint.parse("https://prom.example:9090/api")
    assert api.admits("https", "prom.example", 9090, "/api/v1")
    assert not api.admits("https", "prom.example", 9090, "/apix")
    assert not api.admits("http", "prom.example", 9090, "/api")


# Issue 25 item 6: a prefix escaped with dot segments, plain or percent-encoded (once or
# twice), admits nothing outside it. Offline, as strings: never sent anywhere.
ESCAPES = ["/prom/../admin", "/prom/%2e%2e/admin", "/prom/%2E%2E/admin",
           "/prom/%252e%252e/admin", "/prom/..%2fadmin", "/prom/%2e%2e%2fadmin",
           "/prom/./../admin", "/prom/..", "/prom/x/../../admin", "/prom\\..\\admin",
           "/prom/%25252e%25252e/admin"]


@pytest.mark.parametrize("path", ESCAPES)
def test_a_path_prefix_escaped_with_dot_segments_is_refused(path: str) -> None:
    access = PrometheusAccess(allowed=(AllowedEndpoint.parse(
        "https://prometheus.monitoring.svc:9090/prom"),))
    with pytest.raises(PrometheusNotAllowed, match="not on the operator's allow-list"):
        access.check(f"https://prometheus.monitoring.svc:9090{path}")


def test_dot_segments_inside_the_prefix_stay_allowed() -> None:
    access = PrometheusAccess(allowed=(AllowedEndpoint.parse(
        "https://prometheus.monitoring.svc:9090/prom"),))
    for path in ("/prom", "/prom/", "/prom/a/../b", "/prom/%2e/x"):
        access.check(f"https://prometheus.monitoring.svc:9090{path}")
    # An allow-list entry is normalised too: /prom/../admin means /admin.
    entry = AllowedEndpoint.parse("https://prometheus.monitoring.svc:9090/prom/%2e%2e/admin")
    assert entry.path == "/admin/"


def test_a_deeply_nested_reply_is_unavailable_not_a_recursion_error() -> None:
    """A reply nested 100,000 deep (200 kB, within the size limit) once raised RecursionError
    on every tick, and ProfileStale was never set."""
    deep = b"[" * 100_000 + b"]" * 100_000
    with serving(lambda h: _send(h, 200, deep)) as url:
        with pytest.raises(PrometheusUnavailable, match="nested too deeply"):
            _query(url)
        body, kube = _retune_body(url), _StatusOnlyKube()
        kube.body = body
        outcome = retune_handlers.retune_once(
            body, kube=kube,  # type: ignore[arg-type]
            profiler=lambda u, s: profile_from_prometheus(u, s, access=LOOPBACK))
    assert outcome.failed and outcome.reason == "PrometheusUnavailable"
    stale = next(c for c in kube.body["status"]["conditions"] if c["type"] == "ProfileStale")
    assert stale["status"] == "True" and "nested too deeply" in stale["message"]


def test_redirects_are_not_followed() -> None:
    with serving(lambda h: _send(h, 200, SECRET.encode())) as inner, \
            serving(lambda h: _send(h, 302, b"", {"Location": f"{inner}/latest/meta-data"})
                    ) as outer:
        with pytest.raises(PrometheusUnavailable, match="HTTP 302 redirect") as err:
            _query(outer)
        assert len(outer.hits) == 1 and inner.hits == []
    assert SECRET not in str(err.value)


@pytest.mark.parametrize("declared", [True, False])
def test_a_huge_reply_is_cut_off(declared: bool) -> None:
    body = b"[" + b"0," * (2 * 2**20) + b"0]"

    def handle(h: BaseHTTPRequestHandler) -> None:
        if declared:
            _send(h, 200, body)
        else:  # no Content-Length: the size is found while reading
            h.send_response(200)
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.write(body)

    with serving(handle) as url, pytest.raises(PrometheusUnavailable, match="bytes"):
        _query(url)


def test_a_trickling_reply_is_bounded_in_time() -> None:
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        for _ in range(60):
            try:
                h.wfile.write(b" " * 100)
                h.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)

    access = PrometheusAccess(allowed=LOOPBACK.allowed, timeout_seconds=1.5,
                              max_response_bytes=10**6)
    with serving(handle) as url:
        started = time.monotonic()
        with pytest.raises(PrometheusUnavailable, match="no complete reply within"):
            _query(url, access)
        assert time.monotonic() - started < 3 * 1.5 + 2


@pytest.mark.parametrize("status", [500, 400, 404, 200])
def test_an_error_reply_is_never_quoted(status: int) -> None:
    body = json.dumps({"status": "error", "errorType": "bad_data",
                       "error": f"token={SECRET} " + "x" * (2 * 2**20)}).encode()
    access = PrometheusAccess(allowed=LOOPBACK.allowed, max_response_bytes=4 * 2**20)
    with serving(lambda h: _send(h, status, body)) as url, \
            pytest.raises(PrometheusUnavailable) as err:
        _query(url, access)
    message = str(err.value)
    assert SECRET not in message and len(message) < 300
    assert f"HTTP {status}" in message and "bad_data" in message
    # Neither is an error type that is not one of Prometheus' own words.
    body = json.dumps({"status": "error", "errorType": SECRET + " !"}).encode()
    with serving(lambda h: _send(h, 500, body)) as url, \
            pytest.raises(PrometheusUnavailable) as err:
        _query(url, access)
    assert SECRET not in str(err.value) and "unknown" in str(err.value)


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_is_verified_and_the_token_is_sent(tls_cert: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("the-operators-token\n")

    def handle(h: BaseHTTPRequestHandler) -> None:
        ok = h.headers.get("Authorization") == "Bearer the-operators-token"
        _send(h, 200 if ok else 401, _vector() if ok else b'{"status":"error"}')

    allowed = (AllowedEndpoint.parse("https://127.0.0.1:*"),)
    with serving(handle, tls=tls_cert) as url:
        with pytest.raises(PrometheusUnavailable, match="TLS verification failed"):
            _query(url, PrometheusAccess(allowed=allowed))
        with pytest.raises(PrometheusUnavailable, match="HTTP 401"):
            _query(url, PrometheusAccess(allowed=allowed, ca_file=str(tls_cert[0])))
        data = _query(url, PrometheusAccess(allowed=allowed, ca_file=str(tls_cert[0]),
                                            bearer_token_file=str(token)))
        assert data == {"resultType": "vector", "result": []}
        # Skipping verification is the operator's own choice (its configuration) only.
        assert _query(url, PrometheusAccess(allowed=allowed, insecure_skip_verify=True,
                                            bearer_token_file=str(token))) == data


def test_the_allow_list_comes_from_the_operators_environment() -> None:
    access = PrometheusAccess.from_env({
        prom_http.ENV_ALLOWED: "https://prom.monitoring.svc:9090, http://127.0.0.1:*",
        prom_http.ENV_MAX_BYTES: "1000", prom_http.ENV_TIMEOUT: "3"})
    assert access.check("https://prom.monitoring.svc:9090/") == \
        "https://prom.monitoring.svc:9090"
    assert access.check("http://127.0.0.1:41234") == "http://127.0.0.1:41234"
    assert access.max_response_bytes == 1000 and access.timeout_seconds == 3.0
    with pytest.raises(PrometheusNotAllowed):
        access.check("http://169.254.169.254/latest/meta-data")
    with pytest.raises(PrometheusNotAllowed):
        access.check("https://prom.monitoring.svc:9091")
    with pytest.raises(ValueError, match="KVTUNE_PROMETHEUS_ALLOWED_URLS"):
        PrometheusAccess.from_env({prom_http.ENV_ALLOWED: "ftp://x"})


# --- item 8: every reply is checked ---------------------------------------------------------


def _bucket_samples(*pairs: tuple[str, str]) -> list[Sample]:
    data = json.loads(_vector(*[({"le": le}, v) for le, v in pairs]))["data"]
    return replies.vector(data, "prompt_buckets")


@pytest.mark.parametrize(("data", "needle"), [
    ({"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "1"]]}]}, "matrix"),
    ({"resultType": "scalar", "result": [1, "1"]}, "scalar"),
    ({"resultType": "vector", "result": [{"metric": {}, "value": [1, "+Inf"]}]}, "infinite"),
    ({"resultType": "vector", "result": [{"metric": {}, "value": [1, "many"]}]},
     "not a number"),
    ({"resultType": "vector", "result": [{"metric": {}, "value": [1, 7]}]}, "[time, value]"),
    ({"resultType": "vector", "result": "nope"}, "not a list"),
    ("a string", "no data object"),
])
def test_malformed_replies_are_refused(data: Any, needle: str) -> None:
    with pytest.raises(PrometheusDataInvalid, match=needle.replace("[", r"\[")):
        replies.vector(data, "requests")


@pytest.mark.parametrize(("pairs", "needle"), [
    ((("100", "5"), ("1000", "9")), "no \\+Inf bucket"),
    ((("+Inf", "9"),), "only its \\+Inf bucket"),
    ((("100", "900"), ("1000", "500"), ("+Inf", "100")), "go down"),
    ((("abc", "1"), ("+Inf", "1")), "le that is not a number"),
    ((("NaN", "1"), ("+Inf", "1")), "le that is not a number"),
    ((("100", "1"), ("1e2", "1"), ("+Inf", "1")), "same le twice"),
    ((("100", "-3"), ("+Inf", "1")), "negative"),
])
def test_untrustworthy_histograms_are_refused(pairs: tuple[tuple[str, str], ...],
                                              needle: str) -> None:
    with pytest.raises(PrometheusDataInvalid, match=needle):
        replies.buckets(_bucket_samples(*pairs), "prompt_buckets")


def test_good_histograms_pass_with_increases_small_dents() -> None:
    got = replies.buckets(_bucket_samples(("+Inf", "1000"), ("100", "300"), ("1000", "995.5"),
                                          ("500", "1001")), "prompt_buckets")
    assert got == [(100.0, 300.0), (500.0, 1001.0), (1000.0, 995.5), (math.inf, 1000.0)]
    # A bucket that began counting inside the window is extrapolated less than the one
    # below it (seen in CI on a replay through real Prometheus): a dent, not garbage.
    fresh = replies.buckets(_bucket_samples(("5", "1218"), ("10", "1143"), ("+Inf", "1300")),
                            "reuse_gap_buckets")
    assert fresh[1] == (10.0, 1143.0)
    with pytest.raises(PrometheusDataInvalid, match="le=10: 600 after 1218"):
        replies.buckets(_bucket_samples(("5", "1218"), ("10", "600"), ("+Inf", "1300")),
                        "reuse_gap_buckets")
    assert replies.buckets([], "prompt_buckets") == []
    assert replies.scalar([], "requests") is None
    with pytest.raises(PrometheusDataInvalid, match="negative"):
        replies.scalar([Sample({}, -1.0)], "requests")


GARBAGE_PROMPT_BUCKETS = {
    "matrix": {"status": "success", "data": {"resultType": "matrix", "result": []}},
    "reversed": json.loads(_vector(({"le": "100"}, "900"), ({"le": "1000"}, "500"),
                                   ({"le": "+Inf"}, "100"))),
    "only +Inf": json.loads(_vector(({"le": "+Inf"}, "900"))),
}


@pytest.mark.parametrize("kind", sorted(GARBAGE_PROMPT_BUCKETS))
def test_garbage_through_http_keeps_the_plan_and_says_why(kind: str) -> None:
    """A loopback server answering like Prometheus, except for the prompt histogram; the
    retune timer's tick keeps the plan and sets ProfileStale with the reason."""
    def handle(h: BaseHTTPRequestHandler) -> None:
        from urllib.parse import parse_qs, urlsplit

        promql = parse_qs(urlsplit(h.path).query)["query"][0]
        if "request_prompt_tokens_bucket" in promql:
            _send(h, 200, json.dumps(GARBAGE_PROMPT_BUCKETS[kind]).encode())
        elif "_bucket" in promql:
            _send(h, 200, _vector(({"le": "100"}, "10"), ({"le": "+Inf"}, "900")))
        else:
            _send(h, 200, _vector(({}, "900")))

    with serving(handle) as url:
        with pytest.raises(PrometheusDataInvalid) as err:
            profile_from_prometheus(url, ProfilingSettings(window_seconds=60),
                                    access=LOOPBACK)
        assert "prompt_buckets" in str(err.value)
        body, kube = _retune_body(url), _StatusOnlyKube()
        kube.body = body
        outcome = retune_handlers.retune_once(
            body, kube=kube,  # type: ignore[arg-type]
            profiler=lambda u, s: profile_from_prometheus(u, s, access=LOOPBACK))
    assert outcome.failed and outcome.reason == "PrometheusDataInvalid"
    stale = next(c for c in kube.body["status"]["conditions"] if c["type"] == "ProfileStale")
    assert stale["status"] == "True" and stale["reason"] == "PrometheusDataInvalid"
    assert "prompt_buckets" in stale["message"] and "keeping the last good profile" in \
        stale["message"]
    kept = kube.body["status"]["pools"]  # the plan stays
    assert [(p["planHash"], p["revision"]) for p in kept] == [("abc", 3)]


def test_a_secret_bearing_error_body_never_reaches_status() -> None:
    body = json.dumps({"status": "error", "errorType": "internal",
                       "error": SECRET + "y" * (2 * 2**20)}).encode()
    with serving(lambda h: _send(h, 500, body)) as url:
        retune_body, kube = _retune_body(url), _StatusOnlyKube()
        kube.body = retune_body
        access = PrometheusAccess(allowed=LOOPBACK.allowed, max_response_bytes=4 * 2**20)
        outcome = retune_handlers.retune_once(
            retune_body, kube=kube,  # type: ignore[arg-type]
            profiler=lambda u, s: profile_from_prometheus(u, s, access=access))
    assert outcome.reason == "PrometheusUnavailable"
    written = json.dumps(kube.body["status"])
    assert SECRET not in written and len(written) < 20_000
    assert SECRET not in outcome.message


# A status as a reconcile left it: one pool running a plan.
_POOLS = [{"name": "h200", "gpuClass": "H200", "tensorParallel": 1, "replicas": 1,
           "phase": "Applied", "planHash": "abc", "revision": 3}]


def _retune_body(url: str) -> dict[str, Any]:
    return {"metadata": {"name": "bot", "namespace": "llm", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                     "workload": {"profile": "chat"}, "pools": [{"gpuClass": "H200"}],
                     "tuning": {"prometheus": {"url": url, "window": "1m",
                                               "poolSelector": "none"}}},
            "status": {"observedGeneration": 1, "mode": "auto", "pools": list(_POOLS)}}


class _StatusOnlyKube:
    """The two calls the status writer makes (``Kube.request``), on one object in memory."""

    body: dict[str, Any]

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        if method == "GET":
            return json.loads(json.dumps(self.body))
        assert (method, path.rsplit("/", 1)[-1]) == ("PATCH", "status"), (method, path)

        def merge(old: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
            out = dict(old)
            for k, v in patch.items():
                if v is None:
                    out.pop(k, None)
                elif isinstance(v, dict) and isinstance(out.get(k), dict):
                    out[k] = merge(out[k], v)
                else:
                    out[k] = v
            return out

        # As the API server: a write at a stale resourceVersion would be a 409 (status.update
        # sends the one it read); each write moves the version on.
        meta = self.body["metadata"]
        sent = (body.get("metadata") or {}).get("resourceVersion")
        assert sent in (None, meta["resourceVersion"]), (sent, meta["resourceVersion"])
        self.body["status"] = merge(self.body.get("status") or {}, body["status"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return json.loads(json.dumps(self.body))
