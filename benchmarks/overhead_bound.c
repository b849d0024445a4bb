/* The least recording the loop can have: benchmarks/overhead_bound.py builds this at run
   time and times it next to plain and trainkit. Not part of trainkit, and not a tool: it keeps
   nothing a user could read (no session, no step logic, no profiler or CUDA checks, no events).

   Each mark is a clock_gettime into a C array of (tag, step, value) records:
     region(name)  -> one context manager per name: its entry reads the clock, its exit stores
                      the time since;
     wrap(batches) -> an iterable whose passes store each batch's wait and its first tensor's
                      len() (its items);
     patch(step)   -> a callable that times the step, stores its time and the time between steps,
                      and counts steps;
     log(name, v)  -> keeps v (and the step) for drain();
     drain()       -> reads the kept values (Tensor.item) and empties both stores, as a writer
                      would before it encodes anything. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>

typedef struct {
    int tag;
    long long step;
    double v;
} Rec;

static Rec *recs;
static Py_ssize_t nrec, caprec;
static long long g_step;
static double g_last_end;
static PyObject **kept;
static long long *kept_steps;
static Py_ssize_t nkept, capkept;
static PyObject *regions, *s_item;

enum { DATA_WAIT = 1000, ITEMS, UPDATE, STEP_TIME };

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int put(int tag, double v) {
    if (nrec == caprec) {
        Py_ssize_t cap = caprec ? caprec * 2 : 4096;
        Rec *r = PyMem_RawRealloc(recs, cap * sizeof(Rec));
        if (!r) {
            PyErr_NoMemory();
            return -1;
        }
        recs = r;
        caprec = cap;
    }
    recs[nrec].tag = tag;
    recs[nrec].step = g_step;
    recs[nrec].v = v;
    nrec++;
    return 0;
}

typedef struct {
    PyObject_HEAD
    int tag;
    double t0;
} Region;

static PyObject *region_enter(Region *self, PyObject *Py_UNUSED(unused)) {
    self->t0 = now_ms();
    Py_RETURN_NONE;
}

static PyObject *region_exit(Region *self, PyObject *const *Py_UNUSED(args),
                             Py_ssize_t Py_UNUSED(n)) {
    if (put(self->tag, now_ms() - self->t0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL, NULL},
    {NULL}};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "overhead_bound.Region",
    .tp_basicsize = sizeof(Region),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = region_methods,
};

typedef struct {
    PyObject_HEAD
    PyObject *it;
} Pass;

static void pass_dealloc(Pass *self) {
    Py_XDECREF(self->it);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pass_next(Pass *self) {
    double t0 = now_ms();
    PyObject *batch = PyIter_Next(self->it);
    if (!batch) return NULL;
    if (put(DATA_WAIT, now_ms() - t0) < 0) goto fail;
    if (PyTuple_Check(batch) && PyTuple_GET_SIZE(batch) > 0) {
        Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(batch, 0));
        if (n < 0) goto fail;
        if (put(ITEMS, (double)n) < 0) goto fail;
    }
    return batch;
fail:
    Py_DECREF(batch);
    return NULL;
}

static PyTypeObject PassType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "overhead_bound.Pass",
    .tp_basicsize = sizeof(Pass),
    .tp_dealloc = (destructor)pass_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)pass_next,
};

typedef struct {
    PyObject_HEAD
    PyObject *source;
} Wrapped;

static void wrapped_dealloc(Wrapped *self) {
    Py_XDECREF(self->source);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *wrapped_iter(Wrapped *self) {
    PyObject *it = PyObject_GetIter(self->source);
    if (!it) return NULL;
    Pass *p = PyObject_New(Pass, &PassType);
    if (!p) {
        Py_DECREF(it);
        return NULL;
    }
    p->it = it;
    return (PyObject *)p;
}

static PyTypeObject WrappedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "overhead_bound.Wrapped",
    .tp_basicsize = sizeof(Wrapped),
    .tp_dealloc = (destructor)wrapped_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = (getiterfunc)wrapped_iter,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *step;
} Step;

/* GC-tracked: opt.step = patch(opt.step) is a cycle (optimizer, Step, bound method) */
static int step_traverse(Step *self, visitproc visit, void *arg) {
    Py_VISIT(self->step);
    return 0;
}

static int step_clear(Step *self) {
    Py_CLEAR(self->step);
    return 0;
}

static void step_dealloc(Step *self) {
    PyObject_GC_UnTrack(self);
    step_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *step_call(PyObject *o, PyObject *const *args, size_t nargsf, PyObject *kw) {
    Step *self = (Step *)o;
    if (!self->step) {
        PyErr_SetString(PyExc_ReferenceError, "this step was cleared by the collector");
        return NULL;
    }
    double t0 = now_ms();
    PyObject *r = PyObject_Vectorcall(self->step, args, nargsf, kw);
    if (!r) return NULL;
    double t1 = now_ms();
    if (put(UPDATE, t1 - t0) < 0 || (g_last_end && put(STEP_TIME, t1 - g_last_end) < 0)) {
        Py_DECREF(r);
        return NULL;
    }
    g_last_end = t1;
    g_step++;
    return r;
}

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "overhead_bound.Step",
    .tp_basicsize = sizeof(Step),
    .tp_dealloc = (destructor)step_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_vectorcall_offset = offsetof(Step, vectorcall),
    .tp_call = PyVectorcall_Call,
};

static PyObject *m_region(PyObject *Py_UNUSED(m), PyObject *name) {
    PyObject *r = PyDict_GetItemWithError(regions, name);
    if (r) {
        Py_INCREF(r);
        return r;
    }
    if (PyErr_Occurred()) return NULL;
    Region *g = PyObject_New(Region, &RegionType);
    if (!g) return NULL;
    g->tag = (int)PyDict_GET_SIZE(regions);
    g->t0 = 0;
    if (PyDict_SetItem(regions, name, (PyObject *)g) < 0) {
        Py_DECREF(g);
        return NULL;
    }
    return (PyObject *)g;
}

static PyObject *m_wrap(PyObject *Py_UNUSED(m), PyObject *source) {
    Wrapped *w = PyObject_New(Wrapped, &WrappedType);
    if (!w) return NULL;
    Py_INCREF(source);
    w->source = source;
    return (PyObject *)w;
}

static PyObject *m_patch(PyObject *Py_UNUSED(m), PyObject *step) {
    Step *s = PyObject_GC_New(Step, &StepType);
    if (!s) return NULL;
    Py_INCREF(step);
    s->step = step;
    s->vectorcall = step_call;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

static PyObject *m_log(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "log(name, value)");
        return NULL;
    }
    if (nkept == capkept) {
        Py_ssize_t cap = capkept ? capkept * 2 : 4096;
        PyObject **k = PyMem_RawRealloc(kept, cap * sizeof(PyObject *));
        if (!k) return PyErr_NoMemory();
        kept = k;
        long long *s = PyMem_RawRealloc(kept_steps, cap * sizeof(long long));
        if (!s) return PyErr_NoMemory();
        kept_steps = s;
        capkept = cap;
    }
    Py_INCREF(args[1]);
    kept[nkept] = args[1];
    kept_steps[nkept] = g_step;
    nkept++;
    Py_RETURN_NONE;
}

static PyObject *m_drain(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(unused)) {
    double sum = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < nkept; i++) { /* every kept value released, whatever fails */
        if (!failed) {
            PyObject *v = PyObject_CallMethodNoArgs(kept[i], s_item);
            double x = v ? PyFloat_AsDouble(v) : -1.0;
            Py_XDECREF(v);
            if (x == -1.0 && PyErr_Occurred())
                failed = 1;
            else
                sum += x;
        }
        Py_CLEAR(kept[i]);
    }
    for (Py_ssize_t i = 0; i < nrec; i++) sum += recs[i].v;
    Py_ssize_t n = nrec + nkept;
    nrec = nkept = 0;
    if (failed) return NULL;
    return Py_BuildValue("(nd)", n, sum);
}

static PyMethodDef methods[] = {
    {"region", m_region, METH_O, "region(name): the context manager timing `name`"},
    {"wrap", m_wrap, METH_O, "wrap(batches): an iterable storing each batch's wait and items"},
    {"patch", m_patch, METH_O, "patch(step): step, timed and counted"},
    {"log", (PyCFunction)(void (*)(void))m_log, METH_FASTCALL, "log(name, value): keep value"},
    {"drain", m_drain, METH_NOARGS, "drain(): read and drop what was stored: (records, sum)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "overhead_bound", NULL, -1, methods};

PyMODINIT_FUNC PyInit_overhead_bound(void) {
    PyTypeObject *types[] = {&RegionType, &PassType, &WrappedType, &StepType};
    for (int i = 0; i < 4; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    regions = PyDict_New();
    s_item = PyUnicode_InternFromString("item");
    if (!regions || !s_item) return NULL;
    return PyModule_Create(&module);
}
