"""Helpers the tests share (imported as `helpers.<module>`: tests/conftest.py puts tests/ on sys.path)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
