"""HTTP only: routing, auth, request/response models and the error shape."""

from genhook.api.app import build_state, create_app
from genhook.api.deps import AppState

__all__ = ["AppState", "build_state", "create_app"]
