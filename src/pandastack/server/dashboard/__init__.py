"""The web dashboard at `/dashboard`: pages and assets shipped in this package (static/), API
key sign-in to a signed session cookie, and the REST API reached in process as that key
(docs/adr/0034-dashboard.md)."""

from .middleware import DashboardMiddleware

__all__ = ["DashboardMiddleware"]
