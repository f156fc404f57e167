"""Registers the fixtures of this folder (defined in fixtures.py)."""

from .fixtures import operator_factory

__all__ = ["operator_factory"]
