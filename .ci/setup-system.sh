#!/usr/bin/env bash
# System set-up for sits-observe on Debian 12, used by `make demo` and `make test`.
#   setup-system.sh demo   python3-venv, bcc, kernel headers (+ shim), prometheus
#   setup-system.sh test   the above plus alertmanager, chromium, chromium-driver, gcc, e2fsprogs and strace
# As non-root it installs nothing and says so once: the daemon then runs with eBPF off.
set -euo pipefail
mode=${1:-demo}
pkgs=(python3-venv python3-bpfcc linux-headers-amd64 prometheus)  # python3-venv: the Makefile's venv (ensurepip)
if [ "$mode" = test ]; then
  # gcc: the probe tests build stub libraries; e2fsprogs: their ext4 images; strace: which commits reach the disk
  pkgs+=(prometheus-alertmanager chromium chromium-driver gcc e2fsprogs strace)
fi

if [ "$(id -u)" != 0 ]; then
  echo "setup: not root, skipping system packages and kernel set-up (eBPF probes will be off)"
  exit 0
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts the packaged services where systemd runs; the tests start their own on loopback.

# Kernel headers shim: bcc compiles against /lib/modules/$(uname -r)/{build,source}. Where the running
# kernel has no packaged headers (as on these VMs), point both at Debian's newest linux-headers-*-amd64.
# Real hosts should install the headers of their own kernel instead.
mods=/lib/modules/$(uname -r)
if [ ! -e "$mods/build/include" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$hdr" ]; then
    mkdir -p "$mods"
    ln -sfn "$hdr" "$mods/build"
    ln -sfn "${hdr%-amd64}-common" "$mods/source"
    echo "setup: linked $mods/build -> $hdr (headers for another kernel version: read tracepoint args only)"
  fi
fi

# tracefs / debugfs
if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || echo "setup: could not mount tracefs"
fi
if ! mountpoint -q /sys/kernel/debug 2>/dev/null; then
  mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || echo "setup: could not mount debugfs"
fi
exit 0
