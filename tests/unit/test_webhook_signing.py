"""The batch signer's Ed25519 signatures are those of the key itself, for every key."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from genhook.sender.keys import ActiveKey
from genhook.sender.signing import sign_all
from genhook.signature import ed25519_message


def test_signatures_match_the_key_and_verify() -> None:
    messages = [ed25519_message("1700000000", os.urandom(n)) for n in (0, 1, 425, 70_000)]
    for _ in range(3):
        private = Ed25519PrivateKey.generate()
        key = ActiveKey("key_same_id", private)  # one id, new key: no stale signer
        signatures = sign_all(key, messages)
        assert signatures == [private.sign(m) for m in messages]
        for message, signature in zip(messages, signatures, strict=True):
            private.public_key().verify(signature, message)


def test_a_rotated_key_signs_with_its_own_secret() -> None:
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    message = ed25519_message("1700000000", b'{"session_id":"t1"}')
    (first,) = sign_all(ActiveKey("key_old", old), [message])
    (second,) = sign_all(ActiveKey("key_new", new), [message])
    (again,) = sign_all(ActiveKey("key_old", old), [message])
    assert first == again == old.sign(message)
    assert second == new.sign(message) != first
