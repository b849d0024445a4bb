"""Build shim: the metadata lives in setup.cfg; here only the optional C extension.

``trainkit._speedups`` (trainkit/_speedups.c) does the session writer's per-record work in C. It
is optional: where it cannot be built (no C compiler, no Python headers), the install goes on
and trainkit runs the same code in Python, writing the same bytes, only slower.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("trainkit._speedups", ["trainkit/_speedups.c"],
                             depends=["trainkit/_speedups_step.h"], optional=True)])
