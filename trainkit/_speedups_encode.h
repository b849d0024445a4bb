/* trainkit._speedups: CRC32C and a step's TensorBoard event, encoded and written. Included by _speedups.c (after the setup section, whose
   names and constants it uses). */

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
