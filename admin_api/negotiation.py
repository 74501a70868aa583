"""Proactive content negotiation (RFC 9110, 12.5.1): which of the media types a route offers the
`Accept` header prefers.

Each offered type takes the weight (`q`) of the most specific range that matches it (`type/subtype`
over `type/*` over `*/*`); the highest weight above 0 wins, ties going to the route's order. No
header, or an empty one, accepts anything. Parameters other than `q` are not compared (a client's
`text/csv; charset=utf-8` accepts the CSV).
"""

from __future__ import annotations

from collections.abc import Sequence


def _ranges(accept: str) -> list[tuple[str, str, float]]:
    out = []
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if "/" not in media:
            continue
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = min(max(float(value.strip()), 0.0), 1.0)
                except ValueError:
                    q = 0.0  # an unreadable weight accepts nothing rather than everything
        typ, _, sub = media.partition("/")
        out.append((typ.strip(), sub.strip(), q))
    return out


def _weight(media: str, ranges: list[tuple[str, str, float]]) -> float:
    typ, _, sub = media.lower().partition("/")
    best: tuple[int, float] | None = None
    for rtyp, rsub, q in ranges:
        if rtyp == typ and rsub == sub:
            specificity = 2
        elif rtyp == typ and rsub == "*":
            specificity = 1
        elif rtyp == "*" and rsub == "*":
            specificity = 0
        else:
            continue
        if best is None or specificity > best[0] or (specificity == best[0] and q > best[1]):
            best = (specificity, q)
    return 0.0 if best is None else best[1]


def negotiate(accept: str | None, offered: Sequence[str]) -> str | None:
    """The offered media type the header prefers, or None when it accepts none of them (a 406)."""
    if not offered:
        return None
    if accept is None or not accept.strip():
        return offered[0]
    ranges = _ranges(accept)
    best, best_q = None, 0.0
    for media in offered:
        q = _weight(media, ranges)
        if q > best_q:
            best, best_q = media, q
    return best
