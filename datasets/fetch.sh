#!/usr/bin/env bash
# datasets/fetch.sh: downloads the binary versions of CIFAR-10 / CIFAR-100 from the authors' site,
# checks the published MD5, and unpacks them into datasets/data/ (see datasets/README.md).
#
#   datasets/fetch.sh cifar10|cifar100|all
#
# Environment: DATA_DIR (default datasets/data), CIFAR_URL (default the Toronto location; set it to a
# mirror or a file:// folder holding the same archives), FETCH_CONNECT_TIMEOUT (seconds, default 5).
# Offline, it says so in one line within seconds and exits 1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
data_dir=${DATA_DIR:-$here/data}
base_url=${CIFAR_URL:-https://www.cs.toronto.edu/~kriz}
connect_timeout=${FETCH_CONNECT_TIMEOUT:-5}

usage() {
  echo "usage: datasets/fetch.sh cifar10|cifar100|all" >&2
  exit 2
}

# name -> archive, MD5 (published on https://www.cs.toronto.edu/~kriz/cifar.html), folder, files and sizes
archive_of() { case $1 in cifar10) echo cifar-10-binary.tar.gz ;; cifar100) echo cifar-100-binary.tar.gz ;; esac; }
md5_of() { case $1 in cifar10) echo c32a1d4ab5d03f1284b67883e8d87530 ;; cifar100) echo 03b5dce01913d631647c71ecec9e9cb8 ;; esac; }
folder_of() { case $1 in cifar10) echo cifar-10-batches-bin ;; cifar100) echo cifar-100-binary ;; esac; }
# "file:bytes" pairs the unpacked folder must hold (10000 records of 1 + 3072 bytes; 50000/10000 of 2 + 3072)
files_of() {
  case $1 in
    cifar10) for b in 1 2 3 4 5; do echo "data_batch_$b.bin:30730000"; done; echo "test_batch.bin:30730000" ;;
    cifar100) echo "train.bin:153700000"; echo "test.bin:30740000" ;;
  esac
}

# True when every file of the dataset is there with its exact size.
complete() {
  local dir entry
  dir=$data_dir/$(folder_of "$1")
  for entry in $(files_of "$1"); do
    local f=${entry%%:*} size=${entry##*:}
    [[ -f $dir/$f && $(stat -c %s "$dir/$f") == "$size" ]] || return 1
  done
}

md5_file() { md5sum "$1" | cut -d' ' -f1; }

# The first curl/wget error line (the one that says what failed), without the tool's prefix.
last_error() { grep -v '^$' "$1" 2>/dev/null | head -n1 | sed -E 's/^(curl: |wget: )//; s/^\([0-9]+\) //'; }

# Checks within seconds that url answers, so an offline machine gets one clear line and no download
# attempt. Returns non-zero with that line on stderr.
reachable() {
  local url=$1 what=$2 host err
  host=$(sed -E 's#^[a-z]+://([^/]*).*#\1#' <<<"$url")
  err=$(mktemp)
  if command -v curl >/dev/null; then
    if ! curl -fsSIL --connect-timeout "$connect_timeout" --max-time $((connect_timeout * 3)) -o /dev/null "$url" 2>"$err"; then
      echo "fetch: offline or ${host:-the server} unreachable ($(last_error "$err")): $what not downloaded; see datasets/README.md" >&2
      rm -f "$err"
      return 1
    fi
  elif command -v wget >/dev/null; then
    if ! wget -q --spider --tries=1 --connect-timeout="$connect_timeout" --dns-timeout="$connect_timeout" \
         --read-timeout="$connect_timeout" "$url" 2>"$err"; then
      echo "fetch: offline or ${host:-the server} unreachable: $what not downloaded; see datasets/README.md" >&2
      rm -f "$err"
      return 1
    fi
  else
    echo "fetch: neither curl nor wget is installed (apt install curl): $what not downloaded" >&2
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
}

# Downloads url to dest (through a .part file). Returns non-zero with one line on stderr.
download() {
  local url=$1 dest=$2 err=$2.err
  rm -f "$dest.part"
  if command -v curl >/dev/null; then
    local progress=-sS
    [[ -t 2 ]] && progress=-#
    # Abort a stalled transfer (under 10 kB/s for 30 s) rather than hang a workshop.
    if ! curl -fL $progress --connect-timeout "$connect_timeout" --speed-limit 10000 --speed-time 30 \
         -o "$dest.part" "$url" 2>"$err"; then
      echo "fetch: download of $url failed ($(last_error "$err"))" >&2
      rm -f "$dest.part" "$err"
      return 1
    fi
  elif ! wget -q --connect-timeout="$connect_timeout" --read-timeout=30 --tries=1 -O "$dest.part" "$url" 2>"$err"; then
    echo "fetch: download of $url failed ($(last_error "$err"))" >&2
    rm -f "$dest.part" "$err"
    return 1
  fi
  rm -f "$err"
  mv "$dest.part" "$dest"
}

fetch_one() {
  local name=$1 archive md5 got
  archive=$(archive_of "$name")
  md5=$(md5_of "$name")
  if complete "$name"; then
    echo "fetch: $name is already in $data_dir/$(folder_of "$name")"
    return 0
  fi
  mkdir -p "$data_dir"
  local dest=$data_dir/$archive
  if [[ -f $dest && $(md5_file "$dest") == "$md5" ]]; then
    echo "fetch: $name: using the archive already downloaded ($dest)"
  else
    reachable "$base_url/$archive" "$name" || return 1
    echo "fetch: downloading $base_url/$archive (about $([[ $name == cifar10 ]] && echo 170 || echo 169) MB)"
    download "$base_url/$archive" "$dest" || return 1
    got=$(md5_file "$dest")
    if [[ $got != "$md5" ]]; then
      echo "fetch: $dest: MD5 mismatch: expected $md5, found $got (a corrupt or partial download; removed it, run again)" >&2
      rm -f "$dest"
      return 1
    fi
  fi
  if ! tar -xzf "$dest" -C "$data_dir"; then
    echo "fetch: $dest: could not unpack (disk full?)" >&2
    return 1
  fi
  if ! complete "$name"; then
    echo "fetch: $data_dir/$(folder_of "$name"): the unpacked files do not have the expected names and sizes" >&2
    return 1
  fi
  rm -f "$dest"  # verified and unpacked: the archive is no longer needed
  echo "fetch: $name ready in $data_dir/$(folder_of "$name") (MD5 $md5 verified)"
}

[[ $# -eq 1 ]] || usage
case $1 in
  cifar10|cifar100) fetch_one "$1" ;;
  all) fetch_one cifar10 && fetch_one cifar100 ;;
  -h|--help) usage ;;
  *) usage ;;
esac
