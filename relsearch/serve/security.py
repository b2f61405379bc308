"""Who may call ``relsearch serve``, and what every answer carries.

Only this server's own names and pages may call it: a Host it does not answer to is 421 (DNS
rebinding), a request from a page of another origin 403 (Origin, Sec-Fetch-Site), a body not
declared ``application/json`` 415 (what a page may send without a CORS preflight); then the API key
(401), the body's size (413) and arrival time (408). Every answer carries ``nosniff``; an HTML page
without a Content-Security-Policy of its own gets one. docs/guarantees.md ("Serving: who can call")
has the threat model. :class:`Guard` is the ASGI middleware doing all of it, with the request
metrics and the access log.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException

from .. import explorer
from .errors import error_response
from .metrics import Metrics
from .models import ServeLimits

access_log = logging.getLogger("relsearch.access")

API_KEY_ENV = "RELSEARCH_API_KEY"
# no data behind them: the explorer page and its files ask for the key themselves (relsearch/explorer.py)
OPEN_PATHS = frozenset({"/health", "/docs", "/openapi.json", "/docs/oauth2-redirect", *explorer.PAGE_PATHS})


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header or ``--allowed-host`` value → (name lower-cased, IPv6 in brackets; port or
    None); None when it is not ``NAME``, ``NAME:PORT``, ``[IPV6]`` or ``[IPV6]:PORT``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]") + 1
        name, rest = value[:end], value[end:] if end else ""
    else:
        colon = value.find(":")
        name, rest = (value, "") if colon < 0 else (value[:colon], value[colon:])
    port = rest[1:] if rest.startswith(":") else None
    if (not name.strip("[]") or any(c in name for c in "/@?#\\ ") or (rest and port is None)
            or (port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535))):
        return None
    return name, None if port is None else int(port)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


OWN_PORT = -1  # in Hosts: the port the request came in on (create_app does not know the port it will get)


@dataclass(frozen=True)
class Hosts:
    """The names a request's ``Host`` may give. A browser page on attacker.example whose name is
    made to resolve to this machine (DNS rebinding) sends ``Host: attacker.example``: refusing
    names the server does not answer to keeps such a page from reading or writing the indexes.
    ``names``: (name, port; None: any port, OWN_PORT: the server's own). ``any_ip_port``: with a
    wildcard bind (0.0.0.0, ::), any IP address literal on this port is accepted too: the machine's
    own addresses are not listed, and a literal address is never a rebound name (the browser
    connects to that very address)."""

    names: frozenset[tuple[str, int | None]]
    any_ip_port: int | None = None  # None: no address literal beyond the names

    @classmethod
    def bound(cls, host: str, port: int | None, allowed: Iterable[str] = ()) -> Hosts:
        """The names of a server bound to ``host:port`` (port None: the port it gets), plus
        ``allowed`` (``--allowed-host NAME``, any port, or ``NAME:PORT``: e.g. the name a reverse
        proxy forwards, or a tunnel's local port)."""
        host, port = host.strip().lower(), OWN_PORT if port is None else port
        wildcard = host in ("0.0.0.0", "::", "")
        if wildcard or host == "localhost" or _is_ip(host) and ipaddress.ip_address(host).is_loopback:
            names = set(LOOPBACK_NAMES)  # a loopback (or every) address: the names that reach it from here
        else:
            names = {f"[{host}]" if ":" in host else host}
        out = {(name, port) for name in names}
        for entry in allowed:
            bare_ipv6 = entry.count(":") > 1 and not entry.strip().startswith("[")
            parsed = split_host(f"[{entry.strip()}]" if bare_ipv6 else entry)
            if parsed is None:
                raise ValueError(f"--allowed-host {entry!r} is not NAME or NAME:PORT (IPv6 as [ADDRESS])")
            out.add(parsed)
        return cls(frozenset(out), port if wildcard else None)

    @classmethod
    def loopback(cls) -> Hosts:
        """create_app's default: the loopback names, on the port the server listens on."""
        return cls.bound("127.0.0.1", None)

    def named(self, name: str, port: int, own: int | None = None) -> bool:
        """True when ``name:port`` is one of the names (not merely an address literal); ``own``:
        the port the server listens on (None: unknown, any)."""
        return any(n == name and _port_matches(p, port, own) for n, p in self.names)

    def accepts(self, name: str, port: int, own: int | None = None) -> bool:
        return self.named(name, port, own) or (self.any_ip_port is not None and _is_ip(name)
                                               and _port_matches(self.any_ip_port, port, own))

    def describe(self, own: int | None = None) -> str:
        def shown(name, port):
            port = own if port == OWN_PORT else port
            return f"{name}:{port}" if port is not None else name

        return ", ".join(sorted(shown(n, p) for n, p in self.names)) + (
            f", any IP address on port {own if self.any_ip_port == OWN_PORT else self.any_ip_port}"
            if self.any_ip_port is not None else "")


def _port_matches(wanted: int | None, port: int, own: int | None) -> bool:
    return wanted is None or wanted == port or (wanted == OWN_PORT and own in (None, port))


def _refuse_host(scope, headers: list[tuple[bytes, bytes]], hosts: Hosts) -> JSONResponse | None:
    """421 unless every Host header names this server (none at all: an HTTP/1.0 client, never a browser)."""
    default = DEFAULT_PORTS.get(scope.get("scheme", "http"), 80)
    own = (scope.get("server") or (None, None))[1]
    for key, value in headers:
        if key != b"host":
            continue
        text = value.decode("latin-1")
        parsed = split_host(text)
        if parsed is None or not hosts.accepts(parsed[0], parsed[1] or default, own):
            return error_response(421, "host", f"Host {_printable(text, 100)!r} is not a name this server answers "
                                               f"to ({hosts.describe(own)}); name it with relsearch serve "
                                               "--allowed-host")
    return None


# the headers that say where a request comes from: each at most once, else a foreign value could hide
# before the page's own (a header map keeps the last of a repeated name)
ONCE = (b"origin", b"sec-fetch-site", b"sec-fetch-mode")


def _refuse_cross_site(scope, raw: list[tuple[bytes, bytes]], hosts: Hosts) -> JSONResponse | None:
    """403 for a request a page of another origin made: its ``Origin`` is not this server's, or,
    without one, its ``Sec-Fetch-Site`` is cross-site or same-site (another port or subdomain is
    another origin), or it repeats one of these headers (:data:`ONCE`). The explorer page's own
    requests are same-origin; a link followed from another site (a GET navigation) still opens a page."""
    for name in ONCE:
        if sum(key == name for key, _ in raw) > 1:
            return error_response(403, name.decode(), f"{name.decode().title()} sent more than once: a request says "
                                                      "once where it comes from; pages of other origins may not call "
                                                      "this API")
    headers = dict(raw)
    origin = headers.get(b"origin", b"").decode("latin-1")
    if b"origin" in headers and not _own_origin(scope, origin, headers.get(b"host", b"").decode("latin-1"), hosts):
        return error_response(403, "origin", f"Origin {_printable(origin, 100)!r} is not this server's: pages of "
                                             "other origins may not call this API")
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
    navigation = headers.get(b"sec-fetch-mode", b"").lower() == b"navigate" and scope["method"] in ("GET", "HEAD")
    if site in ("cross-site", "same-site") and not navigation:
        return error_response(403, "sec-fetch-site", f"a {site} request (Sec-Fetch-Site): pages of other origins "
                                                     "may not call this API")
    return None


def _own_origin(scope, origin: str, host: str, hosts: Hosts) -> bool:
    """True when ``origin`` (scheme://host[:port], as browsers send it) is this server: the host the
    request names (the same netloc; a TLS proxy in front changes the scheme, not the name), or a
    name it is bound to or allowed (a proxy that rewrites Host). "null" (a sandboxed or file: page) never is."""
    scheme, sep, netloc = origin.strip().lower().partition("://")
    if not sep or scheme not in DEFAULT_PORTS or not netloc:
        return False
    if netloc == host.strip().lower():
        return True
    parsed = split_host(netloc)
    own = (scope.get("server") or (None, None))[1]
    return parsed is not None and hosts.named(parsed[0], parsed[1] or DEFAULT_PORTS[scheme], own)


def _refuse_media_type(value: bytes | None) -> JSONResponse | None:
    """415 unless the body is declared ``application/json`` (optionally ``; charset=utf-8``). A
    page of another origin can send text/plain or a form without asking (no CORS preflight),
    never application/json: reading every body as JSON would let it write."""
    text = (value or b"").decode("latin-1")
    media, *params = [part.strip() for part in text.split(";")]
    if media.lower() != "application/json":
        return error_response(415, "content-type", f"request bodies are JSON: send Content-Type: application/json, "
                                                   f"got {_printable(text, 80)!r}" if text else
                                                   "request bodies are JSON: send Content-Type: application/json")
    for param in params:
        name, _, charset = param.partition("=")
        if name.strip().lower() == "charset" and charset.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return error_response(415, "content-type",
                                  f"JSON bodies are UTF-8, got charset {_printable(charset, 40)!r}")
    return None


_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def page_csp(html: bytes) -> str:
    """The Content-Security-Policy of an HTML page that sets none itself (/docs and its OAuth2
    redirect: Swagger UI from this server): scripts from here and the page's own inline scripts
    (by their hashes, so no other inline script runs), styles from here and inline (Swagger UI
    styles elements inline), images from here or data: URLs (its CSS icons), requests to here
    only, never in a frame."""
    hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
                     for script in _INLINE_SCRIPT.findall(html))
    return (f"default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class Headed:
    """``send`` with this server's response headers: ``X-Content-Type-Options: nosniff`` on every
    response (no JSON answer is ever run as a script or styled as CSS); an HTML page without a
    Content-Security-Policy of its own gets :func:`page_csp` of its body, and every page
    ``X-Frame-Options: DENY`` (frame-ancestors for browsers without CSP level 2)."""

    def __init__(self, send, status: list[int]):
        self.send, self.status = send, status
        self.held: dict | None = None  # the start of an HTML page waiting for its body
        self.body = b""

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.status[0] = message["status"]
            headers = MutableHeaders(scope=message)
            headers.setdefault("X-Content-Type-Options", "nosniff")
            if headers.get("content-type", "").startswith("text/html"):
                headers.setdefault("X-Frame-Options", "DENY")
                if "content-security-policy" not in headers:
                    self.held = message
                    return
        elif message["type"] == "http.response.body" and self.held is not None:
            self.body += message.get("body", b"")
            if message.get("more_body", False):
                return
            MutableHeaders(scope=self.held).append("Content-Security-Policy", page_csp(self.body))
            await self.send(self.held)
            message, self.held = {**message, "body": self.body}, None
        await self.send(message)


class Guard:
    """ASGI middleware: who may call (Host, Origin, Sec-Fetch-Site), API key, request body type, size
    and arrival time, response headers, request metrics and the access log."""

    def __init__(self, app, *, api_key: str | None, limits: ServeLimits, metrics: Metrics, paths: set[str],
                 json_paths: set[str] = frozenset(), hosts: Hosts | None = None, access: bool = True):
        self.app, self.api_key, self.limits, self.metrics, self.paths = app, api_key, limits, metrics, paths
        self.json_paths, self.hosts, self.access = json_paths, hosts or Hosts.loopback(), access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]
        send_headed = Headed(send, status)
        try:
            response = self._refuse(scope)
            if response is not None:
                return await response(scope, receive, send_headed)
            await self.app(scope, self._limited(receive), send_headed)
        finally:
            seconds = time.perf_counter() - started
            path = scope["path"] if scope["path"] in self.paths else "other"  # bounded label values
            self.metrics.observe_request(path, status[0], seconds)
            if self.access:  # method, path, status, latency: never a body, a query string or a header
                access_log.info("%s %s %d %.1fms", _printable(scope.get("method", "?"), 16),
                                _printable(scope.get("raw_path", b"").decode("latin-1") or scope["path"], 200),
                                status[0], seconds * 1000)

    def _refuse(self, scope) -> JSONResponse | None:
        """The first refusal that applies, in this order: Host (421), another origin (403), the key
        (401), the body's size (413), its type (415)."""
        headers = dict(scope["headers"])
        raw = scope["headers"]
        refused = _refuse_host(scope, raw, self.hosts) or _refuse_cross_site(scope, raw, self.hosts)
        if refused is not None:
            return refused
        if (self.api_key is not None and scope["path"] not in OPEN_PATHS
                and not scope["path"].startswith(explorer.OPEN_PREFIXES)):
            given = headers.get(b"x-api-key")
            auth = headers.get(b"authorization", b"")
            if given is None and auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            # compare as bytes in constant time; a missing key compares against an empty string
            if not hmac.compare_digest(given or b"", self.api_key.encode("utf-8")):
                return error_response(401, "authorization",
                                      "missing or wrong API key (Authorization: Bearer KEY or X-API-Key)")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limits.max_body_bytes):
            return error_response(413, "body", f"request body larger than {self.limits.max_body_bytes} bytes")
        if scope["method"] == "POST" and scope["path"] in self.json_paths:
            return _refuse_media_type(headers.get(b"content-type"))
        return None

    def _limited(self, receive):
        seen, complete = 0, False
        deadline = time.monotonic() + self.limits.body_timeout_s

        async def receive_limited():
            nonlocal seen, complete
            if complete:  # after the body: waiting for a disconnect, unbounded
                return await receive()
            try:  # a client that sends fewer bytes than its Content-Length is cut off here
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
            except asyncio.TimeoutError:
                raise HTTPException(408, f"request body not received within {self.limits.body_timeout_s:g} s "
                                         f"(fewer bytes than Content-Length?)",
                                    headers={"Connection": "close"}) from None  # and the connection is closed
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.limits.max_body_bytes:  # chunked bodies carry no Content-Length
                raise HTTPException(413, f"request body larger than {self.limits.max_body_bytes} bytes")
            return message

        return receive_limited


def _printable(text: str, limit: int) -> str:
    """``text`` for a log line: printable ASCII, the rest escaped, at most ``limit`` characters."""
    out = "".join(c if " " < c < "\x7f" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def read_api_key(key_file: str | None) -> str | None:
    """The API key from ``key_file`` (first line), else ``$RELSEARCH_API_KEY``; None: no key. An
    empty key (a blank first line, ``RELSEARCH_API_KEY=""``) is a ValueError, never "no key"."""
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise ValueError(f"{key_file} holds no API key")
        return key
    key = os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError(f"{API_KEY_ENV} is set but empty: set it to a key, or unset it to serve without one")
    return key
