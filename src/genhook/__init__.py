"""genhook: asynchronous generation tasks with signed webhook callbacks.

The bare package is the SDK (``genhook.client``, ``genhook.receiver``); the service
lives behind the ``server`` extra and is never imported from here.
"""

__version__ = "0.1.0"
