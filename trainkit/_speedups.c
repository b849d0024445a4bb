/* trainkit._speedups: the session writer's per-record work, and profile_region's entry and exit,
   in C.

   The writer thread turns the hot path's records into one TensorBoard event per step
   (trainkit/recorder.py: Recorder.flush, _write_steps, derive; trainkit/sinks/tensorboard.py:
   encode_scalars, EventFileWriter._write_record). Written in Python, that work holds the GIL for
   ~10 us a step of 8 records, time the training thread waits for on a small step. This module
   does the same work for the common records (plain floats) with no Python frame, and calls the
   Python functions for everything else: a step holding a pending GPU value or several values of
   one tag (recorder._combine_step), host-to-device rates (recorder.derive), a value or a step
   that is no plain float or int (EventFileWriter.write_scalars).

   The Python code is the reference: every function here mirrors one there, line for line, and
   tests/test_speedups.py checks that both write byte-identical event files from the same records.
   Setting TRAINKIT_PURE_PYTHON=1 (or a machine without a C compiler at install) runs the Python
   code alone. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030B0000
#define PACK4(x, p) PyFloat_Pack4((x), (char *)(p), 1)
#define PACK8(x, p) PyFloat_Pack8((x), (char *)(p), 1)
#else
#define PACK4(x, p) _PyFloat_Pack4((x), (unsigned char *)(p), 1)
#define PACK8(x, p) _PyFloat_Pack8((x), (unsigned char *)(p), 1)
#endif

/* ---- CRC32C (Castagnoli), as google-crc32c and TFRecord compute it: slicing by 8 ---------- */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
            crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc(const unsigned char *p, size_t n) {
    uint32_t x = crc32c(p, n);
    return ((x >> 15) | (x << 17)) + 0xA282EAD8u;
}

static void put_u32le(unsigned char *p, uint32_t v) {
    p[0] = v & 0xFF; p[1] = (v >> 8) & 0xFF; p[2] = (v >> 16) & 0xFF; p[3] = v >> 24;
}

static size_t put_varint(unsigned char *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v & 0x7F) | 0x80;
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

/* ---- what recorder.py hands over once (setup) ------------------------------------------- */
static PyObject *STEP_REC, *BATCH_REC, *UPDATE_MS, *STEP_END, *STEP_TIME, *DATA_WAIT, *ITEMS,
    *SAMPLES_PER_S, *H2D_BYTES, *H2D_PINNED_BYTES;
static PyObject *combine_step_py; /* recorder._combine_step(tags, final) */
static PyObject *derive_py;       /* recorder.derive(values) */
static PyObject *prefix_py;       /* sinks.tensorboard._prefix(tag) */
static PyObject *prefix_cache;    /* sinks.tensorboard._value_prefix: tag -> bytes */
static PyObject *behind;          /* recorder._BEHIND (an int) */
static PyObject *thousand;        /* 1e3 */
static PyObject *s_write_scalars, *s_file, *s_write, *s_write_record, *s_step, *s_values,
    *s_wall_time;
static int ready = 0;

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *tags, *funcs;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &tags, &PyTuple_Type, &funcs)) return NULL;
    PyObject **slots[] = {&STEP_REC, &BATCH_REC, &UPDATE_MS, &STEP_END, &STEP_TIME, &DATA_WAIT,
                          &ITEMS, &SAMPLES_PER_S, &H2D_BYTES, &H2D_PINNED_BYTES};
    PyObject **fslots[] = {&combine_step_py, &derive_py, &prefix_py, &prefix_cache, &behind};
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

/* recorder._add: one more value of a tag within a step (the first one is stored as it is) */
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

/* ---- encoding: sinks/tensorboard.py encode_scalars + EventFileWriter._write_record -------- */

/* Write the event of `values` (a dict of str -> float) at `step`, `wall` (a float), if every
   value is a float and the step an int64; returns 1 written, 0 not attempted (the caller writes
   through Python), -1 error. */
static int write_fast(PyObject *writer, PyObject *step, PyObject *values, PyObject *wall) {
    if (!PyFloat_CheckExact(wall) || !PyLong_CheckExact(step)) return 0;
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(step, &overflow);
    if (overflow || (n == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t pos = 0, count = 0;
    PyObject *tag, *v;
    size_t summary = 0;
    /* First pass: every value a float, and the summary's length (each tag's prefix, a float32) */
    while (PyDict_Next(values, &pos, &tag, &v)) {
        if (!PyFloat_CheckExact(v) || !PyUnicode_CheckExact(tag)) return 0;
        PyObject *prefix = PyDict_GetItemWithError(prefix_cache, tag);
        if (!prefix) {
            if (PyErr_Occurred()) return -1;
            prefix = PyObject_CallOneArg(prefix_py, tag); /* computes (and caches) it */
            if (!prefix) return -1;
            if (!PyBytes_CheckExact(prefix)) {
                Py_DECREF(prefix);
                PyErr_SetString(PyExc_TypeError, "_prefix() must return bytes");
                return -1;
            }
            summary += PyBytes_GET_SIZE(prefix) + 4;
            Py_DECREF(prefix);
        } else {
            if (!PyBytes_CheckExact(prefix)) return 0;
            summary += PyBytes_GET_SIZE(prefix) + 4;
        }
        count++;
    }
    if (count == 0) return 1; /* write_scalars writes nothing for no values */
    /* event: 0x09 wall(8) [0x10 varint(step)] 0x2a varint(len) summary */
    unsigned char head[32];
    size_t h = 0;
    head[h++] = 0x09;
    if (PACK8(PyFloat_AS_DOUBLE(wall), head + h) < 0) return -1;
    h += 8;
    if (n != 0) { /* proto3 leaves a zero step out */
        head[h++] = 0x10;
        h += put_varint(head + h, (uint64_t)n);
    }
    head[h++] = 0x2a;
    h += put_varint(head + h, (uint64_t)summary);
    size_t data_len = h + summary;
    PyObject *rec = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(12 + data_len + 4));
    if (!rec) return -1;
    unsigned char *r = (unsigned char *)PyBytes_AS_STRING(rec);
    uint64_t len64 = (uint64_t)data_len;
    for (int i = 0; i < 8; i++) r[i] = (unsigned char)(len64 >> (8 * i));
    put_u32le(r + 8, masked_crc(r, 8));
    unsigned char *d = r + 12, *q = d + h;
    memcpy(d, head, h);
    pos = 0;
    while (PyDict_Next(values, &pos, &tag, &v)) {
        PyObject *prefix = PyDict_GetItemWithError(prefix_cache, tag);
        if (!prefix || !PyBytes_CheckExact(prefix) ||
            (size_t)(q - d) + PyBytes_GET_SIZE(prefix) + 4 > data_len) {
            /* the cache changed under us (another thread cleared it): Python writes this one */
            Py_DECREF(rec);
            if (PyErr_Occurred()) return -1;
            return 0;
        }
        memcpy(q, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix));
        q += PyBytes_GET_SIZE(prefix);
        double x = PyFloat_AS_DOUBLE(v);
        if (PACK4(x, q) < 0) { /* past float32's range: +-inf, as _float32 */
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                Py_DECREF(rec);
                return -1;
            }
            PyErr_Clear();
            if (PACK4(copysign(INFINITY, x), q) < 0) {
                Py_DECREF(rec);
                return -1;
            }
        }
        q += 4;
    }
    if ((size_t)(q - d) != data_len) { /* values changed size under us: Python writes it */
        Py_DECREF(rec);
        return 0;
    }
    put_u32le(q, masked_crc(d, data_len));
    /* EventFileWriter._write_record's check, then its write */
    PyObject *file = PyObject_GetAttr(writer, s_file);
    if (!file) {
        Py_DECREF(rec);
        return -1;
    }
    PyObject *out;
    if (file == Py_None) /* closed: its own _write_record raises the error it says */
        out = PyObject_CallMethodOneArg(writer, s_write_record, rec);
    else
        out = PyObject_CallMethodOneArg(file, s_write, rec);
    Py_DECREF(file);
    Py_DECREF(rec);
    if (!out) return -1;
    Py_DECREF(out);
    return 1;
}

static int write_scalars(PyObject *writer, PyObject *step, PyObject *values, PyObject *wall) {
    int rc = write_fast(writer, step, values, wall);
    if (rc != 0) return rc < 0 ? -1 : 0;
    /* self.writer.write_scalars(step=step, values=values, wall_time=wall) */
    PyObject *meth = PyObject_GetAttr(writer, s_write_scalars);
    if (!meth) return -1;
    PyObject *args = PyTuple_New(0), *kw = PyDict_New();
    PyObject *out = NULL;
    if (args && kw && PyDict_SetItem(kw, s_step, step) == 0 &&
        PyDict_SetItem(kw, s_values, values) == 0 && PyDict_SetItem(kw, s_wall_time, wall) == 0)
        out = PyObject_Call(meth, args, kw);
    Py_XDECREF(args);
    Py_XDECREF(kw);
    Py_DECREF(meth);
    if (!out) return -1;
    Py_DECREF(out);
    return 0;
}

/* ---- recorder.derive, for a step of floats without host-to-device copies ---------------- */
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
        int truth = PyObject_IsTrue(items);
        if (truth < 0) {
            Py_DECREF(items);
            return NULL;
        }
        if (truth) {
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

static PyObject *write_steps(PyObject *self, PyObject *args) {
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

static PyObject *ingest(PyObject *self, PyObject *args) {
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


/* ---- profile_region's fast entry and exit (profiling/regions.py: _fast_region) -------------
   One pair per region name, put on the name's own class as __enter__ and __exit__: neither
   binds to the instance (no __get__), so `with` calls them with no instance, and
   type(cm).__enter__(cm) (contextlib.ExitStack) with it, which both take. */
typedef struct {
    PyObject_HEAD
    PyObject *starts; /* the name's stack of start times, shared with its full region */
    PyObject *now;    /* timing.now when the name was first used (as the map() entry had it) */
} RegionEnter;

static void enter_dealloc(RegionEnter *self) {
    Py_XDECREF(self->starts);
    Py_XDECREF(self->now);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *enter_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *starts, *now;
    if (!PyArg_ParseTuple(args, "O!O:RegionEnter", &PyList_Type, &starts, &now)) return NULL;
    RegionEnter *self = (RegionEnter *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    Py_INCREF(starts);
    Py_INCREF(now);
    self->starts = starts;
    self->now = now;
    return (PyObject *)self;
}

static PyObject *enter_call(RegionEnter *self, PyObject *args, PyObject *kw) {
    if ((kw && PyDict_GET_SIZE(kw)) || PyTuple_GET_SIZE(args) > 1) {
        PyErr_SetString(PyExc_TypeError, "profile_region.__enter__() takes no arguments");
        return NULL;
    }
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
    .tp_call = (ternaryfunc)enter_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = enter_new,
    .tp_doc = "RegionEnter(starts, now): push now() on starts.",
};

typedef struct {
    PyObject_HEAD
    PyObject *tag;    /* "trainkit/region/<name>_ms" */
    PyObject *starts; /* shared with RegionEnter and the full region */
    PyObject *full;   /* the name's _Region: its __exit__ ends what it began */
    PyObject *timing; /* trainkit.timing's __dict__ ("now", as _Region.__exit__ reads it) */
    PyObject *smod;   /* trainkit.session's __dict__ ("_active": the session in progress) */
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

static PyObject *exit_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *tag, *starts, *full, *timing, *smod;
    if (!PyArg_ParseTuple(args, "UO!OO!O!:RegionExit", &tag, &PyList_Type, &starts, &full,
                          &PyDict_Type, &timing, &PyDict_Type, &smod))
        return NULL;
    RegionExit *self = (RegionExit *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    PyObject *all[] = {tag, starts, full, timing, smod};
    for (int i = 0; i < 5; i++) Py_INCREF(all[i]);
    self->tag = tag;
    self->starts = starts;
    self->full = full;
    self->timing = timing;
    self->smod = smod;
    return (PyObject *)self;
}

static PyObject *dict_item(PyObject *d, PyObject *key) { /* d[key], borrowed */
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v && !PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
    return v;
}

/* _Region.__exit__'s fast path: the time since its entry, one (tag, step, ms) record */
static PyObject *exit_call(RegionExit *self, PyObject *args, PyObject *kw) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((kw && PyDict_GET_SIZE(kw)) || (n != 3 && n != 4)) {
        PyErr_SetString(PyExc_TypeError, "profile_region.__exit__() takes (exc_type, exc, tb)");
        return NULL;
    }
    Py_ssize_t off = n - 3; /* called through the type (ExitStack): the instance comes first */
    PyObject *now = dict_item(self->timing, s_now);
    if (!now) return NULL;
    PyObject *t1 = PyObject_CallNoArgs(now);
    if (!t1) return NULL;
    Py_ssize_t depth = PyList_GET_SIZE(self->starts);
    if (depth == 0) {
        Py_DECREF(t1);
        PyErr_SetString(PyExc_IndexError, "pop from empty list");
        return NULL;
    }
    PyObject *start = PyList_GET_ITEM(self->starts, depth - 1);
    Py_INCREF(start);
    if (PyList_SetSlice(self->starts, depth - 1, depth, NULL) < 0) goto fail_start;
    if (!PyFloat_CheckExact(start)) { /* begun by the full region: its exit ends it */
        Py_DECREF(t1);
        int rc = PyList_Append(self->starts, start);
        Py_DECREF(start);
        if (rc < 0) return NULL;
        return PyObject_CallMethodObjArgs(self->full, s_exit, PyTuple_GET_ITEM(args, off),
                                          PyTuple_GET_ITEM(args, off + 1),
                                          PyTuple_GET_ITEM(args, off + 2), NULL);
    }
    PyObject *s = dict_item(self->smod, s_active);
    if (!s) goto fail_start;
    if (s != Py_None) {
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
    .tp_call = (ternaryfunc)exit_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = exit_new,
    .tp_doc = "RegionExit(tag, starts, full, timing_dict, session_dict): a region's fast exit.",
};

#include "_speedups_step.h" /* FastStep: a patched optimizer's step */

static PyObject *py_crc32c(PyObject *self, PyObject *arg) {
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
    {"crc32c", py_crc32c, METH_O, "crc32c(data) -> int: CRC-32C (Castagnoli) of a buffer."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainkit._speedups",
                                    "The session writer's per-record work, in C.", -1, methods};

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
    one = PyLong_FromLong(1);
    if (!thousand || !s_write_scalars || !s_file || !s_write || !s_write_record || !s_step ||
        !s_values || !s_wall_time || !s_now || !s_active || !s_last_end ||
        !s_last_host || !s_buf || !s_append || !s_exit || !one)
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
