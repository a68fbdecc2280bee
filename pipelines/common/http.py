"""The rules of every HTTP request Groundskeeper makes with a credential in it (no Dagster).

- No request follows a redirect: a 3xx is answered as it is (:class:`Redirected` names where it
  pointed, without query or fragment), never with a request to a URL nobody checked.
- A URL whose path a normalising server could read as another one (:func:`leaves_its_path`) is
  refused rather than normalised.
"""

from __future__ import annotations

import urllib.request
from urllib.parse import unquote, urlsplit


class Redirected(Exception):
    """The server answered a redirect, which is never followed (``where``: its ``Location`` without
    query or fragment, cut short)."""

    def __init__(self, status: int, location: str | None) -> None:
        super().__init__(status, location)
        self.status = status
        parts = urlsplit(location or "")
        self.where = f"{parts.scheme}://{parts.netloc}{parts.path}"[:200] if parts.netloc else (parts.path[:200] or "?")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Answers a 3xx as it is (an ``HTTPError``), never with a request to the new location."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


NO_REDIRECTS = urllib.request.build_opener(_NoRedirects)
"""The opener of every request that carries a credential."""


def leaves_its_path(path: str) -> bool:
    """True when a server or proxy that normalises ``path`` could serve another one: a segment that,
    percent-decoded, is ``.`` or ``..`` (also before a ``;`` parameter, as some servers read it), or
    holds an encoded ``/`` or a ``\\``. Such a path is refused rather than normalised."""
    for segment in path.split("/"):
        decoded = unquote(segment)
        if decoded.split(";", 1)[0] in (".", "..") or "/" in decoded or "\\" in decoded:
            return True
    return False
