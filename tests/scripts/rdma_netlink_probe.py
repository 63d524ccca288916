#!/usr/bin/env python3
"""Reports, one `key=value` line each, what this process may do with sockets.

test_rdma_netlink.sh runs it plainly, under `uroce run` and with the LD_PRELOAD
line of `uroce env`. The NETLINK_RDMA probes print the errno name ("ok" if the
socket opened); the others print "ok" only when data actually went through.

SOCK_STREAM tells a refusal by uroce from one by the kernel: the kernel checks a
netlink socket's type before its protocol and gives ESOCKTNOSUPPORT, whatever
RDMA support it has, while uroce refuses NETLINK_RDMA of any type with
EPROTONOSUPPORT.
"""
import ctypes
import errno
import os
import platform
import socket
import struct

NETLINK_RDMA = 20
NETLINK_GENERIC = 16


def errname(e):
    return errno.errorcode.get(e, str(e))


def try_socket(family, type_, proto):
    try:
        socket.socket(family, type_, proto).close()
        return "ok"
    except OSError as e:
        return errname(e.errno)


def raw_socket_syscall(family, type_, proto):
    """socket(2) without libc's wrapper (x86-64 only), so an LD_PRELOAD cannot see it."""
    if platform.machine() != "x86_64":
        return "n/a"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(41), ctypes.c_long(family), ctypes.c_long(type_),
                      ctypes.c_long(proto))
    if fd < 0:
        return errname(ctypes.get_errno())
    os.close(fd)
    return "ok"


def route_dump():
    """An RTM_GETLINK dump over NETLINK_ROUTE: ok if at least one link comes back."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
            s.settimeout(5)
            s.bind((0, 0))
            RTM_GETLINK, RTM_NEWLINK, NLMSG_DONE = 18, 16, 3
            NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
            ifinfo = struct.pack("BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)
            hdr = struct.pack("=IHHII", 16 + len(ifinfo), RTM_GETLINK,
                              NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
            s.send(hdr + ifinfo)
            links = 0
            for _ in range(100):
                data = s.recv(65536)
                off = 0
                while off + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, off)
                    if kind == NLMSG_DONE:
                        return "ok" if links > 0 else "no-links"
                    if kind == RTM_NEWLINK:
                        links += 1
                    off += (length + 3) & ~3
                    if length < 16:
                        return "bad-reply"
            return "no-done"
    except OSError as e:
        return errname(e.errno)


def generic_bind():
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as s:
            s.bind((0, 0))
            return "ok"
    except OSError as e:
        return errname(e.errno)


def udp_echo():
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as a:
            a.settimeout(5)
            a.bind(("127.0.0.1", 0))
            a.sendto(b"uroce-probe", a.getsockname())
            return "ok" if a.recv(64) == b"uroce-probe" else "wrong-data"
    except OSError as e:
        return errname(e.errno)


def unix_pair():
    try:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with a, b:
            a.sendall(b"uroce-probe")
            b.settimeout(5)
            return "ok" if b.recv(64) == b"uroce-probe" else "wrong-data"
    except OSError as e:
        return errname(e.errno)


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return "absent"


print("rdma_raw=" + try_socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA))
print("rdma_dgram=" + try_socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_RDMA))
print("rdma_stream=" + try_socket(socket.AF_NETLINK, socket.SOCK_STREAM, NETLINK_RDMA))
print("syscall_rdma_stream=" +
      raw_socket_syscall(socket.AF_NETLINK, socket.SOCK_STREAM, NETLINK_RDMA))
# The same with garbage in the upper halves of the int arguments, which the kernel ignores.
print("syscall_rdma_stream_high=" +
      raw_socket_syscall((1 << 32) | socket.AF_NETLINK, socket.SOCK_STREAM,
                         (1 << 32) | NETLINK_RDMA))
print("route_dump=" + route_dump())
print("generic_bind=" + generic_bind())
print("udp_echo=" + udp_echo())
print("unix_pair=" + unix_pair())
print("no_new_privs=" + status("NoNewPrivs"))
print("seccomp=" + status("Seccomp"))
