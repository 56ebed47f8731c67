#!/usr/bin/env bash
# scripts/slurm/run-job.sh: the body of the kit's batch scripts (train-1node.sbatch, train-multinode.sbatch),
# run by sbatch on the first node of the allocation. It starts the training on every task of the job and, when
# Slurm's SIGTERM made the program save and stop (preemption, or --signal before the time limit), requeues the
# job: the next run resumes from the newest checkpoint.
#
#   sbatch [sbatch options] scripts/slurm/train-1node.sbatch [PROGRAM ARGS...]
#
# Chosen by the environment (sbatch passes the submitting shell's environment to the job):
#   KIT_PROGRAM    the training program (default: lesson 04's solution, build/solutions/04-checkpoint/train)
#   KIT_LAUNCH     how the ranks find each other:
#                    pmix / pmi2   srun --mpi=pmix|pmi2: Slurm starts the MPI ranks itself (the kit's MPI bootstrap)
#                    env           srun --mpi=none + torchrun's variables (torchrun-env.sh): the MPI-free bootstrap
#                    auto          pmix when this Slurm has it, else pmi2 (default)
#   KIT_CKPT_DIR   where checkpoints go (default runs/slurm-JOBID under the submit folder; the job id survives a
#                  requeue); "none" for a program without checkpoints (lesson 03): no resume, no requeue
#   KIT_MAX_REQUEUE  requeues at most (default 3): a job that never finishes must not circle forever
#   KIT_DIR        the kit's folder (default: where sbatch was run)
set -euo pipefail

: "${SLURM_JOB_ID:?run-job.sh runs inside a Slurm job: sbatch scripts/slurm/train-1node.sbatch}"
kit=${KIT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}
program=${KIT_PROGRAM:-$kit/build/solutions/04-checkpoint/train}
launch=${KIT_LAUNCH:-auto}
restarts=${SLURM_RESTART_COUNT:-0}
max_requeue=${KIT_MAX_REQUEUE:-3}

[ -x "$program" ] || { echo "run-job: $program is not an executable (HINT: make, or set KIT_PROGRAM)" >&2; exit 2; }

mpis=$(srun --mpi=list 2>&1 || true)
if [ "$launch" = auto ]; then
  launch=pmi2
  grep -qw pmix <<< "$mpis" && launch=pmix
fi
case "$launch" in
  pmix|pmi2)
    grep -qw "$launch" <<< "$mpis" ||
      { echo "run-job: this Slurm has no --mpi=$launch (srun --mpi=list: $(tr '\n' ' ' <<< "$mpis")); try KIT_LAUNCH=env" >&2; exit 2; }
    step=(srun --mpi="$launch" --kill-on-bad-exit=1 "$program")
    ;;
  env)
    step=(srun --mpi=none --kill-on-bad-exit=1 "$kit/scripts/slurm/torchrun-env.sh" "$program")
    ;;
  *) echo "run-job: KIT_LAUNCH=$launch: expected pmix, pmi2, env or auto" >&2; exit 2 ;;
esac

args=("$@")
ckpt=${KIT_CKPT_DIR:-$kit/runs/slurm-$SLURM_JOB_ID}
if [ "$ckpt" != none ]; then
  mkdir -p "$ckpt"
  # --resume auto: the newest valid checkpoint in the folder, or step 0 when there is none (the first run).
  args+=(--checkpoint-dir "$ckpt" --resume auto)
fi

echo "run-job: job $SLURM_JOB_ID run $((restarts + 1)) on ${SLURM_JOB_NUM_NODES:-1} node(s) ($SLURM_JOB_NODELIST)," \
     "${SLURM_NTASKS:-1} task(s), launch $launch"
echo "run-job: ${step[*]} ${args[*]}"

# The program's lines go to the job's output as usual and, for the check below, to this run's own log.
log=$(mktemp "${TMPDIR:-/tmp}/run-job.XXXXXX")
trap 'rm -f "$log"' EXIT
set +e
"${step[@]}" "${args[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# Stopped by Slurm's SIGTERM after saving (lesson 04's program says "stopped after step N by SIGTERM ..." and
# exits 0): put the job back in the queue; the same script runs again and resumes.
if [ "$rc" -eq 0 ] && [ "$ckpt" != none ] && grep -q '^stopped after step [0-9]* by SIGTERM' "$log"; then
  if [ "$restarts" -ge "$max_requeue" ]; then
    echo "run-job: stopped by SIGTERM after $restarts requeue(s); KIT_MAX_REQUEUE=$max_requeue allows no more: giving up" \
         "(the checkpoints stay in $ckpt)" >&2
    exit 1
  fi
  echo "run-job: stopped by SIGTERM after saving: requeueing job $SLURM_JOB_ID (it resumes from $ckpt)"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi
echo "run-job: the program exited with status $rc"
exit "$rc"
