"""A workload process for the probe tests, driven over stdin/stdout (one JSON command per line).

    python probe_workload.py COMM [LIB ...]     set /proc/self/comm, dlopen the libraries, print "ready"
    ["call", LIB_INDEX, SYMBOL, ARG, N]   call SYMBOL(ARG) N times
    ["sleep", SECONDS, N]                 N sleeps (runq)
    ["spin_sleep", SPIN_S, SLEEP_S, N]    N times: spin SPIN_S then sleep SLEEP_S (runq)
    ["pread_direct", PATH, N]             N O_DIRECT 4 KiB reads at distinct offsets (block_io)
    ["serve", N]                          accept N TCP connections on a printed port, one request each
Each command answers "ok" (or "error: ..."); EOF ends the process.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import socket
import sys
import time


def _pread_direct(path: str, n: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4096)
    try:
        for i in range(n):
            os.preadv(fd, [buf], i * 4096)
    finally:
        os.close(fd)


def _serve(n: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(srv.getsockname()[1], flush=True)
    for i in range(n):
        conn, _ = srv.accept()
        with conn:
            if i % 2:  # read/write on the fd for odd requests, recv/send for even ones
                os.read(conn.fileno(), 64)
                os.write(conn.fileno(), b"pong\n")
            else:
                conn.recv(64)
                conn.sendall(b"pong\n")
    srv.close()


def main() -> None:
    with open("/proc/self/comm", "w") as f:
        f.write(sys.argv[1])
    libs = [ctypes.CDLL(p) for p in sys.argv[2:]]
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd[0] == "call":
                fn = getattr(libs[cmd[1]], cmd[2])
                for _ in range(cmd[4]):
                    fn(ctypes.c_ulong(cmd[3]))
            elif cmd[0] == "sleep":
                for _ in range(cmd[2]):
                    time.sleep(cmd[1])
            elif cmd[0] == "spin_sleep":
                for _ in range(cmd[3]):
                    end = time.perf_counter() + cmd[1]
                    while time.perf_counter() < end:
                        pass
                    time.sleep(cmd[2])
            elif cmd[0] == "pread_direct":
                _pread_direct(cmd[1], cmd[2])
            elif cmd[0] == "serve":
                _serve(cmd[1])
            print("ok", flush=True)
        except OSError as exc:
            print(f"error: {exc}", flush=True)


if __name__ == "__main__":
    main()
