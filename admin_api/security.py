"""API keys with roles, stored hashed in Redis.

Keys are 256-bit random tokens, so a plain SHA-256 is the right hash (nothing to brute-force; a
slow password hash would only cost every request time). Redis holds only the digest, so a leaked
Redis dump does not leak usable keys. The API caches a verified digest for a few seconds
(`FLEETFENCE_API_KEY_CACHE_S`) to keep reads at one Redis round trip; revocation takes effect
within that time.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from enum import StrEnum

import redis
import redis.asyncio as aioredis

from admin_api.errors import ApiKeyError
from fleetfence.contracts import VEHICLE_ID_RE, utc_now_ms

logger = logging.getLogger(__name__)

KEY_PREFIX = "ffk_"


class Role(StrEnum):
    VIEWER = "viewer"
    ADMIN = "admin"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_hash_key(prefix: str, key_digest: str) -> str:
    return f"{prefix}apikey:{key_digest}"


def names_key(prefix: str) -> str:
    return f"{prefix}apikeys:names"


# One script, so the name and its key are written together or not at all: with two commands a
# crash between them left a name pointing at no key, which blocks the name until someone revokes it.
CREATE_LUA = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
    return 0
end
redis.call('HSET', KEYS[2], 'name', ARGV[1], 'role', ARGV[3], 'created_ms', ARGV[4])
return 1
"""


def create_api_key(r: redis.Redis, prefix: str, name: str, role: Role) -> str:
    """Create a key; returns the plain key, which is shown once and never stored."""
    if not VEHICLE_ID_RE.match(name):
        raise ApiKeyError(f"key name {name!r} must match {VEHICLE_ID_RE.pattern}")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    d = digest(key)
    keys = [names_key(prefix), key_hash_key(prefix, d)]
    if not r.register_script(CREATE_LUA)(keys=keys, args=[name, d, role.value, utc_now_ms()]):
        raise ApiKeyError(f"an API key named {name!r} already exists; revoke it first")
    logger.info("api key created name=%s role=%s", name, role.value)
    return key


def list_api_keys(r: redis.Redis, prefix: str) -> list[dict[str, str]]:
    out = []
    for name, d in sorted(r.hgetall(names_key(prefix)).items()):
        h = r.hgetall(key_hash_key(prefix, _s(d)))
        out.append({"name": _s(name), **{_s(k): _s(v) for k, v in h.items()}})
    return out


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _role(raw: bytes | str, key_digest: str) -> Role | None:
    """The stored role, or None when it is not a Role (hand-edited or corrupt data).

    Such a key is refused like an unknown one (401) instead of failing every request with a 500;
    the warning names the digest (never the key), i.e. the record `apikey:<digest>` to fix.
    """
    value = _s(raw)
    try:
        return Role(value)
    except ValueError:
        logger.warning(
            "api key with an invalid stored role refused digest=%s role=%r", key_digest, value[:40]
        )
        return None


def revoke_api_key(r: redis.Redis, prefix: str, name: str) -> None:
    d = r.hget(names_key(prefix), name)
    if d is None:
        raise ApiKeyError(f"no API key named {name!r}")
    pipe = r.pipeline(transaction=True)
    pipe.delete(key_hash_key(prefix, _s(d)))
    pipe.hdel(names_key(prefix), name)
    pipe.execute()
    logger.info("api key revoked name=%s", name)


class KeyVerifier:
    """Key -> role for the API, with a short in-process cache."""

    def __init__(self, r: aioredis.Redis, prefix: str, cache_s: float) -> None:
        self.r = r
        self.prefix = prefix
        self.cache_s = cache_s
        self._cache: dict[str, tuple[Role, float]] = {}

    async def role_of(self, key: str) -> Role | None:
        if not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        d = digest(key)
        hit = self._cache.get(d)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        raw = await self.r.hget(key_hash_key(self.prefix, d), "role")
        if raw is None:
            self._cache.pop(d, None)
            return None
        role = _role(raw, d)
        if role is None:
            self._cache.pop(d, None)
            return None
        if self.cache_s > 0:
            if len(self._cache) > 10_000:  # bounded: unique bad keys must not grow memory forever
                self._cache.clear()
            self._cache[d] = (role, now + self.cache_s)
        return role


# --------------------------------------------------------------------------- stream tokens

STREAM_TOKEN_PREFIX = "fft_"


def stream_token_key(prefix: str, token_digest: str) -> str:
    return f"{prefix}streamtoken:{token_digest}"


async def issue_stream_token(r: aioredis.Redis, prefix: str, api_key: str, ttl_s: int) -> str:
    """A short-lived token for `GET /api/v1/stream?token=...`.

    Browsers' EventSource cannot send X-API-Key, and an API key in a URL ends up in access logs and
    proxy logs for good. A token lives `ttl_s` seconds, is stored only hashed, and points at the
    digest of the key it was issued for, so revoking the key also stops its tokens.
    """
    token = STREAM_TOKEN_PREFIX + secrets.token_urlsafe(24)
    await r.set(stream_token_key(prefix, digest(token)), digest(api_key), ex=ttl_s)
    return token


async def stream_token_role(r: aioredis.Redis, prefix: str, token: str) -> Role | None:
    """The role of the key a live token was issued for; None when expired, unknown or revoked."""
    if not token.startswith(STREAM_TOKEN_PREFIX) or len(token) > 128:
        return None
    key_digest = await r.get(stream_token_key(prefix, digest(token)))
    if key_digest is None:
        return None
    raw = await r.hget(key_hash_key(prefix, _s(key_digest)), "role")
    return None if raw is None else _role(raw, _s(key_digest))
