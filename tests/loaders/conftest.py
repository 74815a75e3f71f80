"""Fixtures of the uaii-loaders tests. Helpers live in loader_helpers.py, importable as `loader_helpers`."""

from __future__ import annotations


