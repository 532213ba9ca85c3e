"""Protobuf's wire format, read without the protobuf package: TF checkpoint indexes and SentencePiece `.model` files
are protobuf messages, and a reader needs only the few fields it names."""

from __future__ import annotations


class Malformed(Exception):
    """Bytes that do not parse; the caller re-raises it as its own error naming the file."""


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the base-128 varint at pos."""
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Malformed("truncated or overlong varint")
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if b < 0x80:
            return value, pos


def fields(buf: bytes):
    """(field number, value) pairs of a protobuf message: ints for varint/fixed fields, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        tag, pos = varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, pos = int.from_bytes(buf[pos:pos + n], "little"), pos + n
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise Malformed(f"protobuf wire type {wire} (groups) is not read")
        if pos > len(buf):
            raise Malformed("protobuf message is truncated")
        yield tag >> 3, value
