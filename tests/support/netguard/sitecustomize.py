"""Imported at start-up by every Python process the tests start (this folder is on their
PYTHONPATH), so services under test stay on loopback too."""

import os

if os.environ.get("GENHOOK_TEST_NETGUARD") == "1":
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "_genhook_test_netguard", os.path.join(os.path.dirname(__file__), "__init__.py")
    )
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_module)
        _module.install()
