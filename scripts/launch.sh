#!/usr/bin/env bash
# scripts/launch.sh: starts PROGRAM on NP ranks, the same way on a laptop, a GPU box and a Slurm cluster.
#
#   scripts/launch.sh NP PROGRAM [ARGS...]
#
# Inside a Slurm allocation (SLURM_JOB_ID set): srun --mpi=pmix -n NP PROGRAM ARGS
# Otherwise: mpirun -np NP PROGRAM ARGS, adding
#   --allow-run-as-root   when running as root (containers, cloud images); Open MPI refuses root without it
#   --oversubscribe       when NP is more than the cores here; Open MPI refuses without it
# Extra launcher options can be passed in LAUNCH_ARGS, e.g. LAUNCH_ARGS="--bind-to none".
# LAUNCH_DRY_RUN=1 prints the command instead of running it.
set -euo pipefail

if [ $# -lt 2 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NP PROGRAM [ARGS...]   (NP: number of ranks, at least 1)" >&2
  exit 2
fi
np=$1
shift

read -r -a extra <<< "${LAUNCH_ARGS:-}"

if [ -n "${SLURM_JOB_ID:-}" ] && command -v srun >/dev/null 2>&1; then
  cmd=(srun --mpi=pmix -n "$np" "${extra[@]}" "$@")
else
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "launch.sh: mpirun not found." >&2
    echo "HINT: install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev, or run make deps)" >&2
    exit 127
  fi
  cmd=(mpirun -np "$np")
  [ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
  cores=$(nproc 2>/dev/null || echo 1)
  [ "$np" -gt "$cores" ] && cmd+=(--oversubscribe)
  cmd+=("${extra[@]}" "$@")
fi

# Each rank's stdout is a pseudo-terminal under mpirun: when ours is not a terminal (a log file, CI),
# ask the kit for plain progress lines instead of a bar redrawn with carriage returns.
[ -t 1 ] || export KIT_PROGRESS=plain

if [ "${LAUNCH_DRY_RUN:-0}" = 1 ]; then
  echo "${cmd[*]}"
  exit 0
fi
exec "${cmd[@]}"
