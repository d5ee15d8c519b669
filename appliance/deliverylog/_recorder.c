/* The hot events' recorder in C: each record_<kind>(*values) call reads CLOCK_MONOTONIC and encodes the clock
 * and the values into one growing buffer (no tuple, no Python clock call).
 *
 * Optional accelerator of DeliveryLog (sink.py); the pure-Python lanes stay the reference. The drain takes the
 * buffer as bytes in one call (no marshal of a Python object per value) and decode() turns it back into the lanes
 * batch that batch.py describes: lane k (1..5) holds, per event, its clock and values inline.
 *
 * Record:  <kind u8><values u8>'q' <clock i64><value>...  (values counts the clock; kind is its lane, 1..5)
 * Value:   'N' None | 'T' True | 'F' False | 'b' u8 | 'h' u16 | 'q' i64 | 's' <u32 n><n UTF-8 bytes>
 *          | 'L' list / 'U' tuple <u16 n><value>... (nested at most 4 deep) | 'm' <u32 n><marshal v4 bytes>
 * Integers are in the machine's byte order: a buffer never leaves the machine that wrote it undecoded.
 * A value marshal refuses is a TypeError. Calls hold the GIL and never run Python code in between
 * their first and last byte, so a record is whole or absent; on an error the buffer is rolled back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <marshal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define KINDS 6       /* lane 0 is Python's (keyword events); hot kinds are 1..5 */
#define MAX_DEPTH 4
#define MAX_VALUES 255
#define KEEP_CAP (1 << 20)  /* a buffer larger than this is freed after a take() */

typedef struct {
    PyObject_HEAD
    char *buf;
    Py_ssize_t len, cap, events;
    Py_ssize_t limit, dropped; /* events kept at most (0: no limit) and those refused beyond it since lost() */
    Py_ssize_t widths[KINDS];
} Recorder;

static int grow(Recorder *r, Py_ssize_t need) {
    if (r->len + need <= r->cap)
        return 0;
    Py_ssize_t cap = r->cap ? r->cap : 1 << 16;
    while (cap < r->len + need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *buf = PyMem_Realloc(r->buf, cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->buf = buf;
    r->cap = cap;
    return 0;
}

static int put(Recorder *r, const void *data, Py_ssize_t n) {
    if (grow(r, n) < 0)
        return -1;
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return 0;
}

static int put_tag(Recorder *r, char tag) { return put(r, &tag, 1); }

static int put_sized(Recorder *r, char tag, const char *data, Py_ssize_t n) {
    if (n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a recorded value over 4 GiB");
        return -1;
    }
    uint32_t size = (uint32_t)n;
    if (grow(r, 5 + n) < 0)
        return -1;
    r->buf[r->len] = tag;
    memcpy(r->buf + r->len + 1, &size, 4);
    memcpy(r->buf + r->len + 5, data, n);
    r->len += 5 + n;
    return 0;
}

static int put_marshal(Recorder *r, PyObject *v) {
    PyObject *m = PyMarshal_WriteObjectToString(v, 4);
    if (m == NULL) {
        if (PyErr_ExceptionMatches(PyExc_ValueError)) { /* taking str() here could run Python code mid-record */
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "a recorded value must be a builtin (marshal) value, not %.100s",
                         Py_TYPE(v)->tp_name);
        }
        return -1;
    }
    int rc = put_sized(r, 'm', PyBytes_AS_STRING(m), PyBytes_GET_SIZE(m));
    Py_DECREF(m);
    return rc;
}

static int put_value(Recorder *r, PyObject *v, int depth) {
    if (v == Py_None)
        return put_tag(r, 'N');
    if (v == Py_True)
        return put_tag(r, 'T');
    if (v == Py_False)
        return put_tag(r, 'F');
    if (PyLong_Check(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow)
            return put_marshal(r, v);
        if (x >= 0 && x < 256) {
            uint8_t b[2] = {'b', (uint8_t)x};
            return put(r, b, 2);
        }
        if (x >= 0 && x < 65536) {
            char b[3] = {'h'};
            uint16_t h = (uint16_t)x;
            memcpy(b + 1, &h, 2);
            return put(r, b, 3);
        }
        char b[9] = {'q'};
        int64_t q = (int64_t)x;
        memcpy(b + 1, &q, 8);
        return put(r, b, 9);
    }
    if (PyUnicode_Check(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL) { /* lone surrogates: marshal keeps them */
            PyErr_Clear();
            return put_marshal(r, v);
        }
        return put_sized(r, 's', s, n);
    }
    if ((PyList_Check(v) || PyTuple_Check(v)) && depth < MAX_DEPTH && Py_SIZE(v) < 65536) {
        int is_list = PyList_Check(v);
        Py_ssize_t n = Py_SIZE(v);
        char head[3] = {is_list ? 'L' : 'U'};
        uint16_t count = (uint16_t)n;
        memcpy(head + 1, &count, 2);
        if (put(r, head, 3) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* a list cannot change under us: nothing here runs Python code */
            PyObject *item = is_list ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
            if (put_value(r, item, depth + 1) < 0)
                return -1;
        }
        return 0;
    }
    return put_marshal(r, v);
}

static PyObject *record(Recorder *r, int kind, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != r->widths[kind] - 1) {
        PyErr_Format(PyExc_TypeError, "event kind %d takes %zd values, got %zd", kind, r->widths[kind] - 1, nargs);
        return NULL;
    }
    if (r->limit && r->events >= r->limit) { /* nobody drains (a stalled writer): memory stays bounded */
        r->dropped++;
        Py_RETURN_NONE;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic_ns()'s clock */
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    Py_ssize_t start = r->len;
    unsigned char head[11] = {(unsigned char)kind, (unsigned char)(nargs + 1), 'q'};
    memcpy(head + 3, &now, 8);
    if (put(r, head, 11) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (put_value(r, args[i], 0) < 0) {
            r->len = start;
            return NULL;
        }
    }
    r->events++;
    Py_RETURN_NONE;
}

#define RECORD_METHOD(name, kind) \
    static PyObject *Recorder_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
        return record((Recorder *)self, kind, args, nargs); \
    }
RECORD_METHOD(received, 1)
RECORD_METHOD(committed, 2)
RECORD_METHOD(routed, 3)
RECORD_METHOD(delivered, 4)
RECORD_METHOD(acked, 5)

static PyObject *Recorder_take(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    Recorder *r = (Recorder *)self;
    PyObject *out = PyBytes_FromStringAndSize(r->buf, r->len);
    if (out == NULL)
        return NULL;
    r->len = 0;
    r->events = 0;
    if (r->cap > KEEP_CAP) {
        PyMem_Free(r->buf);
        r->buf = NULL;
        r->cap = 0;
    }
    return out;
}

static PyObject *Recorder_clear(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    Recorder *r = (Recorder *)self;
    r->len = 0;
    r->events = 0;
    Py_RETURN_NONE;
}

static PyObject *Recorder_lost(PyObject *self, PyObject *Py_UNUSED(ignored)) {
    Recorder *r = (Recorder *)self;
    Py_ssize_t n = r->dropped;
    r->dropped = 0;
    return PyLong_FromSsize_t(n);
}

static Py_ssize_t Recorder_length(PyObject *self) { return ((Recorder *)self)->events; }

static int read_widths(PyObject *widths, Py_ssize_t out[KINDS]) {
    if (!PyTuple_Check(widths) || PyTuple_GET_SIZE(widths) != KINDS) {
        PyErr_SetString(PyExc_TypeError, "widths: a tuple of 6 lane widths (batch.LANE_WIDTHS)");
        return -1;
    }
    for (int k = 0; k < KINDS; k++) {
        Py_ssize_t w = PyLong_AsSsize_t(PyTuple_GET_ITEM(widths, k));
        if (w == -1 && PyErr_Occurred())
            return -1;
        if (w < 1 || w > MAX_VALUES) {
            PyErr_SetString(PyExc_ValueError, "widths: each between 1 and 255");
            return -1;
        }
        out[k] = w;
    }
    return 0;
}

static int Recorder_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"widths", "limit", NULL};
    PyObject *widths;
    Py_ssize_t limit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|n:Recorder", names, &widths, &limit))
        return -1;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "limit: 0 (none) or a positive number of events");
        return -1;
    }
    ((Recorder *)self)->limit = limit;
    return read_widths(widths, ((Recorder *)self)->widths);
}

static void Recorder_dealloc(PyObject *self) {
    PyMem_Free(((Recorder *)self)->buf);
    Py_TYPE(self)->tp_free(self);
}

/* -- decode ------------------------------------------------------------------------------------------------------ */

typedef struct {
    const unsigned char *p, *end;
} Reader;

static PyObject *bad(const Reader *rd, const unsigned char *start, const char *what) {
    PyErr_Format(PyExc_ValueError, "recorded events do not decode at byte %zd: %s", (Py_ssize_t)(rd->p - start),
                 what);
    return NULL;
}

static PyObject *get_value(Reader *rd, const unsigned char *start, int depth) {
    if (rd->p >= rd->end)
        return bad(rd, start, "truncated");
    unsigned char tag = *rd->p++;
    Py_ssize_t left = rd->end - rd->p;
    switch (tag) {
    case 'N':
        Py_RETURN_NONE;
    case 'T':
        Py_RETURN_TRUE;
    case 'F':
        Py_RETURN_FALSE;
    case 'b':
        if (left < 1)
            return bad(rd, start, "truncated");
        return PyLong_FromLong(*rd->p++);
    case 'h': {
        uint16_t h;
        if (left < 2)
            return bad(rd, start, "truncated");
        memcpy(&h, rd->p, 2);
        rd->p += 2;
        return PyLong_FromLong(h);
    }
    case 'q': {
        int64_t q;
        if (left < 8)
            return bad(rd, start, "truncated");
        memcpy(&q, rd->p, 8);
        rd->p += 8;
        return PyLong_FromLongLong(q);
    }
    case 's':
    case 'm': {
        uint32_t n;
        if (left < 4)
            return bad(rd, start, "truncated");
        memcpy(&n, rd->p, 4);
        rd->p += 4;
        if ((Py_ssize_t)n > rd->end - rd->p)
            return bad(rd, start, "truncated");
        const char *data = (const char *)rd->p;
        rd->p += n;
        if (tag == 's')
            return PyUnicode_DecodeUTF8(data, n, NULL);
        PyObject *v = PyMarshal_ReadObjectFromString(data, n);
        if (v == NULL && !PyErr_ExceptionMatches(PyExc_MemoryError)) { /* EOFError, TypeError: bad data */
            PyErr_Clear();
            return bad(rd, start, "bad marshal data");
        }
        return v;
    }
    case 'L':
    case 'U': {
        uint16_t n;
        if (depth >= MAX_DEPTH)
            return bad(rd, start, "nested too deep");
        if (left < 2)
            return bad(rd, start, "truncated");
        memcpy(&n, rd->p, 2);
        rd->p += 2;
        PyObject *seq = tag == 'L' ? PyList_New(n) : PyTuple_New(n);
        if (seq == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = get_value(rd, start, depth + 1);
            if (item == NULL) {
                Py_DECREF(seq);
                return NULL;
            }
            if (tag == 'L')
                PyList_SET_ITEM(seq, i, item);
            else
                PyTuple_SET_ITEM(seq, i, item);
        }
        return seq;
    }
    default:
        rd->p--;
        return bad(rd, start, "unknown value tag");
    }
}

static PyObject *decode(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer view;
    PyObject *widths_arg;
    Py_ssize_t widths[KINDS];
    if (!PyArg_ParseTuple(args, "y*O:decode", &view, &widths_arg))
        return NULL;
    PyObject *lanes = NULL;
    if (read_widths(widths_arg, widths) < 0)
        goto done;
    lanes = PyList_New(KINDS);
    if (lanes == NULL)
        goto done;
    for (int k = 0; k < KINDS; k++) {
        PyObject *lane = PyList_New(0);
        if (lane == NULL)
            goto fail;
        PyList_SET_ITEM(lanes, k, lane);
    }
    const unsigned char *start = view.buf;
    Reader rd = {start, start + view.len};
    while (rd.p < rd.end) {
        if (rd.end - rd.p < 2) {
            bad(&rd, start, "truncated");
            goto fail;
        }
        int kind = rd.p[0], n = rd.p[1];
        if (kind < 1 || kind >= KINDS || n != widths[kind]) {
            bad(&rd, start, "not an event of a hot kind and its width");
            goto fail;
        }
        rd.p += 2;
        PyObject *lane = PyList_GET_ITEM(lanes, kind);
        for (int i = 0; i < n; i++) {
            PyObject *v = get_value(&rd, start, 0);
            if (v == NULL || PyList_Append(lane, v) < 0) { /* the whole batch is dropped: no partial event escapes */
                Py_XDECREF(v);
                goto fail;
            }
            Py_DECREF(v);
        }
    }
    goto done;
fail:
    Py_CLEAR(lanes);
done:
    PyBuffer_Release(&view);
    return lanes;
}

static PyMethodDef Recorder_methods[] = {
    {"received", (PyCFunction)(void (*)(void))Recorder_received, METH_FASTCALL,
     "received(msg_id, publisher, topic, qos, retain, payload_size, user_properties, publisher_packet_id)"},
    {"committed", (PyCFunction)(void (*)(void))Recorder_committed, METH_FASTCALL, "committed(msg_id)"},
    {"routed", (PyCFunction)(void (*)(void))Recorder_routed, METH_FASTCALL, "routed(msg_id, subscriber, filter, qos)"},
    {"delivered", (PyCFunction)(void (*)(void))Recorder_delivered, METH_FASTCALL,
     "delivered(msg_id, subscriber, qos, dup, attempt)"},
    {"acked", (PyCFunction)(void (*)(void))Recorder_acked, METH_FASTCALL, "acked(msg_id, subscriber, qos)"},
    {"take", Recorder_take, METH_NOARGS, "Every event recorded so far, as bytes for decode(); the recorder empties."},
    {"clear", Recorder_clear, METH_NOARGS, "Forget every event recorded so far."},
    {"lost", Recorder_lost, METH_NOARGS, "Events refused beyond the limit since the last call (and reset it)."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Recorder_as_sequence = {.sq_length = Recorder_length};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "appliance.deliverylog._recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Recorder(widths, limit=0): records the hot events into one buffer; len() is the events held since the "
              "last take(); beyond `limit` held events new ones are counted (lost()), not kept.",
    .tp_new = PyType_GenericNew,
    .tp_init = Recorder_init,
    .tp_dealloc = Recorder_dealloc,
    .tp_methods = Recorder_methods,
    .tp_as_sequence = &Recorder_as_sequence,
};

static PyMethodDef module_methods[] = {
    {"decode", decode, METH_VARARGS, "decode(data, widths) -> the lanes batch (6 lists, lane 0 empty) of take()'s bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recorder", "The delivery log's hot-event recorder (C accelerator of sink.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__recorder(void) {
    if (PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
