"""``python -m uaii.capi``: what a C build needs to use libuaii.

    cc app.c $(python -m uaii.capi --cflags --libs) -o app
    python -m uaii.capi --include-dir        # the -I directory (uaii/c_api/uaii.h lives below it)
    python -m uaii.capi --library            # the path of libuaii.so
"""

from __future__ import annotations

import argparse
import sys

from uaii.capi import paths
from uaii.capi.status import CapiError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uaii.capi", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cflags", action="store_true", help="compiler flags (-I of the header directory)")
    parser.add_argument("--libs", action="store_true",
                        help="linker flags: -L/-rpath of libuaii, -luaii, and the libpython it embeds")
    parser.add_argument("--include-dir", action="store_true", help="the include directory alone")
    parser.add_argument("--library-dir", action="store_true", help="the directory of libuaii.so alone")
    parser.add_argument("--library", action="store_true", help="the path of libuaii.so")
    parser.add_argument("--header", action="store_true", help="the path of uaii/c_api/uaii.h")
    parser.add_argument("--c-api-version", action="store_true", help='the C API version, e.g. "0.3.0"')
    args = parser.parse_args(argv)
    out: list[str] = []
    try:
        if args.cflags:
            out.append(paths.render(paths.cflags()))
        if args.libs:
            paths.library_path()  # fail now, not at link time, when the library is missing
            out.append(paths.render(paths.libs()))
        if args.include_dir:
            out.append(paths.get_include())
        if args.library_dir:
            out.append(paths.get_library_dir())
        if args.library:
            out.append(paths.library_path())
        if args.header:
            out.append(paths.header_path())
        if args.c_api_version:
            out.append(paths.C_API_VERSION)
    except CapiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not out:
        parser.print_help()
        return 2
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
