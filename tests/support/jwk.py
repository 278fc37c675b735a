"""Test-side JWK building, written independently of the code under test."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk(key: Ed25519PrivateKey, kid: str) -> dict[str, str]:
    x = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": b64url(x),
        "use": "sig",
        "alg": "EdDSA",
        "kid": kid,
    }
