"""Alembic revisions, written by hand to match service/store/models.py."""
