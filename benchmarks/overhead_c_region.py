"""Would C make trainkit's regions cheap enough for goal (a)? Measured, not guessed.

Issue 3's goal (a) asks trainkit's instrumentation of the tiny MLP's ~0.34 ms step to cost at most
3% (~10 us a step); ``overhead.py`` measures ~8%. Three regions are the largest part of it. This
script builds a C version of a region (``__enter__`` and ``__exit__`` in C: the clock, a stack of
start times, and one ``(tag, step, ms)`` record into the session's buffer on exit, as trainkit's
Python region does on the CPU) with the machine's C compiler, and times the MLP's loop with
3 regions of each kind side by side, in one process, one thread:

* ``3 empty blocks``: ``with`` on an object whose methods do nothing (what ``with`` itself costs);
* ``3 C regions, no session``: the C region's clock and stack, and no record (no session active);
* ``3 C regions``: the C region, recording into the active session;
* ``3 trainkit regions``: ``with tk.profile_region(name)``, as users write it.

Each round ends with ``s.flush()`` (the writer thread's work for the round's records, inside the
round's time, as in ``overhead.py``). It prints what each adds to the plain step, in us and as a
ratio (the median over rounds of the per-round difference, pooled over fresh processes). The C
region is a probe for this measurement, not part of trainkit: it does not handle CUDA events, the
profiler's ranges or compiled code. Needs a C compiler (``cc``) and Python's headers.

    python benchmarks/overhead_c_region.py [--processes 4] [--rounds 40]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

REGION_C = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

/* One region: its tag, its stack of start times, and the trainkit.session module's dict (whose
   "_active" is the session in progress, or None). */
typedef struct { PyObject_HEAD PyObject *tag; PyObject *starts; PyObject *moddict; } Region;
static PyObject *s_active, *s_step, *s_last_end, *s_last_host, *s_buf, *s_append;

/* time.perf_counter's clock on Linux */
static double now(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static PyObject *r_enter(Region *self, PyObject *unused) {
    PyObject *t = PyFloat_FromDouble(now());
    if (!t) return NULL;
    int rc = PyList_Append(self->starts, t);
    Py_DECREF(t);
    if (rc) return NULL;
    Py_RETURN_NONE;
}

/* trainkit's Python region's exit on the CPU: the step it goes under is the step in progress,
   or the one that ended inside the region; one record appended to the session's buffer. */
static PyObject *r_exit(Region *self, PyObject *const *args, Py_ssize_t nargs) {
    double t1 = now();
    Py_ssize_t n = PyList_GET_SIZE(self->starts);
    if (n == 0) { PyErr_SetString(PyExc_RuntimeError, "region exited without entry"); return NULL; }
    double t0 = PyFloat_AS_DOUBLE(PyList_GET_ITEM(self->starts, n - 1));
    if (PyList_SetSlice(self->starts, n - 1, n, NULL)) return NULL;
    PyObject *s = PyDict_GetItemWithError(self->moddict, s_active);
    if (!s || s == Py_None) { if (PyErr_Occurred()) return NULL; Py_RETURN_NONE; }
    PyObject *o = PyObject_GetAttr(s, s_step);
    if (!o) return NULL;
    long step = PyLong_AsLong(o);
    Py_DECREF(o);
    if (step > 1) {
        PyObject *end = PyObject_GetAttr(s, s_last_end);
        if (!end) return NULL;
        if (!PyFloat_CheckExact(end)) {
            Py_DECREF(end);
            if (!(end = PyObject_GetAttr(s, s_last_host))) return NULL;
        }
        if (end != Py_None && t0 < PyFloat_AsDouble(end)) step -= 1;
        Py_DECREF(end);
    }
    PyObject *buf = PyObject_GetAttr(s, s_buf);
    if (!buf) return NULL;
    PyObject *rec = Py_BuildValue("(Old)", self->tag, step, (t1 - t0) * 1e3);
    PyObject *r = rec ? PyObject_CallMethodOneArg(buf, s_append, rec) : NULL;
    Py_XDECREF(rec); Py_DECREF(buf);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyMethodDef r_methods[] = {
    {"__enter__", (PyCFunction)r_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))r_exit, METH_FASTCALL, NULL},
    {NULL}};

static int r_init(Region *self, PyObject *args, PyObject *kw) {
    PyObject *tag, *moddict;
    if (!PyArg_ParseTuple(args, "UO!", &tag, &PyDict_Type, &moddict)) return -1;
    Py_INCREF(tag); Py_INCREF(moddict);
    self->tag = tag; self->moddict = moddict;
    self->starts = PyList_New(0);
    return self->starts ? 0 : -1;
}

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tk_c_region.Region", .tp_basicsize = sizeof(Region),
    .tp_flags = Py_TPFLAGS_DEFAULT, .tp_new = PyType_GenericNew, .tp_init = (initproc)r_init,
    .tp_methods = r_methods,
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "tk_c_region", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_tk_c_region(void) {
    if (PyType_Ready(&RegionType) < 0) return NULL;
    s_active = PyUnicode_InternFromString("_active");
    s_step = PyUnicode_InternFromString("step");
    s_last_end = PyUnicode_InternFromString("_last_step_end");
    s_last_host = PyUnicode_InternFromString("_last_step_host");
    s_buf = PyUnicode_InternFromString("_buf");
    s_append = PyUnicode_InternFromString("append");
    PyObject *m = PyModule_Create(&mod);
    if (!m) return NULL;
    Py_INCREF(&RegionType);
    PyModule_AddObject(m, "Region", (PyObject *)&RegionType);
    return m;
}
"""


def build(folder: str) -> str:
    """Compile the C region into ``folder``; returns the folder to import ``tk_c_region`` from."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("overhead_c_region.py: no C compiler (cc or gcc) on PATH; install one (Debian: "
                 "apt-get install gcc) or set CC")
    src = os.path.join(folder, "tk_c_region.c")
    with open(src, "w") as fh:
        fh.write(REGION_C)
    so = os.path.join(folder, "tk_c_region" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"],
                    src, "-o", so], check=True)
    return folder


def child(rounds: int, seed: int, built: str) -> None:
    sys.path.insert(0, built)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import tk_c_region  # noqa: F401 - built above

    from overhead import Block, make_batches, mlp
    import trainkit as tk

    torch.set_num_threads(1)
    session_module = importlib.import_module("trainkit.session")
    batches = make_batches(32, 200)
    torch.manual_seed(0)
    model = mlp()
    crit = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    names = ("forward", "loss", "backward")
    c_regions = [tk_c_region.Region(f"trainkit/region/{n}_ms", session_module.__dict__) for n in names]
    c_idle = [tk_c_region.Region(f"trainkit/region/{n}_ms", {"_active": None}) for n in names]
    empty = [Block(), Block(), Block()]

    def plain() -> None:
        for x, y in batches:
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    def with_blocks(blocks):
        forward, loss_region, backward = blocks

        def loop() -> None:
            for x, y in batches:
                with forward:
                    out = model(x)
                with loss_region:
                    loss = crit(out, y)
                with backward:
                    loss.backward()
                opt.step()
                opt.zero_grad()
        return loop

    def trainkit_regions() -> None:
        for x, y in batches:
            with tk.profile_region("forward"):
                out = model(x)
            with tk.profile_region("loss"):
                loss = crit(out, y)
            with tk.profile_region("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()

    variants = {"plain": plain, "3 empty blocks": with_blocks(empty),
                "3 C regions, no session": with_blocks(c_idle),
                "3 C regions": with_blocks(c_regions), "3 trainkit regions": trainkit_regions}
    with tk.session(logdir=tempfile.mkdtemp(prefix="tk-c-region-"), system_metrics=False) as s:
        for fn in variants.values():  # warm-up
            fn()
            s.flush()
        per_step = {n: [] for n in variants}
        rng = random.Random(seed)
        for _ in range(rounds):
            for n in rng.sample(list(variants), len(variants)):
                t0 = time.perf_counter()
                variants[n]()
                s.flush()
                per_step[n].append((time.perf_counter() - t0) / len(batches) * 1e6)
    print(json.dumps(per_step))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--built", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.rounds, args.child, args.built)
        return
    import torch

    with tempfile.TemporaryDirectory(prefix="tk-c-region-build-") as folder:
        build(folder)
        runs = [json.loads(subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", str(i), "--built", folder,
             "--rounds", str(args.rounds)], check=True, capture_output=True, text=True,
        ).stdout.strip().splitlines()[-1]) for i in range(args.processes)]
    per_step = {n: [v for run in runs for v in run[n]] for n in runs[0]}
    plain = per_step["plain"]
    print(f"torch {torch.__version__}, 1 thread, {time.strftime('%Y-%m-%d')}, cpu count "
          f"{os.cpu_count()}: MLP 784-64-10 at batch 32, median plain step "
          f"{statistics.median(plain):.1f} us, {args.processes} processes x {args.rounds} rounds "
          f"x 200 steps")
    for n, times in per_step.items():
        if n == "plain":
            continue
        added = statistics.median([a - b for a, b in zip(times, plain)])
        ratio = statistics.median([a / b for a, b in zip(times, plain)])
        print(f"  {n:24s} adds {added:5.1f} us a step  ({ratio:.3f}x plain)")


if __name__ == "__main__":
    main()
