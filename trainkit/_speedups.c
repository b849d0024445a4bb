/* trainkit._speedups: trainkit's per-step work in C. This file holds the module, its setup (what
   recorder.py hands over once) and the helpers the parts share; the parts are headers it
   includes:

   _speedups_encode.h   CRC32C, and a step's TensorBoard event encoded and written
                        (trainkit/sinks/tensorboard.py: encode_scalars, EventFileWriter._write_record)
   _speedups_writer.h   the writer thread's pass over the records and its write of completed steps
                        (trainkit/recorder.py: Recorder.flush, Recorder._write_steps; trainkit/_steps.py)
   _speedups_regions.h  profile_region's entry and exit (trainkit/profiling/regions.py)
   _speedups_step.h     a patched optimizer's per-step fast path (trainkit/patch.py)
   _speedups_read.h     an event file's chunk read, its plain scalars decoded by hand
                        (trainkit/profiling/points.py: ScalarsParse.take)

   Written in Python, the writer's work holds the GIL for ~10 us a step of 8 records, time the
   training thread waits for on a small step; each region and step costs a Python frame or two.
   Here the common case runs with no Python frame, and the Python functions are called for
   everything else: a step holding a pending GPU value or several values of one tag
   (_steps.combine_step), host-to-device rates (_steps.derive), a value or a step that is no
   plain float or int (EventFileWriter.write_scalars), a region begun by the full one, a step with
   arguments, a gate, CUDA or a profiler (the Python closure).

   The Python code is the reference: every function here mirrors one there, line for line, and
   tests/test_speedups.py checks that both give byte-identical event files and identical records
   (tests/test_read_speedups.py: identical points, texts and cursors read from event files).
   Setting TRAINKIT_PURE_PYTHON=1 (or a machine without a C compiler at install) runs the Python
   code alone. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030B0000
#define PACK4(x, p) PyFloat_Pack4((x), (char *)(p), 1)
#define PACK8(x, p) PyFloat_Pack8((x), (char *)(p), 1)
#else
#define PACK4(x, p) _PyFloat_Pack4((x), (unsigned char *)(p), 1)
#define PACK8(x, p) _PyFloat_Pack8((x), (unsigned char *)(p), 1)
#endif

/* ---- what recorder.py hands over once (setup) ------------------------------------------- */
static PyObject *STEP_REC, *BATCH_REC, *UPDATE_MS, *STEP_END, *STEP_TIME, *DATA_WAIT, *ITEMS,
    *SAMPLES_PER_S, *H2D_BYTES, *H2D_PINNED_BYTES, *PASS_END_WAIT;
static PyObject *take_pass_end_py; /* _steps.take_pass_end(tags, counted) */
static PyObject *combine_step_py; /* _steps.combine_step(tags, final) */
static PyObject *derive_py;       /* _steps.derive(values) */
static PyObject *prefix_py;       /* sinks.tensorboard._prefix(tag) */
static PyObject *prefix_cache;    /* sinks.tensorboard._value_prefix: tag -> bytes */
static PyObject *behind;          /* recorder._BEHIND (an int) */
static PyObject *thousand;        /* 1e3 */
static PyObject *s_write_scalars, *s_file, *s_write, *s_write_record, *s_step, *s_values,
    *s_wall_time;
static int ready = 0;

static PyObject *setup(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *tags, *funcs;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &tags, &PyTuple_Type, &funcs)) return NULL;
    PyObject **slots[] = {&STEP_REC, &BATCH_REC, &UPDATE_MS, &STEP_END, &STEP_TIME, &DATA_WAIT,
                          &ITEMS, &SAMPLES_PER_S, &H2D_BYTES, &H2D_PINNED_BYTES,
                          &PASS_END_WAIT};
    PyObject **fslots[] = {&combine_step_py, &derive_py, &prefix_py, &prefix_cache, &behind,
                           &take_pass_end_py};
    Py_ssize_t nt = sizeof(slots) / sizeof(*slots), nf = sizeof(fslots) / sizeof(*fslots);
    if (PyTuple_GET_SIZE(tags) != nt || PyTuple_GET_SIZE(funcs) != nf) {
        PyErr_Format(PyExc_ValueError, "setup(): expected %zd tags and %zd functions", nt, nf);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nt; i++) {
        PyObject *t = PyTuple_GET_ITEM(tags, i);
        if (!PyUnicode_CheckExact(t)) {
            PyErr_SetString(PyExc_TypeError, "setup(): tags must be str");
            return NULL;
        }
        Py_INCREF(t);
        Py_XSETREF(*slots[i], t);
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *f = PyTuple_GET_ITEM(funcs, i);
        Py_INCREF(f);
        Py_XSETREF(*fslots[i], f);
    }
    if (!PyDict_Check(prefix_cache) || !PyLong_Check(behind)) {
        PyErr_SetString(PyExc_TypeError, "setup(): the prefix cache must be a dict, _BEHIND an int");
        return NULL;
    }
    ready = 1;
    Py_RETURN_NONE;
}

static int check_ready(void) {
    if (!ready) PyErr_SetString(PyExc_RuntimeError, "trainkit._speedups: setup() was not called");
    return ready;
}

/* ---- the per-flush context: (writer, wall0, perf0, clock) ------------------------------- */
typedef struct {
    PyObject *writer; /* the EventFileWriter */
    PyObject *wall0, *perf0;
    PyObject *clock; /* time.time */
} Ctx;

static int parse_ctx(PyObject *ctx, Ctx *c) {
    if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != 4) {
        PyErr_SetString(PyExc_TypeError, "ctx must be (writer, wall0, perf0, clock)");
        return -1;
    }
    c->writer = PyTuple_GET_ITEM(ctx, 0);
    c->wall0 = PyTuple_GET_ITEM(ctx, 1);
    c->perf0 = PyTuple_GET_ITEM(ctx, 2);
    c->clock = PyTuple_GET_ITEM(ctx, 3);
    return 0;
}

/* (a - b) * 1e3, as Python computes it */
static PyObject *ms_between(PyObject *a, PyObject *b) {
    if (PyFloat_CheckExact(a) && PyFloat_CheckExact(b))
        return PyFloat_FromDouble((PyFloat_AS_DOUBLE(a) - PyFloat_AS_DOUBLE(b)) * 1e3);
    PyObject *d = PyNumber_Subtract(a, b);
    if (!d) return NULL;
    PyObject *r = PyNumber_Multiply(d, thousand);
    Py_DECREF(d);
    return r;
}

/* `bool(getattr(obj, name))`: 1 true, 0 false, -1 error */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *x = PyObject_GetAttr(obj, name);
    if (!x) return -1;
    int c = PyObject_IsTrue(x);
    Py_DECREF(x);
    return c;
}

/* _steps.add_value: one more value of a tag within a step (the first one is stored as it is) */
static int add_more(PyObject *tags, PyObject *tag, PyObject *value) {
    PyObject *values = PyDict_GetItemWithError(tags, tag);
    if (!values) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, tag);
        return -1;
    }
    if (Py_IS_TYPE(values, &PyList_Type)) return PyList_Append(values, value);
    PyObject *pair = PyList_New(2);
    if (!pair) return -1;
    Py_INCREF(values);
    PyList_SET_ITEM(pair, 0, values);
    Py_INCREF(value);
    PyList_SET_ITEM(pair, 1, value);
    int rc = PyDict_SetItem(tags, tag, pair);
    Py_DECREF(pair);
    return rc;
}

/* `if add(tag, v) is not v: _add(tags, tag, v)`; steals v */
static int file_value(PyObject *tags, PyObject *tag, PyObject *v) {
    if (!v) return -1;
    PyObject *got = PyDict_SetDefault(tags, tag, v);
    int rc = 0;
    if (!got) rc = -1;
    else if (got != v) rc = add_more(tags, tag, v);
    Py_DECREF(v);
    return rc;
}

#include "_speedups_encode.h"  /* CRC32C, a step's event encoded and written */
#include "_speedups_writer.h"  /* Recorder.flush's pass, Recorder._write_steps */
#include "_speedups_regions.h" /* RegionEnter, RegionExit */
#include "_speedups_step.h" /* FastStep: a patched optimizer's step */
#include "_speedups_read.h" /* ScalarsParse.take: an event file's chunk read */

static PyObject *py_crc32c(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c = crc32c((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(tags, functions): recorder.py's tags and the Python functions for the rare cases."},
    {"ingest", ingest, METH_VARARGS,
     "ingest(buf, opened, completed, final, ctx): Recorder.flush's pass over the buffer."},
    {"write_steps", write_steps, METH_VARARGS,
     "write_steps(opened, completed, final, ctx): Recorder._write_steps."},
    {"take_scalars", take_scalars, METH_VARARGS,
     "take_scalars(parse, data) -> int: ScalarsParse.take (an event file's chunk parsed)."},
    {"crc32c", py_crc32c, METH_O, "crc32c(data) -> int: CRC-32C (Castagnoli) of a buffer."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "trainkit._speedups",
    .m_doc = "trainkit's per-step work in C: the session writer's, regions' and the step's; "
             "and reading event files' scalars.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    crc_init();
    thousand = PyFloat_FromDouble(1e3);
    s_write_scalars = PyUnicode_InternFromString("write_scalars");
    s_file = PyUnicode_InternFromString("_file");
    s_write = PyUnicode_InternFromString("write");
    s_write_record = PyUnicode_InternFromString("_write_record");
    s_step = PyUnicode_InternFromString("step");
    s_values = PyUnicode_InternFromString("values");
    s_wall_time = PyUnicode_InternFromString("wall_time");
    s_now = PyUnicode_InternFromString("now");
    s_active = PyUnicode_InternFromString("_active");
    s_last_end = PyUnicode_InternFromString("_last_step_end");
    s_last_host = PyUnicode_InternFromString("_last_step_host");
    s_buf = PyUnicode_InternFromString("_buf");
    s_append = PyUnicode_InternFromString("append");
    s_exit = PyUnicode_InternFromString("__exit__");
    s_enter = PyUnicode_InternFromString("__enter__");
    s_prof_on = PyUnicode_InternFromString("_is_profiler_enabled");
    re_cuda_on = PyUnicode_InternFromString("_initialized");
    one = PyLong_FromLong(1);
    s_fresh = PyUnicode_InternFromString("_fresh");
    s_open = PyUnicode_InternFromString("_open");
    s_consume = PyUnicode_InternFromString("consume");
    s_steps = PyUnicode_InternFromString("steps");
    s_frombytes = PyUnicode_InternFromString("frombytes");
    if (!thousand || !s_write_scalars || !s_file || !s_write || !s_write_record || !s_step ||
        !s_values || !s_wall_time || !s_now || !s_active || !s_last_end ||
        !s_last_host || !s_buf || !s_append || !s_exit || !s_enter || !s_prof_on ||
        !re_cuda_on || !one || !s_fresh || !s_open || !s_consume || !s_steps ||
        !s_frombytes)
        return NULL;
    if (PyType_Ready(&RegionEnterType) < 0 || PyType_Ready(&RegionExitType) < 0 ||
        fast_step_ready() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RegionEnterType);
    Py_INCREF(&RegionExitType);
    Py_INCREF(&FastStepType);
    if (PyModule_AddObject(m, "RegionEnter", (PyObject *)&RegionEnterType) < 0 ||
        PyModule_AddObject(m, "RegionExit", (PyObject *)&RegionExitType) < 0 ||
        PyModule_AddObject(m, "FastStep", (PyObject *)&FastStepType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
