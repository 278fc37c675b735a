"""The task store: every statement on ``tasks``, ``blobs``, ``usage_lines`` and
``idempotency_keys``, read or write, lives in this package (``tests/unit/test_layering.py``
fails on one anywhere else). The rest of the task domain decides; the store runs the
statements, in the caller's transaction.

- ``hot_path``: the worker's statements, built once and run on the driver connection
  (claims, leases, input images, the completion UPDATE, usage lines).
- ``terminal``: the one terminal transition (``end_where``, and ``complete_in`` for the
  hot path's completions), each followed by ``end_tasks``: input blobs deleted, usage
  line, ``TaskEnded`` on the outbox port.
- ``writes``: the one insert path of a submit's rows (``insert_tasks``, and
  ``write_task_rows`` for the SQLite thread writer), the requeues, retention's deletions and
  the database blob store's rows.
- ``reads``: every other read (the API's, the watcher's, the sweeper's and reconciler's,
  retention's, admission's, and the lookups of the worker, metrics, tracing and the
  database blob store).
"""
