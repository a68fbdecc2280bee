"""The rules of every HTTP request with a credential in it (no Dagster): no redirect is followed, the URL
passes :func:`credential_url`, and a line shows a URL only through :func:`location`."""

import re
import urllib.request
from urllib.parse import SplitResult, unquote, unquote_to_bytes, urlsplit


class Redirected(Exception):
    """A redirect, never followed (``where``: its ``Location`` without query or fragment, cut short)."""

    def __init__(self, status: int, location_header: str | None) -> None:
        super().__init__(status, location_header)
        self.status = status
        self.where = location(location_header or "")[:200] or "?"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Answers a 3xx as it is (an ``HTTPError``), never with a request to the new location."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


NO_REDIRECTS = urllib.request.build_opener(_NoRedirects)


def _decoded(segment: str) -> str:
    """``segment`` percent-decoded until it stops changing: a proxy and a server may each decode it."""
    while (once := unquote(segment)) != segment:
        segment = once
    return segment


def leaves_its_path(path: str) -> bool:
    """True when a server that normalises ``path`` could serve another one: a segment decoded (as often as it
    decodes) ``.`` or ``..`` (also before a ``;``, ``?`` or ``#``, as a server may read it after a proxy decoded
    it), or an encoded ``/`` or a ``\\``."""
    decoded = [_decoded(segment) for segment in path.split("/")]
    return any(re.split("[;?#]", part, maxsplit=1)[0] in (".", "..") or "/" in part or "\\" in part for part in decoded)


class UnsafeURL(ValueError):
    """A URL a credential would go to, refused: one line naming the setting, never its value."""


_HOST = re.compile(r"[A-Za-z0-9.\-]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*", re.ASCII)  # a name, IPv4, or IPv6
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _parts(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:
        return None
    return parts


def _host(parts: SplitResult | None) -> str:
    """``scheme://host[:port]`` of a URL when it can be shown (no user info), else ``""``."""
    host = parts.hostname or "" if parts is not None else ""
    if parts is None or parts.scheme not in ("http", "https") or not _HOST.fullmatch(host):
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port is not None else "")


def location(url: str, *, path: bool = True) -> str:
    """What a line may show of ``url``: ``scheme://host[:port]`` and (``path``) its path, else ``""``."""
    parts = _parts(url.strip())
    where = _host(parts)
    if path and parts is not None and parts.path.isascii() and parts.path.isprintable():
        where += parts.path  # alone for a relative URL (a redirect's Location)
    return where


def credential_url(name: str, value: str | None, *, query: bool = False) -> str:
    """``value``, stripped, when a credential may go to it, else :class:`UnsafeURL` naming ``name``.
    ``query``: a query may follow the path (never for a base URL an item id is appended to)."""
    url = (value or "").strip()
    parts = _parts(url)
    where = _host(parts)
    said = f"{name} (to {where})" if where else name

    def refuse(reason: str) -> UnsafeURL:
        return UnsafeURL(f"{said} {reason}: refused (its value is not shown)")

    if not url:
        raise refuse("is empty")
    if not all(" " < ch < "\x7f" for ch in url):
        raise refuse("has a character outside printable ASCII (non-ASCII, a control character or a blank)")
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise refuse("is not an http(s) URL with a host and a valid port")
    if "@" in parts.netloc:
        raise refuse("carries user info (user:password@): credentials never go in a URL")
    if not _HOST.fullmatch(parts.hostname or ""):
        raise refuse("has an invalid host")
    if "#" in url:
        raise refuse("has a fragment ('#'): a server never sees it, and an item id after it would be lost")
    if not query and (parts.query or "?" in url):
        raise refuse("has a query ('?'): an item id appended to it would land in the query")
    if _BAD_PERCENT.search(url):
        raise refuse("has an invalid percent-encoding ('%' not followed by two hex digits)")
    decoded = unquote_to_bytes(parts.path + parts.query)
    if not all(0x20 <= byte < 0x7F for byte in decoded):
        raise refuse(
            "has a percent-encoded NUL, control or non-ASCII byte (%00, overlong UTF-8 such as %c0%ae, "
            "fullwidth dots): a server could read the path as another one"
        )
    if leaves_its_path(parts.path):
        raise refuse(
            "has a dot segment ('.' or '..', also percent-encoded) or an encoded '/' or a '\\' in its path: "
            "a server that normalises the path would serve another one"
        )
    return url
