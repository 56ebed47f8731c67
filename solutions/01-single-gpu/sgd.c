// sgd.c: the optimizer step of lesson 01, on the CPU (TODO 1), and the switch to the GPU version.
#include "lesson.h"

#include "kit/check.h"

// TODO 1: SGD with momentum, element by element, exactly as torch.optim.SGD defines it (README section 2:
//   weight decay as part of the gradient, the velocity as a decaying sum of gradients, Nesterov's look-ahead).
//   Every array has n floats. The velocity starts at zero, so the first step is plain SGD; it is the
//   optimizer's memory, so what this call leaves in velocity[] is what the next call starts from.
void lesson_sgd_update_cpu(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum,
                           float weight_decay, int nesterov) {
    // BEGIN SOLUTION
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] + weight_decay * param[i];
        float v = momentum * velocity[i] + g;
        velocity[i] = v;
        param[i] -= lr * (nesterov ? g + momentum * v : v);
    }
    // END SOLUTION
}

// The model calls this for each run of parameters; it picks your CPU loop or your CUDA kernel.
void lesson_sgd_update(Device d, size_t n, float *param, const float *grad, float *velocity, float lr,
                       float momentum, float weight_decay, int nesterov) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        lesson_sgd_update_cuda(n, param, grad, velocity, lr, momentum, weight_decay, nesterov);
        return;
    }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    lesson_sgd_update_cpu(n, param, grad, velocity, lr, momentum, weight_decay, nesterov);
}
