#!/usr/bin/env python3
# check_icrc.py [--pmtu N] [--flip] PCAP...: checks the RoCEv2 ICRC of every
# UDP/4791 packet, over IPv4 or IPv6, of classic pcap files (Ethernet link type). With --pmtu, also
# that FIRST/MIDDLE packets carry exactly N payload bytes and no pad. With
# --flip, writes nothing, but flips one payload bit of the first packet in
# memory first (the check must then fail). Exit 0 only if all is good.
import struct, sys, zlib

args = sys.argv[1:]
pmtu = None
flip = False
while args and args[0].startswith('--'):
    if args[0] == '--pmtu':
        pmtu = int(args[1]); args = args[2:]
    elif args[0] == '--flip':
        flip = True; args = args[1:]
    else:
        raise SystemExit('unknown option ' + args[0])

def packets(path):
    with open(path, 'rb') as f:
        data = f.read()
    magic = data[:4]
    if magic in (b'\xd4\xc3\xb2\xa1', b'\x4d\x3c\xb2\xa1'):
        e = '<'
    elif magic in (b'\xa1\xb2\xc3\xd4', b'\xa1\xb2\x3c\x4d'):
        e = '>'
    else:
        raise SystemExit(path + ': not a classic pcap file')
    link = struct.unpack(e + 'I', data[20:24])[0]
    if link != 1:
        raise SystemExit('%s: link type %d, want 1 (Ethernet)' % (path, link))
    off, n = 24, 0
    while off + 16 <= len(data):
        incl, orig = struct.unpack(e + 'II', data[off + 8:off + 16])
        n += 1
        yield n, bytearray(data[off + 16:off + 16 + incl]), incl == orig
        off += 16 + incl

# Extra header bytes after the BTH, per RC opcode.
EXTRA = {0: 0, 1: 0, 2: 0, 3: 4, 4: 0, 5: 4, 6: 16, 7: 0, 8: 0, 9: 4, 10: 16, 11: 20,
         12: 16, 13: 4, 14: 0, 15: 4, 16: 4, 17: 4, 18: 12, 19: 28, 20: 28}
FIRST_MIDDLE = {0, 1, 6, 7, 13, 14}
bad = total = 0

def complain(msg):
    global bad
    bad += 1
    if bad <= 10:
        print(msg)

for path in args:
    for n, fr, whole in packets(path):
        ethertype = fr[12:14]
        if ethertype == b'\x08\x00' and len(fr) >= 34:
            ip = fr[14:]
            ihl = (ip[0] & 15) * 4
            if ip[9] != 17:
                continue
            # The masked IPv4 header: TOS, TTL and header checksum set to ones.
            iph = bytearray(ip[:ihl]); iph[1] = 0xff; iph[8] = 0xff; iph[10:12] = b'\xff\xff'
            ident = 'IP id %d' % struct.unpack('>H', ip[4:6])[0]
        elif ethertype == b'\x86\xdd' and len(fr) >= 54:
            ip = fr[14:]
            ihl = 40
            if ip[6] != 17:
                continue
            # The masked IPv6 header: traffic class, flow label and hop limit set to ones.
            iph = bytearray(ip[:40]); iph[0] |= 0x0f; iph[1:4] = b'\xff\xff\xff'; iph[7] = 0xff
            ident = 'IPv6'
        else:
            continue
        udp = ip[ihl:]
        if struct.unpack('>H', udp[2:4])[0] != 4791:
            continue
        total += 1
        ulen = struct.unpack('>H', udp[4:6])[0]
        if not whole or ulen > len(udp) or ulen < 8 + 12 + 4:
            complain('%s #%d: truncated or too short' % (path, n))
            continue
        if flip and total == 1:
            udp[ulen - 5] ^= 0x01
        uh = bytearray(udp[:8]); uh[6:8] = b'\xff\xff'
        body = bytearray(udp[8:ulen - 4]); body[4] = 0xff
        want = zlib.crc32(b'\xff' * 8 + bytes(iph) + bytes(uh) + bytes(body)) & 0xffffffff
        got = int.from_bytes(udp[ulen - 4:ulen], 'little')
        if want != got:
            complain('%s #%d: ICRC %08x, computed %08x (%s)' % (path, n, got, want, ident))
        op = udp[8]
        pad = (udp[9] >> 4) & 3
        if pmtu is not None and op in EXTRA:
            payload = ulen - 8 - 12 - EXTRA[op] - 4
            if (payload) % 4:
                complain('%s #%d: opcode %d: payload+pad %d is not a multiple of 4' % (path, n, op, payload))
            if op in FIRST_MIDDLE and (payload != pmtu or pad):
                complain('%s #%d: opcode %d carries %d bytes (pad %d), want %d'
                         % (path, n, op, payload, pad, pmtu))
print('icrc: %d packets, %d bad' % (total, bad))
sys.exit(1 if bad or not total else 0)
