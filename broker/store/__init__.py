"""State stores behind one narrow interface (DESIGN.md "State")."""

from broker.store.base import (
    AlreadyExists,
    NotFound,
    Store,
    StoreError,
    VersionConflict,
)

__all__ = ["AlreadyExists", "NotFound", "Store", "StoreError", "VersionConflict"]
