"""CPU tier of the GPU ResNet-50's host side: the compiled forward's step plan and the
argument checks that run before any GPU work (cudalab.models.plan, .ops, .resnet)."""

import numpy as np
import pytest

import cudalab.models as models
from cudalab.models import arch, ops, plan
from _support import assert_arg_error

DTYPES = ("float32", "float16", "bfloat16")


def _plan(batch=3, dtype="float16", precision="highest", height=224, width=224):
    return plan.plan_forward(batch, dtype, precision, plan.weight_layout(arch.RESNET50, dtype),
                             height, width)


def _reads_and_writes(step):
    """(slot, offset) pairs a step reads and the one it writes (gemm: C is read too)."""
    kind = step[0]
    if kind == "im2col":
        return [(step[1], step[2])], (step[4], step[5])
    if kind in ("max_pool", "avg_pool"):
        return [(step[1], step[2])], (step[3], step[4])
    reads = [(step[1], step[2]), (step[3], step[4])]
    if step[16]:  # accumulate: C is the shortcut
        reads.append((step[7], step[8]))
    return reads, (step[7], step[8])


def test_steps_follow_the_layer_list():
    p = _plan()
    kinds = [s[0] for s in p.steps]
    convs = [layer for layer in arch.RESNET50 if isinstance(layer, arch.Conv)]
    im2cols = [c for c in convs if not c.is_1x1 or c.stride != 1]
    assert kinds.count("gemm") == len(convs) + 1
    assert kinds.count("im2col") == len(im2cols)
    assert kinds.count("max_pool") == kinds.count("avg_pool") == 1
    assert kinds[-1] == "gemm" and p.steps[-1][7] == plan.SLOT_LOGITS
    assert p.steps[0][0] == "im2col" and p.steps[0][1] == plan.SLOT_IMAGES
    assert p.steps[0][3] == "float32" and p.steps[0][6] == "float16"  # the stem casts on store


def test_every_step_reads_what_the_previous_steps_wrote():
    """Walk the steps, tracking which activation each workspace buffer holds: a step
    never reads a buffer overwritten since its activation was written, except through
    the scratch area, which the im2col right before the GEMM filled."""
    p = _plan(batch=2)
    holder = {}  # (slot, offset) -> index of the step that last wrote it
    for i, step in enumerate(p.steps):
        reads, write = _reads_and_writes(step)
        for where in reads:
            if where[0] == plan.SLOT_WORKSPACE:
                assert where in holder, f"step {i} reads {where} before anything wrote it"
        if step[0] == "gemm" and step[1] == plan.SLOT_WORKSPACE and step[2] == 0:
            assert p.steps[i - 1][0] == "im2col", f"step {i} reads a stale scratch area"
        holder[write] = i


def test_residual_gemms_write_over_their_shortcut():
    p = _plan()
    residual = [s for s in p.steps if s[0] == "gemm" and s[16]]
    blocks = [c for c in arch.RESNET50 if isinstance(c, arch.Conv) and c.residual]
    assert len(residual) == len(blocks) == 16
    for layer in blocks:
        assert p.buffers[layer.dst] == p.buffers[layer.residual]


def test_live_activations_never_share_a_buffer():
    p = _plan()
    last = arch.last_reads()
    order = {layer.dst: i for i, layer in enumerate(arch.RESNET50)}
    for a, off_a in p.buffers.items():
        for b, off_b in p.buffers.items():
            if a == b or off_a != off_b or order[a] > order[b]:
                continue
            # b is written after a, into a's buffer: a must be dead by then (or b is
            # the residual GEMM writing over its own shortcut a).
            layer_b = arch.RESNET50[order[b]]
            assert last[a] < order[b] or getattr(layer_b, "residual", None) == a, (a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_workspace_grows_linearly_with_the_batch(dtype):
    one, eight = _plan(1, dtype), _plan(8, dtype)
    assert 7.5 * one.workspace_bytes < eight.workspace_bytes <= 8 * one.workspace_bytes + 4096
    assert one.scratch_bytes < one.workspace_bytes
    assert all(off % plan.ALIGN == 0 for off in one.buffers.values())


def test_weight_layout_is_aligned_and_covers_every_gemm():
    for dtype in DTYPES:
        lay = plan.weight_layout(arch.RESNET50, dtype)
        names = [layer.name for layer in arch.RESNET50 if isinstance(layer, (arch.Conv,
                                                                            arch.Linear))]
        assert list(lay.offsets) == names
        spans = []
        for layer in arch.RESNET50:
            if layer.name not in lay.offsets:
                continue
            w, b = lay.offsets[layer.name]
            k = layer.k_padded if isinstance(layer, arch.Conv) else layer.cin
            spans.append((w, w + layer.cout * k * plan.ITEMSIZE[dtype]))
            if b >= 0:
                spans.append((b, b + layer.cout * plan.ITEMSIZE[dtype]))
        spans.sort()
        assert all(lo % plan.ALIGN == 0 for lo, _ in spans)
        assert all(hi <= nxt for (_, hi), (nxt, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= lay.nbytes


def test_gemm_flops_is_the_sum_over_gemm_steps_with_unpadded_k():
    p = _plan(batch=5)
    padded = sum(2 * s[12] * s[13] * s[14] for s in p.steps if s[0] == "gemm")
    stem = arch.RESNET50[0]
    rows = p.steps[1][12]
    assert p.flops == padded - 2 * rows * stem.cout * (stem.k_padded - stem.k)
    assert plan.gemm_flops(5) == p.flops


def test_tf32_only_changes_the_precision_code():
    a, b = _plan(dtype="float32", precision="highest"), _plan(dtype="float32", precision="high")
    for sa, sb in zip(a.steps, b.steps):
        if sa[0] == "gemm":
            assert (sa[11], sb[11]) == (0, 1)
            assert sa[:11] + sa[12:] == sb[:11] + sb[12:]
        else:
            assert sa == sb


# ---- argument checks before any GPU work -------------------------------------------------------


def test_resnet50_rejects_unknown_precisions():
    with assert_arg_error(ValueError, "resnet50", "precision", "fp8"):
        models.resnet50(precision="fp8")
    with assert_arg_error(TypeError, "resnet50", "precision"):
        models.resnet50(precision=16)


def test_resnet50_rejects_unknown_weight_forms():
    with pytest.raises(TypeError, match="resnet50\\(\\) argument 'weights'"):
        models.resnet50(weights=3.5)


@pytest.mark.parametrize("call", [
    lambda: ops.im2col(np.ones((1, 4, 4, 3), np.float32), 3, 3),
    lambda: ops.max_pool2d([1.0]),
    lambda: ops.global_avg_pool(None),
    lambda: ops.conv_gemm(np.ones((4, 4), np.float32), np.ones((4, 4), np.float32)),
])
def test_ops_want_device_arrays(call):
    with pytest.raises(TypeError, match="expected a DeviceArray"):
        call()
