"""The task store: every statement that writes ``tasks``, ``blobs``, ``usage_lines`` and
``idempotency_keys`` lives in this package (``tests/unit/test_layering.py`` fails on one
anywhere else).

- ``hot_path``: the worker's statements, built once and run on the driver connection
  (claims, leases, the completion UPDATE, input blobs, usage lines).
- ``terminal``: the one terminal transition (``end_where``, and ``complete_in`` for the
  hot path's completions), each followed by ``end_tasks``: input blobs deleted, usage
  line, outbox event.
"""
