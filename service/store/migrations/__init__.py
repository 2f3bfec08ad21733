"""Alembic migrations of the store (a package so that installs ship env.py and versions/)."""
