#!/usr/bin/env bash
# scripts/netns-rsh.sh: Open MPI's "rsh agent" for scripts/netns-cluster.sh: where mpirun would run
# `ssh HOST COMMAND`, it runs `netns-rsh.sh HOST COMMAND`, and this enters HOST's network namespace (and gives it
# HOST's hostname) instead of logging in over the network. The COMMAND is a shell command line (Open MPI's
# daemon with its environment), as ssh would hand it to the remote shell.
set -euo pipefail
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done   # ssh options Open MPI may add (-x)
host=${1:?usage: netns-rsh.sh HOST COMMAND...}
shift
[ -e "/run/netns/$host" ] || { echo "netns-rsh: no network namespace '$host' (is the hostfile's name a netns-cluster host?)" >&2; exit 255; }
# shellcheck disable=SC2016  # $0 and $1 belong to the inner shell
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
