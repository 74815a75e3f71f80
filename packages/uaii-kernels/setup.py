"""Build hook of uaii-kernels: everything is declared in pyproject.toml except the cffi extension.

`cffi_modules` is a setup() keyword that cffi registers with setuptools; it runs build_kernels.py's `ffibuilder`,
which compiles csrc/*.c into the extension module uaii.kernels._uaii_kernels.
"""

from setuptools import setup

setup(cffi_modules=["build_kernels.py:ffibuilder"])
