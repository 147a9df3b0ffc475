/*
 * moment.io._native: batched positional reads for the per-rank I/O stack.
 *
 * Why a CPython extension (not ctypes): a whole batch crosses the boundary once as buffers
 * (numpy arrays), the GIL is released while waiting, and setuptools builds it as an optional
 * extension with no extra loader code.
 *
 * One Engine = one submission queue (FIFO of batches) + one completion queue (FIFO of finished
 * batches).  Two kinds share that front end:
 *   - "io_uring": two I/O threads each own a ring of half the `qd` entries, keep it full from the
 *     pending batches, reap CQEs; Python submitters wake them through eventfds polled in the rings.
 *   - "pthreads": `threads` workers each pull one request at a time and pread() it.
 * Unaligned requests are read, rounded outward to `align`, into per-slot bounce buffers and the
 * wanted bytes copied to the destination; aligned requests into aligned memory are read in place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MOMENT_HAVE_LIBURING
#include <liburing.h>
#include <sys/eventfd.h>
#include <poll.h>
#endif

#define KIND_PTHREADS 0
#define KIND_URING 1
#define MAX_QD 4096
#define MAX_CHUNK ((int64_t)1 << 30) /* one kernel read at most; longer requests continue */
#define WAKE_TAG UINT64_MAX
#define SUBMIT_GROUP 4 /* io_uring: SQEs per submission at most (see issue_slot) */
#define SUBMIT_ALONE ((int64_t)64 << 10) /* io_uring: a read this long goes out in a call of its own */
#if defined(__GNUC__)
#define PREFETCH_READ(p, locality) __builtin_prefetch((p), 0, (locality))
#else
#define PREFETCH_READ(p, locality) ((void)(p))
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_STREAM_STORES 1
/* One row written past the cache; `to` 16-byte aligned, `bytes` a multiple of 16. */
static inline void stream_row(char *to, const char *from, long long bytes) {
    for (long long k = 0; k < bytes; k += 16)
        _mm_stream_si128((__m128i *)(to + k), _mm_loadu_si128((const __m128i *)(from + k)));
}
#else
#define HAVE_STREAM_STORES 0
#define stream_row(to, from, bytes) memcpy((to), (from), (size_t)(bytes)) /* never called: `streamed` is 0 */
#endif

typedef struct {
    int fd;
    int64_t off, len; /* what the caller wants */
    char *dst;
    int64_t aoff, alen; /* what is read from the file (rounded outward) */
    int inplace;        /* read straight into dst */
} req_t;

typedef struct batch {
    int64_t id;
    req_t *reqs;
    int64_t n, next, remaining;
    int64_t bytes_read;
    int64_t err_index; /* -1: no error; else index into the caller's arrays */
    int err_code;      /* errno; 0 with err_index >= 0 means a short read */
    int64_t err_got;   /* bytes obtained before the short read */
    int64_t *orig_index;
    int64_t align;
    int done;
    Py_buffer view;
    struct batch *next_pending, *next_done, *next_live;
} batch_t;

typedef struct {
    req_t *r;
    batch_t *b;
    int64_t idx;
    char *bounce;
    size_t cap;
    int64_t got;
} slot_t;

#ifdef MOMENT_HAVE_LIBURING
/* One ring and the I/O thread that owns it: its share of the engine's queue depth in slots. */
typedef struct {
    struct engine *e;
    struct io_uring ring;
    int ok, efd, qd; /* ok: 1 ring and eventfd open, 2 the eventfd only (the ring is gone) */
    slot_t *slots;
    int *free_slots, nfree;
} uring_t;
#endif

typedef struct engine {
    PyObject_HEAD int kind;
    int qd, nthreads, started, stopping;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    batch_t *pend_head, *pend_tail, *done_head, *done_tail, *live;
    int64_t next_id;
    pthread_t *threads;
#ifdef MOMENT_HAVE_LIBURING
    uring_t *rings;
    int nrings;
#endif
} Engine;

/* ---------- shared helpers (engine lock held unless noted) ---------- */

static int ensure_bounce(char **buf, size_t *cap, size_t need) {
    if (*cap >= need) return 0;
    void *p = NULL;
    size_t sz = need < 65536 ? 65536 : need;
    if (posix_memalign(&p, 4096, sz) != 0) return ENOMEM;
    free(*buf);
    *buf = p;
    *cap = sz;
    return 0;
}

static void push_done(Engine *e, batch_t *b) {
    b->done = 1;
    b->next_done = NULL;
    if (e->done_tail) e->done_tail->next_done = b; else e->done_head = b;
    e->done_tail = b;
    pthread_cond_broadcast(&e->done_cv);
}

static void finish_req(Engine *e, batch_t *b, int64_t idx, int64_t got, int err, int short_read) {
    b->bytes_read += got;
    if ((err || short_read) && b->err_index < 0) {
        b->err_index = b->orig_index[idx];
        b->err_code = err;
        b->err_got = got;
    }
    if (--b->remaining == 0) push_done(e, b);
}

/* Next request to issue, or NULL.  Batches that already failed drop their unissued requests. */
static req_t *take_req(Engine *e, batch_t **bp, int64_t *idxp) {
    while (e->pend_head) {
        batch_t *b = e->pend_head;
        if (b->err_index >= 0 || e->stopping) {
            int64_t left = b->n - b->next;
            if (b->err_index < 0) { b->err_index = b->orig_index[b->next]; b->err_code = ECANCELED; }
            b->next = b->n;
            b->remaining -= left;
            e->pend_head = b->next_pending;
            if (!e->pend_head) e->pend_tail = NULL;
            if (b->remaining == 0) push_done(e, b);
            continue;
        }
        int64_t i = b->next++;
        if (b->next == b->n) {
            e->pend_head = b->next_pending;
            if (!e->pend_head) e->pend_tail = NULL;
        }
        *bp = b;
        *idxp = i;
        return &b->reqs[i];
    }
    return NULL;
}

/* After `got` bytes of r: 1 = finished, 0 = read more, -1 = short read (EOF before the wanted end). */
static int progress(const req_t *r, int64_t got, int64_t res, int64_t align) {
    int64_t need = r->off + r->len - r->aoff;
    if (got >= need) return 1;
    if (res == 0 || (got % align) != 0) return -1;
    return 0;
}

static void deliver(const req_t *r, const char *bounce) {
    if (!r->inplace) memcpy(r->dst, bounce + (r->off - r->aoff), (size_t)r->len);
}

/* ---------- pthreads backend ---------- */

/* The kernel's name for an engine thread (top -H, perf): otherwise it shows the rank's own name and its reads'
   kernel time (io_uring_enter, the block layer) is counted as the rank's. */
static void name_thread(const char *name) {
#ifdef __linux__
    pthread_setname_np(pthread_self(), name);
#else
    (void)name;
#endif
}

static void *worker_main(void *arg) {
    Engine *e = (Engine *)arg;
    name_thread("io-pread");
    char *bounce = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        batch_t *b;
        int64_t idx;
        req_t *r = take_req(e, &b, &idx);
        if (!r) {
            if (e->stopping) break;
            pthread_cond_wait(&e->work_cv, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        int err = 0, st = 0;
        int64_t got = 0;
        char *base = r->dst;
        if (!r->inplace) {
            err = ensure_bounce(&bounce, &cap, (size_t)r->alen);
            base = bounce;
        }
        while (!err) {
            int64_t want = r->alen - got;
            if (want > MAX_CHUNK) want = MAX_CHUNK;
            ssize_t res = pread(r->fd, base + got, (size_t)want, r->aoff + got);
            if (res < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                err = errno;
                break;
            }
            got += res;
            st = progress(r, got, res, b->align);
            if (st != 0) break;
        }
        if (!err && st == 1) deliver(r, bounce);
        pthread_mutex_lock(&e->mu);
        finish_req(e, b, idx, got, err, !err && st < 0);
    }
    pthread_mutex_unlock(&e->mu);
    free(bounce);
    return NULL;
}

/* ---------- io_uring backend ---------- */

#ifdef MOMENT_HAVE_LIBURING
static struct io_uring_sqe *get_sqe(struct io_uring *ring) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    while (!sqe) {
        io_uring_submit(ring);
        sqe = io_uring_get_sqe(ring);
    }
    return sqe;
}

static void arm_wake(uring_t *u) {
    struct io_uring_sqe *sqe = get_sqe(&u->ring);
    io_uring_prep_poll_add(sqe, u->efd, POLLIN);
    sqe->user_data = WAKE_TAG;
}

/* Each group's system call also runs the completions deferred to this thread (GETEVENTS, as fio's
 * io_uring engine enters): with DEFER_TASKRUN a CQE is otherwise posted only at the next wait, so the
 * loop would see finished reads, and refill their slots, one wait later. */
static void submit_group(struct io_uring *ring) {
#ifdef MOMENT_HAVE_SUBMIT_GET_EVENTS
    io_uring_submit_and_get_events(ring);
#else
    io_uring_submit(ring);
#endif
}

static void issue_slot(uring_t *u, int s) {
    slot_t *sl = &u->slots[s];
    req_t *r = sl->r;
    int64_t want = r->alen - sl->got;
    if (want > MAX_CHUNK) want = MAX_CHUNK;
    char *base = r->inplace ? r->dst : sl->bounce;
    struct io_uring_sqe *sqe = get_sqe(&u->ring);
    io_uring_prep_read(sqe, r->fd, base + sl->got, (unsigned)want, (uint64_t)(r->aoff + sl->got));
    sqe->user_data = (uint64_t)s;
    /* Submit in small groups: a burst of completions refilled as one burst of submissions keeps the
     * device in lockstep bursts (measured on a virtio disk: 58k IOPS at QD32 batched, 69-75k in
     * groups of 4, as fio's one-at-a-time submission); four per system call costs little CPU.
     * A long read goes alone: submitted together, neighbouring reads of a contiguous span (a packed
     * segment's 1 MiB reads) are merged by the block layer's plug into one request of up to 4 MiB,
     * and the same bytes in flight become a third as many requests for the disk to serve at once.
     * Measured on this project's virtio disk, replaying the 8M bench's packed reads: 3.2 MiB per
     * device request in groups, 1 MiB alone, 1.09-1.12x the MB/s; its cost, a system call per read
     * of 64 KiB and more, is a few microseconds against the tens a read of that size takes. */
    if (want >= SUBMIT_ALONE || io_uring_sq_ready(&u->ring) >= SUBMIT_GROUP) submit_group(&u->ring);
}

/* The ring is unusable: fail what is in flight and queued with `err`, and stop taking work. */
static void fail_ring(uring_t *u, int err) {
    Engine *e = u->e;
    for (int s = 0; s < u->qd; s++) {
        int used = 1;
        for (int k = 0; k < u->nfree; k++) if (u->free_slots[k] == s) { used = 0; break; }
        if (used) finish_req(e, u->slots[s].b, u->slots[s].idx, 0, err, 0);
    }
    e->stopping = 1;
    batch_t *b; int64_t idx;
    while (take_req(e, &b, &idx)) {}
}

static void *uring_main(void *arg) {
    uring_t *u = (uring_t *)arg;
    Engine *e = u->e;
    name_thread("io-ring");
    int inflight = 0;
#ifdef IORING_SETUP_R_DISABLED
    if ((u->ring.flags & IORING_SETUP_R_DISABLED) && io_uring_enable_rings(&u->ring) < 0) {
        /* e.g. a seccomp filter that allows io_uring_setup but not io_uring_register: a plain ring */
        io_uring_queue_exit(&u->ring);
        int ret = io_uring_queue_init((unsigned)u->qd + 2, &u->ring, 0);
        if (ret < 0) {
            u->ok = 2; /* the eventfd stays open, the ring is gone */
            pthread_mutex_lock(&e->mu);
            fail_ring(u, -ret);
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
    }
#endif
    arm_wake(u);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (e->stopping && inflight == 0 && !e->pend_head) { pthread_mutex_unlock(&e->mu); break; }
        while (u->nfree > 0) {
            batch_t *b;
            int64_t idx;
            req_t *r = take_req(e, &b, &idx);
            if (!r) break;
            int s = u->free_slots[--u->nfree];
            slot_t *sl = &u->slots[s];
            sl->r = r; sl->b = b; sl->idx = idx; sl->got = 0;
            if (!r->inplace && ensure_bounce(&sl->bounce, &sl->cap, (size_t)r->alen) != 0) {
                u->free_slots[u->nfree++] = s;
                finish_req(e, b, idx, 0, ENOMEM, 0);
                continue;
            }
            issue_slot(u, s);
            inflight++;
        }
        int stop_now = e->stopping && inflight == 0 && !e->pend_head;
        pthread_mutex_unlock(&e->mu);
        if (stop_now) break;
        int ret = io_uring_submit_and_wait(&u->ring, 1);
        if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY && ret != -ETIME) {
            pthread_mutex_lock(&e->mu);
            fail_ring(u, -ret);
            pthread_mutex_unlock(&e->mu);
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        int rearm = 0;
        pthread_mutex_lock(&e->mu);
        io_uring_for_each_cqe(&u->ring, head, cqe) {
            seen++;
            if (cqe->user_data == WAKE_TAG) {
                eventfd_t v;
                (void)eventfd_read(u->efd, &v);
                rearm = 1;
                continue;
            }
            int s = (int)cqe->user_data;
            slot_t *sl = &u->slots[s];
            int res = cqe->res;
            if (res == -EAGAIN || res == -EINTR) { issue_slot(u, s); continue; }
            int err = res < 0 ? -res : 0, st = 0;
            if (!err) {
                sl->got += res;
                st = progress(sl->r, sl->got, res, sl->b->align);
                if (st == 0) { issue_slot(u, s); continue; }
                if (st == 1) deliver(sl->r, sl->bounce);
            }
            finish_req(e, sl->b, sl->idx, sl->got, err, !err && st < 0);
            u->free_slots[u->nfree++] = s;
            inflight--;
        }
        io_uring_cq_advance(&u->ring, seen);
        pthread_mutex_unlock(&e->mu);
        if (rearm) arm_wake(u);
    }
    return NULL;
}

/* The ring's flags, most helpful first, as fio sets them: completions are run when the I/O thread asks
 * for them (DEFER_TASKRUN, which needs one submitting thread: the ring starts disabled and the I/O
 * thread enables it, becoming its single issuer) and never by interrupting it (COOP_TASKRUN).  On a
 * small VM the interrupts cost a fifth of the 4 KiB IOPS.  Kernels without them get a plain ring. */
static const unsigned RING_FLAGS[] = {
#if defined(IORING_SETUP_DEFER_TASKRUN) && defined(IORING_SETUP_R_DISABLED)
    IORING_SETUP_R_DISABLED | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN,
#endif
#ifdef IORING_SETUP_COOP_TASKRUN
    IORING_SETUP_COOP_TASKRUN,
#endif
    0,
};

static int ring_setup(uring_t *u) {
    int ret = -EINVAL;
    for (size_t i = 0; i < sizeof(RING_FLAGS) / sizeof(RING_FLAGS[0]); i++) {
        struct io_uring_params p;
        memset(&p, 0, sizeof(p));
        p.flags = RING_FLAGS[i];
        ret = io_uring_queue_init_params((unsigned)u->qd + 2, &u->ring, &p);
        if (ret != -EINVAL) break;
    }
    if (ret < 0) return -ret;
    struct io_uring_probe *p = io_uring_get_probe_ring(&u->ring);
    int ok = p && io_uring_opcode_supported(p, IORING_OP_READ) && io_uring_opcode_supported(p, IORING_OP_POLL_ADD);
    if (p) io_uring_free_probe(p);
    if (!ok) { io_uring_queue_exit(&u->ring); return ENOTSUP; }
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd < 0) { int er = errno; io_uring_queue_exit(&u->ring); return er; }
    u->ok = 1;
    u->slots = calloc((size_t)u->qd, sizeof(slot_t));
    u->free_slots = calloc((size_t)u->qd, sizeof(int));
    if (!u->slots || !u->free_slots) return ENOMEM;
    for (int i = 0; i < u->qd; i++) u->free_slots[i] = u->qd - 1 - i;
    u->nfree = u->qd;
    return 0;
}

/* Two rings, each with its own thread and half the queue depth: on a CPU shared with other work one
 * thread waiting for its turn to run no longer stalls every read in flight (measured on a 2-core VM
 * under load: 1.1-1.4x the IOPS of one ring of the same total depth, as fio gains with two jobs). */
#define URING_RINGS 2

static int uring_setup(Engine *e) {
    e->nrings = e->qd < URING_RINGS ? e->qd : URING_RINGS;
    e->rings = calloc((size_t)e->nrings, sizeof(uring_t));
    if (!e->rings) return ENOMEM;
    for (int i = 0; i < e->nrings; i++) {
        uring_t *u = &e->rings[i];
        u->e = e;
        u->qd = e->qd / e->nrings + (i < e->qd % e->nrings);
        int err = ring_setup(u);
        if (err) return err;
    }
    return 0;
}
#endif

/* ---------- Python type ---------- */

static void free_batch(batch_t *b) {
    if (b->view.obj) PyBuffer_Release(&b->view);
    free(b->reqs);
    free(b->orig_index);
    free(b);
}

static void wake(Engine *e) {
#ifdef MOMENT_HAVE_LIBURING
    if (e->kind == KIND_URING) {
        for (int i = 0; i < e->nrings; i++) (void)eventfd_write(e->rings[i].efd, 1);
        return;
    }
#endif
    pthread_cond_broadcast(&e->work_cv);
}

static void engine_stop(Engine *e) {
    if (!e->started) return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_mutex_unlock(&e->mu);
    wake(e);
    for (int i = 0; i < e->nthreads; i++) pthread_join(e->threads[i], NULL);
    Py_END_ALLOW_THREADS
    e->started = 0;
}

static void Engine_dealloc(Engine *e) {
    engine_stop(e);
    batch_t *b = e->live;
    while (b) { batch_t *nx = b->next_live; free_batch(b); b = nx; }
    free(e->threads);
#ifdef MOMENT_HAVE_LIBURING
    for (int r = 0; e->rings && r < e->nrings; r++) {
        uring_t *u = &e->rings[r];
        if (u->ok) {
            if (u->ok == 1) io_uring_queue_exit(&u->ring);
            close(u->efd);
        }
        if (u->slots) for (int i = 0; i < u->qd; i++) free(u->slots[i].bounce);
        free(u->slots);
        free(u->free_slots);
    }
    free(e->rings);
#endif
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work_cv);
    pthread_cond_destroy(&e->done_cv);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"kind", "queue_depth", "threads", NULL};
    const char *kind;
    int qd = 32, nthreads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|ii", kwlist, &kind, &qd, &nthreads)) return -1;
    if (qd < 1 || qd > MAX_QD) { PyErr_Format(PyExc_ValueError, "queue_depth must be 1..%d", MAX_QD); return -1; }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->qd = qd;
    e->next_id = 1;
    if (strcmp(kind, "pthreads") == 0) {
        e->kind = KIND_PTHREADS;
        e->nthreads = nthreads > 0 ? nthreads : qd;
    } else if (strcmp(kind, "io_uring") == 0) {
#ifdef MOMENT_HAVE_LIBURING
        e->kind = KIND_URING;
        int err = uring_setup(e);
        if (err) { errno = err; PyErr_SetFromErrno(PyExc_OSError); return -1; }
        e->nthreads = e->nrings;
#else
        PyErr_SetString(PyExc_OSError, "built without liburing");
        return -1;
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "unknown engine kind %s", kind);
        return -1;
    }
    e->threads = calloc((size_t)e->nthreads, sizeof(pthread_t));
    if (!e->threads) { PyErr_NoMemory(); return -1; }
    for (int i = 0; i < e->nthreads; i++) {
        void *(*fn)(void *) = worker_main;
        void *arg = e;
#ifdef MOMENT_HAVE_LIBURING
        if (e->kind == KIND_URING) { fn = uring_main; arg = &e->rings[i]; }
#endif
        int rc = pthread_create(&e->threads[i], NULL, fn, arg);
        if (rc) {
            e->nthreads = i;
            e->started = 1;
            engine_stop(e);
            errno = rc;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
    }
    e->started = 1;
    return 0;
}

/* A 1-d contiguous array of size_a- or size_b-byte items (the same size twice: that size alone). */
static int get_vec(PyObject *o, Py_buffer *v, const char *name, int writable, int size_a, int size_b) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (v->ndim != 1 || (v->itemsize != size_a && v->itemsize != size_b)) {
        if (size_a == size_b)
            PyErr_Format(PyExc_TypeError, "%s must be a 1-d array of %d-byte integers", name, size_a);
        else
            PyErr_Format(PyExc_TypeError, "%s must be a 1-d array of %d- or %d-byte integers", name, size_a, size_b);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static int get_array(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *name) {
    return get_vec(o, v, name, 0, (int)itemsize, (int)itemsize);
}

PyDoc_STRVAR(submit_doc, "submit(fds, offsets, lengths, dest_offsets, dest, align) -> batch id\n"
             "int32 fds, int64 offsets/lengths/dest_offsets; dest: writable contiguous buffer.");

static PyObject *Engine_submit(Engine *e, PyObject *args) {
    PyObject *ofd, *ooff, *olen, *odoff, *odest;
    long long align;
    if (!PyArg_ParseTuple(args, "OOOOOL", &ofd, &ooff, &olen, &odoff, &odest, &align)) return NULL;
    if (align < 1 || (align & (align - 1))) return PyErr_Format(PyExc_ValueError, "align must be a power of two");
    if (!e->started || e->stopping) return PyErr_Format(PyExc_RuntimeError, "engine is closed");
    Py_buffer vfd, voff, vlen, vdoff;
    if (get_array(ofd, &vfd, 4, "fds") < 0) return NULL;
    if (get_array(ooff, &voff, 8, "offsets") < 0) { PyBuffer_Release(&vfd); return NULL; }
    if (get_array(olen, &vlen, 8, "lengths") < 0) { PyBuffer_Release(&vfd); PyBuffer_Release(&voff); return NULL; }
    if (get_array(odoff, &vdoff, 8, "dest_offsets") < 0) {
        PyBuffer_Release(&vfd); PyBuffer_Release(&voff); PyBuffer_Release(&vlen); return NULL;
    }
    PyObject *result = NULL;
    batch_t *b = calloc(1, sizeof(batch_t));
    Py_ssize_t n = vfd.shape[0];
    if (!b) { PyErr_NoMemory(); goto out; }
    if (voff.shape[0] != n || vlen.shape[0] != n || vdoff.shape[0] != n) {
        PyErr_SetString(PyExc_ValueError, "request arrays differ in length");
        goto fail;
    }
    if (PyObject_GetBuffer(odest, &b->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto fail;
    b->reqs = malloc(sizeof(req_t) * (size_t)(n ? n : 1));
    b->orig_index = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!b->reqs || !b->orig_index) { PyErr_NoMemory(); goto fail; }
    const int32_t *fd = vfd.buf;
    const int64_t *off = voff.buf, *len = vlen.buf, *doff = vdoff.buf;
    char *dest = b->view.buf;
    int64_t dlen = b->view.len, m = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (off[i] < 0 || len[i] < 0 || doff[i] < 0 || doff[i] > dlen - len[i]) {
            PyErr_Format(PyExc_ValueError, "request %zd out of range of the destination", i);
            goto fail;
        }
        if (len[i] == 0) continue;
        req_t *r = &b->reqs[m];
        r->fd = fd[i];
        r->off = off[i];
        r->len = len[i];
        r->dst = dest + doff[i];
        r->aoff = off[i] & ~(int64_t)(align - 1);
        r->alen = ((off[i] + len[i] + align - 1) & ~(int64_t)(align - 1)) - r->aoff;
        r->inplace = r->aoff == r->off && r->alen == r->len && ((uintptr_t)r->dst % (uintptr_t)align) == 0;
        b->orig_index[m++] = i;
    }
    b->n = m;
    b->remaining = m;
    b->err_index = -1;
    b->align = align;
    pthread_mutex_lock(&e->mu);
    b->id = e->next_id++;
    b->next_live = e->live;
    e->live = b;
    if (m == 0) {
        push_done(e, b);
    } else {
        if (e->pend_tail) e->pend_tail->next_pending = b; else e->pend_head = b;
        e->pend_tail = b;
    }
    pthread_mutex_unlock(&e->mu);
    if (m) wake(e);
    result = PyLong_FromLongLong(b->id);
    goto out;
fail:
    if (b) free_batch(b);
out:
    PyBuffer_Release(&vfd); PyBuffer_Release(&voff); PyBuffer_Release(&vlen); PyBuffer_Release(&vdoff);
    return result;
}

static void unlink_done(Engine *e, batch_t *b) {
    batch_t **pp = &e->done_head, *prev = NULL;
    while (*pp && *pp != b) { prev = *pp; pp = &(*pp)->next_done; }
    if (*pp) { *pp = b->next_done; if (e->done_tail == b) e->done_tail = prev; }
    batch_t **lp = &e->live;
    while (*lp && *lp != b) lp = &(*lp)->next_live;
    if (*lp) *lp = b->next_live;
}

PyDoc_STRVAR(reap_doc, "reap(batch_id, min_count, timeout) -> [(id, bytes_read, err_index, errno, got)]\n"
             "batch_id > 0 waits for that batch; else for min_count finished batches. timeout < 0: forever.");

static PyObject *Engine_reap(Engine *e, PyObject *args) {
    long long want_id;
    int min_count;
    double timeout;
    if (!PyArg_ParseTuple(args, "Lid", &want_id, &min_count, &timeout)) return NULL;
    struct timespec dl;
    if (timeout >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        double t = (double)dl.tv_nsec / 1e9 + timeout;
        dl.tv_sec += (time_t)t;
        dl.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    }
    batch_t *got_list = NULL, **tail = &got_list;
    int unknown = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (want_id > 0) {
            batch_t *b = e->live;
            while (b && b->id != want_id) b = b->next_live;
            if (!b) { unknown = 1; break; }
            if (b->done) { unlink_done(e, b); b->next_done = NULL; *tail = b; break; }
        } else {
            int cnt = 0;
            for (batch_t *b = e->done_head; b; b = b->next_done) cnt++;
            if (cnt >= min_count && (cnt > 0 || timeout == 0 || min_count <= 0)) {
                while (e->done_head) {
                    batch_t *b = e->done_head;
                    unlink_done(e, b);
                    b->next_done = NULL;
                    *tail = b;
                    tail = &b->next_done;
                }
                break;
            }
        }
        if (timeout == 0) break;
        if (timeout < 0) pthread_cond_wait(&e->done_cv, &e->mu);
        else if (pthread_cond_timedwait(&e->done_cv, &e->mu, &dl) == ETIMEDOUT) {
            if (want_id <= 0) {
                while (e->done_head) {
                    batch_t *b = e->done_head;
                    unlink_done(e, b);
                    b->next_done = NULL;
                    *tail = b;
                    tail = &b->next_done;
                }
            }
            break;
        }
    }
    pthread_mutex_unlock(&e->mu);
    Py_END_ALLOW_THREADS
    if (unknown) return PyErr_Format(PyExc_KeyError, "unknown or already reaped batch %lld", want_id);
    PyObject *lst = PyList_New(0);
    batch_t *b = got_list;
    while (b) {
        batch_t *nx = b->next_done;
        if (lst) {
            PyObject *t = Py_BuildValue("(LLLiL)", (long long)b->id, (long long)b->bytes_read,
                                        (long long)b->err_index, b->err_code, (long long)b->err_got);
            if (!t || PyList_Append(lst, t) < 0) Py_CLEAR(lst);
            Py_XDECREF(t);
        }
        free_batch(b);
        b = nx;
    }
    return lst;
}

static PyObject *Engine_close(Engine *e, PyObject *Py_UNUSED(ignored)) {
    engine_stop(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_get_kind(Engine *e, void *Py_UNUSED(c)) {
    return PyUnicode_FromString(e->kind == KIND_URING ? "io_uring" : "pthreads");
}

static PyMethodDef Engine_methods[] = {
    {"submit", (PyCFunction)Engine_submit, METH_VARARGS, submit_doc},
    {"reap", (PyCFunction)Engine_reap, METH_VARARGS, reap_doc},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "Stop the I/O threads; queued requests are cancelled."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Engine_getset[] = {
    {"kind", (getter)Engine_get_kind, NULL, "io_uring or pthreads", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "moment.io._native.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Batched read engine with its own submission and completion queues.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

static PyObject *uring_usable(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(a)) {
#ifdef MOMENT_HAVE_LIBURING
    struct io_uring ring;
    int ret = io_uring_queue_init(4, &ring, 0);
    if (ret < 0) return Py_BuildValue("(Os)", Py_False, strerror(-ret));
    struct io_uring_probe *p = io_uring_get_probe_ring(&ring);
    int ok = p && io_uring_opcode_supported(p, IORING_OP_READ) && io_uring_opcode_supported(p, IORING_OP_POLL_ADD);
    if (p) io_uring_free_probe(p);
    io_uring_queue_exit(&ring);
    if (!ok) return Py_BuildValue("(Os)", Py_False, "kernel lacks IORING_OP_READ/POLL_ADD");
    return Py_BuildValue("(Os)", Py_True, "");
#else
    return Py_BuildValue("(Os)", Py_False, "built without liburing headers");
#endif
}

PyDoc_STRVAR(copy_rows_doc, "copy_rows(dst, dst_rows, src, src_index, src_stride, row_bytes, ahead=8, stream=-1)\n"
             "For each i: dst row dst_rows[i] (i when dst_rows is None) = the row_bytes bytes of src at byte\n"
             "src_index[i] * src_stride. dst: writable contiguous buffer of whole rows; dst_rows, src_index: 1-d\n"
             "int64. Every index is checked before any byte moves; the copy runs without the GIL. The source row\n"
             "`ahead` rows on is prefetched (0: none, as bench/row_copy.py compares). stream: -1 streaming stores\n"
             "where they pay (see below), 0 never, 1 wherever rows and destination allow them.");

/* The gather path's row copies (a finished read's rows into a job's buffer, a job's or the CPU cache's rows
   into the batch): one memcpy per row, where NumPy's fancy indexing copies through a temporary (two passes)
   and holds the GIL. The source rows are random rows of a large segment (the CPU cache's): each starts with a
   cache and TLB miss, which the copy would wait for one row after another; the row COPY_AHEAD rows on is
   prefetched (its first COPY_PREFETCH_BYTES), so that several misses are outstanding at once. Measured on this
   project's 2-core machines, random rows of a 2 GiB segment in C: 512-byte rows 159 -> 111 ns each, 1 KiB rows
   294 -> 255-263 ns, 8 rows ahead the best of 4, 8, 16 and 32; bench/row_copy.py (against none, in shared memory),
   the median of nine runs: 1.19x at 512 B, 1.08x at 1 KiB, 1.06x at 256 B. Writes are not prefetched (scattered
   1 KiB rows were slower with it).
   Where the source is read in order (src_index not decreasing: a finished read's rows, a pack segment's, into the
   batch) the rows are written with streaming stores, which skip the cache: an ordinary store first reads the
   destination's cache line from memory, and a batch of tens of MB is not read again before it leaves the cache
   anyway. Measured here (1 KiB rows, in order from a 47 MB buffer into a batch's scattered rows): 208-245 ns a row
   with memcpy, 97-105 with streaming stores; they paid from 500 KiB up (1.1-1.6x there), not at 125 KiB (0.8x),
   so the copy takes them from STREAM_MIN_BYTES.
   From random rows of a large segment they cost 1.3-2.9x (the loads wait, the stores cannot be merged), so there
   the copy stays memcpy. bench/row_copy.py prints both cases. On the 16M data-only bench run (2 ranks, three runs
   each, alternated) the steady epochs' CPU fell from 1.85-2.05 CPU-s to 1.59-1.86. */
#define COPY_AHEAD 8
#define COPY_PREFETCH_BYTES 2048
#define STREAM_MIN_BYTES (1LL << 20)
static PyObject *copy_rows(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *odst, *odrows, *osrc, *oidx;
    long long stride, rb;
    int ahead_rows = COPY_AHEAD, stream = -1;
    if (!PyArg_ParseTuple(args, "OOOOLL|ii", &odst, &odrows, &osrc, &oidx, &stride, &rb, &ahead_rows, &stream))
        return NULL;
    if (rb < 1 || stride < 1) return PyErr_Format(PyExc_ValueError, "row_bytes and src_stride must be >= 1");
    if (ahead_rows < 0) return PyErr_Format(PyExc_ValueError, "ahead must be >= 0");
    Py_buffer vd, vs, vi, vr;
    int have_rows = odrows != Py_None;
    if (PyObject_GetBuffer(odst, &vd, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(osrc, &vs, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&vd); return NULL; }
    if (get_array(oidx, &vi, 8, "src_index") < 0) { PyBuffer_Release(&vd); PyBuffer_Release(&vs); return NULL; }
    if (have_rows && get_array(odrows, &vr, 8, "dst_rows") < 0) {
        PyBuffer_Release(&vd); PyBuffer_Release(&vs); PyBuffer_Release(&vi); return NULL;
    }
    Py_ssize_t n = vi.shape[0], nd = vd.len / rb;
    const int64_t *idx = vi.buf, *rows = have_rows ? vr.buf : NULL;
    PyObject *ret = NULL;
    if (have_rows && vr.shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "dst_rows has %zd entries, src_index %zd", vr.shape[0], n);
        goto done;
    }
    if (!have_rows && n > nd) {
        PyErr_Format(PyExc_ValueError, "%zd rows do not fit a destination of %zd rows", n, nd);
        goto done;
    }
    int in_order = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        in_order &= i == 0 || idx[i] >= idx[i - 1];
        if (idx[i] < 0 || idx[i] > (vs.len - rb) / stride) {
            PyErr_Format(PyExc_IndexError, "src_index[%zd] = %lld is outside the source", i, (long long)idx[i]);
            goto done;
        }
        if (rows && (rows[i] < 0 || rows[i] >= nd)) {
            PyErr_Format(PyExc_IndexError, "dst_rows[%zd] = %lld is outside the %zd rows of the destination", i,
                         (long long)rows[i], nd);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    char *d = vd.buf;
    const char *sb = vs.buf;
    long long ahead = ahead_rows ? (rb < COPY_PREFETCH_BYTES ? rb : COPY_PREFETCH_BYTES) : 0;
    int streamed = HAVE_STREAM_STORES && stream != 0 && rb % 16 == 0 && (uintptr_t)d % 16 == 0
                   && (stream > 0 || (in_order && (long long)n * rb >= STREAM_MIN_BYTES));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + ahead_rows < n)
            for (long long o = 0; o < ahead; o += 64) PREFETCH_READ(sb + idx[i + ahead_rows] * stride + o, 0);
        char *to = d + (rows ? rows[i] : i) * rb;
        if (streamed)
            stream_row(to, sb + idx[i] * stride, rb);
        else
            memcpy(to, sb + idx[i] * stride, (size_t)rb);
    }
#if HAVE_STREAM_STORES
    if (streamed) _mm_sfence(); /* the streamed rows are seen before anything this thread writes next */
#endif
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&vd);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&vi);
    if (have_rows) PyBuffer_Release(&vr);
    return ret;
}

PyDoc_STRVAR(subsequence_doc, "subsequence(have, want, out) -> bool\n"
             "Whether `want` is `have` with some entries left out, the rest in the same order; then out[i] is the\n"
             "position in `have` of want[i]. have, want, out: 1-d int64, out as long as want.");

/* A batch's misses against its pack segment, both in the batch's order (moment.io.sequences): one pass. */
static PyObject *subsequence(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *ohave, *owant, *oout;
    if (!PyArg_ParseTuple(args, "OOO", &ohave, &owant, &oout)) return NULL;
    Py_buffer vh, vw, vo;
    if (get_array(ohave, &vh, 8, "have") < 0) return NULL;
    if (get_array(owant, &vw, 8, "want") < 0) { PyBuffer_Release(&vh); return NULL; }
    if (PyObject_GetBuffer(oout, &vo, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&vh); PyBuffer_Release(&vw); return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t nh = vh.shape[0], nw = vw.shape[0], j = 0, i = 0;
    if (vo.len != nw * 8) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, want has %zd entries", vo.len, nw);
        goto done;
    }
    const int64_t *h = vh.buf, *w = vw.buf;
    int64_t *o = vo.buf;
    Py_BEGIN_ALLOW_THREADS
    for (; i < nw; i++, j++) {
        while (j < nh && h[j] != w[i]) j++;
        if (j == nh) break;
        o[i] = j;
    }
    Py_END_ALLOW_THREADS
    ret = i == nw ? Py_True : Py_False;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&vh);
    PyBuffer_Release(&vw);
    PyBuffer_Release(&vo);
    return ret;
}

static int64_t floordiv(int64_t a, int64_t b) { /* Python's a // b for b > 0 */
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

PyDoc_STRVAR(plan_runs_doc, "plan_runs(f, off, order, row_bytes, align, merge_gap, max_request, sizes, out) -> (runs, bytes)\n"
             "The aligned runs covering rows at (file f[i], byte offset off[i]), given sorted by (file, offset), merged\n"
             "as moment.io.merge.plan_runs says. f: int32; off, sizes (per file, or None): int64. out: None (count\n"
             "only), or the arrays (run_file int32, run_start, run_len, row_run, row_at int64) to fill: runs in the\n"
             "first three (n entries, the first `runs` filled), row i's in row_run[order[i]], row_at[order[i]].");

/* One sequential pass over the rows in place order: what moment.io.merge.plan_runs computes with NumPy (a
   run per file change or gap wider than `merge_gap`, split every `max_request` bytes from the run's first
   block), without its temporaries; counting alone (out None) lets a shape price every merge gap for the
   cost of one sort. */
static PyObject *plan_runs(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *of, *ooff, *oorder, *osizes, *oout;
    long long rb, align, gap, maxreq;
    if (!PyArg_ParseTuple(args, "OOOLLLLOO", &of, &ooff, &oorder, &rb, &align, &gap, &maxreq, &osizes, &oout))
        return NULL;
    if (rb < 1 || align < 1 || gap < 0) return PyErr_Format(PyExc_ValueError, "row_bytes, align must be >= 1, merge_gap >= 0");
    Py_buffer v[10];
    int got = 0;
    PyObject *ret = NULL;
    const char *names[5] = {"run_file", "run_start", "run_len", "row_run", "row_at"};
    if (get_array(of, &v[got], 4, "f") < 0) goto done;
    got++;
    if (get_array(ooff, &v[got], 8, "off") < 0) goto done;
    got++;
    Py_ssize_t n = v[0].shape[0], nsizes = 0;
    const int32_t *f = v[0].buf;
    const int64_t *off = v[1].buf, *order = NULL, *sizes = NULL;
    if (v[1].shape[0] != n) { PyErr_Format(PyExc_ValueError, "f has %zd entries, off %zd", n, v[1].shape[0]); goto done; }
    if (osizes != Py_None) {
        if (get_array(osizes, &v[got], 8, "sizes") < 0) goto done;
        sizes = v[got].buf;
        nsizes = v[got++].shape[0];
    }
    int32_t *run_file = NULL;
    int64_t *run_start = NULL, *run_len = NULL, *row_run = NULL, *row_at = NULL;
    if (oout != Py_None) {
        if (!PyTuple_Check(oout) || PyTuple_GET_SIZE(oout) != 5 || oorder == Py_None) {
            PyErr_SetString(PyExc_TypeError, "out must be None or a tuple of 5 arrays, with an order");
            goto done;
        }
        if (get_array(oorder, &v[got], 8, "order") < 0) goto done;
        order = v[got++].buf;
        if (v[got - 1].shape[0] != n) { PyErr_Format(PyExc_ValueError, "order has %zd entries, f %zd", v[got - 1].shape[0], n); goto done; }
        int iout = got;
        for (int k = 0; k < 5; k++) {
            if (get_array(PyTuple_GET_ITEM(oout, k), &v[got], k == 0 ? 4 : 8, names[k]) < 0) goto done;
            if (v[got++].readonly || v[got - 1].shape[0] < n) {
                PyErr_Format(PyExc_ValueError, "%s must be writable with at least %zd entries", names[k], n);
                goto done;
            }
        }
        run_file = v[iout].buf;
        run_start = v[iout + 1].buf, run_len = v[iout + 2].buf, row_run = v[iout + 3].buf, row_at = v[iout + 4].buf;
    }
    /* every index checked, and the rows checked to be in place order, before anything is written */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (order && (order[i] < 0 || order[i] >= n)) {
            PyErr_Format(PyExc_IndexError, "order[%zd] = %lld is outside the rows", i, (long long)order[i]);
            goto done;
        }
        if (sizes && (f[i] < 0 || f[i] >= nsizes)) { PyErr_Format(PyExc_IndexError, "file %d has no size", f[i]); goto done; }
        if (i && (f[i] < f[i - 1] || (f[i] == f[i - 1] && off[i] < off[i - 1]))) {
            PyErr_SetString(PyExc_ValueError, "the rows are not in (file, offset) order");
            goto done;
        }
    }
    int64_t runs = 0, bytes = 0;
    Py_BEGIN_ALLOW_THREADS
    const int64_t gap_blocks = gap / align, cap = maxreq / align > 1 ? maxreq / align : 1;
    int shift = -1; /* align a power of two (as always in practice): blocks by a shift, not a division */
    if ((align & (align - 1)) == 0) for (shift = 0; ((int64_t)1 << shift) < align; shift++) {}
    int64_t prev_last = 0, start0 = 0, next_piece = 0, r_first = 0, r_last = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        int64_t first = 0, last = 0;
        int cut = 1;
        if (i < n) {
            first = shift >= 0 ? off[i] >> shift : floordiv(off[i], align); /* >>: a floor, negatives too */
            last = shift >= 0 ? (off[i] + rb - 1) >> shift : floordiv(off[i] + rb - 1, align);
            if (i && f[i] == f[i - 1] && first <= prev_last + 1 + gap_blocks) { /* the same gap-run */
                cut = first >= next_piece; /* in a later piece of `cap` blocks from the gap-run's first */
                if (cut) next_piece = start0 + ((first - start0) / cap + 1) * cap;
            } else {
                start0 = first;
                next_piece = start0 + cap;
            }
        }
        if (cut && i) { /* close the run of rows up to i - 1 */
            int64_t len = (r_last - r_first + 1) * align;
            if (sizes && sizes[f[i - 1]] - r_first * align < len) len = sizes[f[i - 1]] - r_first * align;
            if (run_file) { run_file[runs] = f[i - 1]; run_start[runs] = r_first * align; run_len[runs] = len; }
            bytes += len;
            runs++;
        }
        if (i == n) break;
        if (cut) { r_first = first; r_last = last; }
        else if (last > r_last) r_last = last;
        if (row_run) { row_run[order[i]] = runs; row_at[order[i]] = off[i] - r_first * align; }
        prev_last = last;
    }
    Py_END_ALLOW_THREADS
    ret = Py_BuildValue("(LL)", (long long)runs, (long long)bytes);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    return ret;
}

/* ---- a batch's ids split by what node-indexed tables say of each (moment.io.splits) ---------------- */

/* ids ahead whose table entry is prefetched: enough misses in flight to cover memory's latency */
#define SPLIT_AHEAD 16

static inline int64_t load_int(const void *p, Py_ssize_t i, Py_ssize_t size) {
    switch (size) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const int16_t *)p)[i];
    case 4: return ((const int32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
    }
}

PyDoc_STRVAR(split_held_doc, "split_held(ids, bin, slot, limit, base, on_pos, on_idx, rest_pos) -> on\n"
             "The ids a tier holds, in one pass: node i is bin[i]'s row slot[i], and the tier holds bin b's first limit[b]\n"
             "rows from its row base[b]. on_pos[:on] gets their positions (ascending), on_idx[:on] their rows in the tier,\n"
             "rest_pos[:n - on] the other positions. ids: int64; bin: uint8 or int16; slot: int32 or int64; limit, base:\n"
             "int64, one per bin; the outputs: int64, as long as ids.");

static PyObject *split_held(PyObject *Py_UNUSED(m), PyObject *args) {
    PyObject *o[8];
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7])) return NULL;
    static const char *names[8] = {"ids", "bin", "slot", "limit", "base", "on_pos", "on_idx", "rest_pos"};
    static const int sizes[8][2] = {{8, 8}, {1, 2}, {4, 8}, {8, 8}, {8, 8}, {8, 8}, {8, 8}, {8, 8}};
    Py_buffer v[8];
    int got = 0;
    PyObject *ret = NULL;
    for (; got < 8; got++)
        if (get_vec(o[got], &v[got], names[got], got >= 5, sizes[got][0], sizes[got][1]) < 0) goto done;
    Py_ssize_t n = v[0].shape[0], nodes = v[1].shape[0], bins = v[3].shape[0];
    if (v[2].shape[0] != nodes || v[4].shape[0] != bins || v[5].shape[0] < n || v[6].shape[0] < n || v[7].shape[0] < n) {
        PyErr_SetString(PyExc_ValueError, "bin and slot must have an entry per node, limit and base one per bin, the "
                                          "outputs one per id");
        goto done;
    }
    const int64_t *ids = v[0].buf, *limit = v[3].buf, *base = v[4].buf;
    int64_t *op = v[5].buf, *oi = v[6].buf, *rp = v[7].buf;
    Py_ssize_t on = 0, rest = 0, bad = -1, bsz = v[1].itemsize, ssz = v[2].itemsize;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + SPLIT_AHEAD < n) {
            uint64_t ahead = (uint64_t)ids[i + SPLIT_AHEAD];
            if (ahead < (uint64_t)nodes) PREFETCH_READ((const char *)v[1].buf + ahead * bsz, 3);
        }
        int64_t id = ids[i];
        if (id < 0 || id >= nodes) { bad = i; break; }
        int64_t b = load_int(v[1].buf, id, bsz);
        if (b < 0 || b >= bins) { bad = i; break; }
        int64_t lim = limit[b];
        if (lim > 0) {
            int64_t s = load_int(v[2].buf, id, ssz);
            if (s < lim) {
                op[on] = i;
                oi[on++] = base[b] + s;
                continue;
            }
        }
        rp[rest++] = i;
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0)
        PyErr_Format(PyExc_ValueError, "ids[%zd] = %lld is outside the %zd nodes or in no bin", bad,
                     (long long)ids[bad], nodes);
    else
        ret = PyLong_FromSsize_t(on);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    return ret;
}

static PyMethodDef module_methods[] = {
    {"io_uring_usable", uring_usable, METH_NOARGS, "(ok, reason): does io_uring_queue_init work here?"},
    {"copy_rows", copy_rows, METH_VARARGS, copy_rows_doc},
    {"plan_runs", plan_runs, METH_VARARGS, plan_runs_doc},
    {"subsequence", subsequence, METH_VARARGS, subsequence_doc},
    {"split_held", split_held, METH_VARARGS, split_held_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "moment.io._native", "Native batched read engines for moment.io.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) { Py_DECREF(&EngineType); Py_DECREF(m); return NULL; }
#ifdef MOMENT_HAVE_LIBURING
    PyModule_AddIntConstant(m, "HAVE_LIBURING", 1);
#else
    PyModule_AddIntConstant(m, "HAVE_LIBURING", 0);
#endif
    return m;
}
