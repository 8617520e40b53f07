// One implicit-GEMM NHWC convolution kernel of NVIDIA's CUTLASS (its 2.x
// device API, SM80 tensor-core mma.sync with a cp.async multistage
// pipeline), wrapped behind conv_op so that the dispatcher
// (conv_implicit.cu) never sees a CUTLASS type.
//
// The GEMM it runs without ever writing the columns: rows are the output
// pixels (n, oh, ow), columns the output channels, the reduction (ky, kx, c).
// The activation iterator reads each row's window straight from the NHWC
// input (masks for the padding) and the filter iterator reads the KRSC
// weights, so the input is read from memory about once instead of kh*kw
// times through a written-out im2col matrix.
//
// The epilogue is CUTLASS's LinearCombinationRelu: D = max(acc + C, t).
//   bias:     C is the bias vector read through a layout whose strides are
//             all 0, so every output pixel reads the same cout values;
//   residual: C is a full NHWC tensor (the shortcut), beta = 1;
//   t = 0 gives the ReLU, t = -inf none (max propagates NaN, as torch does).
// Only one of bias and residual per kernel: one C operand.
//
// Two ways to walk the reduction: kOptimized steps over the filter taps
// and, per tap, over the channels in blocks of the tile's K (so the channels
// must be whole 16-byte vectors, and few channels would waste most of each
// block); kFixedChannels, for the stem, treats (ky, kx, c) as one run of
// exactly `Channels` channels per tap (the images widened to 4), so no
// block computes padding beyond that.
//
// Only included by the per-dtype files (conv_f16.cu, ...), which list the
// tile shapes built for their dtype.
#pragma once

#include <math.h>

#include "cutlass/cutlass.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/epilogue/thread/linear_combination_relu.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

#include "conv_op.h"

namespace cl_implicit {

template <typename Element, typename Block, typename Warp, typename Instruction, int Stages,
          int Channels = 0>
class CutlassConv final : public conv_op {
    static constexpr int kVector = 128 / cutlass::sizeof_bits<Element>::value;
    // The activation and filter loads: one 16-byte vector, or one tap's
    // `Channels` elements with kFixedChannels.
    static constexpr int kLoad = Channels > 0 ? Channels : kVector;
    static constexpr cutlass::conv::IteratorAlgorithm kAlgorithm =
        Channels > 0 ? cutlass::conv::IteratorAlgorithm::kFixedChannels
                     : cutlass::conv::IteratorAlgorithm::kOptimized;
    using Layout = cutlass::layout::TensorNHWC;
    using Epilogue = cutlass::epilogue::thread::LinearCombinationRelu<
        Element, 128 / cutlass::sizeof_bits<Element>::value, float, float>;
    using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
        Element, Layout, Element, Layout, Element, Layout, float,
        cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, Block, Warp, Instruction, Epilogue,
        cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, Stages,
        cutlass::arch::OpMultiplyAdd, kAlgorithm, cutlass::conv::StrideSupport::kStrided, kLoad,
        kLoad>::Kernel;
    using Operator = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

  public:
    static cudaError_t make(const cl_conv_implicit_desc *d, conv_op **out)
    {
        auto *op = new (std::nothrow) CutlassConv(d);
        if (op == nullptr) {
            return cudaErrorMemoryAllocation;
        }
        cudaError_t err = op->prepare();
        if (err != cudaSuccess) {
            delete op;
            return err;
        }
        *out = op;
        return cudaSuccess;
    }

    // A copy of the prepared parameters per launch (a few hundred bytes), so
    // that threads running one program at once never share the pointers.
    cudaError_t run(void *out, const void *x, const void *w, const void *c,
                    cudaStream_t stream) const override
    {
        Operator launch = operator_;
        if (launch.update(arguments(out, x, w, c)) != cutlass::Status::kSuccess) {
            return cudaErrorInvalidValue;
        }
        if (launch.run(stream) != cutlass::Status::kSuccess) {
            cudaError_t err = cudaGetLastError();
            return err != cudaSuccess ? err : cudaErrorLaunchFailure;
        }
        return cudaSuccess;
    }

  private:
    explicit CutlassConv(const cl_conv_implicit_desc *d)
        : desc_(*d),
          problem_(d->g.n, d->g.h, d->g.w, d->g.c, d->cout, d->g.kh, d->g.kw, d->g.oh, d->g.ow,
                   d->g.padding, d->g.padding, d->g.stride, d->g.stride, 1, 1,
                   cutlass::conv::Mode::kCrossCorrelation)
    {
    }

    // C's layout: the bias broadcast over every pixel (all strides 0) or the
    // output's own (the residual). With no C the epilogue never reads it.
    Layout c_layout() const
    {
        if (desc_.epilogue == CL_CONV_EPILOGUE_BIAS) {
            return Layout(Layout::Stride(0));
        }
        return Layout::packed({problem_.N, problem_.P, problem_.Q, problem_.K});
    }

    typename Operator::Arguments arguments(void *out, const void *x, const void *w,
                                           const void *c) const
    {
        const float beta = desc_.epilogue == CL_CONV_EPILOGUE_NONE ? 0.0f : 1.0f;
        const float threshold = desc_.relu ? 0.0f : -INFINITY;
        auto *y = static_cast<Element *>(out);
        auto *src = static_cast<Element *>(const_cast<void *>(c != nullptr ? c : out));
        return typename Operator::Arguments(
            problem_,
            {static_cast<Element *>(const_cast<void *>(x)),
             Layout::packed({problem_.N, problem_.H, problem_.W, problem_.C})},
            {static_cast<Element *>(const_cast<void *>(w)),
             Layout::packed({problem_.K, problem_.R, problem_.S, problem_.C})},
            {src, c_layout()},
            {y, Layout::packed({problem_.N, problem_.P, problem_.Q, problem_.K})},
            {1.0f, beta, threshold});
    }

    // Checks the shape against what this kernel can do, computes the
    // kernel's parameters once (so a run only swaps pointers and launches)
    // and raises the kernel's shared-memory limit.
    cudaError_t prepare()
    {
        // Placeholder pointers: only the layouts and shapes matter here.
        static Element placeholder[1];
        auto args = arguments(placeholder, placeholder, placeholder,
                              desc_.epilogue == CL_CONV_EPILOGUE_NONE ? nullptr : placeholder);
        if (Operator::can_implement(args) != cutlass::Status::kSuccess ||
            Operator::get_workspace_size(args) != 0) {
            return cudaErrorNotSupported;
        }
        if (operator_.initialize(args) != cutlass::Status::kSuccess) {
            cudaError_t err = cudaGetLastError();
            return err != cudaSuccess ? err : cudaErrorNotSupported;
        }
        return cudaSuccess;
    }

    cl_conv_implicit_desc desc_;
    cutlass::conv::Conv2dProblemSize problem_;
    Operator operator_;
};

} // namespace cl_implicit
