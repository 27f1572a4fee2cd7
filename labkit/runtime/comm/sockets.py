"""The bytes a process wrote to its TCP sockets, as the kernel counts them (Linux).

gloo moves a rank's point-to-point and collective traffic over TCP connections to its peers.
The kernel keeps, for every TCP socket, how many bytes the peer acknowledged
(``tcpi_bytes_acked``) and how many are still queued unacknowledged (``idiag_wqueue``): their
sum is every byte the process wrote to the socket. ``WireSnapshot(pids)`` reads them for the
sockets each process holds (``/proc/<pid>/fd``) with one ``sock_diag`` netlink dump per
address family (what ``ss -ti`` uses), from another process: nothing running inside the
measured process can change what is read, whatever it does to its own Python.

The kernel also counts the bytes each socket received (``tcpi_bytes_received``): a rank's
received bytes say what reached it, from its peers or from anything else on the loopback (the
cluster's store, in the notebook's process, whose own sockets are not a rank's).

A check compares two readings (``WireSnapshot``) taken around a job: the bytes that crossed
each rank's sockets meanwhile. Counted: TCP over IPv4 and IPv6, the sockets a process holds at
the second reading (a socket opened meanwhile counts from zero; one closed meanwhile is not
counted). ``Unmeasurable`` says why no reading can be taken (not Linux, a process whose
``/proc/<pid>/fd`` cannot be read, netlink refused).
"""

from __future__ import annotations

import os
import socket
import struct
import sys

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2  # the rtattr that carries struct tcp_info
TCP_LISTEN = 10
BYTES_ACKED_OFFSET = 120  # struct tcp_info: __u64 tcpi_bytes_acked (Linux 4.2+)
BYTES_RECEIVED_OFFSET = 128  # and __u64 tcpi_bytes_received, right after it
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBxI48x")  # struct inet_diag_req_v2, the socket id left zero
_MESSAGE = struct.Struct("=BBBB48xIIIII")  # struct inet_diag_msg


class Unmeasurable(RuntimeError):
    """The kernel's socket counters cannot be read here; the message says why."""


def _request(family: int, sequence: int) -> bytes:
    body = _REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1),
                         0xFFFFFFFF & ~(1 << TCP_LISTEN))
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY,
                        NLM_F_REQUEST | NLM_F_DUMP, sequence, 0) + body


def _written(message: memoryview) -> tuple[int, tuple[int, int]] | None:
    """(inode, (bytes written, bytes received)) of one inet_diag_msg, None if it carries no
    tcp_info."""
    *_, wqueue, _uid, inode = _MESSAGE.unpack_from(message)
    offset = _MESSAGE.size
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            break
        if kind == INET_DIAG_INFO and length - 4 >= BYTES_RECEIVED_OFFSET + 8:
            acked, received = struct.unpack_from("=QQ", message,
                                                 offset + 4 + BYTES_ACKED_OFFSET)
            return inode, (acked + wqueue, received)
        offset += (length + 3) & ~3
    return None


def _dump(family: int) -> dict[int, tuple[int, int]]:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as link:
        link.sendall(_request(family, 1))
        found: dict[int, tuple[int, int]] = {}
        while True:
            data = memoryview(link.recv(1 << 16))
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR or length < _HEADER.size:
                    raise Unmeasurable("the kernel refused the socket dump (sock_diag)")
                entry = _written(data[offset + _HEADER.size:offset + length])
                if entry is not None:
                    found[entry[0]] = entry[1]
                offset += (length + 3) & ~3


def tcp_written() -> dict[int, tuple[int, int]]:
    """{socket inode: (bytes written, bytes received)} of every TCP socket of this network
    namespace."""
    if not sys.platform.startswith("linux"):
        raise Unmeasurable("the kernel's socket counters are read on Linux only")
    try:
        return {**_dump(socket.AF_INET), **_dump(socket.AF_INET6)}
    except OSError as error:
        raise Unmeasurable(f"the kernel's socket counters cannot be read ({error})") from None


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds."""
    folder = f"/proc/{pid}/fd"
    inodes = set()
    try:
        names = os.listdir(folder)
    except OSError as error:
        raise Unmeasurable(f"the sockets of process {pid} cannot be listed "
                           f"({error.strerror})") from None
    for name in names:
        try:
            target = os.readlink(f"{folder}/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


class WireSnapshot:
    """The bytes written so far to each TCP socket of each of ``pids``, and received on it."""

    def __init__(self, pids):
        self.pids = list(pids)
        held = {pid: socket_inodes(pid) for pid in self.pids}
        counts = tcp_written()
        self.by_pid = {pid: {i: counts[i][0] for i in inodes if i in counts}
                       for pid, inodes in held.items()}
        self.received_by_pid = {pid: {i: counts[i][1] for i in inodes if i in counts}
                                for pid, inodes in held.items()}

    def sent_since(self, earlier: WireSnapshot) -> list[int]:
        """Per pid (in order): the bytes written to its sockets since ``earlier``."""
        return self._since(earlier, "by_pid")

    def received_since(self, earlier: WireSnapshot) -> list[int]:
        """Per pid (in order): the bytes its sockets received since ``earlier``."""
        return self._since(earlier, "received_by_pid")

    def _since(self, earlier: WireSnapshot, field: str) -> list[int]:
        if earlier.pids != self.pids:
            raise Unmeasurable("the ranks were restarted between the two readings")
        now, before = getattr(self, field), getattr(earlier, field)
        return [sum(n - before[pid].get(i, 0) for i, n in now[pid].items())
                for pid in self.pids]
