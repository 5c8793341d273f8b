"""Alembic migration scripts, shipped as package data and applied at startup."""
