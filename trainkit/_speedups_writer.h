/* trainkit._speedups: the session writer's pass over the records and its write of completed steps. Included by _speedups.c (after the setup section, whose
   names and constants it uses). */

/* ---- _steps.derive, for a step of floats without host-to-device copies ---------------- */
static PyObject *derive(PyObject *values) {
    int h2d = PyDict_Contains(values, H2D_BYTES);
    if (h2d == 0) h2d = PyDict_Contains(values, H2D_PINNED_BYTES);
    if (h2d < 0) return NULL;
    if (h2d) return PyObject_CallOneArg(derive_py, values);
    if (PyDict_GetItemWithError(values, STEP_END)) {
        if (PyDict_DelItem(values, STEP_END) < 0) return NULL;
    } else if (PyErr_Occurred())
        return NULL;
    PyObject *items = PyDict_GetItemWithError(values, ITEMS);
    if (items) {
        Py_INCREF(items);
        if (PyDict_DelItem(values, ITEMS) < 0) {
            Py_DECREF(items);
            return NULL;
        }
        /* 0 too (empty batches): a rate of 0, not a point left out */
        PyObject *step_ms = PyDict_GetItemWithError(values, STEP_TIME);
        int t2 = step_ms ? PyObject_IsTrue(step_ms) : (PyErr_Occurred() ? -1 : 0);
        if (t2 < 0) {
            Py_DECREF(items);
            return NULL;
        }
        if (t2) {
            PyObject *rate;
            if (PyFloat_CheckExact(items) && PyFloat_CheckExact(step_ms)) {
                rate = PyFloat_FromDouble(PyFloat_AS_DOUBLE(items) /
                                          (PyFloat_AS_DOUBLE(step_ms) / 1e3));
            } else {
                Py_INCREF(step_ms);
                PyObject *sec = PyNumber_TrueDivide(step_ms, thousand);
                Py_DECREF(step_ms);
                rate = sec ? PyNumber_TrueDivide(items, sec) : NULL;
                Py_XDECREF(sec);
            }
            if (!rate || PyDict_SetItem(values, SAMPLES_PER_S, rate) < 0) {
                Py_XDECREF(rate);
                Py_DECREF(items);
                return NULL;
            }
            Py_DECREF(rate);
        }
        Py_DECREF(items);
    } else if (PyErr_Occurred())
        return NULL;
    Py_INCREF(values);
    return values;
}

/* ---- Recorder._write_steps ---------------------------------------------------------------- */
static int all_floats(PyObject *tags) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(tags, &pos, &k, &v))
        if (!PyFloat_CheckExact(v)) return 0;
    return 1;
}

static int do_write_steps(PyObject *opened, PyObject *completed, int final, Ctx *c) {
    PyObject *steps = PyDict_Keys(opened);
    if (!steps) return -1;
    if (PyList_Sort(steps) < 0) {
        Py_DECREF(steps);
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(steps); i++) {
        PyObject *step = PyList_GET_ITEM(steps, i);
        if (!final) {
            int past = PyObject_RichCompareBool(step, completed, Py_GT);
            if (past < 0) { rc = -1; break; }
            if (past) break;
        }
        /* taken out before it is written: a flush run inside this one neither writes it again
           nor finds it gone */
        PyObject *tags = PyDict_GetItemWithError(opened, step);
        if (!tags) {
            if (PyErr_Occurred()) { rc = -1; break; }
            continue;
        }
        Py_INCREF(tags);
        if (PyDict_DelItem(opened, step) < 0) {
            Py_DECREF(tags);
            rc = -1;
            break;
        }
        /* a pass's end waited in this step: its data wait if the step was counted (always so
           before the final flush, which writes the step in progress too), else no point */
        int ended = PyDict_Contains(tags, PASS_END_WAIT);
        if (ended > 0) {
            int counted = final ? PyObject_RichCompareBool(step, completed, Py_LE) : 1;
            PyObject *left = counted < 0 ? NULL : PyObject_CallFunctionObjArgs(
                take_pass_end_py, tags, counted ? Py_True : Py_False, NULL);
            ended = left ? PyObject_IsTrue(left) : -1;
            Py_XDECREF(left);
            if (ended == 0) { /* nothing else in the step */
                Py_DECREF(tags);
                continue;
            }
        }
        if (ended < 0) {
            Py_DECREF(tags);
            rc = -1;
            break;
        }
        PyObject *combined;
        if (PyDict_CheckExact(tags) && all_floats(tags)) {
            Py_INCREF(tags);
            combined = tags;
        } else {
            combined = PyObject_CallFunctionObjArgs(combine_step_py, tags,
                                                    final ? Py_True : Py_False, NULL);
            if (!combined) {
                Py_DECREF(tags);
                rc = -1;
                break;
            }
            if (combined == Py_None) { /* the GPU has not got there yet; keep steps in order */
                Py_DECREF(combined);
                rc = PyDict_SetItem(opened, step, tags);
                Py_DECREF(tags);
                break;
            }
        }
        Py_DECREF(tags);
        PyObject *wall;
        PyObject *end = PyDict_GetItemWithError(combined, STEP_END);
        if (end) {
            if (PyFloat_CheckExact(end) && PyFloat_CheckExact(c->wall0) &&
                PyFloat_CheckExact(c->perf0))
                wall = PyFloat_FromDouble(PyFloat_AS_DOUBLE(c->wall0) +
                                          (PyFloat_AS_DOUBLE(end) - PyFloat_AS_DOUBLE(c->perf0)));
            else {
                PyObject *d = PyNumber_Subtract(end, c->perf0);
                wall = d ? PyNumber_Add(c->wall0, d) : NULL;
                Py_XDECREF(d);
            }
        } else
            wall = PyErr_Occurred() ? NULL : PyObject_CallNoArgs(c->clock);
        if (!wall) {
            Py_DECREF(combined);
            rc = -1;
            break;
        }
        PyObject *values = derive(combined);
        Py_DECREF(combined);
        if (!values || write_scalars(c->writer, step, values, wall) < 0) rc = -1;
        Py_XDECREF(values);
        Py_DECREF(wall);
        if (rc < 0) break;
    }
    Py_DECREF(steps);
    return rc;
}

static PyObject *write_steps(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *opened, *completed, *ctx;
    int final;
    if (!check_ready() ||
        !PyArg_ParseTuple(args, "O!OpO:write_steps", &PyDict_Type, &opened, &completed, &final,
                          &ctx))
        return NULL;
    Ctx c;
    if (parse_ctx(ctx, &c) < 0 || do_write_steps(opened, completed, final, &c) < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- Recorder.flush's pass over the buffer ------------------------------------------------ */
static PyObject *item(PyObject *rec, Py_ssize_t i) { /* rec[i], a new reference */
    if (PyTuple_CheckExact(rec) && i < PyTuple_GET_SIZE(rec)) {
        PyObject *x = PyTuple_GET_ITEM(rec, i);
        Py_INCREF(x);
        return x;
    }
    return PySequence_GetItem(rec, i);
}

static int file_record(PyObject *opened, PyObject *rec, PyObject *completed, Ctx *c) {
    int rc = -1;
    PyObject *tag = item(rec, 0), *step = tag ? item(rec, 1) : NULL;
    PyObject *tags = NULL, *a = NULL, *b = NULL, *x = NULL;
    if (!step) goto done;
    tags = PyDict_GetItemWithError(opened, step);
    if (tags)
        Py_INCREF(tags);
    else {
        if (PyErr_Occurred()) goto done;
        if (PyDict_GET_SIZE(opened)) { /* steps far enough behind this one are complete */
            PyObject *limit = PyNumber_Subtract(step, behind);
            if (!limit) goto done;
            int lt = PyObject_RichCompareBool(limit, completed, Py_LT);
            int wrc = lt < 0 ? -1 : do_write_steps(opened, lt ? limit : completed, 0, c);
            Py_DECREF(limit);
            if (wrc < 0) goto done;
        }
        tags = PyDict_New();
        if (!tags || PyDict_SetItem(opened, step, tags) < 0) goto done;
    }
    if (tag == STEP_REC) {
        if (!(a = item(rec, 2)) || !(b = item(rec, 3)) || !(x = item(rec, 4))) goto done;
        if (file_value(tags, UPDATE_MS, ms_between(b, a)) < 0) goto done;
        Py_INCREF(b);
        if (file_value(tags, STEP_END, b) < 0) goto done;
        if (PyFloat_CheckExact(x) && file_value(tags, STEP_TIME, ms_between(b, x)) < 0) goto done;
    } else if (tag == BATCH_REC) {
        if (!(a = item(rec, 2)) || !(b = item(rec, 3)) || !(x = item(rec, 4))) goto done;
        if (file_value(tags, DATA_WAIT, ms_between(b, a)) < 0) goto done;
        if (x != Py_None && file_value(tags, ITEMS, PyNumber_Float(x)) < 0) goto done;
    } else {
        if (!(a = item(rec, 2))) goto done;
        int has = PyDict_Contains(tags, tag);
        if (has < 0) goto done;
        if (has ? add_more(tags, tag, a) < 0 : PyDict_SetItem(tags, tag, a) < 0) goto done;
    }
    rc = 0;
done:
    Py_XDECREF(tag);
    Py_XDECREF(step);
    Py_XDECREF(tags);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(x);
    return rc;
}

static PyObject *ingest(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *buf, *opened, *completed, *ctx;
    int final;
    if (!check_ready() ||
        !PyArg_ParseTuple(args, "OO!OpO:ingest", &buf, &PyDict_Type, &opened, &completed, &final,
                          &ctx))
        return NULL;
    Ctx c;
    if (parse_ctx(ctx, &c) < 0) return NULL;
    PyObject *pop = PyObject_GetAttrString(buf, "popleft");
    if (!pop) return NULL;
    Py_ssize_t todo = final ? -1 : PyObject_Size(buf);
    if (todo < -1 || (todo == -1 && !final)) {
        Py_DECREF(pop);
        return NULL;
    }
    /* the records there now; the final flush takes every one (the session's buffer is closed
       by then, but a thread may still be putting one it was about to put) */
    for (;;) {
        if (final) {
            Py_ssize_t left = PyObject_Size(buf);
            if (left < 0) goto fail;
            if (left == 0) break;
        } else if (todo-- <= 0)
            break;
        PyObject *rec = PyObject_CallNoArgs(pop);
        if (!rec) {
            if (PyErr_ExceptionMatches(PyExc_IndexError)) { /* a signal handler's flush took it */
                PyErr_Clear();
                break;
            }
            goto fail;
        }
        int rc = file_record(opened, rec, completed, &c);
        Py_DECREF(rec);
        if (rc < 0) goto fail;
    }
    Py_DECREF(pop);
    Py_RETURN_NONE;
fail:
    Py_DECREF(pop);
    return NULL;
}
