/* matmul through cuBLASLt (main path) and cuBLAS (fallback, and float64).
 *
 *   matmul(a, b, out=None, precision=None, pad=None), a @ b
 *   set_float32_matmul_precision("highest" | "high"), get_float32_matmul_precision()
 *   set_matmul_padding("auto" | True | False), get_matmul_padding()
 *
 * Semantics follow np.matmul: the last two axes are the matrices, the leading
 * axes are batch axes broadcast against each other; a 1-D first operand is a
 * row vector and a 1-D second operand a column vector, and the added axis is
 * dropped from the result (1-D @ 1-D gives a 0-d array). Supported dtypes:
 * float64, float32, float16, bfloat16; both operands must have the same one,
 * and the result has it too. float16/bfloat16 accumulate in float32 (split-K
 * reductions in the output type are excluded). float32 runs in true fp32
 * ("highest", the default) or TF32 ("high").
 *
 * A call is validate (matmul_validate: operands, shapes, broadcasting, out=;
 * no CUDA call) -> plan (matmul_plan: layouts, copies, batching, the GEMM
 * key; ops/matmul_plan.c turns the key into a cached cuBLASLt plan) -> run
 * (matmul_run: the GEMM calls; then the copy into an overlapping out=).
 *
 * Column-major mapping. cuBLAS is column-major; a row-major C (M x N) is a
 * column-major C^T (N x M), so we compute C^T = B^T A^T: cuBLAS's first
 * operand ("X") is our b, its second ("Y") our a, m = N, n = M, k = K. A
 * matrix operand of shape (R, C) with element strides (rs, cs) is passed
 * without any copy when it is
 *   row-major with a leading dimension: cs == 1, rs >= C  -> CUBLAS_OP_N, ld = rs
 *   column-major (e.g. x.T):            rs == 1, cs >= R  -> CUBLAS_OP_T, ld = cs
 * (axes of extent 1 impose nothing). Any other layout, and any negative
 * stride (cuBLAS wants positive leading dimensions and batch strides), is
 * first made C-contiguous with cl_op_contiguous_copy.
 *
 * Batches. The output's batch axes of extent > 1 are split into an inner run
 * that every operand addresses with one constant stride (0 for a broadcast
 * operand) -- one strided-batched call -- and an outer rest, looped over in C
 * (at most MAX_OUTER_CALLS calls; beyond that the operands that cannot use one
 * stride are materialized C-contiguous at the full batch shape first).
 *
 * Padding. Tensor-core GEMMs (float16, bfloat16, float32 as TF32) want the
 * contiguous extent and leading dimension of every matrix to be a multiple
 * of 16 bytes; otherwise cuBLAS falls back to slow kernels. Both operands and
 * the result are row-major here, so those extents are K (of a) and N (of b
 * and the result); M never is one. When K or N is not a multiple of
 * 16 / itemsize elements (see pad_wanted for when), the operands are copied
 * into buffers padded to Kp, Np (zeros beyond K: exact; columns beyond N of
 * b: zeros, their products dropped), the aligned GEMM writes a padded result
 * (when N was padded) and its first N columns are copied into the target.
 * An operand already aligned at the padded shape is used as it is.
 *
 * Backends. float64 goes to cublasGemmStridedBatchedEx_64 directly (see
 * use_lt): that is the library path torch.mm takes for doubles; the private
 * _set_matmul_backend(dtype, 'lt'|'cublas') switches a dtype for benchmarks. */
#include "ops/ops.h"
#include "ops/matmul.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

#include <stdatomic.h>

#define MAX_OUTER_CALLS 16

/* Whether dtype's main path is cuBLASLt (1) or cublasGemmStridedBatchedEx (0).
 * Process-wide; _set_matmul_backend (private, for benchmarks) changes it. */
static _Atomic int use_lt[CL_NUM_DTYPES] = {
    [CL_FLOAT16] = 1, [CL_BFLOAT16] = 1, [CL_FLOAT32] = 1, [CL_FLOAT64] = 0,
};

enum { PREC_HIGHEST = 0, PREC_HIGH = 1 };
static const char *const precision_names[] = {"highest", "high"};

/* Process-wide, like torch.set_float32_matmul_precision. */
static _Atomic int float32_precision = PREC_HIGHEST;

/* Padding of misaligned tensor-core GEMMs (see "Padding" above): never,
 * whenever K or N is misaligned, or only where the copies cost little. */
enum { PAD_OFF = 0, PAD_ON = 1, PAD_AUTO = 2 };
static _Atomic int matmul_padding = PAD_AUTO;
/* Tensor-core loads and leading dimensions: multiples of 16 bytes. */
#define PAD_BYTES 16
/* "auto" pads only when every dimension is at least PAD_MIN_DIM and
 * M N K >= PAD_MIN_WORK (a 1024^3 product): the copies move O(MK + KN +
 * MN) bytes against the GEMM's O(MNK) work, and below that size a few
 * extra launches cost as much as the misaligned GEMM loses. */
#define PAD_MIN_DIM 256
#define PAD_MIN_WORK ((int64_t)1 << 30)

cublasComputeType_t
cl_mm_compute_type(cl_dtype dtype, int precision)
{
    if (dtype == CL_FLOAT64) {
        return CUBLAS_COMPUTE_64F;
    }
    if (dtype == CL_FLOAT32 && precision == PREC_HIGH) {
        return CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    return CUBLAS_COMPUTE_32F;
}

/* ---- operands ------------------------------------------------------------------------ */

/* A matmul operand as cuBLAS will see it: matrix rows x cols with element
 * strides, batch strides aligned to the output's batch axes. */
typedef struct operand {
    DeviceArray *arr;   /* the argument (borrowed) until run time, then a strong
                         * reference to it or to its contiguous copy */
    bool vector;        /* was 1-D */
    int64_t rows, cols, rs, cs;
    int nbatch;         /* batch axes of arr */
    cublasOperation_t op; /* set by operand_layout */
    int64_t ld;
} operand;

/* The product, as validation leaves it. */
typedef struct mm_problem {
    cl_op op;
    cl_dtype dtype;
    int precision;
    DeviceArray *a, *b;  /* the arguments (borrowed) */
    DeviceArray *out;    /* out= (borrowed) or NULL */
    int pad;             /* PAD_* for this call */
    operand oa, ob;
    int64_t M, N, K;     /* K, N: the padded extents once matmul_pad ran */
    int64_t flops;       /* 2 M N K per product, of the logical (unpadded) shapes */
    int nb;              /* batch axes of the result, and their extents */
    Py_ssize_t bshape[CL_MAX_NDIM];
    int rnd;             /* the result's shape */
    Py_ssize_t rshape[CL_MAX_NDIM];
} mm_problem;

/* The output's batch axes of extent > 1 with each operand's element stride
 * along them; axes [0, split) are looped over in C (outer calls), axes
 * [split, n_axes) are one strided-batched call of `inner` products. */
typedef struct mm_batching {
    int n_axes, split;
    int64_t ext[CL_MAX_NDIM], sa[CL_MAX_NDIM], sb[CL_MAX_NDIM], sc[CL_MAX_NDIM];
    int64_t outer, inner;
} mm_batching;

/* Read the matrix part of `o->arr`; `first` says whether it is the left
 * operand (a 1-D left operand is a row vector, a right one a column). */
static void
operand_load(operand *o, bool first)
{
    DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    int nd = a->ndim;
    o->vector = nd == 1;
    if (nd == 1) {
        o->nbatch = 0;
        if (first) {
            o->rows = 1;
            o->cols = a->shape[0];
            o->rs = a->shape[0];
            o->cs = a->strides[0] / item;
        }
        else {
            o->rows = a->shape[0];
            o->cols = 1;
            o->rs = a->strides[0] / item;
            o->cs = 1;
        }
        return;
    }
    o->nbatch = nd - 2;
    o->rows = a->shape[nd - 2];
    o->cols = a->shape[nd - 1];
    o->rs = a->strides[nd - 2] / item;
    o->cs = a->strides[nd - 1] / item;
}

/* Can the matrix go to cuBLAS as is? Sets o->op (N: row-major, T:
 * column-major in cuBLAS's terms of our transposed problem) and o->ld.
 * Never with a negative stride: cuBLAS takes positive leading dimensions,
 * and its batch strides are not meant to step backwards either. */
static bool
operand_layout(operand *o)
{
    const DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    if (cl_has_negative_stride(a)) {
        return false;
    }
    for (int i = 0; i < a->ndim; i++) {
        if (a->strides[i] % item != 0) {
            return false;
        }
    }
    int64_t R = o->rows, C = o->cols;
    int64_t rld = R == 1 ? (C > 1 ? C : 1) : o->rs;
    if ((C == 1 || o->cs == 1) && rld >= (C > 1 ? C : 1)) {
        o->op = CUBLAS_OP_N;
        o->ld = rld;
        return true;
    }
    int64_t cld = C == 1 ? (R > 1 ? R : 1) : o->cs;
    if ((R == 1 || o->rs == 1) && cld >= (R > 1 ? R : 1)) {
        o->op = CUBLAS_OP_T;
        o->ld = cld;
        return true;
    }
    return false;
}

/* Element strides of `o` along the output's `nb` batch axes (0 where the
 * operand has no such axis or broadcasts it). */
static void
batch_strides(const operand *o, int nb, const Py_ssize_t *bshape, int64_t *out)
{
    const DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    for (int i = 0; i < nb; i++) {
        int j = i - (nb - o->nbatch); /* operand axis aligned to output axis i */
        out[i] = (j >= 0 && a->shape[j] == bshape[i] && bshape[i] > 1) ? a->strides[j] / item
                                                                         : 0;
    }
}

/* Replace o->arr with a C-contiguous copy (of a broadcast view at the full
 * batch shape when `bshape` is given), which cuBLAS takes as it is. */
static int
operand_make_contiguous(mm_problem *p, operand *o, const Py_ssize_t *bshape)
{
    cl_state *st = p->op.st;
    DeviceArray *src = o->arr;
    DeviceArray *view = NULL;
    if (bshape != NULL) {
        /* shape: bshape + the operand's own matrix axes (1-D operands never
         * reach here: they have no batch axes to broadcast). */
        int nb = p->nb;
        Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
        int64_t bs[CL_MAX_NDIM];
        batch_strides(o, nb, bshape, bs);
        int64_t item = (int64_t)cl_itemsize(src->dtype);
        for (int i = 0; i < nb; i++) {
            shape[i] = bshape[i];
            strides[i] = (Py_ssize_t)(bs[i] * item);
        }
        shape[nb] = src->shape[src->ndim - 2];
        shape[nb + 1] = src->shape[src->ndim - 1];
        strides[nb] = src->strides[src->ndim - 2];
        strides[nb + 1] = src->strides[src->ndim - 1];
        view = cl_array_view(st, src, src->data, nb + 2, shape, strides);
        if (view == NULL) {
            return -1;
        }
        src = view;
    }
    DeviceArray *copy = cl_op_contiguous_copy(&p->op, src, src->dtype);
    Py_XDECREF(view);
    if (copy == NULL) {
        return -1;
    }
    cl_op_use(&p->op, copy);
    Py_SETREF(o->arr, copy);
    operand_load(o, o == &p->oa);
    (void)operand_layout(o);
    return 0;
}

/* ---- validate (no CUDA call) ------------------------------------------------------------ */

int
cl_mm_default_precision(void)
{
    return atomic_load(&float32_precision);
}

int
cl_mm_parse_precision(PyObject *obj, const char *func, const char *param, int *out)
{
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected 'highest' or 'high', got %.100s", Py_TYPE(obj)->tp_name);
    }
    for (int i = 0; i < 2; i++) {
        if (PyUnicode_CompareWithASCIIString(obj, precision_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return cl_arg_error(PyExc_ValueError, func, param, "expected 'highest' or 'high', got %R",
                        obj);
}

static int
parse_pad(PyObject *obj, const char *func, const char *param, int *out)
{
    if (PyBool_Check(obj)) {
        *out = obj == Py_True ? PAD_ON : PAD_OFF;
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected 'auto', True or False, got %.100s", Py_TYPE(obj)->tp_name);
    }
    if (PyUnicode_CompareWithASCIIString(obj, "auto") == 0) {
        *out = PAD_AUTO;
        return 0;
    }
    return cl_arg_error(PyExc_ValueError, func, param, "expected 'auto', True or False, got %R",
                        obj);
}

/* Raise with the two shapes in the message: "<detail>: 'a' has shape (..)
 * and 'b' has shape (..)". */
static int
shape_error(const mm_problem *p, const char *detail)
{
    PyObject *sa = cl_shape_tuple(p->a->ndim, p->a->shape);
    PyObject *sb = cl_shape_tuple(p->b->ndim, p->b->shape);
    if (sa != NULL && sb != NULL) {
        cl_arg_error(PyExc_ValueError, p->op.func, "b",
                     "%s: 'a' has shape %R and 'b' has shape %R", detail, sa, sb);
    }
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    return -1;
}

/* A DeviceArray on the op's device, of a float dtype, with at least one axis. */
static int
validate_operand(cl_op *op, PyObject *obj, const char *param, DeviceArray **arr)
{
    if (cl_op_array(op, obj, param, arr) < 0) {
        return -1;
    }
    if (!cl_dtype_is_float((*arr)->dtype)) {
        return cl_arg_error(PyExc_TypeError, op->func, param,
                            "unsupported dtype %s (matmul supports float16, bfloat16, float32 "
                            "and float64)", cl_dtype_name((*arr)->dtype));
    }
    if ((*arr)->ndim == 0) {
        return cl_arg_error(PyExc_ValueError, op->func, param,
                            "a 0-d array has no matrix dimensions (use multiply for scalars)");
    }
    return 0;
}

/* Contracted axis, batch broadcast, result shape. */
static int
validate_shapes(mm_problem *p)
{
    operand *oa = &p->oa, *ob = &p->ob;
    *oa = (operand){.arr = p->a};
    *ob = (operand){.arr = p->b};
    operand_load(oa, true);
    operand_load(ob, false);
    p->M = oa->rows;
    p->K = oa->cols;
    p->N = ob->cols;
    if (ob->rows != p->K) {
        char detail[160];
        snprintf(detail, sizeof detail,
                 "the contracted dimensions differ (%lld in 'a', %lld in 'b')", (long long)p->K,
                 (long long)ob->rows);
        return shape_error(p, detail);
    }
    p->nb = oa->nbatch > ob->nbatch ? oa->nbatch : ob->nbatch;
    for (int i = 0; i < p->nb; i++) {
        int ia = i - (p->nb - oa->nbatch), ib = i - (p->nb - ob->nbatch);
        Py_ssize_t ea = ia >= 0 ? p->a->shape[ia] : 1, eb = ib >= 0 ? p->b->shape[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            return shape_error(p, "the batch dimensions cannot be broadcast together");
        }
        p->bshape[i] = ea == 1 ? eb : ea;
    }
    p->rnd = 0;
    for (int i = 0; i < p->nb; i++) {
        p->rshape[p->rnd++] = p->bshape[i];
    }
    if (!oa->vector) {
        p->rshape[p->rnd++] = (Py_ssize_t)p->M;
    }
    if (!ob->vector) {
        p->rshape[p->rnd++] = (Py_ssize_t)p->N;
    }
    return 0;
}

/* out= is C-contiguous, possibly read backwards along some axes (a view
 * such as c[::-1] of a C-contiguous c): every element once, in C order up to
 * the sign of the strides. Empty arrays always qualify. */
static bool
out_layout_ok(const DeviceArray *out)
{
    if (cl_array_size(out) == 0) {
        return true;
    }
    Py_ssize_t expected = (Py_ssize_t)cl_itemsize(out->dtype);
    for (int i = out->ndim - 1; i >= 0; i--) {
        Py_ssize_t s = out->strides[i] < 0 ? -out->strides[i] : out->strides[i];
        if (out->shape[i] != 1 && s != expected) {
            return false;
        }
        expected *= out->shape[i];
    }
    return true;
}

static int
matmul_validate(mm_problem *p, cl_state *st, const char *func, PyObject *a_obj, PyObject *b_obj,
                PyObject *out_obj, PyObject *precision_obj, PyObject *pad_obj)
{
    cl_op_init(&p->op, st, func);
    /* The scalar options first, so they are checked even without arrays (CPU tier). */
    p->precision = cl_mm_default_precision();
    p->pad = atomic_load(&matmul_padding);
    if ((precision_obj != NULL && precision_obj != Py_None &&
         cl_mm_parse_precision(precision_obj, func, "precision", &p->precision) < 0) ||
        (pad_obj != NULL && pad_obj != Py_None && parse_pad(pad_obj, func, "pad", &p->pad) < 0)) {
        return -1;
    }
    if (validate_operand(&p->op, a_obj, "a", &p->a) < 0 ||
        validate_operand(&p->op, b_obj, "b", &p->b) < 0) {
        return -1;
    }
    if (p->a->dtype != p->b->dtype) {
        return cl_arg_error(PyExc_TypeError, func, "b",
                            "dtype %s differs from 'a''s dtype %s (convert one with astype())",
                            cl_dtype_name(p->b->dtype), cl_dtype_name(p->a->dtype));
    }
    p->dtype = p->a->dtype;
    if (validate_shapes(p) < 0 ||
        cl_op_out(&p->op, out_obj, p->rnd, p->rshape, &p->out) < 0 ||
        cl_op_out_dtype(&p->op, p->out, p->dtype) < 0) {
        return -1;
    }
    if (p->out != NULL && !out_layout_ok(p->out)) {
        return cl_arg_error(PyExc_ValueError, func, "out", "must be C-contiguous");
    }
    p->flops = 2 * p->M * p->N * p->K;
    for (int i = 0; i < p->nb; i++) {
        p->flops *= p->bshape[i];
    }
    return 0;
}

/* ---- plan ---------------------------------------------------------------------------- */

/* Fill `bt` from the operands' current arrays (see mm_batching). */
static void
batching_split(const mm_problem *p, mm_batching *bt)
{
    int64_t sa_all[CL_MAX_NDIM], sb_all[CL_MAX_NDIM];
    batch_strides(&p->oa, p->nb, p->bshape, sa_all);
    batch_strides(&p->ob, p->nb, p->bshape, sb_all);
    bt->n_axes = 0;
    for (int i = 0; i < p->nb; i++) {
        if (p->bshape[i] > 1) {
            bt->ext[bt->n_axes] = p->bshape[i];
            bt->sa[bt->n_axes] = sa_all[i];
            bt->sb[bt->n_axes] = sb_all[i];
            bt->n_axes++;
        }
    }
    int n = bt->n_axes;
    int64_t stride_c = p->M * p->N;
    for (int i = n - 1; i >= 0; i--) {
        bt->sc[i] = stride_c;
        stride_c *= bt->ext[i];
    }
    bt->split = n > 0 ? n - 1 : 0; /* inner axes: split .. n-1 */
    while (bt->split > 0 &&
           bt->sa[bt->split - 1] == bt->sa[bt->split] * bt->ext[bt->split] &&
           bt->sb[bt->split - 1] == bt->sb[bt->split] * bt->ext[bt->split]) {
        bt->split--;
    }
    bt->outer = 1;
    bt->inner = 1;
    for (int i = 0; i < n; i++) {
        if (i < bt->split) {
            bt->outer *= bt->ext[i];
        }
        else {
            bt->inner *= bt->ext[i];
        }
    }
}

/* Whether `s` addresses all of bt's batch axes with one constant stride. */
static bool
one_batch_stride(const mm_batching *bt, const int64_t *s)
{
    for (int i = 0; i + 1 < bt->n_axes; i++) {
        if (s[i] != s[i + 1] * bt->ext[i + 1]) {
            return false;
        }
    }
    return true;
}

/* Split the batch; when that takes too many calls, materialize the operands
 * that need them at the full batch shape and split again. */
static int
plan_batches(mm_problem *p, mm_batching *bt)
{
    batching_split(p, bt);
    if (bt->outer <= MAX_OUTER_CALLS) {
        return 0;
    }
    bool a_ok = one_batch_stride(bt, bt->sa), b_ok = one_batch_stride(bt, bt->sb);
    if ((!a_ok && operand_make_contiguous(p, &p->oa, p->bshape) < 0) ||
        (!b_ok && operand_make_contiguous(p, &p->ob, p->bshape) < 0)) {
        return -1;
    }
    batching_split(p, bt);
    return 0;
}

uint32_t
cl_mm_alignment_of(uint64_t value)
{
    if (value == 0) {
        return 256;
    }
    uint64_t a = value & (~value + 1);
    return a > 256 ? 256 : (uint32_t)a;
}

static uint32_t
min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* The GEMM of one (outer) call: cuBLAS's X = our b (m = N, k = K), Y = our
 * a (k = K, n = M), C = target; pointer alignments include every batch step. */
static void
plan_key(const mm_problem *p, const mm_batching *bt, const DeviceArray *target, cl_mm_key *key)
{
    int64_t item = (int64_t)cl_itemsize(p->dtype);
    int n = bt->n_axes;
    bool batched = bt->inner > 1;
    uint32_t al_a = cl_mm_alignment_of((uintptr_t)p->oa.arr->data);
    uint32_t al_b = cl_mm_alignment_of((uintptr_t)p->ob.arr->data);
    uint32_t al_c = cl_mm_alignment_of((uintptr_t)target->data);
    for (int i = 0; i < n; i++) {
        al_a = min_u32(al_a, cl_mm_alignment_of((uint64_t)(bt->sa[i] * item)));
        al_b = min_u32(al_b, cl_mm_alignment_of((uint64_t)(bt->sb[i] * item)));
        al_c = min_u32(al_c, cl_mm_alignment_of((uint64_t)(bt->sc[i] * item)));
    }
    memset(key, 0, sizeof *key);
    key->device = p->op.device;
    key->dtype = (int)p->dtype;
    key->compute = (int)cl_mm_compute_type(p->dtype, p->precision);
    key->lt = atomic_load(&use_lt[p->dtype]);
    key->opx = (int)p->ob.op;
    key->opy = (int)p->oa.op;
    key->m = p->N;
    key->n = p->M;
    key->k = p->K;
    key->ldx = p->ob.ld;
    key->ldy = p->oa.ld;
    key->ldc = p->N;
    key->batch = bt->inner;
    key->sx = batched && n > 0 ? bt->sb[n - 1] : 0;
    key->sy = batched && n > 0 ? bt->sa[n - 1] : 0;
    key->sc = batched && n > 0 ? bt->sc[n - 1] : 0;
    key->align_x = al_b;
    key->align_y = al_a;
    key->align_c = al_c;
}

/* Layouts cuBLAS cannot take as they are become contiguous; then the batch
 * split and the GEMM key. */
static int
matmul_plan(mm_problem *p, const DeviceArray *target, mm_batching *bt, cl_mm_key *key)
{
    if ((!operand_layout(&p->oa) && operand_make_contiguous(p, &p->oa, NULL) < 0) ||
        (!operand_layout(&p->ob) && operand_make_contiguous(p, &p->ob, NULL) < 0) ||
        plan_batches(p, bt) < 0) {
        return -1;
    }
    plan_key(p, bt, target, key);
    return 0;
}

/* ---- padding (see "Padding" in the header comment) ------------------------------------- */

static bool
tensor_core_dtype(const mm_problem *p)
{
    return p->dtype == CL_FLOAT16 || p->dtype == CL_BFLOAT16 ||
           (p->dtype == CL_FLOAT32 && p->precision == PREC_HIGH);
}

/* Pad this call? A tensor-core dtype, two matrices (no 1-D operand), K or N
 * misaligned; under "auto" also every dimension >= PAD_MIN_DIM and
 * M N K >= PAD_MIN_WORK. */
static bool
pad_wanted(const mm_problem *p)
{
    if (p->pad == PAD_OFF || !tensor_core_dtype(p) || p->oa.vector || p->ob.vector) {
        return false;
    }
    int64_t step = PAD_BYTES / (int64_t)cl_itemsize(p->dtype);
    if (p->K % step == 0 && p->N % step == 0) {
        return false;
    }
    return p->pad == PAD_ON ||
           (p->M >= PAD_MIN_DIM && p->N >= PAD_MIN_DIM && p->K >= PAD_MIN_DIM &&
            (double)p->M * (double)p->N * (double)p->K >= (double)PAD_MIN_WORK);
}

/* Whether `o` can serve the padded GEMM as it is: its shape is the padded
 * one and cuBLAS sees 16-byte aligned data, leading dimension, contiguous
 * extent and batch strides. */
static bool
operand_aligned(operand *o, int64_t rows_p, int64_t cols_p)
{
    const DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    if (o->rows != rows_p || o->cols != cols_p || !operand_layout(o) ||
        cl_mm_alignment_of((uintptr_t)a->data) < PAD_BYTES || (o->ld * item) % PAD_BYTES != 0 ||
        ((o->op == CUBLAS_OP_N ? o->cols : o->rows) * item) % PAD_BYTES != 0) {
        return false;
    }
    for (int i = 0; i < o->nbatch; i++) {
        if (a->shape[i] > 1 && a->strides[i] % PAD_BYTES != 0) {
            return false;
        }
    }
    return true;
}

/* Whether `o` is row-major with its matrices one batch stride apart (rows *
 * pitch): what cl_pad_matrices reads. Sets the row pitch in elements. */
static bool
operand_pitched(const operand *o, int64_t *pitch)
{
    const DeviceArray *a = o->arr;
    int nd = a->ndim;
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(a->dtype);
    if (o->cols > 1 && a->strides[nd - 1] != item) {
        return false;
    }
    if (o->rows > 1 && (a->strides[nd - 2] % item != 0 || o->rs < o->cols)) {
        return false;
    }
    *pitch = o->rows > 1 ? o->rs : o->cols;
    int64_t expect = o->rows * *pitch * item;
    for (int i = nd - 3; i >= 0; i--) {
        if (a->shape[i] > 1 && a->strides[i] != expect) {
            return false;
        }
        expect *= a->shape[i];
    }
    return true;
}

/* Make `o` a C-contiguous rows_p x cols_p (per batch) copy with zeros
 * beyond its own rows x cols, unless it can serve as it is. */
static int
operand_pad(mm_problem *p, operand *o, int64_t rows_p, int64_t cols_p)
{
    int64_t pitch = 0;
    if (operand_aligned(o, rows_p, cols_p)) {
        return 0;
    }
    if (!operand_pitched(o, &pitch)) {
        /* A C-contiguous copy always is pitched. */
        if (operand_make_contiguous(p, o, NULL) < 0) {
            return -1;
        }
        (void)operand_pitched(o, &pitch);
    }
    const DeviceArray *src = o->arr;
    int nd = src->ndim;
    Py_ssize_t shape[CL_MAX_NDIM];
    int64_t depth = 1;
    for (int i = 0; i < nd - 2; i++) {
        shape[i] = src->shape[i];
        depth *= src->shape[i];
    }
    shape[nd - 2] = (Py_ssize_t)rows_p;
    shape[nd - 1] = (Py_ssize_t)cols_p;
    DeviceArray *dst = cl_op_new(&p->op, nd, shape, NULL, p->dtype);
    if (dst == NULL) {
        return -1;
    }
    /* One pass: the copy and the zeros beyond rows x cols. */
    CL_CUDA_CHECK(p->op.st, cl_pad_matrices(dst->data, rows_p, cols_p, src->data,
                                            o->rows * pitch, pitch, o->rows, o->cols, depth,
                                            cl_itemsize(p->dtype), p->op.stream));
    Py_SETREF(o->arr, dst);
    operand_load(o, o == &p->oa);
    return 0;
fail:
    Py_DECREF(dst);
    return -1;
}

/* Pad the operands to K -> Kp, N -> Np and, when N grew, make *padded the
 * result the GEMM writes (rows of Np); p->K and p->N become Kp and Np. */
static int
matmul_pad(mm_problem *p, DeviceArray **padded)
{
    int64_t step = PAD_BYTES / (int64_t)cl_itemsize(p->dtype);
    int64_t Kp = (p->K + step - 1) / step * step, Np = (p->N + step - 1) / step * step;
    *padded = NULL;
    if (operand_pad(p, &p->oa, p->M, Kp) < 0 || operand_pad(p, &p->ob, Kp, Np) < 0) {
        return -1;
    }
    if (Np != p->N) {
        Py_ssize_t shape[CL_MAX_NDIM];
        memcpy(shape, p->rshape, sizeof shape);
        shape[p->rnd - 1] = (Py_ssize_t)Np;
        *padded = cl_op_new(&p->op, p->rnd, shape, NULL, p->dtype);
        if (*padded == NULL) {
            return -1;
        }
    }
    p->K = Kp;
    p->N = Np;
    return 0;
}

/* The first n columns of each row of `padded` (rows of p->N) into `target`. */
static int
result_unpad(mm_problem *p, const DeviceArray *padded, DeviceArray *target, int64_t n)
{
    int64_t rows = cl_array_size(target) / n;
    CL_CUDA_CHECK(p->op.st, cl_pad_matrices(target->data, rows, n, padded->data, 0, p->N, rows,
                                            n, 1, cl_itemsize(p->dtype), p->op.stream));
    return 0;
fail:
    return -1;
}

/* ---- run ------------------------------------------------------------------------------- */

/* One strided-batched GEMM per outer batch index. */
static int
matmul_run(mm_problem *p, const mm_batching *bt, const cl_mm_key *key, DeviceArray *target)
{
    cl_mm_exec ex;
    if (cl_mm_prepare(p->op.st, key, p->op.stream, &ex) < 0) {
        return -1;
    }
    int64_t item = (int64_t)cl_itemsize(p->dtype);
    int64_t idx[CL_MAX_NDIM] = {0};
    for (int64_t call = 0; call < bt->outer; call++) {
        int64_t off_a = 0, off_b = 0, off_c = 0;
        for (int i = 0; i < bt->split; i++) {
            off_a += idx[i] * bt->sa[i];
            off_b += idx[i] * bt->sb[i];
            off_c += idx[i] * bt->sc[i];
        }
        if (cl_mm_run(p->op.st, &ex, p->ob.arr->data + off_b * item,
                      p->oa.arr->data + off_a * item, target->data + off_c * item) < 0) {
            return -1;
        }
        for (int i = bt->split - 1; i >= 0; i--) {
            if (++idx[i] < bt->ext[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
    return 0;
}

/* The product into `target`: nothing for an empty result, zeros for K = 0,
 * through padded buffers where pad_wanted says so. */
static int
matmul_compute(mm_problem *p, DeviceArray *target)
{
    int64_t batch_total = 1;
    for (int i = 0; i < p->nb; i++) {
        batch_total *= p->bshape[i];
    }
    if (batch_total == 0 || p->M == 0 || p->N == 0) {
        return 0;
    }
    if (p->K == 0) {
        CL_CUDA_CHECK(p->op.st, cudaMemsetAsync(target->data, 0,
                                                (size_t)cl_array_size(target) *
                                                    cl_itemsize(p->dtype),
                                                p->op.stream));
        return 0;
    }
    int64_t n = p->N;
    DeviceArray *padded = NULL;
    if (pad_wanted(p) && matmul_pad(p, &padded) < 0) {
        return -1;
    }
    DeviceArray *gemm_target = padded != NULL ? padded : target;
    mm_batching bt;
    cl_mm_key key;
    int rc = (matmul_plan(p, gemm_target, &bt, &key) < 0 ||
              matmul_run(p, &bt, &key, gemm_target) < 0 ||
              (padded != NULL && result_unpad(p, padded, target, n) < 0)) ? -1 : 0;
    Py_XDECREF(padded);
    return rc;
fail:
    return -1;
}

/* The returned array and the one the GEMM writes: out= itself, or a
 * temporary when out= overlaps an operand or has negative strides, which
 * cuBLAS cannot write (copied into out= afterwards). */
static int
matmul_targets(mm_problem *p, DeviceArray **result, DeviceArray **target)
{
    if (p->out == NULL) {
        *result = cl_op_new(&p->op, p->rnd, p->rshape, NULL, p->dtype);
        *target = (DeviceArray *)Py_XNewRef(*result);
    }
    else {
        *result = (DeviceArray *)Py_NewRef(p->out);
        if (cl_has_negative_stride(p->out) || cl_arrays_overlap(p->out, p->a) ||
            cl_arrays_overlap(p->out, p->b)) {
            *target = cl_op_new(&p->op, p->rnd, p->rshape, NULL, p->dtype);
        }
        else {
            *target = (DeviceArray *)Py_NewRef(p->out);
        }
    }
    return *result == NULL || *target == NULL ? -1 : 0;
}

/* Close the op: the profiler's record (result NULL: it failed). Bytes: a, b
 * and the result once each; FLOPs: 2 M N K per matrix product, of the
 * logical shapes (padding's extra work is not counted). */
static void
matmul_end(mm_problem *p, DeviceArray *result)
{
    if (!CL_OP_PROFILING(&p->op) || result == NULL) {
        cl_op_end(&p->op, (PyObject *)result, NULL);
        return;
    }
    cl_prof_info info = {
        .dtype = (int)p->dtype,
        .bytes = cl_prof_nbytes(p->a) + cl_prof_nbytes(p->b) + cl_prof_nbytes(result),
        .flops = p->flops,
        .ninputs = 2,
        .inputs = {p->a, p->b},
        .out_ndim = p->rnd,
        .out_shape = p->rshape,
    };
    cl_op_end(&p->op, (PyObject *)result, &info);
}

static PyObject *
do_matmul(cl_state *st, const char *func, PyObject *a_obj, PyObject *b_obj, PyObject *out_obj,
          PyObject *precision_obj, PyObject *pad_obj)
{
    mm_problem p;
    if (matmul_validate(&p, st, func, a_obj, b_obj, out_obj, precision_obj, pad_obj) < 0 ||
        cl_op_begin(&p.op) < 0) {
        return NULL;
    }
    cl_mm_drain_graveyard(st);
    Py_INCREF(p.oa.arr);
    Py_INCREF(p.ob.arr);
    cl_op_use(&p.op, p.a); /* stream-safe frees (record_stream) */
    cl_op_use(&p.op, p.b);
    cl_op_use(&p.op, p.out);
    DeviceArray *result = NULL, *target = NULL;
    if (matmul_targets(&p, &result, &target) < 0 || matmul_compute(&p, target) < 0 ||
        (target != result && cl_op_copy_into(&p.op, result, target) < 0)) {
        Py_CLEAR(result);
    }
    matmul_end(&p, result);
    Py_DECREF(p.oa.arr);
    Py_DECREF(p.ob.arr);
    Py_XDECREF(target);
    return (PyObject *)result;
}

/* ---- Python functions ------------------------------------------------------------------- */

PyDoc_STRVAR(matmul_doc,
"matmul(a, b, out=None, precision=None, pad=None)\n--\n\n"
"Matrix product of two DeviceArrays, with np.matmul's semantics, on cuBLASLt.\n\n"
"The last two axes are the matrices; leading (batch) axes broadcast against\n"
"each other. A 1-D `a` is a row vector and a 1-D `b` a column vector; the\n"
"added axis is dropped from the result (1-D @ 1-D gives a 0-d array).\n"
"Transposed and column-major views (``x.T``) and row-major views with a\n"
"leading dimension (``x[:, :n]``) reach cuBLAS as operation flags and leading\n"
"dimensions, without a copy; other layouts (negative strides among them:\n"
"cuBLAS takes only positive leading dimensions) are copied C-contiguous first.\n"
"The work is enqueued on the current stream of the operands' device.\n\n"
"Parameters\n----------\n"
"a, b : DeviceArray\n"
"    float64, float32, float16 or bfloat16, both of the same dtype and on\n"
"    the same device. float16/bfloat16 accumulate in float32.\n"
"out : DeviceArray, optional\n"
"    C-contiguous array of exactly the result's shape and dtype to write\n"
"    into (it may overlap the operands). A C-contiguous array viewed with\n"
"    some axes reversed (``c[::-1]``) is accepted too, written through a\n"
"    temporary; an empty array of the right shape always is.\n"
"precision : {'highest', 'high'}, optional\n"
"    For float32 only: 'highest' computes in true fp32, 'high' lets the\n"
"    tensor cores use TF32. Defaults to get_float32_matmul_precision().\n"
"pad : {'auto', True, False}, optional\n"
"    Padding of tensor-core products (float16, bfloat16, float32 under\n"
"    'high') whose K or N is not a multiple of 16 bytes (8 half or 4 float\n"
"    elements), where cuBLAS would fall back to slow kernels: the operands\n"
"    are copied into zero-padded buffers with K and N rounded up, the\n"
"    aligned product runs, and its first N columns are copied into the\n"
"    result (zeros along K keep it exact). True pads every such product\n"
"    with two matrix operands; 'auto' only when M, N and K are all >= 256\n"
"    and M*N*K >= 2**30, where the copies cost little beside the GEMM;\n"
"    False never. Other dtypes are never padded. Defaults to\n"
"    get_matmul_padding().\n\n"
"Returns\n-------\nDeviceArray\n    `out` if given, else a new C-contiguous array.\n\n"
"Raises\n------\n"
"TypeError\n    Non-DeviceArray operands, unsupported or mixed dtypes.\n"
"ValueError\n    Mismatched shapes, a bad `out`, `precision` or `pad`.\n"
"CublasError\n    A cuBLAS/cuBLASLt call failed.");

static PyObject *
matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"a", "b", "out", "precision", "pad", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[5];
    if (cl_parse_args("matmul", args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    return do_matmul(st, "matmul", argv[0], argv[1], argv[2], argv[3], argv[4]);
}

PyDoc_STRVAR(set_float32_matmul_precision_doc,
"set_float32_matmul_precision(precision)\n--\n\n"
"Choose how float32 matmul computes, for the whole process.\n\n"
"Parameters\n----------\n"
"precision : {'highest', 'high'}\n"
"    'highest' (the default): true fp32 (CUBLAS_COMPUTE_32F). 'high': TF32 on\n"
"    the tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), about 1e-3 relative\n"
"    error and several times faster. A matmul's own `precision` argument\n"
"    overrides this setting for that call.");

static PyObject *
set_float32_matmul_precision(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    static const char *const names[] = {"precision", NULL};
    PyObject *argv[1];
    int precision;
    if (cl_parse_args("set_float32_matmul_precision", args, nargs, kwnames, names, 1, argv) <
            0 ||
        cl_mm_parse_precision(argv[0], "set_float32_matmul_precision", "precision",
                              &precision) < 0) {
        return NULL;
    }
    atomic_store(&float32_precision, precision);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_float32_matmul_precision_doc,
"get_float32_matmul_precision()\n--\n\n"
"The process-wide float32 matmul precision: 'highest' or 'high'.");

static PyObject *
get_float32_matmul_precision(PyObject *module, PyObject *unused)
{
    return PyUnicode_FromString(precision_names[atomic_load(&float32_precision)]);
}

PyDoc_STRVAR(set_matmul_padding_doc,
"set_matmul_padding(mode)\n--\n\n"
"Choose, for the whole process, when matmul pads misaligned tensor-core\n"
"products (see matmul's `pad`).\n\n"
"Parameters\n----------\n"
"mode : {'auto', True, False}\n"
"    'auto' (the default): only where the padding copies cost little beside\n"
"    the GEMM (M, N, K >= 256 and M*N*K >= 2**30). True: every tensor-core\n"
"    product whose K or N is not a multiple of 16 bytes. False: never. A\n"
"    matmul's own `pad` argument overrides this setting for that call.");

static PyObject *
set_matmul_padding(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"mode", NULL};
    PyObject *argv[1];
    int mode;
    if (cl_parse_args("set_matmul_padding", args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_pad(argv[0], "set_matmul_padding", "mode", &mode) < 0) {
        return NULL;
    }
    atomic_store(&matmul_padding, mode);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_matmul_padding_doc,
"get_matmul_padding()\n--\n\n"
"The process-wide matmul padding mode: 'auto' (the default), True or False.");

static PyObject *
get_matmul_padding(PyObject *module, PyObject *unused)
{
    int mode = atomic_load(&matmul_padding);
    if (mode == PAD_AUTO) {
        return PyUnicode_FromString("auto");
    }
    return PyBool_FromLong(mode == PAD_ON);
}

PyDoc_STRVAR(_set_matmul_backend_doc,
"_set_matmul_backend(dtype, backend)\n--\n\n"
"Private, for benchmarks: route `dtype`'s matmuls to 'lt' (cuBLASLt with a\n"
"cached heuristic choice, the default except for float64) or 'cublas'\n"
"(cublasGemmStridedBatchedEx). Returns the previous backend.");

static PyObject *
_set_matmul_backend(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    static const char *const names[] = {"dtype", "backend", NULL};
    static const char *func = "_set_matmul_backend";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    cl_dtype dtype;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0 ||
        cl_dtype_converter(st, argv[0], func, "dtype", &dtype) < 0) {
        return NULL;
    }
    if (!cl_dtype_is_float(dtype)) {
        return cl_arg_error(PyExc_TypeError, func, "dtype", "unsupported dtype %s",
                            cl_dtype_name(dtype)), NULL;
    }
    int lt;
    if (PyUnicode_Check(argv[1]) && PyUnicode_CompareWithASCIIString(argv[1], "lt") == 0) {
        lt = 1;
    }
    else if (PyUnicode_Check(argv[1]) &&
             PyUnicode_CompareWithASCIIString(argv[1], "cublas") == 0) {
        lt = 0;
    }
    else {
        return cl_arg_error(PyExc_ValueError, func, "backend", "expected 'lt' or 'cublas', got %R",
                            argv[1]), NULL;
    }
    int before = atomic_exchange(&use_lt[dtype], lt);
    return PyUnicode_FromString(before ? "lt" : "cublas");
}

PyMethodDef cl_blas_methods[] = {
    CL_FASTCALL(matmul),
    CL_FASTCALL(_set_matmul_backend),
    CL_FASTCALL(set_float32_matmul_precision),
    {"get_float32_matmul_precision", get_float32_matmul_precision, METH_NOARGS,
     get_float32_matmul_precision_doc},
    CL_FASTCALL(set_matmul_padding),
    {"get_matmul_padding", get_matmul_padding, METH_NOARGS, get_matmul_padding_doc},
    {NULL, NULL, 0, NULL},
};

/* a @ b: DeviceArray's nb_matrix_multiply slot (either operand may be ours). */
PyObject *
cl_nb_matrix_multiply(PyObject *a, PyObject *b)
{
    PyTypeObject *ours = NULL;
    if (PyType_GetSlot(Py_TYPE(a), Py_nb_matrix_multiply) == (void *)cl_nb_matrix_multiply) {
        ours = Py_TYPE(a);
    }
    else if (PyType_GetSlot(Py_TYPE(b), Py_nb_matrix_multiply) ==
             (void *)cl_nb_matrix_multiply) {
        ours = Py_TYPE(b);
    }
    if (ours == NULL) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    cl_state *st = cl_state_from_type(ours);
    if (st == NULL) {
        return NULL;
    }
    if (!CL_IS_DEVICEARRAY(st, a) || !CL_IS_DEVICEARRAY(st, b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    return do_matmul(st, "matmul", a, b, NULL, NULL, NULL);
}
