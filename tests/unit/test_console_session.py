"""The console's CSRF tokens belong to one session, and the sign-in throttle counts each
client and account on its own."""

from __future__ import annotations

from genhook.console.session import SignInThrottle, check_csrf, csrf_token


def test_csrf_tokens_are_per_session() -> None:
    token = csrf_token("session-a")
    assert check_csrf("session-a", token)
    assert not check_csrf("session-b", token)
    assert not check_csrf("session-a", None)
    assert not check_csrf("session-a", token[:-1] + "A")


def test_the_throttle_refuses_past_its_limit_per_name() -> None:
    throttle = SignInThrottle(limit=3, window=300)
    for _ in range(3):
        assert throttle.wait_seconds("client:a") == 0
        throttle.count("client:a")
    assert 0 < throttle.wait_seconds("client:a") <= 300
    assert throttle.wait_seconds("client:a", "account:x") > 0
    assert throttle.wait_seconds("client:b", "account:x") == 0
