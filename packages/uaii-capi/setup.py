"""setuptools shim: ``cffi_modules`` (which pyproject.toml cannot express) and the name of the embedding library.

cffi builds ``uaii.capi._uaii_capi_cffi`` as an extension; this build_ext writes it as ``uaii/capi/libuaii.so``
(no Python ABI tag), the name C programs link with ``-luaii``.
"""

import os

from setuptools import setup
from setuptools.command.build_ext import build_ext

EMBEDDED_MODULE = "uaii.capi._uaii_capi_cffi"


class BuildLibuaii(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # Called with the dotted name (-> path below the build dir) and with its last part alone.
        parts = fullname.split(".")
        if parts[-1] == EMBEDDED_MODULE.rsplit(".", 1)[-1]:
            return os.path.join(*parts[:-1], "libuaii.so")
        return super().get_ext_filename(fullname)


setup(cffi_modules=["build_capi.py:ffibuilder"], cmdclass={"build_ext": BuildLibuaii})
