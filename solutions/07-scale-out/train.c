// train.c: lesson 07, lesson 03's DDP program, started by mpirun across nodes OR without it.
//
//   mpirun -np 4 --hostfile hosts --map-by ppr:2:node ./train ...           (lesson 03's start, several nodes)
//   RANK=r WORLD_SIZE=4 MASTER_ADDR=node0 MASTER_PORT=29500 ./train ...     (one per rank: torchrun's start)
//
// Every rank runs this whole file. main() decides how the job was started: with mpirun's (or srun's)
// environment, the process group is lesson 03's (MPI, NCCL on GPUs); with RANK and WORLD_SIZE instead, the
// ranks introduce themselves through a rendezvous store (bootstrap.c: TODO 1-4) and the kit's socket backend
// carries the collectives. Then it prints where every rank runs (the node map) and trains exactly as lesson
// 03 does: the same steps, the same all-reduces, the same result on either start.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

Model *scaleout_train(ProcessGroup *pg, const TrainOptions *o) {
    int world = pg_world(pg);
    bool is_main = pg_rank(pg) == 0;
    Device dev = pg_device(pg);
    TrainData data;
    int local_batch = ddp_data_open(&data, o, pg);
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, data.train.c, data.train.h, data.train.w, data.train.classes);
    Model *m = model_create(&cfg, dev, local_batch, o->seed);
    ddp_broadcast_model(pg, m);
    Ddp ddp = {.pg = pg, .model = m, .buckets = ddp_attach_buckets(pg, m, o->bucket_mb)};
    SgdConfig opt = train_sgd_config(o);
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    LrSchedule sched = train_schedule(o, steps_per_epoch);
    if (is_main) {
        train_print_setup(&data, m);
        printf("data: %d rank%s x %d images per step = global batch %d; %d steps per epoch\n", world,
               world == 1 ? "" : "s", local_batch, local_batch * world, steps_per_epoch);
    }
    TrainLog log;
    trainlog_begin(&log, o, data.train.name, dev, world, is_main);
    for (int epoch = 0; epoch < o->epochs; epoch++) {
        trainlog_epoch_begin(&log, epoch, steps_per_epoch);
        ddp_start_epoch(&data, epoch);
        const Batch *b;
        double wait;
        while ((b = loader_next(data.train_loader, &wait)) != NULL) {
            opt.lr = lr_at(&sched, epoch * steps_per_epoch + b->index);
            Metrics r = ddp_step(&ddp, b, &opt, o->label_smoothing);
            trainlog_step(&log, b->index, &r, wait);
        }
        char what[64];
        snprintf(what, sizeof what, "parameters after epoch %d", epoch + 1);
        pg_check_identical(pg, m->params, m->n_params, what);
        Metrics train = ddp_global_metrics(pg, log.local);
        Metrics test = ddp_evaluate(pg, m, data.test_loader);
        trainlog_epoch_end(&log, &train, &test, opt.lr);
    }
    if (is_main)
        printf("ddp: rank 0 computed for %.1f s and waited %.1f s for the gradient all-reduce (%s backend)\n",
               ddp.compute_seconds, ddp.comm_seconds, pg_backend_name(pg_backend(pg)));
    char extra[64];
    snprintf(extra, sizeof extra, "ranks=%d backend=%s", world, pg_backend_name(pg_backend(pg)));
    trainlog_final(&log, extra);
    m->on_grads_ready = NULL;
    buckets_free(ddp.buckets);
    train_data_close(&data);
    return m;
}

#ifdef AUTOGRADER
int scaleout_program_main(int argc, char **argv);
#define main scaleout_program_main
#endif

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_RDZV);  // lesson 03's options plus --init-method
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);

    // Who started us? mpirun/srun leave their environment; a torchrun-style start leaves RANK and WORLD_SIZE
    // (one of them alone is a broken job script: the store start says which is missing). A bare ./train
    // (neither) is a job of one, through MPI as in lesson 03.
    bool by_store = !scaleout_started_by_mpi() && (getenv("RANK") || getenv("WORLD_SIZE"));
    ProcessGroup *pg = by_store ? scaleout_setup_store(&o, dev) : ddp_setup(&argc, &argv, &o, dev);
    char host[RDZV_HOST_LEN] = {0};
    const char *forced = getenv("KIT_NODE_NAME");
    if (forced && *forced) snprintf(host, sizeof host, "%s", forced);
    else if (gethostname(host, sizeof host - 1) < 0) snprintf(host, sizeof host, "unknown");
    if (pg_rank(pg) == 0)
        printf("launch: %s\n", by_store ? "rendezvous store (RANK/WORLD_SIZE from the environment, no mpirun)"
                                        : "mpirun/srun (MPI's environment)");
    scaleout_print_mapping(pg, host);

    Model *m = scaleout_train(pg, &o);
    model_free(m);
    pg_finalize(pg);
    return 0;
}
