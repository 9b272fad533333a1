#!/usr/bin/env python3
"""scapy side of roce-user/tests/wire_scapy.rs: an independent RoCE v2 implementation.

scapy.contrib.roce provides BTH (with its ICRC), AETH and the CNP padding; the other extended
headers are described here with scapy fields, from IBA vol 1 9.3 / rxe_hdr.h, and the opcode ->
headers table is typed here from include/rdma/ib_pack.h and rxe_opcode.c (on purpose not taken
from roce-xdp, so the two implementations are checked against each other).

  wire_scapy.py gen               -> JSON list of packets built by scapy: {name, hex, fields}
  wire_scapy.py dissect < in.json -> for each {name, hex}: {name, fields, icrc_valid}

`fields` is the flat dict that scapy dissects out of a frame; the Rust test builds the same
dict from roce-xdp's parser and compares.
"""
import json
import sys

try:
    from scapy.all import Ether, Dot1Q, Dot1AD, IP, IPv6, UDP, Raw, raw
    from scapy.packet import Packet
    from scapy.fields import XLongField, XIntField, XByteField, X3BytesField
    from scapy.contrib.roce import BTH, AETH, CNPPadding, cnp
except ImportError as e:  # the Rust test turns this into a loud failure
    print(f"wire_scapy.py: cannot import scapy ({e}); run `pip install scapy`", file=sys.stderr)
    sys.exit(3)


class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), XIntField("dlen", 0)]


class AtomicETH(Packet):
    name = "AtomicETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), XLongField("swap", 0), XLongField("cmp", 0)]


class AtomicAckETH(Packet):
    name = "AtomicAckETH"
    fields_desc = [XLongField("orig", 0)]


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class IETH(Packet):
    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]


class FETH(Packet):
    name = "FETH"
    fields_desc = [XIntField("raw", 0)]


class DETH(Packet):
    name = "DETH"
    fields_desc = [XIntField("qkey", 0), XByteField("resv", 0), X3BytesField("sqpn", 0)]


for cls in (FETH, RETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH, AETH, CNPPadding):
    cls.extract_padding = lambda self, s: (b"", s)  # each header is fixed-size: rest is payload

# opcode -> (extended headers in wire order, payload?)  (ib_pack.h values, rxe_opcode.c layout)
OPS = {}
for base in (0x00, 0x20):
    OPS.update({
        base + 0x00: ([], True), base + 0x01: ([], True), base + 0x02: ([], True),
        base + 0x03: ([ImmDt], True), base + 0x04: ([], True), base + 0x05: ([ImmDt], True),
        base + 0x06: ([RETH], True), base + 0x07: ([], True), base + 0x08: ([], True),
        base + 0x09: ([ImmDt], True), base + 0x0a: ([RETH], True), base + 0x0b: ([RETH, ImmDt], True),
    })
OPS.update({
    0x0c: ([RETH], False), 0x0d: ([AETH], True), 0x0e: ([], True), 0x0f: ([AETH], True),
    0x10: ([AETH], True), 0x11: ([AETH], False), 0x12: ([AETH, AtomicAckETH], False),
    0x13: ([AtomicETH], False), 0x14: ([AtomicETH], False), 0x16: ([IETH], True), 0x17: ([IETH], True),
    0x1c: ([FETH, RETH], False), 0x1d: ([RETH], True),
    0x64: ([DETH], True), 0x65: ([DETH, ImmDt], True), 0x81: ([CNPPadding], False),
})

HDR_KEYS = {
    FETH: ("feth", ["raw"]),
    RETH: ("reth", ["va", "rkey", "dlen"]),
    AtomicETH: ("atomiceth", ["va", "rkey", "swap", "cmp"]),
    AtomicAckETH: ("atomicacketh", ["orig"]),
    ImmDt: ("immdt", ["imm"]),
    IETH: ("ieth", ["rkey"]),
    DETH: ("deth", ["qkey", "sqpn"]),
    AETH: ("aeth", ["syndrome", "msn"]),
    CNPPadding: ("cnp", []),
}


def dissect(frame: bytes):
    """scapy's view of a frame as a flat dict, plus whether scapy's own ICRC matches."""
    pkt = Ether(frame)
    f = {"eth.dst": pkt.dst, "eth.src": pkt.src}
    vlans = []
    layer = pkt.payload
    while isinstance(layer, (Dot1Q, Dot1AD)):
        vlans.append([layer.prio, layer.dei if hasattr(layer, "dei") else layer.id, layer.vlan])
        layer = layer.payload
    f["vlan"] = vlans
    if isinstance(layer, IP):
        f.update({"ip.version": 4, "ip.src": layer.src, "ip.dst": layer.dst, "ip.tos": layer.tos,
                  "ip.ttl": layer.ttl, "ip.id": layer.id, "ip.df": int(bool(layer.flags.DF)),
                  "ip.len": layer.len})
    elif isinstance(layer, IPv6):
        f.update({"ip.version": 6, "ip.src": layer.src, "ip.dst": layer.dst, "ip.tos": layer.tc,
                  "ip.ttl": layer.hlim, "ip.fl": layer.fl, "ip.len": layer.plen})
    else:
        raise ValueError("no IP layer")
    udp = layer[UDP]
    f.update({"udp.sport": udp.sport, "udp.dport": udp.dport, "udp.len": udp.len})
    bth = pkt[BTH]
    f.update({"bth.opcode": bth.opcode, "bth.se": bth.solicited, "bth.migreq": bth.migreq,
              "bth.pad": bth.padcount, "bth.pkey": bth.pkey, "bth.fecn": bth.fecn, "bth.becn": bth.becn,
              "bth.dqpn": bth.dqpn, "bth.ackreq": bth.ackreq, "bth.psn": bth.psn})
    rest = raw(bth.payload)
    hdrs, has_payload = OPS[bth.opcode]
    for cls in hdrs:
        h = cls(rest)
        key, names = HDR_KEYS[cls]
        for n in names:
            f[f"{key}.{n}"] = getattr(h, n)
        if cls is CNPPadding:
            f["cnp"] = 1
        rest = rest[len(raw(cls())):]
    pad = bth.padcount
    f["payload"] = rest[: len(rest) - pad].hex()
    f["pad"] = rest[len(rest) - pad:].hex()
    f["has_payload"] = int(has_payload)
    # The ICRC: the last four bytes of the UDP datagram, as on the wire.
    udp_start = 14 + 4 * len(vlans) + (layer.ihl * 4 if isinstance(layer, IP) else 40)
    end = udp_start + udp.len
    f["icrc_wire"] = frame[end - 4:end].hex()
    # Rebuild with the ICRC left to scapy and compare with what is on the wire.
    again = pkt.copy()
    again[BTH].icrc = None
    rebuilt = raw(again)
    return f, rebuilt == frame[: len(rebuilt)]


def build_table():
    """The packets scapy builds: every RC request/response kind, UD, UC, CNP, over v4 and v6."""
    out = []
    payloads = [b"", b"a", b"ab", b"abc", b"abcd", bytes(range(256)) * 4]
    rows = [
        ("send_first", 0x00, {}, 1024), ("send_middle", 0x01, {}, 1024), ("send_last", 0x02, {}, 3),
        ("send_last_imm", 0x03, {"imm": 0xdeadbeef}, 1), ("send_only", 0x04, {}, 5),
        ("send_only_imm", 0x05, {"imm": 0x01020304}, 2), ("send_last_inv", 0x16, {"ieth": 0x1234}, 4),
        ("send_only_inv", 0x17, {"ieth": 0xabcdef01}, 0),
        ("write_first", 0x06, {"reth": (0x7f0000001000, 0x55aa, 4096)}, 1024),
        ("write_middle", 0x07, {}, 1024), ("write_last", 0x08, {}, 2),
        ("write_last_imm", 0x09, {"imm": 7}, 3),
        ("write_only", 0x0a, {"reth": (0x1000, 0x77, 5)}, 5),
        ("write_only_imm", 0x0b, {"reth": (0x2000, 0x78, 1), "imm": 9}, 1),
        ("read_request", 0x0c, {"reth": (0xffffffff00000000, 0x99, 8192)}, None),
        ("read_resp_first", 0x0d, {"aeth": (0x1f, 0x10)}, 1024), ("read_resp_middle", 0x0e, {}, 1024),
        ("read_resp_last", 0x0f, {"aeth": (0x1f, 0x11)}, 3), ("read_resp_only", 0x10, {"aeth": (0x1f, 0x12)}, 4),
        ("ack", 0x11, {"aeth": (0x1f, 0xabcdef)}, None), ("ack_credits", 0x11, {"aeth": (0x05, 1)}, None),
        ("rnr_nak", 0x11, {"aeth": (0x20 | 12, 2)}, None), ("nak_psn_seq", 0x11, {"aeth": (0x60, 3)}, None),
        ("nak_inv_req", 0x11, {"aeth": (0x61, 4)}, None), ("nak_rem_access", 0x11, {"aeth": (0x62, 5)}, None),
        ("nak_rem_op", 0x11, {"aeth": (0x63, 6)}, None), ("nak_inv_rd", 0x11, {"aeth": (0x64, 7)}, None),
        ("atomic_ack", 0x12, {"aeth": (0x1f, 8), "orig": 0x0102030405060708}, None),
        ("cmp_swap", 0x13, {"atomic": (0x10008, 0x42, 0x1111, 0x2222)}, None),
        ("fetch_add", 0x14, {"atomic": (0x10010, 0x43, 1, 0)}, None),
        ("ud_send_only", 0x64, {"deth": (0x80010000, 0x123456)}, 3),
        ("ud_send_only_imm", 0x65, {"deth": (0x11111111, 0x1), "imm": 0x5}, 4),
        ("uc_send_only", 0x24, {}, 2), ("uc_write_only", 0x2a, {"reth": (0x3000, 0x5, 1)}, 1),
        ("cnp", 0x81, {"cnp": True}, None),
    ]
    for ipv in (4, 6):
        for i, (name, op, h, plen_idx) in enumerate(rows):
            payload = payloads[plen_idx] if isinstance(plen_idx, int) and plen_idx < len(payloads) else b""
            if isinstance(plen_idx, int) and plen_idx >= len(payloads):
                payload = bytes((j * 7) & 0xff for j in range(plen_idx))
            pad = (-len(payload)) & 3
            bth = BTH(opcode=op, dqpn=0x11 + i, psn=(0xfffff0 + i * 3) & 0xffffff, padcount=pad,
                      ackreq=int(op in (0x02, 0x04, 0x0a)), solicited=int(op == 0x05),
                      becn=int(op == 0x81), fecn=int(name == "send_only"),
                      pkey=0xffff if i % 5 else 0x8001)
            ext = b""
            if "deth" in h:
                ext += raw(DETH(qkey=h["deth"][0], sqpn=h["deth"][1]))
            if "reth" in h:
                va, rkey, dlen = h["reth"]
                ext += raw(RETH(va=va, rkey=rkey, dlen=dlen))
            if "atomic" in h:
                va, rkey, swap, cmp = h["atomic"]
                ext += raw(AtomicETH(va=va, rkey=rkey, swap=swap, cmp=cmp))
            if "aeth" in h:
                ext += raw(AETH(syndrome=h["aeth"][0], msn=h["aeth"][1]))
            if "orig" in h:
                ext += raw(AtomicAckETH(orig=h["orig"]))
            if "imm" in h:
                ext += raw(ImmDt(imm=h["imm"]))
            if "ieth" in h:
                ext += raw(IETH(rkey=h["ieth"]))
            if h.get("cnp"):
                ext += raw(CNPPadding())
            l2 = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b")
            if i % 7 == 3:
                l2 = l2 / Dot1Q(prio=3, vlan=100 + i)
            tos = [0x00, 0x02, 0x01, 0x03, 0x8a][i % 5]
            if ipv == 4:
                l3 = IP(src="10.77.0.3", dst="10.77.0.2", tos=tos, ttl=64 - i, id=0x1000 + i, flags="DF")
                l4 = UDP(sport=0xc000 + i, dport=4791, chksum=0)
            else:
                l3 = IPv6(src="fd00::3", dst="fd00::2", tc=tos, hlim=64 - i, fl=0x12345 + i)
                l4 = UDP(sport=0xc000 + i, dport=4791)
            frame = raw(l2 / l3 / l4 / bth / Raw(ext + payload + b"\0" * pad))
            fields, ok = dissect(frame)
            assert ok, name
            out.append({"name": f"v{ipv}_{name}", "hex": frame.hex(), "fields": fields})
    # The Mellanox CNP example (reference §1), built with scapy's own cnp() helper.
    mellanox = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:0b") / IP(
        src="22.22.22.8", dst="22.22.22.7", id=0x98c6, flags="DF", ttl=0x20, tos=0x89
    ) / UDP(sport=56238, dport=4791, chksum=0) / cnp(0xd2)
    frame = raw(mellanox)
    fields, ok = dissect(frame)
    assert ok, "mellanox_cnp"
    out.append({"name": "mellanox_cnp", "hex": frame.hex(), "fields": fields})
    return out


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("gen", "dissect"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "gen":
        json.dump(build_table(), sys.stdout)
    else:
        res = []
        for item in json.load(sys.stdin):
            fields, ok = dissect(bytes.fromhex(item["hex"]))
            res.append({"name": item["name"], "fields": fields, "icrc_valid": ok})
        json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
