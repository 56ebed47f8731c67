// kit/cuda/conv_cudnn.h: conv2d's three GEMM-shaped passes on cuDNN (kit/cuda/conv_cudnn.cu), for conv.cu.
//
// Each function runs its pass on cuDNN and returns true, or returns false having queued nothing: cuDNN is off
// (cuda_conv_use_cudnn, KIT_CUDNN=0), not in this build, did not start on this GPU, or has no deterministic
// GEMM-family algorithm for the shape within conv's work budget. conv.cu then runs the pass with im2col + cuBLAS, so
// the two engines give one conv2d, pass by pass. Buffers in the layout given (ConvLayout) and in storage format t
// (float32, bf16 or fp16; w already in t), on the compute stream. cuDNN's workspace is the CUDA context's conv work
// (cuda_conv_work, kit/cuda/cuda_context.h), grown to what the chosen algorithm asks for.
#ifndef KIT_CUDA_CONV_CUDNN_H
#define KIT_CUDA_CONV_CUDNN_H

#include <stddef.h>

#include "kit/ops_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where the channels are. The kit's tensors are CONV_NCHW: x (N, C, H, W), w (K, C, R, R), y and dy (N, K, P, Q).
// CONV_NHWC, PyTorch's channels_last: x (N, H, W, C), w (K, R, R, C), y and dy (N, P, Q, K), the order cuDNN's
// tensor-core kernels read; given NCHW 16-bit data, cuDNN may transpose it around those kernels.
// bench_profile's 16-bit profile times both on each conv layer (which one a 16-bit step should store).
typedef enum { CONV_NCHW, CONV_NHWC } ConvLayout;

// Whether cuDNN may be asked at all (the build has it and it is switched on): conv.cu converts an input for it
// only then.
bool cudnn_conv_wanted(void);
// y = conv(x, w): y overwritten (no bias: conv.cu adds it).
bool cudnn_conv_forward(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *x, const void *w, void *y);
// dx += the gradient of x, rounded once to t where t is 16-bit (the sum in float32).
bool cudnn_conv_backward_data(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *w, const void *dy,
                              void *dx);
// dw = the gradient of w + beta * dw, stored in t like x and dy (cuDNN writes the filter gradient in the data's
// type): conv.cu passes float32's dw with beta 1, or a 16-bit scratch with beta 0 that it adds into the float32 dw.
bool cudnn_conv_backward_filter(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *x, const void *dy,
                                void *dw, float beta);

#ifdef __cplusplus
}
#endif

#endif  // KIT_CUDA_CONV_CUDNN_H
