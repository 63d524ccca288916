#!/usr/bin/env bash
# Installs what building and testing uroce needs, from Debian 12's own packages.
set -euo pipefail
packages=(
  g++ clang meson ninja-build pkg-config
  libibverbs-dev libevent-dev libisal-dev libcli11-dev libfmt-dev libpcap-dev libbpf-dev libseccomp-dev catch2
  ibverbs-utils perftest tshark iproute2 procps strace ethtool  # strace: test_rdma_netlink.sh; ethtool: test_gro_sharing.sh
  groff-base man-db  # tests/scripts/test_man.sh (groff -ww, man --warnings)
  python3-pyverbs  # tests/scripts/test_fork.sh (fork with multiprocessing)
  ucx-utils openmpi-bin libopenmpi-dev  # tests/scripts/test_ucx.sh (ucx_perftest, mpirun, mpicc)
  qemu-system-x86 cpio kmod xz-utils zstd ibverbs-providers  # tools/stock-kernel-test.sh, tools/rxe-interop-test.sh
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers for tools/fuzz
  librdmacm-dev rdmacm-utils qperf  # RDMA CM: the rdma_cm emulation's tests (rping, udaddy, ...)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; the default (no) is fine.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
