/* The neighbour sampler's per-hop loops (moment/workload/sampler.py holds the spec: its torch path).
 *
 * Built by the package build (setup.py) as moment.workload._sampling; optional: without it the sampler runs
 * its torch path, which gives the same batches bit for bit (tests/test_sampler_native.py). Every random
 * number still comes from the sampler's torch.Generator: the caller draws a hop's uniforms in one call and
 * hands them in, so a seed gives the same batches on either path.
 *
 * Why native: torch's vectorised form makes one pass over the hop's targets per operation (a gather, a
 * compare, a scatter...), each a round of cache misses on a graph far larger than the cache; here each
 * target's slots and each candidate's table entry are touched once. The GIL is released inside. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int get_vec(PyObject *o, Py_buffer *v, int writable, const char *name) {
    if (PyObject_GetBuffer(o, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (v->ndim != 1 || (v->itemsize != 4 && v->itemsize != 8)) {
        PyErr_Format(PyExc_ValueError, "%s must be a 1-d array of 32- or 64-bit numbers", name);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* get_vec for n objects (writable[i] == 'w': written); on a failure the buffers already taken are released. */
static int get_vecs(int n, PyObject *const *o, Py_buffer *v, const char *writable, const char *const *name) {
    for (int i = 0; i < n; i++)
        if (get_vec(o[i], &v[i], writable[i] == 'w', name[i]) < 0) {
            while (i--) PyBuffer_Release(&v[i]);
            return -1;
        }
    return 0;
}

static void release_vecs(int n, Py_buffer *v) {
    for (int i = 0; i < n; i++) PyBuffer_Release(&v[i]);
}

static int64_t at(const Py_buffer *v, Py_ssize_t i) {
    return v->itemsize == 8 ? ((const int64_t *)v->buf)[i] : ((const int32_t *)v->buf)[i];
}

/* Each loop below touches one random place of a large array per item (a node's indptr entry, its first
   neighbour slot, its entry in the batch's table): the place `ahead` items on is prefetched, so that the misses
   of several items are outstanding at once instead of one after another. On the 8M bench graph's batches
   (1024 seeds, fan-outs 25,10) the per-target loop ran 1.12-1.32x faster, the indptr loop 1.06-1.48x, the table's
   1.06-1.34x; the whole sampler 1.15-1.56x (median 1.24 of six runs of bench/presample.py, against `prefetch(0)`). */
static Py_ssize_t prefetch_ahead = 16; /* read once per call, with the GIL held, as `ahead` */
#if defined(__GNUC__)
#define PREFETCH(p, write) __builtin_prefetch((p), (write), 0)
#else
#define PREFETCH(p, write) ((void)(p))
#endif

PyDoc_STRVAR(prepare_doc, "prepare(indptr, targets, fanout, start, deg) -> (slots, partial, max_degree)\n"
             "start[i], deg[i]: target i's first slot and degree. slots: sum of min(deg, fanout); partial: targets\n"
             "whose degree exceeds fanout (each takes fanout uniforms). indptr, targets: int64; start, deg: int64\n"
             "outputs as long as targets.");

static PyObject *prepare(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *o[4];
    long long fanout;
    if (!PyArg_ParseTuple(args, "OOLOO", &o[0], &o[1], &fanout, &o[2], &o[3])) return NULL;
    Py_buffer v[4];
    if (get_vecs(4, o, v, "rrww", (const char *const[]){"indptr", "targets", "start", "deg"}) < 0) return NULL;
    Py_buffer ip = v[0], tg = v[1], st = v[2], dg = v[3];
    PyObject *ret = NULL;
    Py_ssize_t m = tg.shape[0], n = ip.shape[0] - 1, bad = -1;
    if (ip.itemsize != 8 || tg.itemsize != 8 || st.itemsize != 8 || dg.itemsize != 8 || st.shape[0] != m ||
        dg.shape[0] != m) {
        PyErr_SetString(PyExc_ValueError, "indptr, targets, start and deg must be int64, the last two as long as targets");
        goto done;
    }
    const int64_t *p = ip.buf, *t = tg.buf;
    int64_t *s = st.buf, *d = dg.buf, slots = 0, partial = 0, maxd = 0;
    const Py_ssize_t ahead = prefetch_ahead;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        if (ahead && i + ahead < m && t[i + ahead] >= 0 && t[i + ahead] < n) PREFETCH(p + t[i + ahead], 0);
        int64_t node = t[i];
        if (node < 0 || node >= n) { bad = i; break; }
        s[i] = p[node];
        d[i] = p[node + 1] - p[node];
        if (d[i] > maxd) maxd = d[i];
        if (d[i] > fanout) { partial++; slots += fanout; } else slots += d[i];
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "target %lld is not a node of the graph (%zd nodes)", (long long)t[bad], n);
        goto done;
    }
    ret = Py_BuildValue("LLL", (long long)slots, (long long)partial, (long long)maxd);
done:
    release_vecs(4, v);
    return ret;
}

static void sort_small(int64_t *a, int64_t k) {
    for (int64_t i = 1; i < k; i++) {
        int64_t x = a[i], j = i - 1;
        for (; j >= 0 && a[j] > x; j--) a[j + 1] = a[j];
        a[j + 1] = x;
    }
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

PyDoc_STRVAR(fill_doc, "fill(indices, start, deg, fanout, u, nbr, dst) -> None\n"
             "Target i's chosen neighbours, in CSR order: every slot when deg[i] <= fanout, else Floyd's uniform\n"
             "fanout-subset drawn with the p-th partial target's uniforms u[r * partial + p] (round r). nbr: their\n"
             "ids; dst: i, once per neighbour. indices: int32 or int64; u: float64 of fanout * partial; nbr, dst:\n"
             "int64 of `slots` (prepare's).");

static PyObject *fill(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *o[6];
    long long fanout;
    if (!PyArg_ParseTuple(args, "OOOLOOO", &o[0], &o[1], &o[2], &fanout, &o[3], &o[4], &o[5])) return NULL;
    Py_buffer v[6];
    if (get_vecs(6, o, v, "rrrrww", (const char *const[]){"indices", "start", "deg", "u", "nbr", "dst"}) < 0)
        return NULL;
    Py_buffer ix = v[0], st = v[1], dg = v[2], u = v[3], nb = v[4], ds = v[5];
    PyObject *ret = NULL;
    Py_ssize_t m = st.shape[0], ne = ix.shape[0], nu = u.shape[0], cap = nb.shape[0];
    if (st.itemsize != 8 || dg.itemsize != 8 || nb.itemsize != 8 || ds.itemsize != 8 || dg.shape[0] != m ||
        ds.shape[0] != cap || fanout < 0 || strcmp(u.format, "d") != 0) {
        PyErr_SetString(PyExc_ValueError, "start, deg, nbr and dst must be int64 (deg as long as start, dst as nbr), "
                        "u float64");
        goto release;
    }
    const int64_t *s = st.buf, *d = dg.buf;
    int64_t slots = 0, partial = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (d[i] < 0 || s[i] < 0 || s[i] + d[i] > ne) {
            PyErr_Format(PyExc_IndexError, "target %zd's slots [%lld, %lld) are outside the %zd of indices", i,
                         (long long)s[i], (long long)(s[i] + d[i]), ne);
            goto release;
        }
        if (d[i] > fanout) { partial++; slots += fanout; } else slots += d[i];
    }
    if (slots > cap || fanout * partial > nu) {
        PyErr_Format(PyExc_ValueError, "%lld slots and %lld uniforms needed; nbr holds %zd, u %zd",
                     (long long)slots, (long long)(fanout * partial), cap, nu);
        goto release;
    }
    int64_t *sel = partial ? malloc(sizeof(int64_t) * (size_t)fanout) : NULL;
    if (partial && !sel) { PyErr_NoMemory(); goto release; }
    const double *uu = u.buf;
    int64_t *out = nb.buf, *dst = ds.buf, k = 0, p = 0;
    const Py_ssize_t ahead = prefetch_ahead;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        if (ahead && i + ahead < m && d[i + ahead] > 0)
            PREFETCH((const char *)ix.buf + s[i + ahead] * ix.itemsize, 0);
        if (d[i] <= fanout) {
            for (int64_t c = 0; c < d[i]; c++, k++) { out[k] = at(&ix, s[i] + c); dst[k] = i; }
            continue;
        }
        /* Floyd: round r picks from [0, j], j = deg - fanout + r; a pick already taken becomes j */
        for (int64_t r = 0; r < fanout; r++) {
            int64_t j = d[i] - fanout + r;
            int64_t t = (int64_t)(uu[r * partial + p] * (double)(j + 1));
            if (t > j) t = j;
            for (int64_t q = 0; q < r; q++)
                if (sel[q] == t) { t = j; break; }
            sel[r] = t;
        }
        if (fanout <= 64) sort_small(sel, fanout); else qsort(sel, (size_t)fanout, sizeof(int64_t), cmp_i64);
        for (int64_t c = 0; c < fanout; c++, k++) { out[k] = at(&ix, s[i] + sel[c]); dst[k] = i; }
        p++;
    }
    Py_END_ALLOW_THREADS
    free(sel);
    ret = Py_None;
    Py_INCREF(ret);
release:
    release_vecs(6, v);
    return ret;
}

PyDoc_STRVAR(dedup_doc, "dedup(local, cand, m, loc, new) -> number of new ids\n"
             "Local ids of `cand` in the batch: a node already in `local` (>= 0) keeps its id; an unseen one gets\n"
             "m, m + 1, ... in order of first appearance and is listed in `new`. local: int32 over every node\n"
             "(-1: not in the batch), updated; cand: int64; loc, new: int64 as long as cand.");

static PyObject *dedup(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *o[4];
    long long m;
    if (!PyArg_ParseTuple(args, "OOLOO", &o[0], &o[1], &m, &o[2], &o[3])) return NULL;
    Py_buffer v[4];
    if (get_vecs(4, o, v, "wrww", (const char *const[]){"local", "cand", "loc", "new"}) < 0) return NULL;
    Py_buffer lc = v[0], cd = v[1], lo = v[2], nw = v[3];
    PyObject *ret = NULL;
    Py_ssize_t k = cd.shape[0], n = lc.shape[0], bad = -1;
    if (lc.itemsize != 4 || cd.itemsize != 8 || lo.itemsize != 8 || nw.itemsize != 8 || lo.shape[0] != k ||
        nw.shape[0] != k) {
        PyErr_SetString(PyExc_ValueError, "local must be int32; cand, loc and new int64, loc and new as long as cand");
        goto done;
    }
    if (m < 0 || m + k > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "a batch of %lld + %zd nodes does not fit 32-bit local ids", m, k);
        goto done;
    }
    int32_t *l = lc.buf;
    const int64_t *c = cd.buf;
    int64_t *out = lo.buf, *fresh = nw.buf, nn = 0;
    const Py_ssize_t ahead = prefetch_ahead;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        if (ahead && i + ahead < k && c[i + ahead] >= 0 && c[i + ahead] < n) PREFETCH(l + c[i + ahead], 1);
        int64_t node = c[i];
        if (node < 0 || node >= n) { bad = i; break; }
        if (l[node] < 0) { l[node] = (int32_t)(m + nn); fresh[nn++] = node; }
        out[i] = l[node];
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {  /* leave the table as it was: the ids this call added go back to -1 */
        for (int64_t i = 0; i < nn; i++) l[fresh[i]] = -1;
        PyErr_Format(PyExc_IndexError, "node %lld is not in the table of %zd nodes", (long long)c[bad], n);
        goto done;
    }
    ret = PyLong_FromLongLong(nn);
done:
    release_vecs(4, v);
    return ret;
}

PyDoc_STRVAR(clear_doc, "clear(local, ids) -> None\n"
             "local[ids] = -1: the batch's nodes leave the table (local: int32; ids: int64, each a node of it).");

static PyObject *clear(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *o[2];
    if (!PyArg_ParseTuple(args, "OO", &o[0], &o[1])) return NULL;
    Py_buffer v[2];
    if (get_vecs(2, o, v, "wr", (const char *const[]){"local", "ids"}) < 0) return NULL;
    Py_buffer lc = v[0], id = v[1];
    PyObject *ret = NULL;
    Py_ssize_t k = id.shape[0], n = lc.shape[0], bad = -1;
    if (lc.itemsize != 4 || id.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "local must be int32 and ids int64");
        goto done;
    }
    int32_t *l = lc.buf;
    const int64_t *ids = id.buf;
    for (Py_ssize_t i = 0; i < k; i++)
        if (ids[i] < 0 || ids[i] >= n) { bad = i; break; }
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "node %lld is not in the table of %zd nodes", (long long)ids[bad], n);
        goto done;
    }
    const Py_ssize_t ahead = prefetch_ahead;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        if (ahead && i + ahead < k) PREFETCH(l + ids[i + ahead], 1);
        l[ids[i]] = -1;
    }
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    release_vecs(2, v);
    return ret;
}

PyDoc_STRVAR(prefetch_doc, "prefetch(ahead=None) -> int\n"
             "How many items on the loops prefetch (0: none); sets it when given. Returns the value in force.");

static PyObject *prefetch(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *given = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &given)) return NULL;
    if (given != Py_None) {
        Py_ssize_t ahead = PyLong_AsSsize_t(given);
        if (ahead == -1 && PyErr_Occurred()) return NULL;
        if (ahead < 0 || ahead > 1024) return PyErr_Format(PyExc_ValueError, "ahead must be 0..1024, not %zd", ahead);
        prefetch_ahead = ahead;
    }
    return PyLong_FromSsize_t(prefetch_ahead);
}

static PyMethodDef methods[] = {
    {"prepare", prepare, METH_VARARGS, prepare_doc},
    {"fill", fill, METH_VARARGS, fill_doc},
    {"dedup", dedup, METH_VARARGS, dedup_doc},
    {"clear", clear, METH_VARARGS, clear_doc},
    {"prefetch", prefetch, METH_VARARGS, prefetch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampling",
                                    "The neighbour sampler's per-hop loops (moment.workload.sampler).", -1, methods};

PyMODINIT_FUNC PyInit__sampling(void) { return PyModule_Create(&module); }
