/* trainkit._speedups: profile_region's entry and exit. Included by _speedups.c (after the setup section, whose
   names and constants it uses). */

/* ---- profile_region's fast entry and exit (profiling/regions.py: _fast_region) -------------
   One pair per region name, put on the name's own class as __enter__ and __exit__: neither
   binds to the instance (no __get__), so `with` calls them with no instance, and
   type(cm).__enter__(cm) (contextlib.ExitStack) with it, which both take.
   The stack `starts` is the owner's (the thread that made the name's region): any other thread
   is handed to the full region, which keeps one stack per thread, so that two threads' entries
   of a name are timed each on their own; the owner pays one compare of thread idents. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* `with` calls it with no arguments tuple (tp_call would make one) */
    PyObject *starts; /* the name's stack of start times, shared with its full region */
    PyObject *now;    /* timing.now when the name was first used (as the map() entry had it) */
    PyObject *tap;    /* regions._TAP: `_is_profiler_enabled` */
    PyObject *tc;     /* regions._TC (torch.cuda): `_initialized` */
    PyObject *full;   /* the name's _Region, which enters while either is true */
    unsigned long owner; /* the thread whose entries go on `starts` (the full region's _owner) */
} RegionEnter;

/* "_is_profiler_enabled" (FastStep's too), "_initialized", "__enter__" */
static PyObject *s_prof_on, *re_cuda_on, *s_enter;

static void enter_dealloc(RegionEnter *self) {
    Py_XDECREF(self->starts);
    Py_XDECREF(self->now);
    Py_XDECREF(self->tap);
    Py_XDECREF(self->tc);
    Py_XDECREF(self->full);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *enter_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames);

static PyObject *enter_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *starts, *now, *tap, *tc, *full;
    unsigned long owner;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "RegionEnter() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOOOk:RegionEnter", &PyList_Type, &starts, &now, &tap, &tc,
                          &full, &owner))
        return NULL;
    RegionEnter *self = (RegionEnter *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = enter_vectorcall;
    PyObject *all[] = {starts, now, tap, tc, full};
    for (int i = 0; i < 5; i++) Py_INCREF(all[i]);
    self->starts = starts;
    self->now = now;
    self->tap = tap;
    self->tc = tc;
    self->full = full;
    self->owner = owner;
    return (PyObject *)self;
}

static PyObject *enter_vectorcall(PyObject *callable, PyObject *const *Py_UNUSED(args),
                                  size_t nargsf, PyObject *kwnames) {
    RegionEnter *self = (RegionEnter *)callable;
    if ((kwnames && PyTuple_GET_SIZE(kwnames)) || PyVectorcall_NARGS(nargsf) > 1) {
        PyErr_SetString(PyExc_TypeError, "profile_region.__enter__() takes no arguments");
        return NULL;
    }
    /* Another thread than the owner: its own stack, in the full region */
    if (PyThread_get_thread_ident() != self->owner)
        return PyObject_CallMethodNoArgs(self->full, s_enter);
    /* A region kept from before a profiler started (or CUDA did), `fwd = profile_region("x")`
       then `with fwd:` each step: its full region enters, with the trace's range (and events) */
    int on = attr_true(self->tap, s_prof_on);
    if (on == 0) on = attr_true(self->tc, re_cuda_on);
    if (on < 0) return NULL;
    if (on) return PyObject_CallMethodNoArgs(self->full, s_enter);
    PyObject *t = PyObject_CallNoArgs(self->now);
    if (!t) return NULL;
    int rc = PyList_Append(self->starts, t);
    Py_DECREF(t);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyTypeObject RegionEnterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "trainkit._speedups.RegionEnter",
    .tp_basicsize = sizeof(RegionEnter),
    .tp_dealloc = (destructor)enter_dealloc,
    .tp_vectorcall_offset = offsetof(RegionEnter, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = enter_new,
    .tp_doc = "RegionEnter(starts, now, tap, tc, full, owner): push now() on starts, or enter "
              "full while a profiler records or CUDA is initialised, or in a thread other than "
              "owner (a thread ident).",
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall; /* `with` calls it with its 3 arguments, no tuple made */
    PyObject *tag;    /* "trainkit/region/<name>_ms" */
    PyObject *starts; /* shared with RegionEnter and the full region */
    PyObject *full;   /* the name's _Region: its __exit__ ends what it began */
    PyObject *timing; /* trainkit.timing's __dict__ ("now", as _Region.__exit__ reads it) */
    PyObject *smod;   /* trainkit.session's __dict__ ("_active": the session in progress) */
    unsigned long owner; /* the thread whose entries are on `starts`; others' are full's */
} RegionExit;

static PyObject *s_now, *s_active, *s_last_end, *s_last_host, *s_buf, *s_append,
    *s_exit, *one;

static void exit_dealloc(RegionExit *self) {
    Py_XDECREF(self->tag);
    Py_XDECREF(self->starts);
    Py_XDECREF(self->full);
    Py_XDECREF(self->timing);
    Py_XDECREF(self->smod);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *exit_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames);

static PyObject *exit_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *tag, *starts, *full, *timing, *smod;
    unsigned long owner;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "RegionExit() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "UO!OO!O!k:RegionExit", &tag, &PyList_Type, &starts, &full,
                          &PyDict_Type, &timing, &PyDict_Type, &smod, &owner))
        return NULL;
    RegionExit *self = (RegionExit *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = exit_vectorcall;
    PyObject *all[] = {tag, starts, full, timing, smod};
    for (int i = 0; i < 5; i++) Py_INCREF(all[i]);
    self->tag = tag;
    self->starts = starts;
    self->full = full;
    self->timing = timing;
    self->smod = smod;
    self->owner = owner;
    return (PyObject *)self;
}

static PyObject *dict_item(PyObject *d, PyObject *key) { /* d[key], borrowed */
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
    return v;
}

/* _Region.__exit__'s fast path: the time since its entry, one (tag, step, ms) record */
static PyObject *exit_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    RegionExit *self = (RegionExit *)callable;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if ((kwnames && PyTuple_GET_SIZE(kwnames)) || (n != 3 && n != 4)) {
        PyErr_SetString(PyExc_TypeError, "profile_region.__exit__() takes (exc_type, exc, tb)");
        return NULL;
    }
    Py_ssize_t off = n - 3; /* called through the type (ExitStack): the instance comes first */
    if (PyThread_get_thread_ident() != self->owner) /* entered on its own stack, in full */
        return PyObject_CallMethodObjArgs(self->full, s_exit, args[off], args[off + 1],
                                          args[off + 2], NULL);
    PyObject *now = dict_item(self->timing, s_now);
    if (!now) return NULL;
    PyObject *t1 = PyObject_CallNoArgs(now);
    if (!t1) return NULL;
    Py_ssize_t depth = PyList_GET_SIZE(self->starts);
    if (depth == 0) { /* unmatched: the full region's exit raises the error that says so */
        Py_DECREF(t1);
        return PyObject_CallMethodObjArgs(self->full, s_exit, args[off], args[off + 1],
                                          args[off + 2], NULL);
    }
    PyObject *start = PyList_GET_ITEM(self->starts, depth - 1);
    Py_INCREF(start);
    if (PyList_SetSlice(self->starts, depth - 1, depth, NULL) < 0) goto fail_start;
    if (!PyFloat_CheckExact(start)) { /* begun by the full region: its exit ends it */
        Py_DECREF(t1);
        int rc = PyList_Append(self->starts, start);
        Py_DECREF(start);
        if (rc < 0) return NULL;
        return PyObject_CallMethodObjArgs(self->full, s_exit, args[off], args[off + 1],
                                          args[off + 2], NULL);
    }
    PyObject *s = dict_item(self->smod, s_active);
    if (!s) goto fail_start;
    if (s != Py_None && depth == 1) { /* an entry inside one of its name: in that one's time */
        Py_INCREF(s);
        PyObject *step = NULL, *end = NULL, *ms = NULL, *rec = NULL, *buf = NULL, *out = NULL;
        int bad = 1;
        step = PyObject_GetAttr(s, s_step);
        if (!step) goto done;
        int later = PyObject_RichCompareBool(step, one, Py_GT);
        if (later < 0) goto done;
        if (later) { /* before the first step, the last "end" is where its data began */
            end = PyObject_GetAttr(s, s_last_end);
            if (!end) goto done;
            if (!PyFloat_CheckExact(end)) { /* a CUDA event: the host time of that end */
                Py_SETREF(end, PyObject_GetAttr(s, s_last_host));
                if (!end) goto done;
            }
            if (end != Py_None) {
                int before = PyObject_RichCompareBool(start, end, Py_LT);
                if (before < 0) goto done;
                if (before) {
                    Py_SETREF(step, PyNumber_Subtract(step, one));
                    if (!step) goto done;
                }
            }
        }
        ms = ms_between(t1, start);
        if (!ms) goto done;
        rec = PyTuple_Pack(3, self->tag, step, ms);
        buf = rec ? PyObject_GetAttr(s, s_buf) : NULL;
        out = buf ? PyObject_CallMethodOneArg(buf, s_append, rec) : NULL;
        bad = out == NULL;
    done:
        Py_XDECREF(step);
        Py_XDECREF(end);
        Py_XDECREF(ms);
        Py_XDECREF(rec);
        Py_XDECREF(buf);
        Py_XDECREF(out);
        Py_DECREF(s);
        if (bad) goto fail_start;
    }
    Py_DECREF(t1);
    Py_DECREF(start);
    Py_RETURN_NONE;
fail_start:
    Py_DECREF(t1);
    Py_DECREF(start);
    return NULL;
}

static PyTypeObject RegionExitType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "trainkit._speedups.RegionExit",
    .tp_basicsize = sizeof(RegionExit),
    .tp_dealloc = (destructor)exit_dealloc,
    .tp_vectorcall_offset = offsetof(RegionExit, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = exit_new,
    .tp_doc = "RegionExit(tag, starts, full, timing_dict, session_dict, owner): a region's fast "
              "exit; in a thread other than owner, full's exit.",
};
