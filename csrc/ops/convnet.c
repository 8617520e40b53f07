/* A convolutional network's forward as one compiled program of steps, run
 * from C in one call (no Python per layer).
 *
 *   _convnet_compile(steps, slots, name) -> program (a capsule)
 *   _convnet_run(program, slots)
 *
 * Slots. A program addresses memory only through numbered slots, each a
 * C-contiguous DeviceArray used as raw bytes, plus a byte offset per operand.
 * A ResNet binds (workspace, weights, images, logits); a single op binds its
 * own operands. The arrays given to _convnet_compile are examples: their
 * sizes and alignments are what the program is planned for. _convnet_run
 * takes the same number of arrays, each on the program's device, at least as
 * large as the program reads or writes through it, and at least as aligned
 * (so a program compiled once serves every buffer of the same layout, and a
 * replaced buffer cannot make a planned GEMM read out of bounds).
 *
 * Steps, each a tuple (offsets in bytes, sizes in elements, dtypes as
 * cudalab dtype names):
 *   ("im2col", src_slot, src_off, src_dtype, dst_slot, dst_off, dst_dtype,
 *              n, h, w, c, oh, ow, kh, kw, stride, padding, k_padded)
 *   ("max_pool", src_slot, src_off, dst_slot, dst_off, dtype,
 *                n, h, w, c, oh, ow, kernel, stride, padding)
 *   ("avg_pool", src_slot, src_off, dst_slot, dst_off, dtype, n, hw, c)
 *   ("gemm", a_slot, a_off, w_slot, w_off, bias_slot, bias_off, out_slot, out_off,
 *            dtype, out_dtype, precision, rows, k, cout, relu, accumulate)
 *       out (rows, cout) = relu?(a (rows, k) @ w.T + bias (+ out when accumulate)),
 *       w (cout, k) and a, out row-major and dense; bias_slot -1 for none.
 *       precision 'highest' or 'high' (float32 only: fp32 or TF32).
 *       out_dtype is dtype, or float32 with half operands (the logits).
 *       One cuBLASLt GEMM: bias and ReLU are its epilogue, accumulate is
 *       beta = 1 (how a residual block adds its shortcut before the ReLU).
 *   ("conv", x_slot, x_off, w_slot, w_off, c_slot, c_off, out_slot, out_off, dtype,
 *            n, h, w, c, oh, ow, kh, kw, stride, padding, cout, epilogue, relu, tile)
 *       out (n, oh, ow, cout) = relu?(conv(x (n, h, w, c), w (cout, kh, kw, c)) + C)
 *       as one implicit-GEMM kernel (no columns written): epilogue 0 no C
 *       (c_slot -1), 1 C = a bias (cout,), 2 C = a residual shaped like out
 *       (it may be out itself). tile: the kernel's tile shape (an index into
 *       _conv_implicit_tiles(dtype)), -1 for the default. float16/bfloat16, or
 *       float32 on TF32 tensor cores.
 *   ("pad_channels", src_slot, src_off, src_dtype, dst_slot, dst_off, dst_dtype,
 *                    pixels, c, c_padded)
 *       dst (pixels, c_padded) = src (pixels, c) cast, zeros in the added
 *       channels: the float32 RGB images made 8 (4 for float32) channels so
 *       the stem's implicit GEMM loads whole vectors.
 *
 * The GEMMs' cuBLASLt plans are made at compile time and owned by the
 * program, so a run is only kernel launches and cublasLtMatmul calls on the
 * current stream: capturable in a CUDA graph, nothing allocated. */
#include "ops/ops.h"
#include "ops/matmul.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

#include <stdlib.h>

#define CAPSULE_NAME "cudalab._convnet"
#define MAX_SLOTS 16

enum { STEP_IM2COL, STEP_MAX_POOL, STEP_AVG_POOL, STEP_GEMM, STEP_CONV, STEP_PAD_CHANNELS };

typedef struct operand {
    int slot;             /* -1: none */
    int64_t offset;       /* bytes */
} operand;

typedef struct step {
    int kind;
    operand src, dst;     /* gemm: a and out */
    operand w, bias;      /* gemm and conv (conv: bias is its C operand) */
    cl_dtype dtype, dst_dtype;
    cl_conv_geometry g;   /* im2col, max_pool; avg_pool uses n, h (= hw), c */
    int64_t rows, k, cout;
    int precision;        /* gemm, float32: 0 fp32, 1 TF32 (cl_mm_parse_precision's codes) */
    bool relu, accumulate;
    struct mm_plan *plan; /* gemm: owned */
    int epilogue, tile;   /* conv */
    cl_conv_implicit *conv; /* conv: owned */
} step;

typedef struct program {
    int device;
    int nsteps, nslots;
    step *steps;
    size_t slot_bytes[MAX_SLOTS];   /* bytes each slot must hold */
    uint32_t slot_align[MAX_SLOTS]; /* alignment each slot's base must have */
    int64_t flops;
    char name[64];
} program;

static void
program_free(program *p)
{
    if (p == NULL) {
        return;
    }
    for (int i = 0; i < p->nsteps && p->steps != NULL; i++) {
        cl_mm_plan_free(p->steps[i].plan);
        cl_conv_implicit_destroy(p->steps[i].conv);
    }
    free(p->steps);
    free(p);
}

static void
capsule_destructor(PyObject *capsule)
{
    program_free(PyCapsule_GetPointer(capsule, CAPSULE_NAME));
}

/* ---- parsing the step tuples -------------------------------------------------------- */

static int
step_error(int index, const char *what)
{
    PyErr_Format(PyExc_ValueError, "_convnet_compile(): step %d: %s", index, what);
    return -1;
}

/* Item `i` of the step tuple as an int64 (bounds checked by the caller). */
static int
item_int(PyObject *t, Py_ssize_t i, int64_t *out)
{
    *out = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
item_dtype(cl_state *st, PyObject *t, Py_ssize_t i, cl_dtype *out)
{
    PyObject *obj = PyTuple_GET_ITEM(t, i);
    if (cl_dtype_converter(st, obj, "_convnet_compile", "steps", out) < 0) {
        return -1;
    }
    if (!cl_dtype_is_float(*out)) {
        PyErr_Format(PyExc_ValueError, "_convnet_compile(): expected a float dtype, got %R", obj);
        return -1;
    }
    return 0;
}

static size_t
array_bytes(const DeviceArray *a)
{
    return (size_t)cl_array_size(a) * cl_itemsize(a->dtype);
}

/* Items first..first+count-1 as ints into `out`. */
static int
item_ints(PyObject *t, Py_ssize_t first, int count, int64_t *out)
{
    for (int i = 0; i < count; i++) {
        if (item_int(t, first + i, &out[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
geometry_from(const int64_t *v, int count, cl_conv_geometry *g)
{
    int64_t all[11] = {0};
    for (int i = 0; i < count; i++) {
        if (v[i] < 0 || v[i] > INT32_MAX) {
            return -1;
        }
        all[i] = v[i];
    }
    *g = (cl_conv_geometry){(int)all[0], (int)all[1], (int)all[2], (int)all[3], (int)all[4],
                            (int)all[5], (int)all[6], (int)all[7], (int)all[8], (int)all[9],
                            (int)all[10]};
    return 0;
}

/* (n, h, w, c, oh, ow, kh, kw, stride, padding[, k_padded]) from the tuple. */
static int
parse_geometry(PyObject *t, Py_ssize_t first, int count, cl_conv_geometry *g, int index)
{
    int64_t v[11] = {0}; /* k_padded stays 0 where the tuple has none (conv) */
    if (item_ints(t, first, count, v) < 0) {
        return -1;
    }
    if (count == 9) {
        /* max_pool: (n, h, w, c, oh, ow, kernel, stride, padding): kh = kw. */
        int64_t w[11] = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[6], v[7], v[8], 0};
        memcpy(v, w, sizeof w);
    }
    if (geometry_from(v, 11, g) < 0 || g->stride < 1) {
        return step_error(index, "geometry out of range");
    }
    return 0;
}

static int
parse_operand(PyObject *t, Py_ssize_t i, operand *op)
{
    int64_t slot, offset;
    if (item_int(t, i, &slot) < 0 || item_int(t, i + 1, &offset) < 0) {
        return -1;
    }
    op->slot = (int)slot;
    op->offset = offset;
    return 0;
}

static int
parse_gemm(cl_state *st, PyObject *t, step *s, int index)
{
    int64_t v[5], precision;
    if (parse_operand(t, 1, &s->src) < 0 || parse_operand(t, 3, &s->w) < 0 ||
        parse_operand(t, 5, &s->bias) < 0 || parse_operand(t, 7, &s->dst) < 0 ||
        item_dtype(st, t, 9, &s->dtype) < 0 || item_dtype(st, t, 10, &s->dst_dtype) < 0 ||
        item_int(t, 11, &precision) < 0 || item_ints(t, 12, 5, v) < 0) {
        return -1;
    }
    s->rows = v[0];
    s->k = v[1];
    s->cout = v[2];
    s->relu = v[3] != 0;
    s->accumulate = v[4] != 0;
    s->precision = precision != 0;
    if (s->dst_dtype != s->dtype && s->dst_dtype != CL_FLOAT32) {
        return step_error(index, "gemm out_dtype must be dtype or float32");
    }
    if (s->dtype == CL_FLOAT64 || s->rows < 1 || s->k < 1 || s->cout < 1) {
        return step_error(index, "gemm: float16, bfloat16 or float32 and positive sizes");
    }
    return 0;
}

static int
parse_conv(cl_state *st, PyObject *t, step *s, int index)
{
    int64_t v[4];
    if (parse_operand(t, 1, &s->src) < 0 || parse_operand(t, 3, &s->w) < 0 ||
        parse_operand(t, 5, &s->bias) < 0 || parse_operand(t, 7, &s->dst) < 0 ||
        item_dtype(st, t, 9, &s->dtype) < 0 || parse_geometry(t, 10, 10, &s->g, index) < 0 ||
        item_ints(t, 20, 4, v) < 0) {
        return -1;
    }
    s->dst_dtype = s->dtype;
    s->cout = v[0];
    s->epilogue = (int)v[1];
    s->relu = v[2] != 0;
    s->tile = (int)v[3];
    if (s->cout < 1 || s->cout > INT32_MAX || v[1] < 0 || v[1] > 2 || v[3] < -1 ||
        v[3] > 64) {
        return step_error(index, "conv: cout, epilogue (0-2) or tile out of range");
    }
    if ((s->epilogue == 0) != (s->bias.slot < 0)) {
        return step_error(index, "conv: a C operand exactly when the epilogue reads one");
    }
    return 0;
}

static int
parse_pad_channels(cl_state *st, PyObject *t, step *s, int index)
{
    int64_t v[3];
    if (parse_operand(t, 1, &s->src) < 0 || item_dtype(st, t, 3, &s->dtype) < 0 ||
        parse_operand(t, 4, &s->dst) < 0 || item_dtype(st, t, 6, &s->dst_dtype) < 0 ||
        item_ints(t, 7, 3, v) < 0) {
        return -1;
    }
    s->rows = v[0]; /* pixels */
    s->k = v[1];    /* channels in */
    s->cout = v[2]; /* channels out */
    if (s->rows < 0 || s->k < 1 || s->cout < s->k || s->cout > 64) {
        return step_error(index, "pad_channels: 1 <= c <= c_padded <= 64");
    }
    return 0;
}

static int
parse_step(cl_state *st, PyObject *t, step *s, int index)
{
    static const struct {
        const char *name;
        int kind;
        Py_ssize_t len;
    } kinds[] = {{"im2col", STEP_IM2COL, 18},
                 {"max_pool", STEP_MAX_POOL, 15},
                 {"avg_pool", STEP_AVG_POOL, 9},
                 {"gemm", STEP_GEMM, 17},
                 {"conv", STEP_CONV, 24},
                 {"pad_channels", STEP_PAD_CHANNELS, 10}};
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0))) {
        return step_error(index, "expected a tuple starting with the step's name");
    }
    s->kind = -1;
    s->bias.slot = -1;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(t, 0), kinds[i].name) == 0) {
            if (PyTuple_GET_SIZE(t) != kinds[i].len) {
                return step_error(index, "wrong number of items");
            }
            s->kind = kinds[i].kind;
        }
    }
    switch (s->kind) {
    case STEP_IM2COL:
        return (parse_operand(t, 1, &s->src) < 0 || item_dtype(st, t, 3, &s->dtype) < 0 ||
                parse_operand(t, 4, &s->dst) < 0 || item_dtype(st, t, 6, &s->dst_dtype) < 0)
                   ? -1
                   : parse_geometry(t, 7, 11, &s->g, index);
    case STEP_MAX_POOL:
        s->dst_dtype = CL_NUM_DTYPES;
        return (parse_operand(t, 1, &s->src) < 0 || parse_operand(t, 3, &s->dst) < 0 ||
                item_dtype(st, t, 5, &s->dtype) < 0)
                   ? -1
                   : parse_geometry(t, 6, 9, &s->g, index);
    case STEP_AVG_POOL: {
        int64_t v[3];
        if (parse_operand(t, 1, &s->src) < 0 || parse_operand(t, 3, &s->dst) < 0 ||
            item_dtype(st, t, 5, &s->dtype) < 0 || item_ints(t, 6, 3, v) < 0) {
            return -1;
        }
        s->rows = v[0]; /* images */
        s->k = v[1];    /* pixels */
        s->cout = v[2]; /* channels */
        return 0;
    }
    case STEP_GEMM:
        return parse_gemm(st, t, s, index);
    case STEP_CONV:
        return parse_conv(st, t, s, index);
    case STEP_PAD_CHANNELS:
        return parse_pad_channels(st, t, s, index);
    default:
        return step_error(index, "unknown step (expected im2col, max_pool, avg_pool, gemm, "
                                 "conv or pad_channels)");
    }
}

/* ---- checking the steps against the slots ------------------------------------------------ */

/* Record that `op` spans `bytes` bytes of its slot. */
static int
note_extent(program *p, const operand *op, int64_t bytes, int index)
{
    if (op->slot < 0 || op->slot >= p->nslots || op->offset < 0 || bytes < 0) {
        return step_error(index, "operand slot or offset out of range");
    }
    size_t end = (size_t)op->offset + (size_t)bytes;
    if (end > p->slot_bytes[op->slot]) {
        p->slot_bytes[op->slot] = end;
    }
    return 0;
}

static int
step_extents(program *p, const step *s, int index)
{
    const cl_conv_geometry *g = &s->g;
    size_t in = cl_itemsize(s->dtype);
    switch (s->kind) {
    case STEP_IM2COL:
        return (note_extent(p, &s->src, (int64_t)g->n * g->h * g->w * g->c * in, index) < 0 ||
                note_extent(p, &s->dst,
                            (int64_t)g->n * g->oh * g->ow * g->k_padded *
                                cl_itemsize(s->dst_dtype),
                            index) < 0)
                   ? -1
                   : 0;
    case STEP_MAX_POOL:
        return (note_extent(p, &s->src, (int64_t)g->n * g->h * g->w * g->c * in, index) < 0 ||
                note_extent(p, &s->dst, (int64_t)g->n * g->oh * g->ow * g->c * in, index) < 0)
                   ? -1
                   : 0;
    case STEP_AVG_POOL:
        return (note_extent(p, &s->src, s->rows * s->k * s->cout * in, index) < 0 ||
                note_extent(p, &s->dst, s->rows * s->cout * in, index) < 0)
                   ? -1
                   : 0;
    case STEP_PAD_CHANNELS:
        return (note_extent(p, &s->src, s->rows * s->k * in, index) < 0 ||
                note_extent(p, &s->dst, s->rows * s->cout * cl_itemsize(s->dst_dtype), index) < 0)
                   ? -1
                   : 0;
    case STEP_CONV: {
        int64_t out = (int64_t)g->n * g->oh * g->ow * s->cout * in;
        if (note_extent(p, &s->src, (int64_t)g->n * g->h * g->w * g->c * in, index) < 0 ||
            note_extent(p, &s->w, s->cout * g->kh * g->kw * g->c * in, index) < 0 ||
            note_extent(p, &s->dst, out, index) < 0) {
            return -1;
        }
        return s->bias.slot < 0
                   ? 0
                   : note_extent(p, &s->bias, s->epilogue == 1 ? s->cout * (int64_t)in : out,
                                 index);
    }
    default: {
        size_t out = cl_itemsize(s->dst_dtype);
        if (note_extent(p, &s->src, s->rows * s->k * in, index) < 0 ||
            note_extent(p, &s->w, s->cout * s->k * in, index) < 0 ||
            note_extent(p, &s->dst, s->rows * s->cout * out, index) < 0) {
            return -1;
        }
        return s->bias.slot < 0 ? 0 : note_extent(p, &s->bias, s->cout * out, index);
    }
    }
}

/* The alignment a GEMM operand is planned for: what the slot's base and the
 * offset both guarantee (a rebound base at least as aligned keeps it). */
static uint32_t
operand_alignment(const program *p, const operand *op)
{
    uint32_t base = p->slot_align[op->slot];
    uint32_t off = cl_mm_alignment_of((uint64_t)op->offset);
    return base < off ? base : off;
}

/* The GEMM of step `s` in cuBLAS's column-major terms (as ops/linear.c's
 * forward): D^T (cout x rows) = W (cout x k, op T of its row-major storage)
 * . A^T (k x rows); the bias runs along D's m = cout. */
static void
gemm_key(const program *p, const step *s, cl_mm_key *key)
{
    memset(key, 0, sizeof *key);
    key->device = p->device;
    key->dtype = (int)s->dtype;
    key->compute = (int)cl_mm_compute_type(s->dtype, s->precision);
    key->lt = 1;
    key->opx = CUBLAS_OP_T;
    key->opy = CUBLAS_OP_N;
    key->m = s->cout;
    key->n = s->rows;
    key->k = s->k;
    key->ldx = s->k;
    key->ldy = s->k;
    key->ldc = s->cout;
    key->batch = 1;
    key->align_x = operand_alignment(p, &s->w);
    key->align_y = operand_alignment(p, &s->src);
    key->align_c = operand_alignment(p, &s->dst);
    key->out_f32 = s->dst_dtype != s->dtype;
    bool bias = s->bias.slot >= 0;
    key->epilogue = s->relu ? (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                            : (bias ? CUBLASLT_EPILOGUE_BIAS : 0);
    key->align_bias = bias ? operand_alignment(p, &s->bias) : 0;
}

/* ---- compile ------------------------------------------------------------------------------- */

/* Bind the example slots: device, sizes (at least), alignments. */
static int
slots_check(cl_op *op, PyObject *slots, int *nslots, DeviceArray **arrays, const char *func)
{
    if (!PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) > MAX_SLOTS) {
        PyErr_Format(PyExc_TypeError, "%s(): slots must be a tuple of at most %d DeviceArrays",
                     func, MAX_SLOTS);
        return -1;
    }
    *nslots = (int)PyTuple_GET_SIZE(slots);
    for (int i = 0; i < *nslots; i++) {
        if (cl_op_array(op, PyTuple_GET_ITEM(slots, i), "slots", &arrays[i]) < 0) {
            return -1;
        }
        if (!cl_is_c_contiguous(arrays[i])) {
            PyErr_Format(PyExc_ValueError, "%s(): slot %d is not C-contiguous", func, i);
            return -1;
        }
    }
    return 0;
}

/* A conv step's kernel, prepared for this device with its parameters
 * computed once; every operand must be 16-byte aligned (vector loads). */
static int
compile_conv(program *p, cl_op *op, step *s, int index)
{
    const operand *operands[] = {&s->src, &s->w, &s->dst, &s->bias};
    for (int j = 0; j < 4; j++) {
        if (operands[j]->slot >= 0 && operand_alignment(p, operands[j]) < 16) {
            PyErr_Format(PyExc_ValueError,
                         "_convnet_compile(): step %d: conv operands must be 16-byte aligned",
                         index);
            return -1;
        }
    }
    cl_conv_implicit_desc d = {
        .dtype = s->dtype, .g = s->g, .cout = (int)s->cout,
        .epilogue = (cl_conv_epilogue)s->epilogue, .relu = s->relu,
    };
    cudaError_t err = cl_conv_implicit_create(&s->conv, &d, s->tile);
    if (err == cudaErrorNotSupported || err == cudaErrorInvalidValue) {
        PyErr_Format(op->st->CudalabError,
                     "%s: step %d: no implicit-GEMM kernel for this convolution (%s, "
                     "n=%d h=%d w=%d c=%d cout=%lld %dx%d stride %d; tile %d): %s",
                     p->name, index, cl_dtype_name(s->dtype), s->g.n, s->g.h, s->g.w, s->g.c,
                     (long long)s->cout, s->g.kh, s->g.kw, s->g.stride, s->tile,
                     err == cudaErrorNotSupported
                         ? "needs an SM80+ GPU, a build with the kernels, and c and cout "
                           "multiples of 16 bytes"
                         : "invalid geometry or tile");
        return -1;
    }
    CL_CUDA_CHECK(op->st, err);
    p->flops += 2 * (int64_t)s->g.n * s->g.oh * s->g.ow * s->cout * s->g.kh * s->g.kw * s->g.c;
    return 0;
fail:
    return -1;
}

static int
compile_plans(program *p, cl_op *op)
{
    for (int i = 0; i < p->nsteps; i++) {
        step *s = &p->steps[i];
        if (s->kind == STEP_CONV) {
            if (compile_conv(p, op, s, i) < 0) {
                return -1;
            }
            continue;
        }
        if (s->kind != STEP_GEMM) {
            continue;
        }
        cl_mm_key key;
        gemm_key(p, s, &key);
        cl_mm_exec ex;
        if (cl_mm_plan_new(op->st, &key, op->stream, &ex) < 0) {
            return -1;
        }
        s->plan = ex.plan;
        if (key.epilogue != 0 && !cl_mm_uses_lt(&ex)) {
            PyErr_Format(op->st->CudalabError,
                         "%s: cuBLASLt has no algorithm for step %d (%s, rows=%lld k=%lld "
                         "cout=%lld with its epilogue)",
                         p->name, i, cl_dtype_name(s->dtype), (long long)s->rows,
                         (long long)s->k, (long long)s->cout);
            return -1;
        }
        p->flops += 2 * s->rows * s->k * s->cout;
    }
    return 0;
}

static program *
program_parse(cl_state *st, PyObject *steps, DeviceArray **arrays, int nslots, const char *name)
{
    Py_ssize_t n = PyTuple_GET_SIZE(steps);
    program *p = calloc(1, sizeof *p);
    if (p == NULL || (p->steps = calloc(n > 0 ? (size_t)n : 1, sizeof(step))) == NULL) {
        free(p);
        PyErr_NoMemory();
        return NULL;
    }
    p->nslots = nslots;
    p->device = nslots > 0 ? arrays[0]->device : 0;
    snprintf(p->name, sizeof p->name, "%s", name);
    for (int i = 0; i < nslots; i++) {
        p->slot_align[i] = cl_mm_alignment_of((uintptr_t)arrays[i]->data);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        p->nsteps = (int)i + 1;
        if (parse_step(st, PyTuple_GET_ITEM(steps, i), &p->steps[i], (int)i) < 0 ||
            step_extents(p, &p->steps[i], (int)i) < 0) {
            program_free(p);
            return NULL;
        }
    }
    for (int i = 0; i < nslots; i++) {
        if (array_bytes(arrays[i]) < p->slot_bytes[i]) {
            PyErr_Format(PyExc_ValueError,
                         "_convnet_compile(): slot %d holds %zu bytes, the steps need %zu", i,
                         array_bytes(arrays[i]), p->slot_bytes[i]);
            program_free(p);
            return NULL;
        }
    }
    return p;
}

PyDoc_STRVAR(_convnet_compile_doc,
"_convnet_compile(steps, slots, name)\n--\n\n"
"Compile a tuple of forward steps over slot arrays into a program (a capsule\n"
"for _convnet_run); the cuBLASLt plans of its GEMMs are made now. The step\n"
"format is described at the top of csrc/ops/convnet.c; cudalab.models builds\n"
"the steps. Internal.");

static PyObject *
_convnet_compile(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"steps", "slots", "name", NULL};
    PyObject *argv[3];
    DeviceArray *arrays[MAX_SLOTS];
    int nslots = 0;
    cl_op op;
    cl_op_init(&op, cl_state_from_module(module), "_convnet_compile");
    if (cl_parse_args("_convnet_compile", args, nargs, kwnames, names, 3, argv) < 0 ||
        slots_check(&op, argv[1], &nslots, arrays, "_convnet_compile") < 0) {
        return NULL;
    }
    if (!PyTuple_Check(argv[0]) || !PyUnicode_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "_convnet_compile(): steps must be a tuple, name a str");
        return NULL;
    }
    program *p = program_parse(op.st, argv[0], arrays, nslots, PyUnicode_AsUTF8(argv[2]));
    if (p == NULL) {
        return NULL;
    }
    if (cl_op_begin(&op) < 0) {
        program_free(p);
        return NULL;
    }
    cl_mm_drain_graveyard(op.st);
    PyObject *capsule = NULL;
    if (compile_plans(p, &op) == 0) {
        capsule = PyCapsule_New(p, CAPSULE_NAME, capsule_destructor);
    }
    if (capsule == NULL) {
        program_free(p);
    }
    return cl_op_end(&op, capsule, NULL);
}

/* ---- run ------------------------------------------------------------------------------------ */

static void *
address(char *const *base, const operand *op)
{
    return base[op->slot] + op->offset;
}

static int
run_gemm(cl_op *op, cl_mm_exec ex, const step *s, char *const *base)
{
    ex.plan = s->plan;
    cl_mm_args args = {
        .bias = s->bias.slot >= 0 ? address(base, &s->bias) : NULL,
        .aux = NULL,
        .accumulate = s->accumulate,
    };
    return cl_mm_run_args(op->st, &ex, address(base, &s->w), address(base, &s->src),
                          address(base, &s->dst), &args);
}

static int
run_steps(cl_op *op, const program *p, char *const *base)
{
    cl_mm_exec ex; /* this thread's cuBLASLt handle on op->stream */
    if (cl_mm_bind(op->st, op->device, op->stream, &ex) < 0) {
        return -1;
    }
    for (int i = 0; i < p->nsteps; i++) {
        const step *s = &p->steps[i];
        switch (s->kind) {
        case STEP_IM2COL:
            CL_CUDA_CHECK(op->st, cl_im2col(address(base, &s->dst), s->dst_dtype,
                                            address(base, &s->src), s->dtype, &s->g, op->stream));
            break;
        case STEP_MAX_POOL:
            CL_CUDA_CHECK(op->st, cl_max_pool_nhwc(address(base, &s->dst), address(base, &s->src),
                                                   s->dtype, &s->g, op->stream));
            break;
        case STEP_AVG_POOL:
            CL_CUDA_CHECK(op->st, cl_avg_pool_nhwc(address(base, &s->dst), address(base, &s->src),
                                                   s->dtype, s->rows, s->k, s->cout, op->stream));
            break;
        case STEP_PAD_CHANNELS:
            CL_CUDA_CHECK(op->st, cl_pad_channels(address(base, &s->dst), s->dst_dtype,
                                                  address(base, &s->src), s->dtype, s->rows,
                                                  (int)s->k, (int)s->cout, op->stream));
            break;
        case STEP_CONV:
            CL_CUDA_CHECK(op->st,
                          cl_conv_implicit_run(s->conv, address(base, &s->dst),
                                               address(base, &s->src), address(base, &s->w),
                                               s->bias.slot >= 0 ? address(base, &s->bias) : NULL,
                                               op->stream));
            break;
        default:
            if (run_gemm(op, ex, s, base) < 0) {
                return -1;
            }
        }
    }
    return 0;
fail:
    return -1;
}

/* The run's slots: as many as compiled, each large and aligned enough. */
static int
slots_bind(cl_op *op, const program *p, PyObject *slots, DeviceArray **arrays, char **base)
{
    int nslots = 0;
    if (slots_check(op, slots, &nslots, arrays, "_convnet_run") < 0) {
        return -1;
    }
    if (nslots != p->nslots || (nslots > 0 && arrays[0]->device != p->device)) {
        PyErr_Format(PyExc_ValueError,
                     "_convnet_run(): %s takes %d slot arrays on device %d, got %d", p->name,
                     p->nslots, p->device, nslots);
        return -1;
    }
    for (int i = 0; i < nslots; i++) {
        if (array_bytes(arrays[i]) < p->slot_bytes[i] ||
            cl_mm_alignment_of((uintptr_t)arrays[i]->data) < p->slot_align[i]) {
            PyErr_Format(PyExc_ValueError,
                         "_convnet_run(): slot %d must hold %zu bytes aligned to %u "
                         "(compiled for that layout)",
                         i, p->slot_bytes[i], (unsigned)p->slot_align[i]);
            return -1;
        }
        base[i] = arrays[i]->data;
    }
    return 0;
}

PyDoc_STRVAR(_convnet_run_doc,
"_convnet_run(program, slots)\n--\n\n"
"Run a compiled program on the current stream with these slot arrays (same\n"
"count as compiled, each at least as large and as aligned). Internal.");

static PyObject *
_convnet_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"program", "slots", NULL};
    PyObject *argv[2];
    DeviceArray *arrays[MAX_SLOTS];
    char *base[MAX_SLOTS];
    if (cl_parse_args("_convnet_run", args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    program *p = PyCapsule_GetPointer(argv[0], CAPSULE_NAME);
    if (p == NULL) {
        return NULL;
    }
    cl_op op;
    cl_op_init(&op, cl_state_from_module(module), p->name);
    if (slots_bind(&op, p, argv[1], arrays, base) < 0 || cl_op_begin(&op) < 0) {
        return NULL;
    }
    for (int i = 0; i < p->nslots; i++) {
        cl_op_use(&op, arrays[i]);
    }
    int status = run_steps(&op, p, base);
    cl_prof_info info = {.dtype = -1, .bytes = -1, .flops = p->flops, .out_ndim = -1};
    return cl_op_end(&op, status < 0 ? NULL : Py_NewRef(Py_None),
                     CL_OP_PROFILING(&op) && status == 0 ? &info : NULL);
}

PyDoc_STRVAR(_conv_implicit_tiles_doc,
"_conv_implicit_tiles(dtype)\n--\n\n"
"The implicit-GEMM convolution's tile shapes built for a dtype (names, in the\n"
"order a conv step's `tile` indexes), and the vector width in elements that c\n"
"and cout must be multiples of: (names, alignment). Empty names: none built.\n"
"Internal.");

static PyObject *
_conv_implicit_tiles(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    static const char *const names[] = {"dtype", NULL};
    PyObject *argv[1];
    cl_state *st = cl_state_from_module(module);
    cl_dtype dtype;
    if (cl_parse_args("_conv_implicit_tiles", args, nargs, kwnames, names, 1, argv) < 0 ||
        cl_dtype_converter(st, argv[0], "_conv_implicit_tiles", "dtype", &dtype) < 0) {
        return NULL;
    }
    int count = cl_conv_implicit_tiles(dtype);
    PyObject *tiles = PyTuple_New(count);
    if (tiles == NULL) {
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        PyObject *name = PyUnicode_FromString(cl_conv_implicit_tile_name(dtype, i));
        if (name == NULL) {
            Py_DECREF(tiles);
            return NULL;
        }
        PyTuple_SET_ITEM(tiles, i, name);
    }
    return Py_BuildValue("(Ni)", tiles, cl_conv_implicit_alignment(dtype));
}

PyMethodDef cl_convnet_methods[] = {
    CL_FASTCALL(_convnet_compile),
    CL_FASTCALL(_convnet_run),
    CL_FASTCALL(_conv_implicit_tiles),
    {NULL, NULL, 0, NULL},
};
