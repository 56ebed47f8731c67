#!/usr/bin/env bash
# datasets/get-data.sh: picks the dataset `make run` trains on, getting it when it can.
#
#   datasets/get-data.sh [auto|cifar10|fashion-mnist|synthetic]      (default: auto)
#
# auto: CIFAR-10 (already in datasets/data, or downloaded + MD5-checked by fetch.sh), else Fashion-MNIST
# from Debian's dataset-fashion-mnist package (installed with apt when missing and possible), else the
# built-in synthetic set. A named dataset is that one or an error (exit 1).
# Prints one line saying what it picked and why; the LAST line is machine-readable:
#   dataset=NAME dir=PATH          (PATH is what --data-dir takes; "none" for synthetic)
# Environment: DATA_DIR (default datasets/data), FASHION_DIR (default /usr/share/datasets/fashion-mnist),
# NO_APT=1 (never install packages).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data_dir=${DATA_DIR:-$here/data}
fashion_dir=${FASHION_DIR:-/usr/share/datasets/fashion-mnist}
want=${1:-auto}

case $want in
  auto|cifar10|fashion-mnist|synthetic) ;;
  *) echo "usage: datasets/get-data.sh [auto|cifar10|fashion-mnist|synthetic]" >&2; exit 2 ;;
esac

pick() {  # name dir reason
  echo "data: using $1 ($3)"
  echo "dataset=$1 dir=$2"
  exit 0
}

fashion_present() {
  local split kind
  for split in train t10k; do
    for kind in images-idx3 labels-idx1; do
      [[ -s $fashion_dir/$split-$kind-ubyte.gz || -s $fashion_dir/$split-$kind-ubyte ]] || return 1
    done
  done
}

# Installs Debian's package when apt is there and we may (root, or sudo without a password).
# Bounded: an offline mirror fails within seconds instead of apt's long default retries.
fashion_install() {
  [[ ${NO_APT:-0} == 1 ]] && return 1
  command -v apt-get >/dev/null || return 1
  local sudo=""
  if [[ $(id -u) != 0 ]]; then
    sudo -n true 2>/dev/null || return 1
    sudo="sudo -n"
  fi
  echo "data: installing dataset-fashion-mnist with apt" >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    -o Acquire::http::Timeout=5 -o Acquire::https::Timeout=5 -o Acquire::Retries=0 \
    dataset-fashion-mnist >/dev/null 2>&1
}

try_cifar10() {
  # fetch.sh says "already there", or downloads and verifies; offline it fails in one line, in seconds.
  DATA_DIR=$data_dir "$here/fetch.sh" cifar10 >&2
}

cifar_why=""
if [[ $want == auto || $want == cifar10 ]]; then
  if try_cifar10; then
    pick cifar10 "$data_dir" "CIFAR-10 in $data_dir/cifar-10-batches-bin"
  fi
  cifar_why="CIFAR-10 could not be downloaded"
  if [[ $want == cifar10 ]]; then
    echo "data: $cifar_why (see the line above); try again online, or use fashion-mnist or synthetic" >&2
    exit 1
  fi
fi

if [[ $want == auto || $want == fashion-mnist ]]; then
  if fashion_present || { fashion_install && fashion_present; }; then
    pick fashion-mnist "$fashion_dir" "${cifar_why:+$cifar_why; }Fashion-MNIST from Debian's package in $fashion_dir"
  fi
  if [[ $want == fashion-mnist ]]; then
    echo "data: Fashion-MNIST is not in $fashion_dir and could not be installed (apt install dataset-fashion-mnist)" >&2
    exit 1
  fi
  cifar_why="${cifar_why:+$cifar_why; }Fashion-MNIST is not installed and apt could not install it"
fi

pick synthetic none "${cifar_why:+$cifar_why; }the built-in synthetic set: 10 classes, 3x32x32, 5000 train / 1000 test"
