/*
 * The MSG/HMSG fast path of headrace.protocol.parser, in C.
 *
 * Why: a consume is a run of MSG frames, and in pure Python each costs about 0.9 us to split,
 * check and decode (bench/README.md). That is most of the client's time per message, and it
 * is what keeps a Python consumer behind the C client at large pull windows. This module
 * parses such a run in one call.
 *
 * It is an accelerator, never an authority: it accepts only frames that are complete and
 * well formed, and returns at the first one it does not accept (a partial frame, another
 * operation, an odd separator, a bad number, a payload not followed by CRLF, a subject that
 * is not UTF-8 ...). The pure-Python parser then takes that frame and decides what it is:
 * it waits for more bytes, parses it, or raises the precise ProtocolError. So the events and
 * errors are the same with and without this module (tests/protocol checks that by property),
 * and the module is optional: without a C compiler headrace installs and works, slower.
 *
 * Sans-IO like the parser: bytes in, events out, no socket.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Tokens of a control line this fast path reads: subject, sid, [reply], [hdr], size. */
#define MAX_TOKENS 5
/* Decimal digits accepted in a number (so that the value fits in a long long). */
#define MAX_DIGITS 18
/* Entries the subject memo may hold before this module stops adding to it (the parser
 * clears the memo when it is over its own limit). */
#define MEMO_LIMIT 4096

typedef struct {
    const char *start;
    Py_ssize_t len;
} token_t;

/* The value of an all-digit token, or -1. */
static long long
digits_value(const token_t *t)
{
    if (t->len == 0 || t->len > MAX_DIGITS) {
        return -1;
    }
    long long value = 0;
    for (Py_ssize_t i = 0; i < t->len; i++) {
        char c = t->start[i];
        if (c < '0' || c > '9') {
            return -1;
        }
        value = value * 10 + (c - '0');
    }
    return value;
}

/*
 * Split the control line that starts at p (after the operation and its space) into tokens.
 * Returns the number of tokens and sets *eol to the index of the line's CR, or -1 when this
 * fast path does not take the line: no CRLF before `limit`, more than MAX_TOKENS tokens, or a
 * whitespace byte other than space and tab (bytes.split() would treat \r, \n, \v, \f as
 * separators too; such a line is left to the Python parser).
 */
static int
split_line(const char *base, Py_ssize_t p, Py_ssize_t limit, token_t *tokens, Py_ssize_t *eol)
{
    int count = 0;
    while (p < limit) {
        char c = base[p];
        if (c == ' ' || c == '\t') {
            p++;
            continue;
        }
        if (c == '\r') {
            if (p + 1 < limit && base[p + 1] == '\n') {
                *eol = p;
                return count;
            }
            return -1;
        }
        if (c == '\n' || c == '\v' || c == '\f') {
            return -1;
        }
        if (count == MAX_TOKENS) {
            return -1;
        }
        Py_ssize_t start = p;
        while (p < limit) {
            c = base[p];
            if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f') {
                break;
            }
            p++;
        }
        tokens[count].start = base + start;
        tokens[count].len = p - start;
        count++;
    }
    return -1;
}

/* The subject as str, through the memo (a new reference), or NULL with no error set when it
 * is not UTF-8 (the Python parser reports that), or NULL with an error set. */
static PyObject *
subject_text(PyObject *memo, const token_t *t)
{
    PyObject *key = PyBytes_FromStringAndSize(t->start, t->len);
    if (key == NULL) {
        return NULL;
    }
    PyObject *text = PyDict_GetItemWithError(memo, key);
    if (text != NULL) {
        Py_INCREF(text);
        Py_DECREF(key);
        return text;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    }
    text = PyUnicode_DecodeUTF8(t->start, t->len, NULL);
    if (text == NULL) {
        Py_DECREF(key);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
        }
        return NULL;
    }
    if (PyDict_GET_SIZE(memo) < MEMO_LIMIT && PyDict_SetItem(memo, key, text) < 0) {
        Py_DECREF(key);
        Py_DECREF(text);
        return NULL;
    }
    Py_DECREF(key);
    return text;
}

/* str of a reply token, or NULL with no error set when it is not UTF-8. */
static PyObject *
reply_text(const token_t *t)
{
    PyObject *text = PyUnicode_DecodeUTF8(t->start, t->len, NULL);
    if (text == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
    }
    return text;
}

PyDoc_STRVAR(scan_messages_doc,
"scan_messages(buf, pos, max_line, max_payload, subjects, msg_type, events) -> (pos, total)\n"
"\n"
"Parse the run of complete, well-formed MSG and HMSG frames of ``buf`` that starts at\n"
"``pos``, appending one ``msg_type(subject, sid, reply, data[, raw_headers])`` per frame to\n"
"``events``. Returns where the first frame not taken starts and the message bytes (payload\n"
"and header block) of the frames taken. ``subjects`` is the parser's memo of decoded\n"
"subjects.");

static PyObject *
scan_messages(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "scan_messages takes 7 arguments");
        return NULL;
    }
    PyObject *buf = args[0];
    PyObject *memo = args[4];
    PyObject *msg_type = args[5];
    PyObject *events = args[6];
    if (!PyBytes_CheckExact(buf) || !PyDict_CheckExact(memo) || !PyList_CheckExact(events)) {
        PyErr_SetString(PyExc_TypeError, "scan_messages needs bytes, a dict and a list");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t max_line = PyLong_AsSsize_t(args[2]);
    long long max_payload = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    const char *base = PyBytes_AS_STRING(buf);
    Py_ssize_t n = PyBytes_GET_SIZE(buf);
    Py_ssize_t total = 0;
    token_t tokens[MAX_TOKENS];

    /* The previous frame's subject: a run usually repeats a few subjects, so most frames
     * reuse its str without a memo lookup. */
    const char *last_subject = NULL;
    Py_ssize_t last_subject_len = 0;
    PyObject *last_text = NULL; /* borrowed from the memo or owned: see below */
    PyObject *owned_text = NULL;

    while (pos < n) {
        int headers;
        Py_ssize_t p;
        if (n - pos > 5 && memcmp(base + pos, "MSG ", 4) == 0) {
            headers = 0;
            p = pos + 4;
        }
        else if (n - pos > 6 && memcmp(base + pos, "HMSG ", 5) == 0) {
            headers = 1;
            p = pos + 5;
        }
        else {
            break;
        }
        /* The line may be max_line bytes long; the parser raises beyond that. */
        Py_ssize_t limit = pos + max_line + 2;
        if (limit > n || limit < pos) {
            limit = n;
        }
        Py_ssize_t eol = -1;
        int count = split_line(base, p, limit, tokens, &eol);
        if (count < 0 || eol - pos > max_line) {
            break;
        }
        /* MSG subject sid [reply] size; HMSG subject sid [reply] hdr size. */
        const token_t *reply_token;
        const token_t *size_token = &tokens[count - 1];
        long long hdr = 0;
        if (!headers && (count == 3 || count == 4)) {
            reply_token = count == 4 ? &tokens[2] : NULL;
        }
        else if (headers && (count == 4 || count == 5)) {
            reply_token = count == 5 ? &tokens[2] : NULL;
            hdr = digits_value(&tokens[count - 2]);
            if (hdr <= 0) {
                break;
            }
        }
        else {
            break;
        }
        long long size = digits_value(size_token);
        long long sid = digits_value(&tokens[1]);
        if (size < 0 || sid < 0 || size > max_payload || hdr > size) {
            break;
        }
        Py_ssize_t start = eol + 2;
        /* Complete, and followed by CRLF (no overflow: size is compared with what is left). */
        if (size > (long long)(n - start - 2)) {
            break;
        }
        Py_ssize_t end = start + (Py_ssize_t)size;
        if (base[end] != '\r' || base[end + 1] != '\n') {
            break;
        }

        PyObject *subject;
        if (last_text != NULL && tokens[0].len == last_subject_len
            && memcmp(tokens[0].start, last_subject, (size_t)last_subject_len) == 0) {
            subject = last_text;
            Py_INCREF(subject);
        }
        else {
            subject = subject_text(memo, &tokens[0]);
            if (subject == NULL) {
                if (PyErr_Occurred()) {
                    goto error;
                }
                break;
            }
            Py_XDECREF(owned_text);
            Py_INCREF(subject);
            owned_text = subject;
            last_text = subject;
            last_subject = tokens[0].start;
            last_subject_len = tokens[0].len;
        }
        PyObject *reply;
        if (reply_token != NULL) {
            reply = reply_text(reply_token);
            if (reply == NULL) {
                Py_DECREF(subject);
                if (PyErr_Occurred()) {
                    goto error;
                }
                break;
            }
        }
        else {
            reply = Py_NewRef(Py_None);
        }
        PyObject *sid_obj = PyLong_FromLongLong(sid);
        Py_ssize_t hend = start + (Py_ssize_t)hdr;
        PyObject *data = PyBytes_FromStringAndSize(base + hend, end - hend);
        PyObject *raw = headers ? PyBytes_FromStringAndSize(base + start, hend - start) : NULL;
        PyObject *msg = NULL;
        if (sid_obj != NULL && data != NULL && (raw != NULL || !headers)) {
            PyObject *call_args[5] = {subject, sid_obj, reply, data, raw};
            msg = PyObject_Vectorcall(msg_type, call_args, headers ? 5 : 4, NULL);
        }
        Py_DECREF(subject);
        Py_DECREF(reply);
        Py_XDECREF(sid_obj);
        Py_XDECREF(data);
        Py_XDECREF(raw);
        if (msg == NULL) {
            goto error;
        }
        int appended = PyList_Append(events, msg);
        Py_DECREF(msg);
        if (appended < 0) {
            goto error;
        }
        total += (Py_ssize_t)size;
        pos = end + 2;
    }
    Py_XDECREF(owned_text);
    return Py_BuildValue("(nn)", pos, total);

error:
    Py_XDECREF(owned_text);
    return NULL;
}

static PyMethodDef speedups_methods[] = {
    {"scan_messages", (PyCFunction)(void (*)(void))scan_messages, METH_FASTCALL,
     scan_messages_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "headrace.protocol._speedups",
    "The MSG/HMSG fast path of the protocol parser, in C (optional).",
    -1,
    speedups_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&speedups_module);
}
