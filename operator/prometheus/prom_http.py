"""Talking to Prometheus without being a server-side request forgery proxy.

``spec.tuning.prometheus.url`` is tenant input; the operator runs with its own network reach
and credentials. So a query goes out only when:

- the URL is on the operator's allow-list (``PrometheusAccess.allowed``, from the chart's
  ``prometheus.allowedURLs`` via ``KVTUNE_PROMETHEUS_ALLOWED_URLS``): same scheme, host and
  port (``host:*`` allows any port) and a path under the entry's path; no user info;
- TLS is verified (the system's CAs, or the CA bundle the operator is given); skipping it is
  the operator's own configuration, never the tenant's;
- a bearer token (the operator's, from a mounted Secret) is sent only there;
- redirects are never followed (a 3xx is an error: allow-list the final URL);
- the reply is bounded in size (``max_response_bytes``) and in time (``timeout_seconds`` for
  the whole reply, not per read).

Every failure is ``PrometheusUnavailable`` with a short message that names the URL (without
user info or query), the query and what went wrong; it never quotes the reply's body (a
condition message is readable by anyone who may ``get`` the object).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlencode, urlsplit

ENV_ALLOWED = "KVTUNE_PROMETHEUS_ALLOWED_URLS"
ENV_CA_FILE = "KVTUNE_PROMETHEUS_CA_FILE"
ENV_TOKEN_FILE = "KVTUNE_PROMETHEUS_BEARER_TOKEN_FILE"
ENV_INSECURE = "KVTUNE_PROMETHEUS_INSECURE_SKIP_VERIFY"
ENV_MAX_BYTES = "KVTUNE_PROMETHEUS_MAX_RESPONSE_BYTES"
ENV_TIMEOUT = "KVTUNE_PROMETHEUS_TIMEOUT_SECONDS"
DEFAULT_MAX_RESPONSE_BYTES = 4 * 2**20
DEFAULT_TIMEOUT_SECONDS = 10.0
# Prometheus' own error types (api/v1): the only part of an error reply that is quoted.
_ERROR_TYPE = re.compile(r"^[a-z_]{1,32}$")


class PrometheusUnavailable(Exception):
    """Prometheus could not be reached, refused, or answered something kvtune does not trust;
    the message says which and why (short, never the reply's body)."""

    reason = "PrometheusUnavailable"


class PrometheusNotAllowed(PrometheusUnavailable):
    """The URL is not on the operator's allow-list (or is malformed)."""

    reason = "PrometheusNotAllowed"


@dataclass(frozen=True)
class AllowedEndpoint:
    scheme: str
    host: str
    port: int | None  # None: any port
    path: str  # a prefix, ending in "/"

    @classmethod
    def parse(cls, entry: str) -> AllowedEndpoint:
        text = entry.strip()
        any_port = False
        match = re.match(r"^(https?://[^/:]+):\*(/.*)?$", text)
        if match:
            any_port = True
            text = match.group(1) + (match.group(2) or "")
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username \
                or parts.password or parts.query or parts.fragment:
            raise ValueError(f"{ENV_ALLOWED}: {entry!r} is not an http(s) URL prefix such as "
                             f"https://prometheus.monitoring.svc:9090 or http://127.0.0.1:*")
        port = None if any_port else (parts.port or _default_port(parts.scheme))
        resolved = normalised_path(parts.path)
        if resolved is None:
            raise ValueError(f"{ENV_ALLOWED}: {entry!r} has a path that cannot be compared "
                             f"safely; write it plainly, e.g. /prometheus")
        path = resolved if resolved.endswith("/") else resolved + "/"
        return cls(parts.scheme, parts.hostname.lower(), port, path)

    def admits(self, scheme: str, host: str, port: int, path: str) -> bool:
        """``path`` is compared as the server will resolve it (``normalised_path``): a prefix
        escaped with ``..`` or ``%2e%2e`` admits nothing outside it."""
        resolved = normalised_path(path)
        return (scheme == self.scheme and host == self.host
                and (self.port is None or port == self.port)
                and resolved is not None
                and (resolved if resolved.endswith("/") else resolved + "/").startswith(
                    self.path))


_MAX_UNQUOTES = 4  # %252e%252e → %2e%2e → ..: decode until stable, a few times at most


def normalised_path(path: str) -> str | None:
    """``path`` percent-decoded until stable and with its dot segments removed (RFC 3986
    5.2.4): what a server or proxy may resolve it to. None when it cannot be compared
    safely (still encoded after a few rounds, a backslash, a NUL)."""
    text = path or "/"
    for _ in range(_MAX_UNQUOTES):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    else:
        return None
    if "\\" in text or "\x00" in text:
        return None
    out: list[str] = []
    for segment in text.split("/")[1:] if text.startswith("/") else text.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    resolved = "/" + "/".join(out)
    # A trailing "." or ".." segment names a directory: keep the slash.
    if text.endswith(("/", "/.", "/..")) and not resolved.endswith("/"):
        resolved += "/"
    return resolved


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


@dataclass(frozen=True)
class PrometheusAccess:
    """The operator's own configuration for reaching Prometheus (never the tenant's)."""

    allowed: tuple[AllowedEndpoint, ...] = ()
    ca_file: str | None = None
    bearer_token_file: str | None = None
    insecure_skip_verify: bool = False
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> PrometheusAccess:
        env = dict(os.environ) if env is None else env
        entries = [e for e in re.split(r"[,\s]+", env.get(ENV_ALLOWED, "")) if e]
        return cls(
            allowed=tuple(AllowedEndpoint.parse(e) for e in entries),
            ca_file=env.get(ENV_CA_FILE) or None,
            bearer_token_file=env.get(ENV_TOKEN_FILE) or None,
            insecure_skip_verify=env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"),
            max_response_bytes=int(env.get(ENV_MAX_BYTES) or DEFAULT_MAX_RESPONSE_BYTES),
            timeout_seconds=float(env.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_SECONDS),
        )

    def check(self, url: str) -> str:
        """``url`` without a trailing "/" when it is allow-listed; else PrometheusNotAllowed."""
        try:
            parts = urlsplit(url)
            port = parts.port or _default_port(parts.scheme)
        except ValueError as exc:
            raise PrometheusNotAllowed(f"spec.tuning.prometheus.url: not a valid URL ({exc})"
                                       ) from exc
        shown = shown_url(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PrometheusNotAllowed(f"spec.tuning.prometheus.url={shown}: not an http(s) "
                                       f"URL")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise PrometheusNotAllowed(f"spec.tuning.prometheus.url={shown}: user info, query "
                                       f"and fragment are not allowed; give the base URL")
        if not any(a.admits(parts.scheme, parts.hostname.lower(), port, parts.path or "/")
                   for a in self.allowed):
            raise PrometheusNotAllowed(
                f"spec.tuning.prometheus.url={shown} is not on the operator's allow-list; ask "
                f"the platform team to add it (chart value prometheus.allowedURLs) or use an "
                f"allowed Prometheus")
        return url.rstrip("/")

    def verify(self) -> bool | str:
        if self.insecure_skip_verify:
            return False
        return self.ca_file or True

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.bearer_token_file:
            try:
                token = Path(self.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise PrometheusUnavailable(f"the operator's Prometheus bearer token file "
                                            f"{self.bearer_token_file} cannot be read "
                                            f"({exc.strerror})") from exc
            headers["Authorization"] = f"Bearer {token}"
        return headers


def shown_url(url: str) -> str:
    """A URL as status may quote it: scheme, host, port and path only, at most 200 chars."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"[:200]
    except ValueError:
        return "(malformed URL)"


def query(url: str, promql: str, *, at_unix_seconds: float, access: PrometheusAccess,
          name: str) -> Any:
    """One instant query (``/api/v1/query``); returns the parsed JSON reply's ``data``.

    The standard library's HTTP client on purpose: it follows no redirect, reads no proxy
    or ``.netrc`` from the environment, and its socket can be cut at the deadline (a
    watchdog shuts it down, whatever the server trickles)."""
    base = access.check(url)
    where = f"prometheus {shown_url(url)}: query {name}"
    parts = urlsplit(base)
    conn = _connection(parts, access)
    target = f"{parts.path}/api/v1/query?" + urlencode(
        {"query": promql, "time": f"{at_unix_seconds:.3f}"})
    status, body = _fetch(conn, target, access, where)
    return _reply_data(status, body, where)


def _connection(parts: SplitResult, access: PrometheusAccess) -> http.client.HTTPConnection:
    """An unopened connection to the allow-listed URL (TLS with the operator's CA)."""
    host = parts.hostname or ""
    timeout = access.timeout_seconds
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=access.ca_file)
        if access.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(host, parts.port or 443, timeout=timeout,
                                           context=context)
    else:
        return http.client.HTTPConnection(host, parts.port or 80, timeout=timeout)


def _fetch(conn: http.client.HTTPConnection, target: str, access: PrometheusAccess,
           where: str) -> tuple[int, bytes]:
    """The reply's HTTP status and body, read within the deadline and the size limit: a
    watchdog shuts the socket down at the deadline, whatever the server trickles."""
    timeout = access.timeout_seconds
    expired = threading.Event()
    # The socket, kept here: http.client hands it to the reply (conn.sock becomes None).
    opened: list[socket.socket] = []

    def cut() -> None:
        expired.set()
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        if conn.sock is not None:
            opened.append(conn.sock)
        if expired.is_set():
            raise TimeoutError
        conn.request("GET", target, headers=access.headers())
        reply = conn.getresponse()
        status = reply.status
        if 300 <= status < 400:
            raise PrometheusUnavailable(
                f"{where}: HTTP {status} redirect; kvtune does not follow redirects: set "
                f"spec.tuning.prometheus.url to the final, allow-listed URL")
        declared = reply.getheader("Content-Length") or ""
        if declared.isdigit() and int(declared) > access.max_response_bytes:
            raise PrometheusUnavailable(f"{where}: the reply is {int(declared)} bytes, more "
                                        f"than the {access.max_response_bytes} allowed")
        body = reply.read(access.max_response_bytes + 1)
        reply.close()
        if expired.is_set():  # cut short by the watchdog: what was read is not the reply
            raise TimeoutError
        if len(body) > access.max_response_bytes:
            raise PrometheusUnavailable(f"{where}: the reply exceeds the "
                                        f"{access.max_response_bytes} bytes allowed")
    except PrometheusUnavailable:
        raise
    except ssl.SSLCertVerificationError as exc:
        raise PrometheusUnavailable(f"{where}: TLS verification failed "
                                    f"({exc.verify_message}); give the operator the CA "
                                    f"(prometheus.tls.caSecret)") from exc
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise PrometheusUnavailable(f"{where}: no complete reply within {timeout:g}s"
                                        ) from exc
        raise PrometheusUnavailable(f"{where}: cannot connect ({_short(exc)})") from exc
    finally:
        watchdog.cancel()
        conn.close()
    return status, body


def _reply_data(status: int, body: bytes, where: str) -> Any:
    """The ``data`` of a successful Prometheus reply; PrometheusUnavailable for anything
    else (never quoting the reply)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PrometheusUnavailable(f"{where}: HTTP {status}, the reply is not JSON") from exc
    except RecursionError as exc:
        # A reply nested thousands deep (within the size limit) exhausts the parser's stack.
        raise PrometheusUnavailable(f"{where}: HTTP {status}, the reply is nested too deeply "
                                    f"to be Prometheus JSON") from exc
    if not isinstance(doc, dict):
        raise PrometheusUnavailable(f"{where}: HTTP {status}, the reply is not a JSON object")
    if status != 200 or doc.get("status") != "success":
        kind = doc.get("errorType")
        kind = kind if isinstance(kind, str) and _ERROR_TYPE.match(kind) else "unknown"
        raise PrometheusUnavailable(f"{where}: HTTP {status}, Prometheus error type {kind} "
                                    f"(the reply is not shown)")
    return doc.get("data")


def _short(exc: Exception) -> str:
    """An exception's class and the first words of its text: enough to act on, no dumps."""
    text = re.sub(r"\s+", " ", str(exc))
    return f"{type(exc).__name__}: {text[:120]}"
