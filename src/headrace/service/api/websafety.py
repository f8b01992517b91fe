"""What keeps other sites out: whether a form came from a page of this service.

A browser says where a request comes from: `Origin` on every POST, and `Referer` unless a
policy drops it. A page form (sign-in, sign-out, a decision) is acted on only when that is this
service: the host the request was sent to (its `Host`, the scheme ignored, so a TLS-terminating
proxy in front changes nothing) or one of the configured allowed hosts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit


def host_name(authority: str) -> str:
    """The host of a `host[:port]` (an IPv6 address without its brackets), lowercased."""
    authority = authority.lower()
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.partition(":")[0]


def same_origin(headers: Mapping[str, str], allowed_hosts: Collection[str]) -> bool:
    """Whether a request comes from a page of this service: its `Origin`, else its `Referer`,
    names the `Host` it was sent to (host and port alike) or an allowed host (any port).
    `Origin: null` (a sandboxed frame, a redirect from elsewhere) does not."""
    sender = headers.get("origin") or headers.get("referer")
    if not sender:
        # Neither header: not a browser's form (browsers send Origin with every POST), but a
        # script or a test. Let it by: the form token, bound to a cookie, still has to match.
        return True
    authority = urlsplit(sender).netloc.rpartition("@")[2].lower()
    if not authority:
        return False
    return authority == headers.get("host", "").lower() or host_name(authority) in allowed_hosts
