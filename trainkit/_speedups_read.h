/* trainkit._speedups: a chunk of an event file read, its plain scalars decoded by hand
   (trainkit/profiling/points.py: ScalarsParse.take, which is eventfiles.scan's framing and
   ScalarsParse.consume). Included by _speedups.c after _speedups_encode.h (masked_crc).

   Parsing an Event with protobuf and walking its summary in Python took ~8 us a record of 7
   scalars, ~80% of reading a long run. Here a payload holding only wall_time (field 1), step (2)
   and one summary (5) whose values each hold only a tag (1) and a simple_value (2) is decoded
   directly: its points are gathered per tag in C and added to the tags' arrays (Points.steps,
   Points.values) with array.frombytes. Any other payload (a session log, a text or a histogram, a
   value with its metadata, a field given twice where protobuf merges, an unknown field, a tag
   that is no UTF-8, a malformed or overlong varint) is parsed by ScalarsParse.consume itself,
   in order: the points gathered so far are added first, so a SessionLog.START cuts exactly those
   the Python parse would have, and a payload protobuf refuses raises its DecodeError there. */

/* A tag met in this chunk: its name as in the payloads (pointing into the chunk, which is held
   for the call), as str, and its points since the last flush. */
typedef struct {
    const unsigned char *name;
    size_t len;
    uint64_t hash;
    PyObject *tag;
    int64_t *steps;
    double *values;
    Py_ssize_t n, cap;
    int touched; /* has points since the last flush */
} RdTag;

typedef struct {
    Py_ssize_t tag;
    double value;
} RdPend;

typedef struct {
    PyObject *parse;           /* the ScalarsParse */
    RdTag *tags;               /* in the order first met */
    Py_ssize_t ntags, captags;
    Py_ssize_t *slots;         /* open addressing on the name's hash: 1 + index, 0 free */
    size_t nslots;
    Py_ssize_t *order;         /* the tags with points since the last flush, first touched first */
    Py_ssize_t norder, caporder;
    RdPend *pend;              /* one payload's values, all checked before any is kept */
    Py_ssize_t npend, cappend;
    Py_ssize_t *prev;          /* the tag of each value of the payload before (mostly the same) */
    Py_ssize_t nprev, capprev;
    int full;                  /* a tag holds RD_FLUSH_AT points: flush after this payload */
} Reader;

/* The points a tag gathers before all tags' are added to their arrays: small buffers, used
   again, stay in the cache (a whole chunk's, ~150 KB a tag, read a long run ~10% slower) */
#define RD_FLUSH_AT 4096

static PyObject *s_fresh, *s_open, *s_consume, *s_steps, *s_frombytes; /* and s_values */

static uint64_t rd_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t rd_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A varint at *p: 1 with *v set and *p past it, or 0 where it runs past `end` or past 64 bits
   (protobuf's own reading of those is left to it). */
static int rd_varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    uint64_t x = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        unsigned char b = *(*p)++;
        if (i == 9 && b > 1) return 0;
        x |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's bytes at *p: 1 with [*start, *stop) set and *p past them, or 0 */
static int rd_span(const unsigned char **p, const unsigned char *end, const unsigned char **start,
                   const unsigned char **stop) {
    uint64_t len;
    if (!rd_varint(p, end, &len) || len > INT32_MAX || len > (uint64_t)(end - *p)) return 0;
    *start = *p;
    *p += len;
    *stop = *p;
    return 1;
}

static int rd_grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *b = PyMem_Realloc(*buf, (size_t)n * item);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = b;
    *cap = n;
    return 0;
}

/* The index of the tag named name[:len], added where new; -1 error, -2 no UTF-8 (Python's) */
static Py_ssize_t rd_tag(Reader *r, const unsigned char *name, size_t len) {
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ name[i]) * 1099511628211u;
    size_t mask = r->nslots - 1, s = (size_t)h & mask;
    for (; r->slots[s]; s = (s + 1) & mask) {
        RdTag *t = &r->tags[r->slots[s] - 1];
        if (t->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return r->slots[s] - 1;
    }
    PyObject *tag = PyUnicode_DecodeUTF8((const char *)name, (Py_ssize_t)len, NULL);
    if (!tag) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
        PyErr_Clear();
        return -2;
    }
    if (rd_grow((void **)&r->tags, &r->captags, r->ntags + 1, sizeof(RdTag)) < 0) {
        Py_DECREF(tag);
        return -1;
    }
    Py_ssize_t i = r->ntags++;
    r->tags[i] = (RdTag){.name = name, .len = len, .hash = h, .tag = tag};
    r->slots[s] = i + 1;
    if ((size_t)r->ntags * 2 > r->nslots) { /* rehash into twice the slots */
        size_t n = r->nslots * 2;
        Py_ssize_t *slots = PyMem_Calloc(n, sizeof(Py_ssize_t));
        if (!slots) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = 0; k < r->ntags; k++) {
            size_t j = (size_t)r->tags[k].hash & (n - 1);
            while (slots[j]) j = (j + 1) & (n - 1);
            slots[j] = k + 1;
        }
        PyMem_Free(r->slots);
        r->slots = slots;
        r->nslots = n;
    }
    return i;
}

/* `array.frombytes(buf)` of the attribute `name` of `points` */
static int rd_extend(PyObject *points, PyObject *name, void *buf, Py_ssize_t nbytes) {
    PyObject *arr = PyObject_GetAttr(points, name);
    if (!arr) return -1;
    PyObject *view = PyMemoryView_FromMemory((char *)buf, nbytes, PyBUF_READ);
    PyObject *out = view ? PyObject_CallMethodOneArg(arr, s_frombytes, view) : NULL;
    Py_XDECREF(view);
    Py_DECREF(arr);
    if (!out) return -1;
    Py_DECREF(out);
    return 0;
}

/* The points gathered since the last flush added to their tags' fresh Points, tags in the order
   consume would have met them (ScalarsParse._open makes a tag's first, as consume does). */
static int rd_flush(Reader *r) {
    if (!r->norder) return 0;
    PyObject *fresh = PyObject_GetAttr(r->parse, s_fresh);
    if (!fresh) return -1;
    int rc = -1;
    for (Py_ssize_t k = 0; k < r->norder; k++) {
        RdTag *t = &r->tags[r->order[k]];
        PyObject *points = PyDict_GetItemWithError(fresh, t->tag);
        if (!points) {
            if (PyErr_Occurred()) goto done;
            PyObject *add = PyObject_CallMethodOneArg(r->parse, s_open, t->tag);
            if (!add) goto done;
            Py_DECREF(add);
            points = PyDict_GetItemWithError(fresh, t->tag);
            if (!points) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "ScalarsParse._open made no Points");
                goto done;
            }
        }
        Py_INCREF(points);
        int bad = rd_extend(points, s_steps, t->steps, t->n * (Py_ssize_t)sizeof(int64_t)) < 0 ||
                  rd_extend(points, s_values, t->values, t->n * (Py_ssize_t)sizeof(double)) < 0;
        Py_DECREF(points);
        if (bad) goto done;
        t->n = 0;
        t->touched = 0;
    }
    r->norder = 0;
    r->full = 0;
    rc = 0;
done:
    Py_DECREF(fresh);
    return rc;
}

/* ScalarsParse.consume of one payload: 1 done, 0 not a payload decoded here (consume parses
   it), -1 error. Nothing is kept before the whole payload is checked. */
static int rd_event(Reader *r, const unsigned char *p, const unsigned char *end) {
    uint64_t step = 0;
    const unsigned char *sum = NULL, *sum_end = NULL;
    while (p < end) {
        unsigned char key = *p++;
        if (key == 0x09) { /* wall_time, a double: not read */
            if (end - p < 8) return 0;
            p += 8;
        } else if (key == 0x10) { /* step, the last one given */
            if (!rd_varint(&p, end, &step)) return 0;
        } else if (key == 0x2A && !sum) { /* summary (a second one would merge into it) */
            if (!rd_span(&p, end, &sum, &sum_end)) return 0;
        } else
            return 0;
    }
    if (!sum) return 1; /* neither a summary nor a session log: nothing for consume to do */
    r->npend = 0;
    while (sum < sum_end) {
        const unsigned char *v, *v_end, *name = (const unsigned char *)"";
        const unsigned char *name_end = name;
        int has = 0;
        uint32_t bits = 0;
        if (*sum++ != 0x0A || !rd_span(&sum, sum_end, &v, &v_end)) return 0; /* Summary.value */
        while (v < v_end) {
            unsigned char key = *v++;
            if (key == 0x0A) { /* tag (given twice: protobuf checks each one's UTF-8) */
                if (name_end != name || !rd_span(&v, v_end, &name, &name_end)) return 0;
            } else if (key == 0x15) { /* simple_value, a float32: the last one given */
                if (v_end - v < 4) return 0;
                bits = rd_le32(v);
                v += 4;
                has = 1;
            } else
                return 0;
        }
        if (!has) return 0;
        size_t len = (size_t)(name_end - name);
        Py_ssize_t i = r->npend < r->nprev ? r->prev[r->npend] : -1;
        if (i < 0 || r->tags[i].len != len || memcmp(r->tags[i].name, name, len) != 0) {
            i = rd_tag(r, name, len);
            if (i < 0) return i == -2 ? 0 : -1;
        }
        if (rd_grow((void **)&r->pend, &r->cappend, r->npend + 1, sizeof(RdPend)) < 0) return -1;
        float f;
        memcpy(&f, &bits, sizeof f);
        r->pend[r->npend++] = (RdPend){.tag = i, .value = (double)f};
    }
    if (rd_grow((void **)&r->prev, &r->capprev, r->npend, sizeof(Py_ssize_t)) < 0) return -1;
    for (Py_ssize_t k = 0; k < r->npend; k++) r->prev[k] = r->pend[k].tag;
    r->nprev = r->npend;
    /* int64 as protobuf reads it: the varint's 64 bits, two's complement */
    int64_t s = step <= INT64_MAX ? (int64_t)step : -(int64_t)(~step) - 1;
    for (Py_ssize_t k = 0; k < r->npend; k++) {
        RdTag *t = &r->tags[r->pend[k].tag];
        if (!t->touched) {
            if (rd_grow((void **)&r->order, &r->caporder, r->norder + 1, sizeof(Py_ssize_t)) < 0)
                return -1;
            r->order[r->norder++] = r->pend[k].tag;
            t->touched = 1;
        }
        if (t->n == t->cap) { /* steps and values grow together */
            Py_ssize_t cap = t->cap ? t->cap * 2 : 64;
            int64_t *steps = PyMem_Realloc(t->steps, (size_t)cap * sizeof(int64_t));
            if (steps) t->steps = steps;
            double *values = steps ? PyMem_Realloc(t->values, (size_t)cap * sizeof(double)) : NULL;
            if (!values) {
                PyErr_NoMemory();
                return -1;
            }
            t->values = values;
            t->cap = cap;
        }
        t->steps[t->n] = s;
        t->values[t->n++] = r->pend[k].value;
        if (t->n >= RD_FLUSH_AT) r->full = 1;
    }
    return 1;
}

/* consume([payload]) for a payload not decoded here, after the points gathered before it */
static int rd_python(Reader *r, const unsigned char *p, size_t n) {
    if (rd_flush(r) < 0) return -1;
    PyObject *payload = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
    PyObject *one = payload ? PyTuple_Pack(1, payload) : NULL;
    PyObject *out = one ? PyObject_CallMethodOneArg(r->parse, s_consume, one) : NULL;
    Py_XDECREF(payload);
    Py_XDECREF(one);
    if (!out) return -1;
    Py_DECREF(out);
    return 0;
}

static void rd_free(Reader *r) {
    for (Py_ssize_t i = 0; i < r->ntags; i++) {
        Py_DECREF(r->tags[i].tag);
        PyMem_Free(r->tags[i].steps);
        PyMem_Free(r->tags[i].values);
    }
    PyMem_Free(r->tags);
    PyMem_Free(r->slots);
    PyMem_Free(r->order);
    PyMem_Free(r->pend);
    PyMem_Free(r->prev);
}

/* Whether the error set is protobuf's DecodeError (a payload that is no Event), cleared if so;
   any other stays set. Looked up only then: a corrupt file is rare. */
static int rd_refused(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *mod = PyImport_ImportModule("google.protobuf.message");
    PyObject *decode = mod ? PyObject_GetAttrString(mod, "DecodeError") : NULL;
    Py_XDECREF(mod);
    if (!decode) { /* the import's error dropped: the first one is what to raise */
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return 0;
    }
    int is = type && PyErr_GivenExceptionMatches(type, decode);
    Py_DECREF(decode);
    if (is) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return 1;
    }
    PyErr_Restore(type, value, tb);
    return 0;
}

/* ScalarsParse.take(data): eventfiles.scan's framing (a record's payload length, 8 bytes; that
   length's masked CRC32C, 4; the payload; its masked CRC32C, 4), each payload parsed as it
   comes. Returns where the first incomplete record begins, or -1 - pos at a wrong CRC in the
   record beginning at pos, or at its payload that protobuf refuses (consume's DecodeError, the
   records before it kept): eventfiles.Damage says where a file is corrupt. */
static PyObject *take_scalars(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *parse;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Oy*:take_scalars", &parse, &view)) return NULL;
    Reader r = {.parse = parse, .nslots = 16};
    Py_ssize_t got = -1;
    r.slots = PyMem_Calloc(r.nslots, sizeof(Py_ssize_t));
    if (!r.slots) {
        PyErr_NoMemory();
        goto done;
    }
    const unsigned char *data = view.buf;
    size_t pos = 0, end = (size_t)view.len;
    for (;;) {
        if (end - pos < 12) { /* no record's header left */
            got = (Py_ssize_t)pos;
            break;
        }
        uint64_t length = rd_le64(data + pos);
        if (masked_crc(data + pos, 8) != rd_le32(data + pos + 8)) {
            got = -1 - (Py_ssize_t)pos;
            break;
        }
        size_t start = pos + 12;
        if (end - start < 4 || length > end - start - 4) { /* still being written */
            got = (Py_ssize_t)pos;
            break;
        }
        const unsigned char *payload = data + start;
        if (masked_crc(payload, (size_t)length) != rd_le32(payload + length)) {
            got = -1 - (Py_ssize_t)pos;
            break;
        }
        int rc = rd_event(&r, payload, payload + length);
        if (rc == 0) rc = rd_python(&r, payload, (size_t)length);
        else if (rc > 0 && r.full) rc = rd_flush(&r);
        if (rc < 0) {
            if (!rd_refused()) goto done;
            got = -1 - (Py_ssize_t)pos; /* rd_python flushed the points before it */
            break;
        }
        pos = start + (size_t)length + 4;
    }
    if (rd_flush(&r) == 0) {
        rd_free(&r);
        PyBuffer_Release(&view);
        return PyLong_FromSsize_t(got);
    }
done:
    rd_free(&r);
    PyBuffer_Release(&view);
    return NULL;
}
