#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_receive from RoCEv2 captures (classic pcap, Ethernet).

Each seed is a window of consecutive RoCEv2 packets of one capture in fuzz_receive's input
format (see fuzz_receive.cpp): a scenario byte, then per packet a control byte, a 16-bit
little-endian length and the UDP payload. Packets from the capture's first sender go to
engine A, the others to engine B; every fix-up is on (ICRC, PSN re-base, destination QP,
RETH), so the seeds reach the responder and the completer.

usage: make_seeds.py OUT_DIR CAPTURE.pcap...
"""
import hashlib
import os
import struct
import sys

ROCE_PORT = 4791
WINDOW = 8          # packets per seed
STEP = 4            # first packets of consecutive seeds are this far apart
SEEDS_PER_CAPTURE = 12
MAX_SEED_BYTES = 6000
SCENARIO = 0x1f | (2 << 5)   # receives, SEND, WRITE, two READs; path MTU 1024
FIXUPS = 0x02 | 0x04 | 0x08 | 0x10


def roce_payloads(path):
    """(source IPv4, UDP payload) of every UDP packet to port 4791 in a pcap file."""
    data = open(path, 'rb').read()
    magic = struct.unpack_from('<I', data, 0)[0]
    endian = '<' if magic in (0xa1b2c3d4, 0xa1b23c4d) else '>'
    link = struct.unpack_from(endian + 'I', data, 20)[0]
    if link != 1:
        raise SystemExit(f'{path}: link type {link}, expected Ethernet (1)')
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack_from(endian + 'I', data, off + 8)[0]
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(frame) < 14 + 20 or frame[12:14] != b'\x08\x00':
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0f) * 4
        if ip[9] != 17 or len(ip) < ihl + 8:
            continue
        total = struct.unpack_from('>H', ip, 2)[0]
        udp = ip[ihl:total]
        if struct.unpack_from('>H', udp, 2)[0] != ROCE_PORT:
            continue
        yield ip[12:16], bytes(udp[8:])


def seeds(path):
    packets = list(roce_payloads(path))
    if not packets:
        return
    first_sender = packets[0][0]
    count = 0
    for start in range(0, len(packets), STEP):
        body = bytearray([SCENARIO])
        for src, payload in packets[start:start + WINDOW]:
            if len(body) + 3 + len(payload) > MAX_SEED_BYTES:
                break
            ctrl = FIXUPS | (0 if src == first_sender else 1)
            body += bytes([ctrl]) + struct.pack('<H', len(payload)) + payload
        if len(body) > 1:
            yield bytes(body)
            count += 1
        if count == SEEDS_PER_CAPTURE:
            break


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    written = 0
    for path in sys.argv[2:]:
        name = os.path.splitext(os.path.basename(path))[0]
        for i, seed in enumerate(seeds(path)):
            digest = hashlib.sha1(seed).hexdigest()[:12]
            with open(os.path.join(out, f'{name}-{i:02d}-{digest}'), 'wb') as f:
                f.write(seed)
            written += 1
    print(f'{written} seeds in {out}')


if __name__ == '__main__':
    main()
