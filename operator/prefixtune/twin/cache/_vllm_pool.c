/* vLLM V1's block pool in C: the twin's hot path (issue #3), with exactly the semantics of
 * VllmCache in vllm.py (tests/twin/test_twin_vllm_native.py drives both with the same calls and
 * compares every answer, counter and the whole free queue after each; VllmCache itself is checked
 * against a naive free queue).
 *
 * - A block's hash names the whole prefix ending at it: the pair (segment key, token offset in that
 *   segment) of its last token, as TokenSeq.block_keys (which packs the pair into one int).
 * - Hash map: open addressing, linear probing, backward-shift deletion, at most half full (there
 *   are never more distinct hashes than blocks). A slot maps a hash to the first block holding it;
 *   further holders of the same hash follow it in commit order (dup_next/dup_prev).
 * - Free queue: hashless free blocks on a stack (they all come before any cached block; which one
 *   comes first is unobservable, the order mirrors vllm.py), then the cached free blocks as a
 *   doubly linked LRU list (vLLM's own FreeKVCacheBlockQueue). A block is in the LRU list exactly
 *   when it holds a hash and no request holds it.
 * - Requests: a slot each (blocks, the block hashes of the whole sequence, how many leading blocks
 *   hold theirs), found through a dict request id -> slot.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t key;  /* segment key */
    uint32_t off; /* token offset of the block's end in that segment, >= 1 */
} BlockHash;

typedef struct {
    int64_t key;
    uint32_t off;  /* 0: an empty slot */
    int32_t head;  /* the block hits use */
} Slot;

typedef struct {
    int32_t *blocks;
    Py_ssize_t n_blocks, cap_blocks;
    BlockHash *hashes; /* of the whole sequence's full blocks (prefix caching only) */
    Py_ssize_t n_hashes, cap_hashes;
    Py_ssize_t hashed; /* blocks[0:hashed] hold hashes[0:hashed] */
} Req;

typedef struct {
    PyObject_HEAD
    int32_t num_blocks;
    int32_t block_size;
    int prefix_caching;
    int32_t *ref;      /* requests holding each block */
    int64_t *bkey;     /* the hash each block holds ... */
    uint32_t *boff;    /* ... (boff 0: none) */
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail;
    Py_ssize_t lru_len;
    int32_t *dup_prev, *dup_next;
    int32_t *stack; /* hashless free blocks; the top is allocated first */
    Py_ssize_t stack_len;
    Slot *table;
    size_t mask;
    Py_ssize_t n_hashed; /* blocks holding a hash, duplicates included */
    long long evicted;
    Req *reqs;
    Py_ssize_t n_req_slots;
    Py_ssize_t *free_req_slots;
    Py_ssize_t n_free_req_slots;
    PyObject *req_index; /* dict: request id -> slot (int) */
    BlockHash *scratch;  /* lookup's hashes */
    Py_ssize_t cap_scratch;
    int32_t *hit; /* admit's hit blocks */
} Pool;

static PyObject *str_segments, *str_key, *str_length;

/* -- hash map ------------------------------------------------------------------------------- */

static inline size_t slot_of(int64_t key, uint32_t off, size_t mask) {
    uint64_t h = (uint64_t)key ^ ((uint64_t)off * 0x9E3779B97F4A7C15ULL);
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    h ^= h >> 32;
    return (size_t)h & mask;
}

/* The slot holding (key, off), or the empty slot where it would go. */
static inline size_t probe(const Pool *p, int64_t key, uint32_t off) {
    size_t i = slot_of(key, off, p->mask);
    for (;;) {
        const Slot *s = &p->table[i];
        if (s->off == 0 || (s->off == off && s->key == key)) return i;
        i = (i + 1) & p->mask;
    }
}

static void delete_slot(Pool *p, size_t i) {
    size_t j = i;
    for (;;) {
        j = (j + 1) & p->mask;
        Slot *s = &p->table[j];
        if (s->off == 0) break;
        size_t k = slot_of(s->key, s->off, p->mask);
        /* the entry at j stays unless its home k lies cyclically outside (i, j] */
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            p->table[i] = *s;
            i = j;
        }
    }
    p->table[i].off = 0;
}

/* Block b stops holding its hash (it is being evicted). */
static void drop_hash(Pool *p, int32_t b) {
    size_t i = probe(p, p->bkey[b], p->boff[b]);
    Slot *s = &p->table[i];
    int32_t nx = p->dup_next[b];
    if (s->head == b) {
        if (nx >= 0) {
            s->head = nx; /* the next one cached is the one hits use now */
            p->dup_prev[nx] = -1;
        } else {
            delete_slot(p, i);
        }
    } else {
        int32_t pv = p->dup_prev[b];
        p->dup_next[pv] = nx;
        if (nx >= 0) p->dup_prev[nx] = pv;
    }
    p->dup_next[b] = p->dup_prev[b] = -1;
    p->boff[b] = 0;
    p->n_hashed--;
}

/* Block b (hashless, held) now holds h. */
static void add_hash(Pool *p, int32_t b, BlockHash h) {
    size_t i = probe(p, h.key, h.off);
    Slot *s = &p->table[i];
    if (s->off == 0) {
        s->key = h.key;
        s->off = h.off;
        s->head = b;
    } else { /* a duplicate: it goes after the other holders */
        int32_t last = s->head;
        while (p->dup_next[last] >= 0) last = p->dup_next[last];
        p->dup_next[last] = b;
        p->dup_prev[b] = last;
    }
    p->bkey[b] = h.key;
    p->boff[b] = h.off;
    p->n_hashed++;
}

/* -- free queue ------------------------------------------------------------------------------ */

static inline void lru_unlink(Pool *p, int32_t b) {
    int32_t pv = p->lru_prev[b], nx = p->lru_next[b];
    if (pv >= 0) p->lru_next[pv] = nx; else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pv; else p->lru_tail = pv;
    p->lru_len--;
}

static inline void lru_append(Pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->lru_len++;
}

static inline Py_ssize_t free_count(const Pool *p) { return p->stack_len + p->lru_len; }

/* -- per-request storage ------------------------------------------------------------------- */

/* Room for n elements of `size` bytes in *a (capacity *cap, doubled as needed). */
static int reserve(void **a, Py_ssize_t *cap, Py_ssize_t n, size_t size) {
    if (n <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : 16;
    while (c < n) c *= 2;
    void *x = PyMem_Realloc(*a, (size_t)c * size);
    if (!x) { PyErr_NoMemory(); return -1; }
    *a = x;
    *cap = c;
    return 0;
}

/* Take n blocks from the front of the free queue onto r's blocks (the caller checked there are). */
static int allocate(Pool *p, Req *r, Py_ssize_t n) {
    if (reserve((void **)&r->blocks, &r->cap_blocks, r->n_blocks + n, sizeof(int32_t)) < 0) return -1;
    int32_t *out = r->blocks + r->n_blocks;
    r->n_blocks += n;
    while (n && p->stack_len) {
        int32_t b = p->stack[--p->stack_len];
        p->ref[b] = 1;
        *out++ = b;
        n--;
    }
    p->evicted += n;
    while (n--) {
        int32_t b = p->lru_head;
        lru_unlink(p, b);
        drop_hash(p, b);
        p->ref[b] = 1;
        *out++ = b;
    }
    return 0;
}

/* The block hashes of a sequence's full blocks (the first `limit` of them; -1: all) into *out. */
static Py_ssize_t seq_hashes(Pool *p, PyObject *segments, Py_ssize_t limit, BlockHash **out,
                             Py_ssize_t *cap) {
    if (!PyTuple_Check(segments)) {
        PyErr_SetString(PyExc_TypeError, "segments must be a tuple of Segment");
        return -1;
    }
    const Py_ssize_t bs = p->block_size;
    Py_ssize_t n = 0, start = 0, next_end = bs;
    Py_ssize_t nseg = PyTuple_GET_SIZE(segments);
    for (Py_ssize_t i = 0; i < nseg && (limit < 0 || n < limit); i++) {
        PyObject *seg = PyTuple_GET_ITEM(segments, i);
        PyObject *lo = PyObject_GetAttr(seg, str_length);
        if (!lo) return -1;
        Py_ssize_t len = PyLong_AsSsize_t(lo);
        Py_DECREF(lo);
        if (len == -1 && PyErr_Occurred()) return -1;
        Py_ssize_t seg_end = start + len;
        if (next_end <= seg_end) {
            if (len >= ((Py_ssize_t)1 << 32)) {
                PyErr_Format(PyExc_ValueError, "segment length %zd must be < 2**32 for block keys", len);
                return -1;
            }
            PyObject *ko = PyObject_GetAttr(seg, str_key);
            if (!ko) return -1;
            int overflow = 0;
            long long key = PyLong_AsLongLongAndOverflow(ko, &overflow);
            Py_DECREF(ko);
            if (key == -1 && PyErr_Occurred()) return -1;
            if (overflow) {
                PyErr_SetString(PyExc_OverflowError,
                                "segment key outside the signed 64-bit range (chain_key's keys are 63-bit): "
                                "the native vLLM pool cannot hold it");
                return -1;
            }
            Py_ssize_t count = (seg_end - next_end) / bs + 1;
            if (limit >= 0 && n + count > limit) count = limit - n;
            if (reserve((void **)out, cap, n + count, sizeof(BlockHash)) < 0) return -1;
            BlockHash *h = *out + n;
            for (Py_ssize_t c = 0; c < count; c++) {
                h[c].key = (int64_t)key;
                h[c].off = (uint32_t)(next_end - start + c * bs);
            }
            n += count;
            next_end += count * bs;
        }
        start = seg_end;
    }
    return n;
}

/* The longest run of cached hashes from the start, within the first `limit` (first holders). */
static Py_ssize_t hit_run(const Pool *p, const BlockHash *h, Py_ssize_t n, Py_ssize_t limit, int32_t *hit) {
    if (limit > n) limit = n;
    Py_ssize_t i = 0;
    for (; i < limit; i++) {
        const Slot *s = &p->table[probe(p, h[i].key, h[i].off)];
        if (s->off == 0) break;
        if (hit) hit[i] = s->head;
    }
    return i;
}

/* A Pool made by Pool.__new__ alone has no arrays yet. */
static int ready(const Pool *p) {
    if (p->table) return 1;
    PyErr_SetString(PyExc_RuntimeError, "Pool.__init__ was not called");
    return 0;
}

/* The slot of an admitted request; -1 with KeyError when it is not admitted. */
static Py_ssize_t find_slot(Pool *p, PyObject *req_id) {
    if (!ready(p)) return -1;
    PyObject *slot = PyDict_GetItemWithError(p->req_index, req_id);
    if (!slot) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "request %S is not admitted", req_id);
        return -1;
    }
    return PyLong_AsSsize_t(slot);
}

/* The (req_id, count) calls: the admitted request, and the count in *n; NULL with an error. */
static Req *req_and_count(Pool *p, PyObject *const *args, Py_ssize_t nargs, const char *usage,
                          Py_ssize_t *n) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    *n = PyLong_AsSsize_t(args[1]);
    if (*n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t si = find_slot(p, args[0]);
    return si < 0 ? NULL : &p->reqs[si];
}

/* -- the Python type ------------------------------------------------------------------------- */

static void Pool_dealloc(Pool *p) {
    PyMem_Free(p->ref);
    PyMem_Free(p->bkey);
    PyMem_Free(p->boff);
    PyMem_Free(p->lru_prev);
    PyMem_Free(p->lru_next);
    PyMem_Free(p->dup_prev);
    PyMem_Free(p->dup_next);
    PyMem_Free(p->stack);
    PyMem_Free(p->table);
    for (Py_ssize_t i = 0; i < p->n_req_slots; i++) {
        PyMem_Free(p->reqs[i].blocks);
        PyMem_Free(p->reqs[i].hashes);
    }
    PyMem_Free(p->reqs);
    PyMem_Free(p->free_req_slots);
    PyMem_Free(p->scratch);
    PyMem_Free(p->hit);
    Py_XDECREF(p->req_index);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static int Pool_init(Pool *p, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"num_blocks", "block_size", "prefix_caching", NULL};
    long long nb, bs;
    int pc = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL|p", kwlist, &nb, &bs, &pc)) return -1;
    if (nb < 1 || nb > INT32_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "num_blocks must be in 1..%d, got %lld", INT32_MAX / 4, nb);
        return -1;
    }
    if (bs < 1 || bs > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "block_size must be >= 1, got %lld", bs);
        return -1;
    }
    if (p->ref) {
        PyErr_SetString(PyExc_RuntimeError, "Pool is already initialised");
        return -1;
    }
    size_t n = (size_t)nb;
    p->num_blocks = (int32_t)nb;
    p->block_size = (int32_t)bs;
    p->prefix_caching = pc;
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    p->ref = PyMem_Calloc(n, sizeof(int32_t));
    p->bkey = PyMem_Calloc(n, sizeof(int64_t));
    p->boff = PyMem_Calloc(n, sizeof(uint32_t));
    p->lru_prev = PyMem_Malloc(n * sizeof(int32_t));
    p->lru_next = PyMem_Malloc(n * sizeof(int32_t));
    p->dup_prev = PyMem_Malloc(n * sizeof(int32_t));
    p->dup_next = PyMem_Malloc(n * sizeof(int32_t));
    p->stack = PyMem_Malloc(n * sizeof(int32_t));
    p->hit = PyMem_Malloc(n * sizeof(int32_t));
    p->table = PyMem_Calloc(cap, sizeof(Slot));
    p->req_index = PyDict_New();
    if (!p->ref || !p->bkey || !p->boff || !p->lru_prev || !p->lru_next || !p->dup_prev || !p->dup_next ||
        !p->stack || !p->hit || !p->table || !p->req_index) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    p->mask = cap - 1;
    for (size_t i = 0; i < n; i++) {
        p->lru_prev[i] = p->lru_next[i] = p->dup_prev[i] = p->dup_next[i] = -1;
        p->stack[i] = (int32_t)(n - 1 - i); /* block 0 on top, as vllm.py */
    }
    p->stack_len = (Py_ssize_t)n;
    p->lru_head = p->lru_tail = -1;
    return 0;
}

static PyObject *Pool_admit(Pool *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "admit(req_id, segments, prompt_len, num_tokens)");
        return NULL;
    }
    if (!ready(p)) return NULL;
    PyObject *req_id = args[0];
    Py_ssize_t prompt_len = PyLong_AsSsize_t(args[2]);
    Py_ssize_t num_tokens = PyLong_AsSsize_t(args[3]);
    if ((prompt_len == -1 || num_tokens == -1) && PyErr_Occurred()) return NULL;
    int known = PyDict_Contains(p->req_index, req_id);
    if (known < 0) return NULL;
    if (known) return PyErr_Format(PyExc_ValueError, "request %S is already admitted", req_id);
    /* a slot for the request (its arrays are reused from earlier requests) */
    Py_ssize_t si;
    if (p->n_free_req_slots) {
        si = p->free_req_slots[--p->n_free_req_slots];
    } else {
        Req *rs = PyMem_Realloc(p->reqs, (size_t)(p->n_req_slots + 1) * sizeof(Req));
        Py_ssize_t *fs = PyMem_Realloc(p->free_req_slots, (size_t)(p->n_req_slots + 1) * sizeof(Py_ssize_t));
        if (rs) p->reqs = rs;
        if (fs) p->free_req_slots = fs;
        if (!rs || !fs) return PyErr_NoMemory();
        si = p->n_req_slots++;
        memset(&p->reqs[si], 0, sizeof(Req));
    }
    Req *r = &p->reqs[si];
    r->n_blocks = r->n_hashes = r->hashed = 0;
    const Py_ssize_t bs = p->block_size;
    Py_ssize_t nh = 0;
    if (p->prefix_caching) {
        Py_ssize_t n = seq_hashes(p, args[1], -1, &r->hashes, &r->cap_hashes);
        if (n < 0) goto fail;
        r->n_hashes = n;
        nh = hit_run(p, r->hashes, n, (prompt_len - 1) / bs, p->hit);
    }
    Py_ssize_t need = (num_tokens + bs - 1) / bs - nh;
    Py_ssize_t touched = 0;
    for (Py_ssize_t i = 0; i < nh; i++) touched += p->ref[p->hit[i]] == 0;
    if (need > free_count(p) - touched) {
        p->free_req_slots[p->n_free_req_slots++] = si;
        return PyLong_FromLong(-1);
    }
    if (reserve((void **)&r->blocks, &r->cap_blocks, nh + (need > 0 ? need : 0), sizeof(int32_t)) < 0) goto fail;
    for (Py_ssize_t i = 0; i < nh; i++) { /* touch: a free cached block leaves the queue */
        int32_t b = p->hit[i];
        if (p->ref[b] == 0) lru_unlink(p, b);
        p->ref[b]++;
        r->blocks[i] = b;
    }
    r->n_blocks = nh;
    r->hashed = nh;
    if (need > 0 && allocate(p, r, need) < 0) goto fail; /* cannot fail: reserved above */
    PyObject *slot = PyLong_FromSsize_t(si);
    if (!slot || PyDict_SetItem(p->req_index, req_id, slot) < 0) {
        Py_XDECREF(slot);
        return NULL; /* the pool is inconsistent only on out-of-memory */
    }
    Py_DECREF(slot);
    return PyLong_FromSsize_t(nh);
fail:
    p->free_req_slots[p->n_free_req_slots++] = si;
    return NULL;
}

static PyObject *Pool_lookup(Pool *p, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lookup(segments, prompt_len)");
        return NULL;
    }
    if (!ready(p)) return NULL;
    Py_ssize_t prompt_len = PyLong_AsSsize_t(args[1]);
    if (prompt_len == -1 && PyErr_Occurred()) return NULL;
    if (!p->prefix_caching || prompt_len < 2) return PyLong_FromLong(0);
    Py_ssize_t limit = (prompt_len - 1) / p->block_size;
    Py_ssize_t n = seq_hashes(p, args[0], limit, &p->scratch, &p->cap_scratch);
    if (n < 0) return NULL;
    return PyLong_FromSsize_t(hit_run(p, p->scratch, n, limit, NULL));
}

static PyObject *Pool_grow(Pool *p, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t num_tokens;
    Req *r = req_and_count(p, args, nargs, "grow(req_id, num_tokens)", &num_tokens);
    if (!r) return NULL;
    Py_ssize_t need = (num_tokens + p->block_size - 1) / p->block_size - r->n_blocks;
    if (need <= 0) Py_RETURN_TRUE;
    if (need > free_count(p)) Py_RETURN_FALSE;
    if (allocate(p, r, need) < 0) return NULL;
    Py_RETURN_TRUE;
}

static PyObject *Pool_commit(Pool *p, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t computed;
    Req *r = req_and_count(p, args, nargs, "commit(req_id, computed_tokens)", &computed);
    if (!r) return NULL;
    if (!p->prefix_caching) Py_RETURN_NONE;
    Py_ssize_t full = computed / p->block_size;
    if (full > r->n_blocks) full = r->n_blocks;
    if (full > r->n_hashes) full = r->n_hashes;
    for (Py_ssize_t i = r->hashed; i < full; i++) add_hash(p, r->blocks[i], r->hashes[i]);
    if (full > r->hashed) r->hashed = full;
    Py_RETURN_NONE;
}

static PyObject *Pool_release(Pool *p, PyObject *req_id) {
    Py_ssize_t si = find_slot(p, req_id);
    if (si < 0) return NULL;
    Req *r = &p->reqs[si];
    /* hashless blocks go to the front, the first of them on top; then the hashed ones that nobody
       else holds join the LRU tail, tail block first (so a chain's tail is evicted first) */
    for (Py_ssize_t i = r->n_blocks - 1; i >= r->hashed; i--) {
        int32_t b = r->blocks[i];
        p->ref[b] = 0;
        p->stack[p->stack_len++] = b;
    }
    for (Py_ssize_t i = r->hashed - 1; i >= 0; i--) {
        int32_t b = r->blocks[i];
        if (--p->ref[b] == 0) lru_append(p, b);
    }
    p->free_req_slots[p->n_free_req_slots++] = si;
    if (PyDict_DelItem(p->req_index, req_id) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Pool_free_blocks(Pool *p, PyObject *unused) { return PyLong_FromSsize_t(free_count(p)); }

static PyObject *Pool_usage(Pool *p, PyObject *unused) {
    /* exact as Python's 1.0 - free / num_blocks: both ints < 2**53 convert exactly */
    return PyFloat_FromDouble(1.0 - (double)free_count(p) / (double)p->num_blocks);
}

static PyObject *Pool_cached_blocks(Pool *p, PyObject *unused) { return PyLong_FromSsize_t(p->n_hashed); }

static PyObject *Pool_free_order(Pool *p, PyObject *unused) {
    if (!ready(p)) return NULL;
    PyObject *out = PyList_New(free_count(p));
    if (!out) return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = p->stack_len - 1; i >= 0; i--) PyList_SET_ITEM(out, k++, PyLong_FromLong(p->stack[i]));
    for (int32_t b = p->lru_head; b >= 0; b = p->lru_next[b]) PyList_SET_ITEM(out, k++, PyLong_FromLong(b));
    for (Py_ssize_t i = 0; i < k; i++)
        if (!PyList_GET_ITEM(out, i)) {
            Py_DECREF(out);
            return NULL;
        }
    return out;
}

static PyObject *Pool_get_evicted(Pool *p, void *closure) { return PyLong_FromLongLong(p->evicted); }

static PyMethodDef Pool_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))Pool_admit, METH_FASTCALL,
     "admit(req_id, segments, prompt_len, num_tokens) -> hit blocks, or -1 when the pool cannot hold it"},
    {"lookup", (PyCFunction)(void (*)(void))Pool_lookup, METH_FASTCALL,
     "lookup(segments, prompt_len) -> the blocks a request would hit now"},
    {"grow", (PyCFunction)(void (*)(void))Pool_grow, METH_FASTCALL,
     "grow(req_id, num_tokens) -> False when the free blocks are too few"},
    {"commit", (PyCFunction)(void (*)(void))Pool_commit, METH_FASTCALL,
     "commit(req_id, computed_tokens): full computed blocks take their hashes"},
    {"release", (PyCFunction)Pool_release, METH_O, "release(req_id): the request's blocks are freed"},
    {"free_blocks", (PyCFunction)Pool_free_blocks, METH_NOARGS, "free blocks (hashless and cached)"},
    {"usage", (PyCFunction)Pool_usage, METH_NOARGS, "1 - free / num_blocks"},
    {"cached_blocks", (PyCFunction)Pool_cached_blocks, METH_NOARGS, "blocks holding a hash"},
    {"free_order", (PyCFunction)Pool_free_order, METH_NOARGS, "free blocks in the order they would be allocated"},
    {NULL},
};

static PyGetSetDef Pool_getset[] = {
    {"evicted", (getter)Pool_get_evicted, NULL, "cached blocks evicted so far", NULL},
    {NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prefixtune.twin.cache._vllm_pool.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "vLLM V1's block pool (chained block hashes, LRU free queue), in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_vllm_pool", "vLLM V1's block pool in C (see vllm.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__vllm_pool(void) {
    str_segments = PyUnicode_InternFromString("segments");
    str_key = PyUnicode_InternFromString("key");
    str_length = PyUnicode_InternFromString("length");
    if (!str_segments || !str_key || !str_length || PyType_Ready(&PoolType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
