"""The console's session cookie: it round-trips, and an altered, foreign or stale one is no
session; CSRF tokens belong to one session."""

from __future__ import annotations

from genhook.console.session import MAX_AGE_SECONDS, SessionSigner

KEY = "ghk_abc-DEF_123"


def test_a_cookie_gives_back_its_key_until_it_expires() -> None:
    signer = SessionSigner("s3cret")
    value = signer.cookie_value(KEY, now=1_000_000)
    assert KEY not in value  # not in the clear, though signing is what protects it
    assert signer.api_key(value, now=1_000_000 + 60) == KEY
    assert signer.api_key(value, now=1_000_000 + MAX_AGE_SECONDS + 1) is None


def test_an_altered_or_foreign_cookie_is_no_session() -> None:
    signer = SessionSigner("s3cret")
    value = signer.cookie_value(KEY, now=1_000_000)
    payload, issued, mac = value.split(".")
    other = SessionSigner("s3cret").cookie_value("ghk_other", now=1_000_000).split(".")[0]
    assert signer.api_key(f"{other}.{issued}.{mac}", now=1_000_000) is None
    assert signer.api_key(f"{payload}.{int(issued) + 999}.{mac}", now=1_000_000) is None
    assert signer.api_key(value[:-2] + "AA", now=1_000_000) is None
    assert SessionSigner("different").api_key(value, now=1_000_000) is None
    assert SessionSigner(None).api_key(value, now=1_000_000) is None
    for junk in ("", "a.b", "a.b.c.d", "...", None):
        assert signer.api_key(junk) is None


def test_csrf_tokens_are_per_session() -> None:
    signer = SessionSigner("s3cret")
    token = signer.csrf_token(KEY)
    assert signer.check_csrf(KEY, token)
    assert not signer.check_csrf("ghk_other", token)
    assert not signer.check_csrf(KEY, None)
    assert not SessionSigner("different").check_csrf(KEY, token)
