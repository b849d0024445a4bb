/* trainkit._speedups.FastStep: a patched optimizer's step (trainkit/_optstep.py: step_function)
   with its per-step fast path in C. Included by _speedups.c.

   FastStep(p, fallback, ref, own, bound, now, tap, session_dict, step_rec) is called as the
   Python closure `step(self, *args, **kwargs)` it stands for (bound to a weakref.proxy of the
   optimizer by types.MethodType, or by its own __get__ as an LR scheduler binds the step it
   wraps). The common case (no arguments, no accumulation gate, a CPU step, still patched, the
   session's primary optimizer, no profiler recording) runs here, line for line as the closure's
   first block: the optimizer's own step (or its compiled core) timed by two now() calls, one
   (STEP_REC, n, t0, t1, previous end) record, then Session.step_done's work. Every other call
   goes to `fallback`, the Python closure itself, which keeps the other branches.

   It stands in for a Python function wherever the patched step goes: a __dict__ (the patch's
   __wrapped_step__ marker, an LR scheduler's _wrapped_by_lr_sched / _with_counter, and what
   functools.wraps copies), __name__ / __qualname__ / __module__ / __doc__ / __annotations__
   taken from the closure, __signature__ (the closure's), __get__ binding as functions do, copy
   and deepcopy giving it back as they give a function, weak references, and GC support (its
   fields and dict can be part of cycles). */
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *p;          /* the OptimizerPatch */
    PyObject *fallback;   /* the Python closure `step` */
    PyObject *ref;        /* weakref.ref to the optimizer */
    PyObject *own;        /* its own step: a function (bound) or a callable */
    PyObject *now;        /* timing.now when the patch was made */
    PyObject *tap;        /* regions._TAP: `_is_profiler_enabled` */
    PyObject *smod;       /* trainkit.session's __dict__: `_active` */
    PyObject *step_rec;   /* recorder.STEP_REC */
    PyObject *dict;       /* __dict__ */
    PyObject *weakreflist;
    PyObject *name, *qualname, *module, *doc, *annotations; /* as the closure's */
    int bound;            /* own takes the optimizer (own(ref())) */
} FastStep;

/* The names only the step reads; "step", "_active", "_buf", "append", "_last_step_end",
   "_is_profiler_enabled" and 1 are _speedups.c's and _speedups_regions.h's (s_step, s_active,
   s_buf, s_append, s_last_end, s_prof_on, one), as is attr_true. */
static PyObject *fs_gate, *fs_cuda, *fs_live, *fs_primary, *fs_core, *fs_log_every, *fs_wake,
    *fs_profiler, *fs_profiler_step, *fs_zero;

static int fs_traverse(FastStep *self, visitproc visit, void *arg) {
    Py_VISIT(self->p);
    Py_VISIT(self->fallback);
    Py_VISIT(self->ref);
    Py_VISIT(self->own);
    Py_VISIT(self->now);
    Py_VISIT(self->tap);
    Py_VISIT(self->smod);
    Py_VISIT(self->step_rec);
    Py_VISIT(self->dict);
    Py_VISIT(self->name);
    Py_VISIT(self->qualname);
    Py_VISIT(self->module);
    Py_VISIT(self->doc);
    Py_VISIT(self->annotations);
    return 0;
}

static int fs_clear(FastStep *self) {
    Py_CLEAR(self->p);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->ref);
    Py_CLEAR(self->own);
    Py_CLEAR(self->now);
    Py_CLEAR(self->tap);
    Py_CLEAR(self->smod);
    Py_CLEAR(self->step_rec);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->name);
    Py_CLEAR(self->qualname);
    Py_CLEAR(self->module);
    Py_CLEAR(self->doc);
    Py_CLEAR(self->annotations);
    return 0;
}

static void fs_dealloc(FastStep *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakreflist) PyObject_ClearWeakRefs((PyObject *)self);
    fs_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fs_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames);

/* getattr(fallback, name), or `dflt` (a new reference) where it has none */
static PyObject *fs_copied(PyObject *fallback, const char *name, PyObject *dflt) {
    PyObject *v = PyObject_GetAttrString(fallback, name);
    if (v || !PyErr_ExceptionMatches(PyExc_AttributeError)) return v;
    PyErr_Clear();
    Py_INCREF(dflt);
    return dflt;
}

static PyObject *fs_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *p, *fallback, *ref, *own, *bound, *now, *tap, *smod, *step_rec;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "FastStep() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOOO!O:FastStep", &p, &fallback, &ref, &own, &bound, &now,
                          &tap, &PyDict_Type, &smod, &step_rec))
        return NULL;
    if (!PyCallable_Check(fallback) || !PyCallable_Check(ref) || !PyCallable_Check(own) ||
        !PyCallable_Check(now)) {
        PyErr_SetString(PyExc_TypeError, "FastStep(): fallback, ref, own and now must be callable");
        return NULL;
    }
    int b = PyObject_IsTrue(bound);
    if (b < 0) return NULL;
    FastStep *self = (FastStep *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = fs_vectorcall;
    self->bound = b;
    PyObject *given[] = {p, fallback, ref, own, now, tap, smod, step_rec};
    PyObject **slots[] = {&self->p, &self->fallback, &self->ref, &self->own, &self->now,
                          &self->tap, &self->smod, &self->step_rec};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(given[i]);
        *slots[i] = given[i];
    }
    PyObject *dflt_name = PyUnicode_FromString("step");
    if (!dflt_name) goto fail;
    self->name = fs_copied(fallback, "__name__", dflt_name);
    self->qualname = self->name ? fs_copied(fallback, "__qualname__", dflt_name) : NULL;
    Py_DECREF(dflt_name);
    if (!self->name || !self->qualname) goto fail;
    if (!PyUnicode_Check(self->name) || !PyUnicode_Check(self->qualname)) {
        PyErr_SetString(PyExc_TypeError, "FastStep(): the fallback's __name__ and __qualname__ "
                                         "must be str");
        goto fail;
    }
    if (!(self->module = fs_copied(fallback, "__module__", Py_None)) ||
        !(self->doc = fs_copied(fallback, "__doc__", Py_None)) ||
        !(self->annotations = fs_copied(fallback, "__annotations__", Py_None)))
        goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* `x is None` / `x is False` / `x` on an attribute: 1 true, 0 false, -1 error */
static int fs_attr_is(PyObject *obj, PyObject *name, PyObject *what) {
    PyObject *x = PyObject_GetAttr(obj, name);
    if (!x) return -1;
    int c = x == what;
    Py_DECREF(x);
    return c;
}

/* `n % every == 0`, as Python computes it: 1, 0, -1 error */
static int fs_due(PyObject *n, PyObject *every) {
    if (PyLong_CheckExact(n) && PyLong_CheckExact(every)) {
        int o1 = 0, o2 = 0;
        long long a = PyLong_AsLongLongAndOverflow(n, &o1);
        long long d = PyLong_AsLongLongAndOverflow(every, &o2);
        if (!o1 && !o2 && d > 0 && !(a == -1 && PyErr_Occurred())) return a % d == 0;
        if (PyErr_Occurred()) return -1;
    }
    PyObject *r = PyNumber_Remainder(n, every);
    if (!r) return -1;
    PyObject *eq = PyObject_RichCompare(r, fs_zero, Py_EQ);
    Py_DECREF(r);
    if (!eq) return -1;
    int c = PyObject_IsTrue(eq);
    Py_DECREF(eq);
    return c;
}

/* The closure's first block. Returns 1 with *out (a new reference) when it ran, 0 when the call
   is not its case (the fallback takes it), -1 on an error (as the closure raises it). */
static int fs_fast(FastStep *self, PyObject **out) {
    PyObject *p = self->p;
    int c;
    /* `p.gate is None and p._cuda is False and p.live` */
    if ((c = fs_attr_is(p, fs_gate, Py_None)) <= 0) return c;
    if ((c = fs_attr_is(p, fs_cuda, Py_False)) <= 0) return c;
    if ((c = attr_true(p, fs_live)) <= 0) return c;
    /* `s = _S._active` */
    PyObject *s = PyDict_GetItemWithError(self->smod, s_active);
    if (!s) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError,
                            "module 'trainkit.session' has no attribute '_active'");
        return -1;
    }
    if (s == Py_None) return 0;
    Py_INCREF(s);
    PyObject *core = NULL, *t0 = NULL, *res = NULL, *t1 = NULL, *n = NULL, *buf = NULL,
             *last = NULL, *rec = NULL, *x = NULL;
    int rc = -1;
    /* `s._primary is p and not tap._is_profiler_enabled` */
    if ((c = fs_attr_is(s, fs_primary, p)) <= 0 ||
        (c = attr_true(self->tap, s_prof_on)) != 0) {
        rc = c < 0 ? -1 : 0;
        goto done;
    }
    if (!(core = PyObject_GetAttr(p, fs_core))) goto done;
    if (!(t0 = PyObject_CallNoArgs(self->now))) goto done;
    /* `core() if core is not None else own() if not bound else own(opt) if (opt := ref()) is
       not None else gone(own)`; gone(): the closure's, called as the fallback */
    if (core != Py_None)
        res = PyObject_CallNoArgs(core);
    else if (self->bound) {
        PyObject *opt = PyObject_CallNoArgs(self->ref);
        if (!opt) goto done;
        if (opt == Py_None) {  /* the optimizer was freed: the Python closure says so */
            Py_DECREF(opt);
            rc = 0;
            goto done;
        }
        res = PyObject_CallOneArg(self->own, opt);
        Py_DECREF(opt);
    } else
        res = PyObject_CallNoArgs(self->own);
    if (!res) goto done;
    if (!(t1 = PyObject_CallNoArgs(self->now))) goto done;
    /* `n = s.step; s._buf.append((STEP_REC, n, t0, t1, s._last_step_end))` */
    if (!(n = PyObject_GetAttr(s, s_step))) goto done;
    if (!(buf = PyObject_GetAttr(s, s_buf))) goto done;
    if (!(last = PyObject_GetAttr(s, s_last_end))) goto done;
    if (!(rec = PyTuple_Pack(5, self->step_rec, n, t0, t1, last))) goto done;
    if (!(x = PyObject_CallMethodOneArg(buf, s_append, rec))) goto done;
    Py_CLEAR(x);
    /* `s._last_step_end = t1; s.step = n + 1` */
    if (PyObject_SetAttr(s, s_last_end, t1) < 0) goto done;
    if (!(x = PyNumber_Add(n, one))) goto done;
    if (PyObject_SetAttr(s, s_step, x) < 0) goto done;
    Py_CLEAR(x);
    /* `if n % s._log_every == 0: s._wake()` */
    if (!(x = PyObject_GetAttr(s, fs_log_every))) goto done;
    c = fs_due(n, x);
    Py_CLEAR(x);
    if (c < 0) goto done;
    if (c) {
        if (!(x = PyObject_CallMethodNoArgs(s, fs_wake))) goto done;
        Py_CLEAR(x);
    }
    /* `if s._profiler is not None: s.profiler_step()` */
    if ((c = fs_attr_is(s, fs_profiler, Py_None)) < 0) goto done;
    if (!c) {
        PyObject *r = PyObject_CallMethodNoArgs(s, fs_profiler_step);
        if (!r) goto done;
        Py_DECREF(r);
    }
    *out = res;
    res = NULL;
    rc = 1;
done:
    Py_DECREF(s);
    Py_XDECREF(core);
    Py_XDECREF(t0);
    Py_XDECREF(res);
    Py_XDECREF(t1);
    Py_XDECREF(n);
    Py_XDECREF(buf);
    Py_XDECREF(last);
    Py_XDECREF(rec);
    Py_XDECREF(x);
    return rc;
}

static PyObject *fs_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    FastStep *self = (FastStep *)callable;
    if (!self->fallback) {
        PyErr_SetString(PyExc_ReferenceError, "this FastStep was cleared by the collector");
        return NULL;
    }
    /* `not args and not kwargs`: the optimizer (self) alone */
    if (PyVectorcall_NARGS(nargsf) == 1 && (!kwnames || PyTuple_GET_SIZE(kwnames) == 0) &&
        self->p) {
        PyObject *out = NULL;
        int rc = fs_fast(self, &out);
        if (rc < 0) return NULL;
        if (rc > 0) return out;
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* As a function's __get__: bound to an instance, itself without one */
static PyObject *fs_descr_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type)) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *fs_repr(FastStep *self) {
    return PyUnicode_FromFormat("<trainkit fast step %S at %p>",
                                self->qualname ? self->qualname : Py_None, (void *)self);
}

static PyObject *fs_get_str(FastStep *self, void *which) {
    PyObject *v = which ? self->qualname : self->name;
    if (!v) v = Py_None;
    Py_INCREF(v);
    return v;
}

static int fs_set_str(FastStep *self, PyObject *value, void *which) {
    const char *what = which ? "__qualname__" : "__name__";
    if (!value || !PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be set to a string object", what);
        return -1;
    }
    Py_INCREF(value);
    if (which)
        Py_XSETREF(self->qualname, value);
    else
        Py_XSETREF(self->name, value);
    return 0;
}

/* inspect.signature(fallback): the closure's (self, *args, **kwargs) */
static PyObject *fs_get_signature(FastStep *self, void *Py_UNUSED(closure)) {
    if (!self->fallback) {
        PyErr_SetString(PyExc_AttributeError, "__signature__");
        return NULL;
    }
    PyObject *inspect = PyImport_ImportModule("inspect");
    if (!inspect) return NULL;
    PyObject *sig = PyObject_CallMethod(inspect, "signature", "O", self->fallback);
    Py_DECREF(inspect);
    return sig;
}

/* copy.copy / copy.deepcopy take a function as it is: this too */
static PyObject *fs_self(PyObject *self, PyObject *Py_UNUSED(unused)) {
    Py_INCREF(self);
    return self;
}

static PyMethodDef fs_methods[] = {
    {"__copy__", fs_self, METH_NOARGS, NULL},
    {"__deepcopy__", fs_self, METH_O, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef fs_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"__name__", (getter)fs_get_str, (setter)fs_set_str, NULL, NULL},
    {"__qualname__", (getter)fs_get_str, (setter)fs_set_str, NULL, (void *)1},
    {"__signature__", (getter)fs_get_signature, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef fs_members[] = {
    {"__module__", T_OBJECT, offsetof(FastStep, module), 0, NULL},
    {"__doc__", T_OBJECT, offsetof(FastStep, doc), 0, NULL},
    {"__annotations__", T_OBJECT, offsetof(FastStep, annotations), 0, NULL},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject FastStepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "trainkit._speedups.FastStep",
    .tp_basicsize = sizeof(FastStep),
    .tp_dealloc = (destructor)fs_dealloc,
    .tp_vectorcall_offset = offsetof(FastStep, vectorcall),
    .tp_repr = (reprfunc)fs_repr,
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)fs_traverse,
    .tp_clear = (inquiry)fs_clear,
    .tp_weaklistoffset = offsetof(FastStep, weakreflist),
    .tp_methods = fs_methods,
    .tp_members = fs_members,
    .tp_getset = fs_getset,
    .tp_descr_get = fs_descr_get,
    .tp_dictoffset = offsetof(FastStep, dict),
    .tp_new = fs_new,
    .tp_doc = "FastStep(p, fallback, ref, own, bound, now, tap, session_dict, step_rec): a patched "
              "optimizer's step, its per-step fast path in C (trainkit/_optstep.py: step_function).",
};

/* The interned names, then the type: PyInit__speedups calls it as PyType_Ready */
static int fast_step_ready(void) {
    static const char *names[] = {"gate", "_cuda", "live", "_primary", "_core", "_log_every",
                                  "_wake", "_profiler", "profiler_step"};
    PyObject **slots[] = {&fs_gate, &fs_cuda, &fs_live, &fs_primary, &fs_core, &fs_log_every,
                          &fs_wake, &fs_profiler, &fs_profiler_step};
    for (size_t i = 0; i < sizeof(slots) / sizeof(*slots); i++)
        if (!*slots[i] && !(*slots[i] = PyUnicode_InternFromString(names[i]))) return -1;
    if (!fs_zero && !(fs_zero = PyLong_FromLong(0))) return -1;
    return PyType_Ready(&FastStepType);
}
