"""setuptools shim for ``cffi_modules``, which pyproject.toml cannot express."""

from setuptools import setup

setup(cffi_modules=["build_storage.py:ffibuilder"])
