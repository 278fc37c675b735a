"""``pip install genhook`` (no ``server`` extra) must give a working SDK and receiver.

A subprocess installs a meta-path blocker that makes every server dependency unimportable,
then imports and exercises ``genhook.client`` and ``genhook.receiver``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"fastapi", "sqlalchemy", "cv2", "PIL", "aiohttp", "uvicorn", "starlette",
               "pydantic", "pydantic_settings", "alembic", "numpy", "onnxruntime", "nudenet",
               "asyncpg", "aiosqlite", "prometheus_client"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"blocked server dependency: {name}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
    """
)

EXERCISE = textwrap.dedent(
    """
    import base64, hashlib, hmac, json, time
    try:
        import fastapi  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the blocker does not work")

    import genhook.client as sdk
    import genhook.receiver as hooks
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    x = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    jwks = {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
                      "x": base64.urlsafe_b64encode(x).rstrip(b"=").decode()}]}
    body = json.dumps({"session_id": "t1", "event_type": "image.task.terminal", "status": "OK",
                       "created_at": 1, "payload": {"status": "completed"}}).encode()
    ts = str(int(time.time()))
    sig = base64.urlsafe_b64encode(key.sign(ts.encode() + b"." + body)).rstrip(b"=").decode()
    headers = {"X-Service-Webhook-Id": "t1", "X-Service-Webhook-Timestamp": ts,
               "X-Service-Webhook-Key-Id": "k1", "X-Service-Webhook-Signature-Ed25519": sig,
               "X-Service-Webhook-Signature": hmac.new(b"s", body, hashlib.sha256).hexdigest()}
    event = hooks.WebhookVerifier(jwks=jwks, hmac_secret="s").verify(headers, body)
    assert event.scheme == "ed25519" and event.payload.status == "completed"
    event = hooks.WebhookVerifier(hmac_secret="s").verify(headers, body)
    assert event.scheme == "hmac"
    store = hooks.SQLiteDedupStore(":memory:")
    assert store.first_time("t1") and not store.first_time("t1")
    dependency_factory = hooks.webhook_dependency  # importable; starlette only when called
    try:
        dependency_factory(hooks.WebhookVerifier(hmac_secret="s"))
    except ModuleNotFoundError as exc:
        assert "starlette" in str(exc)
    else:
        raise SystemExit("starlette was importable")
    with sdk.Client("k", base_url="http://127.0.0.1:9") as client:
        assert client.base_url == "http://127.0.0.1:9"
    assert sdk.data_url(b"\\x89PNG\\r\\n\\x1a\\n" + b"0" * 8).startswith("data:image/png;base64,")
    assert sdk.AsyncClient("k").api_key == "k"
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("LIGHT-OK")
    """
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )


def test_sdk_and_receiver_work_without_server_dependencies():
    proc = run(EXERCISE)
    assert proc.returncode == 0, proc.stderr
    assert "LIGHT-OK" in proc.stdout


def test_client_cli_commands_import_without_server_dependencies():
    proc = run(
        "import genhook.cli.client_cmds as cmds\n"
        "assert callable(cmds.register)\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)\n"
        "assert not leaked, leaked\n"
        "print('CLI-OK')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "CLI-OK" in proc.stdout
