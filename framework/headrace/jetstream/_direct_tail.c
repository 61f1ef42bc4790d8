/*
 * The server's lines at the end of a batched Direct Get answer, split in C.
 *
 * Why: a Spark task of the jetstream source reads its range as batched Direct Gets, and for
 * every message the server appends six header lines to the stored message's own block:
 *
 *     Nats-Stream, Nats-Subject, Nats-Sequence, Nats-Time-Stamp, Nats-Num-Pending,
 *     Nats-Last-Sequence
 *
 * Finding them, checking them, reading the two sequences and turning the RFC 3339 time stamp
 * into microseconds took about 60% of a task's CPU in Python (rfind, split, five startswith,
 * two int(), a slice and a dict look-up per message). split_tail() does it in one call.
 *
 * It is an accelerator, never an authority: it returns None for any block whose end is not
 * exactly those six lines with plain decimal sequences, and the caller
 * (headrace_spark.datasource.reading.ColumnReader) then takes its general Python path, which
 * decides what the block means or which error it is. A time stamp of another form than
 * YYYY-MM-DDTHH:MM:SS[.fraction]Z (or an impossible date) comes back as None in the tuple,
 * and the caller reads it in Python. So the rows and errors are the same with and without
 * this module (tests/jetstream/test_direct_tail.py compares the two), and the module is
 * optional: without a C compiler headrace installs and the Python path does the work.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

#define VERSION_LINE "NATS/1.0\r\n"
#define VERSION_LEN 10
/* Where the version line's CRLF is: the lowest place the server's part may start. */
#define FIRST_AT 8
#define LINES 6

/* The names of the six lines, each with its ": ", in their order. */
typedef struct {
    const char *text;
    Py_ssize_t len;
} name_t;
#define NAME(text) {text, (Py_ssize_t)sizeof(text) - 1}
static const name_t names[LINES] = {
    NAME("Nats-Stream: "),     NAME("Nats-Subject: "),     NAME("Nats-Sequence: "),
    NAME("Nats-Time-Stamp: "), NAME("Nats-Num-Pending: "), NAME("Nats-Last-Sequence: "),
};

/* The start of the CRLF that ends before `end` and is the last one at or after `low`, or -1. */
static Py_ssize_t
crlf_before(const char *base, Py_ssize_t low, Py_ssize_t end)
{
    for (Py_ssize_t p = end - 1; p > low; p--) {
        if (base[p] == '\n' && base[p - 1] == '\r') {
            return p - 1;
        }
    }
    return -1;
}

/* A non-negative decimal integer of 1 to 20 digits that fits in 64 bits, into *value; 0 when
 * the text is anything else (empty, a sign, a space, an underscore, too large). */
static int
read_unsigned(const char *p, Py_ssize_t len, unsigned long long *value)
{
    if (len < 1 || len > 20) {
        return 0;
    }
    unsigned long long v = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned int digit = (unsigned char)p[i] - '0';
        if (digit > 9) {
            return 0;
        }
        if (v > (ULLONG_MAX - digit) / 10) {
            return 0;
        }
        v = v * 10 + digit;
    }
    *value = v;
    return 1;
}

/* `count` digits at p as a number, or -1 when one is not a digit. */
static int
fixed_digits(const char *p, int count)
{
    int v = 0;
    for (int i = 0; i < count; i++) {
        unsigned int digit = (unsigned char)p[i] - '0';
        if (digit > 9) {
            return -1;
        }
        v = v * 10 + (int)digit;
    }
    return v;
}

static int
is_leap(int year)
{
    return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
}

/* Days from 1970-01-01 to a date of the proleptic Gregorian calendar. The year is counted
 * from March, so that the leap day is the last of its year: a month's first day is then a
 * fixed number of days into the year ((153 * month + 2) / 5, month 0 being March). */
static long long
days_from_civil(int year, int month, int day)
{
    long long y = year - (month <= 2);
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long year_of_era = y - era * 400;                         /* 0..399 */
    long long shifted = month > 2 ? month - 3 : month + 9;         /* March = 0 */
    long long day_of_year = (153 * shifted + 2) / 5 + day - 1;     /* 0..365 */
    long long day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    return era * 146097 + day_of_era - 719468; /* 719468: 0000-03-01 to 1970-01-01 */
}

/* A time stamp YYYY-MM-DDTHH:MM:SS[.fraction]Z (0 to 9 digits of fraction, truncated to
 * microseconds) in microseconds since the epoch, into *micros; 0 for any other text or an
 * impossible date or time (year 0, February 30, hour 24, second 60 ...). */
static int
read_stamp(const char *p, Py_ssize_t len, long long *micros)
{
    static const int month_days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (len < 20 || len > 30 || p[len - 1] != 'Z') {
        return 0;
    }
    if (p[4] != '-' || p[7] != '-' || p[10] != 'T' || p[13] != ':' || p[16] != ':') {
        return 0;
    }
    int year = fixed_digits(p, 4);
    int month = fixed_digits(p + 5, 2);
    int day = fixed_digits(p + 8, 2);
    int hour = fixed_digits(p + 11, 2);
    int minute = fixed_digits(p + 14, 2);
    int second = fixed_digits(p + 17, 2);
    if (year < 1 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0
        || minute > 59 || second < 0 || second > 59) {
        return 0;
    }
    if (day > month_days[month - 1] + (month == 2 && is_leap(year))) {
        return 0;
    }
    long long fraction = 0;
    if (len > 20) {
        if (p[19] != '.') {
            return 0;
        }
        Py_ssize_t digits = len - 21; /* between the '.' and the 'Z' */
        long long scale = 100000;
        for (Py_ssize_t i = 0; i < digits; i++) {
            unsigned int digit = (unsigned char)p[20 + i] - '0';
            if (digit > 9) {
                return 0;
            }
            if (i < 6) {
                fraction += digit * scale;
                scale /= 10;
            }
        }
    }
    long long seconds = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60
                        + second;
    *micros = seconds * 1000000 + fraction;
    return 1;
}

PyDoc_STRVAR(split_tail_doc,
"split_tail(raw, /)\n"
"--\n"
"\n"
"The server's six lines at the end of a batched Direct Get answer's header block ``raw``\n"
"(``NATS/1.0\\r\\n`` ... ``\\r\\n\\r\\n``): ``(at, subject, seq, last_seq, stamp_micros)``,\n"
"``at`` being ``raw.rfind(b'\\r\\nNats-Stream: ')``, ``subject`` the bytes of\n"
"``Nats-Subject``, ``stamp_micros`` ``Nats-Time-Stamp`` in microseconds since the epoch\n"
"(``None`` when it is not ``YYYY-MM-DDTHH:MM:SS[.fraction]Z``). ``None`` when the block does\n"
"not end with exactly those lines in that order, or a sequence is not a plain decimal\n"
"integer of 64 bits at most: the caller then reads the block the general way.");

static PyObject *
split_tail(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "split_tail() takes bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *base = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n < VERSION_LEN + 4 || memcmp(base, VERSION_LINE, VERSION_LEN) != 0
        || memcmp(base + n - 4, "\r\n\r\n", 4) != 0) {
        Py_RETURN_NONE;
    }
    /* The six lines, from the last back: each ends at the CRLF after it (the last one at the
     * block's closing CRLF CRLF) and starts after the CRLF before it. */
    Py_ssize_t starts[LINES], ends[LINES];
    Py_ssize_t end = n - 4;
    Py_ssize_t at = -1;
    for (int k = LINES - 1; k >= 0; k--) {
        Py_ssize_t crlf = crlf_before(base, FIRST_AT, end);
        if (crlf < FIRST_AT) {
            Py_RETURN_NONE;
        }
        starts[k] = crlf + 2;
        ends[k] = end;
        if (ends[k] - starts[k] < names[k].len
            || memcmp(base + starts[k], names[k].text, (size_t)names[k].len) != 0) {
            Py_RETURN_NONE;
        }
        starts[k] += names[k].len; /* the value */
        end = crlf;
        at = crlf;
    }
    /* No later "\r\nNats-Stream: " can follow `at`: the five CRLFs after it start the other
     * five names. So `at` is what rfind gives. */
    unsigned long long seq, last_seq;
    if (!read_unsigned(base + starts[2], ends[2] - starts[2], &seq)
        || !read_unsigned(base + starts[5], ends[5] - starts[5], &last_seq)) {
        Py_RETURN_NONE;
    }
    long long micros;
    int have_stamp = read_stamp(base + starts[3], ends[3] - starts[3], &micros);

    PyObject *items[5];
    items[0] = PyLong_FromSsize_t(at);
    items[1] = PyBytes_FromStringAndSize(base + starts[1], ends[1] - starts[1]);
    items[2] = PyLong_FromUnsignedLongLong(seq);
    items[3] = PyLong_FromUnsignedLongLong(last_seq);
    items[4] = have_stamp ? PyLong_FromLongLong(micros) : Py_NewRef(Py_None);
    PyObject *result = NULL;
    if (items[0] && items[1] && items[2] && items[3] && items[4]) {
        result = PyTuple_New(5);
    }
    if (result == NULL) {
        for (int i = 0; i < 5; i++) {
            Py_XDECREF(items[i]);
        }
        return NULL;
    }
    for (int i = 0; i < 5; i++) {
        PyTuple_SET_ITEM(result, i, items[i]); /* steals the reference */
    }
    return result;
}

static PyMethodDef direct_tail_methods[] = {
    {"split_tail", split_tail, METH_O, split_tail_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef direct_tail_module = {
    PyModuleDef_HEAD_INIT,
    "headrace.jetstream._direct_tail",
    "The server's lines of a batched Direct Get answer, split in C (optional).",
    -1,
    direct_tail_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__direct_tail(void)
{
    return PyModule_Create(&direct_tail_module);
}
