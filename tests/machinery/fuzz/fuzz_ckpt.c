// tests/machinery/fuzz/fuzz_ckpt.c: libFuzzer target over the checkpoint reader (kit/ckpt.c).
//
// Any byte string goes through ckpt_decode; whatever it accepts then goes through ckpt_check_model against a
// small model and, when that passes too, ckpt_apply and a read of every tensor. The reader must never crash,
// read out of bounds, overflow or leak (ASan + UBSan), whatever the bytes. `make fuzz` runs it.
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kit/ckpt.h"
#include "kit/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Model *m;
    if (!m) {  // the model of the seed corpus (tests/machinery/fuzz/corpus/ckpt), built once
        ModelConfig cfg;
        model_config(&cfg, "tiny-bn", 2, 3, 8, 8, 10);
        m = model_create(&cfg, DEVICE_CPU, 1, 1);
    }
    Ckpt ck;
    char err[512];
    if (ckpt_decode(&ck, data, size, err, sizeof err) != 0) return 0;
    if (ckpt_check_model(&ck, m, err, sizeof err) == 0) ckpt_apply(&ck, m);
    for (int i = 0; i < ck.n_tensors; i++) {
        float *x = malloc(ck.tensors[i].nbytes ? ck.tensors[i].nbytes : 1);
        ckpt_tensor_data(&ck, &ck.tensors[i], x);
        free(x);
    }
    ckpt_free(&ck);
    return 0;
}
