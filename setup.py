"""Build shim: the metadata lives in setup.cfg; here only the optional C extension.

``trainkit._speedups`` (trainkit/_speedups.c and the headers it includes) does the session
writer's per-record work, the regions' entry and exit and the patched step's fast path in C. It
is optional: where it cannot be built (no C compiler, no Python headers), the install goes on
and trainkit runs the same code in Python, writing the same bytes, only slower.
"""
from setuptools import Extension, setup

HEADERS = ["trainkit/_speedups_encode.h", "trainkit/_speedups_writer.h",
           "trainkit/_speedups_regions.h", "trainkit/_speedups_step.h",
           "trainkit/_speedups_read.h"]

setup(ext_modules=[Extension("trainkit._speedups", ["trainkit/_speedups.c"], depends=HEADERS,
                             optional=True)])
