"""The image's HEALTHCHECK: 0 when the role this container runs answers /readyz with 200.

The api answers on GENHOOK_PORT; a worker or a dispatcher on GENHOOK_HEALTH_PORT. The role
is read from the container's processes (``genhook <role>``), so one image serves every role.
Standard library only: it runs beside the service, every few seconds.
"""

import os
import sys
import urllib.request
from pathlib import Path

API_ROLES = {"api", "serve"}
ROLES = API_ROLES | {"worker", "dispatcher"}


def running_role() -> str | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg.endswith("genhook") and argv[i + 1] in ROLES:
                return argv[i + 1]
    return None


def main() -> int:
    role = running_role()
    if role is None:
        print("no genhook role is running", file=sys.stderr)
        return 1
    variable = "GENHOOK_PORT" if role in API_ROLES else "GENHOOK_HEALTH_PORT"
    port = os.environ.get(variable, "8000" if role in API_ROLES else "0")
    if port in ("", "0"):
        print(f"{variable} is not set: the {role} has no health port", file=sys.stderr)
        return 1
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return 0 if answer.status == 200 else 1
    except OSError as error:
        print(f"{url}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
