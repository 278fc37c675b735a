"""The sender side of webhooks: outbox, delivery queue, dispatcher, signing keys, reconciliation.

A server module: it needs the ``server`` extra. Receivers use ``genhook.receiver``; the wire
format both sides share is ``genhook.signature``.
"""
