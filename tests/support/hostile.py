"""Generated hostile inputs, by class: body shapes, JSON edge cases, URL spellings; and a
health monitor that polls ``/healthz`` while they are thrown at a service."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Callable, Iterator

import httpx

from tests.support.images import image_bytes

MODEL = "genhook/image-edit"


def _request(**fields: object) -> dict[str, object]:
    body: dict[str, object] = {"model": MODEL, "prompt": "black and white", "size": "1024*1024"}
    body.update(fields)
    return body


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def body_shapes(max_body: int, max_json: int) -> dict[str, Callable[[], bytes]]:
    """Bodies that cost a parser work or memory out of proportion to their purpose.

    ``max_body`` is the service's whole-body cap, ``max_json`` its cap on everything but
    image data; sizes are drawn around both.
    """
    full = max_body - 64
    small_png = image_bytes(size=8)
    cases: dict[str, Callable[[], bytes]] = {}
    for depth in (33, 1000, 100_000, full // 2):
        cases[f"nested-arrays-{depth}"] = lambda d=depth: b"[" * d + b"]" * d
    for depth in (40, 5000, full // 6):
        cases[f"nested-objects-{depth}"] = lambda d=depth: b'{"a":' * d + b"1" + b"}" * d
    for count in (1001, max_json // 3, full // 3):
        cases[f"wide-empty-arrays-{count}"] = lambda n=count: b"[" + b"[]," * n + b"[]]"
    for count in (max_json // 8, full // 8):
        cases[f"small-objects-{count}"] = lambda n=count: b"[" + b'{"a":1},' * n + b"{}]"
    cases["wide-beside-image"] = lambda: json.dumps(
        _request(images=["data:image/png;base64," + _b64(small_png)], x=[[]] * (full // 4))
    ).encode()
    cases["many-keys"] = lambda: json.dumps({f"k{i}": i for i in range(full // 16)}).encode()
    for size in (max_json + 1, full):
        cases[f"long-prompt-{size}"] = lambda n=size: json.dumps(_request(prompt="a" * n)).encode()
    cases["long-escaped-prompt"] = lambda: json.dumps(
        _request(prompt="\u2603" * (full // 7))
    ).encode()
    cases["structure-inside-data-url"] = lambda: (
        b'{"model":"'
        + MODEL.encode()
        + b'","images":["data:image/png;base64,'
        + b"[" * (full // 2)
        + b'"]}'
    )
    cases["data-url-of-noise"] = lambda: json.dumps(
        _request(images=["data:image/png;base64," + _b64(os.urandom(full // 2))])
    ).encode()
    cases["data-url-not-base64"] = lambda: json.dumps(
        _request(images=["data:image/png;base64," + "!" * (full // 2)])
    ).encode()
    cases["data-url-quote-trick"] = lambda: (
        b'{"model":"'
        + MODEL.encode()
        + b'","images":["x"data:image/png;base64,'
        + b"A" * (full // 2)
        + b'"]}'
    )
    cases["data-url-as-key"] = lambda: b'{"data:image/png;base64,' + b"A" * (full // 2) + b'": 1}'
    cases["many-data-urls"] = lambda: json.dumps(
        _request(images=["data:image/png;base64," + _b64(small_png)] * 2000)
    ).encode()
    cases["data-urls-everywhere"] = lambda: json.dumps(
        {"x": [["data:image/png;base64,AAAA"] * 10] * 300}
    ).encode()
    return cases


def json_edge_cases() -> dict[str, bytes]:
    """Small bodies each parser along the way may choke on."""
    big = "9" * 5000
    return {
        "int-over-digit-limit": ('{"model":' + big + "}").encode(),
        "negative-int-over-digit-limit": ('{"prompt": -' + big + "}").encode(),
        "int-in-array": ('{"images":[' + big + "]}").encode(),
        "int-over-limit-as-size": json.dumps(_request(images=["https://a.test/x"]))
        .replace('"1024*1024"', big)
        .encode(),
        "float-overflow": b'{"model": 1e99999}',
        "float-long-mantissa": ('{"model": 1.' + "1" * 100_000 + "}").encode(),
        "nan": b'{"model": NaN}',
        "infinity": b'{"model": Infinity}',
        "minus-infinity": b'{"model": -Infinity}',
        "lone-surrogate": json.dumps(_request(prompt="\ud800 red border")).encode(),
        "lone-surrogate-key": b'{"\\udfff": 1, "model": "x"}',
        "nul-in-prompt": json.dumps(
            _request(prompt="a\u0000b", images=["https://a.test/x"])
        ).encode(),
        "nul-in-webhook": json.dumps(
            _request(images=["https://a.test/x"], webhook_url="https://a.test/\u0000")
        ).encode(),
        "invalid-utf8": b'{"model": "\xff\xfe"}',
        "utf16": json.dumps({"model": MODEL}).encode("utf-16"),
        "utf8-bom": b"\xef\xbb\xbf" + json.dumps({"model": MODEL}).encode(),
        "trailing-comma": b'{"model": "x",}',
        "duplicate-keys": b'{"model": "x", "model": "' + MODEL.encode() + b'"}',
        "trailing-garbage": b'{"model": "x"} {}',
        "empty": b"",
        "whitespace": b"   \n ",
        "null": b"null",
        "array": b"[]",
        "string": b'"x"',
        "number": b"1",
        "unterminated-string": b'{"model": "x',
        "control-character": b'{"model": "a\x01b"}',
        "bad-escape": b'{"model": "\\u12"}',
        "deep-in-field": ('{"model": ' + "[" * 50_000 + "]" * 50_000 + "}").encode(),
        "prompt-wrong-type": json.dumps(_request(prompt={"a": [1, 2]})).encode(),
        "images-wrong-type": json.dumps(_request(images={"0": "x"})).encode(),
        "size-huge-numbers": json.dumps(
            _request(images=["https://a.test/x"], size="999999*999999")
        ).encode(),
    }


def url_spellings() -> list[str]:
    """URL spellings parsers disagree on, generated around a few plain URLs."""
    bases = ["http://img.test/a.png", "https://img.test:8443/p/a.png?x=1", "http://127.0.0.1:9/a"]
    odd_characters = ["\t", "\n", "\r", " ", "\\", "\x00", "\u00e9", "\u200b", "\uff0e", "%00"]
    spellings: list[str] = list(bases)
    for base in bases:
        cut = base.index("//") + 2
        host_end = base.index("/", cut)
        for char in odd_characters:
            for position in (cut - 1, cut, cut + 3, host_end, len(base)):
                spellings.append(base[:position] + char + base[position:])
    hosts = [
        "img.test.",
        "IMG.TEST",
        "b\u00fccher.test",
        "xn--bcher-kva.test",
        "img..test",
        "-img.test",
        "img_test.test",
        "a" * 64 + ".test",
        "2130706433",
        "0x7f.1",
        "127.1",
        "0177.0.0.1",
        "127.0.0.1.",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[fe80::1%25eth0]",
        "[::1",
        "::1",
        "%69mg.test",
        "user@img.test",
        "user:pass@img.test",
        "img.test@evil.test",
        "",
    ]
    for host in hosts:
        spellings.append(f"http://{host}/a.png")
    for port in ("0", "65535", "65536", "-1", "80a", "", "00080", "99999999999999999999"):
        spellings.append(f"http://img.test:{port}/a.png")
    spellings += [
        "http:/img.test/a.png",
        "http:\\\\img.test\\a.png",
        "//img.test/a.png",
        "HTTP://img.test/a.png",
        "ftp://img.test/a.png",
        "javascript:alert(1)",
        "file:///etc/passwd",
        "http://img.test/" + "a" * 5000,
        "http://img.test/a.png#frag\u00e9",
        "http://img.test/%zz",
    ]
    return spellings


class HealthMonitor:
    """Polls ``/healthz`` on one keep-alive connection and records every failure."""

    def __init__(self, base_url: str, interval: float = 0.02) -> None:
        self.base_url = base_url
        self.interval = interval
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    response = client.get("/healthz")
                    if response.status_code != 200:
                        self.failures.append(f"HTTP {response.status_code}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.perf_counter() - started)
                self._stop.wait(self.interval)

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else 0.0


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size (VmHWM), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]
