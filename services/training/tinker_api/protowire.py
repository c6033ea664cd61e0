"""The protobuf messages of Tinker's public wire format that the gym reads and writes, by hand.

The SDK posts ``forward_backward`` as a ``tinker_public.ForwardBackwardRequest`` and expects
``ForwardBackwardOutput`` and ``SampleResponse`` back as protobuf (``Accept:
application/x-protobuf``). The schema is small and stable, so the service carries a minimal
codec of its own rather than a dependency on the SDK's generated module: varints,
length-delimited fields, fixed 64-bit doubles — nothing else is used by these messages.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.errors import Unprocessable

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASON = {"stop": 0, "length": 1}


class WireError(Unprocessable):
    def __init__(self, message: str):
        super().__init__(f"malformed forward_backward body: {message}", param="body")


# -- decoding ------------------------------------------------------------------------------------

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): ints for varints, bytes for the rest."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: Any
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            if pos + width > len(buf):
                raise WireError("truncated field")
            value, pos = buf[pos:pos + width], pos + width
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError("truncated field")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise WireError(f"unsupported wire type {wire}")
        yield number, wire, value


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise WireError("a string field is not UTF-8") from None


def _double(raw: bytes) -> float:
    if len(raw) != 8:
        raise WireError("truncated double")
    return float(struct.unpack("<d", raw)[0])


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _numbers(raw: bytes, code: str) -> list[Any]:
    values = array(code)
    if len(raw) % values.itemsize:
        raise WireError("a tensor's bytes are not a whole number of elements")
    values.frombytes(raw)
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # big-endian host: the wire is little-endian
        values.byteswap()
    return values.tolist()


def _tensor(buf: bytes) -> list[Any]:
    dense: bytes | None = None
    dtype = 0
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN:
            dense = value
        elif number == 2:
            raise WireError("sparse (CSR) loss_fn_inputs are not supported by this gym; send dense tensors")
        elif number == 3 and wire == _VARINT:
            dtype = value
    raw = dense or b""
    if dtype == DTYPE_FLOAT32:
        return _numbers(raw, "f")
    if dtype == DTYPE_INT64:
        return _numbers(raw, "q")
    if dtype == DTYPE_INT32:
        return _numbers(raw, "i")
    raise WireError(f"unsupported tensor dtype {dtype}")


@dataclass
class WireDatum:
    tokens: list[int]
    loss_fn_inputs: dict[str, list[Any]]


@dataclass
class ForwardBackwardRequest:
    model_id: str = ""
    seq_id: int = 0
    data: list[WireDatum] = field(default_factory=list)
    loss_fn: str = ""
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False


def _entry(buf: bytes) -> tuple[str, list[tuple[int, int, Any]]]:
    key, rest = "", []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN:
            key = _text(value)
        else:
            rest.append((number, wire, value))
    return key, rest


def _datum(buf: bytes) -> WireDatum:
    tokens: list[int] = []
    inputs: dict[str, list[Any]] = {}
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN:  # Chunk
            for cn, cw, chunk in _fields(value):
                if cn != 1 or cw != _LEN:
                    raise WireError("only token (encoded_text) chunks are supported; image and audio chunks are not")
                for tn, tw, raw in _fields(chunk):
                    if tn == 1 and tw == _LEN:
                        tokens.extend(_numbers(raw, "i"))
        elif number == 2 and wire == _LEN:
            key, rest = _entry(value)
            for vn, vw, tensor in rest:
                if vn == 2 and vw == _LEN:
                    inputs[key] = _tensor(tensor)
            inputs.setdefault(key, [])
    return WireDatum(tokens, inputs)


def _config_v2(buf: bytes, into: dict[str, float | str]) -> None:
    """One ``loss_fn_config_v2`` entry (a number or a text value)."""
    key, rest = _entry(buf)
    for vn, vw, raw in rest:
        if vn == 2 and vw == _LEN:
            for cn, cw, cv in _fields(raw):
                if cn == 1 and cw == _I64:
                    into[key] = _double(cv)
                elif cn == 2 and cw == _LEN:
                    into[key] = _text(cv)


def decode_forward_backward(buf: bytes) -> ForwardBackwardRequest:
    out = ForwardBackwardRequest()
    v2: dict[str, float | str] = {}
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _LEN:
            out.model_id = _text(value)
        elif number == 2 and wire == _VARINT:
            out.seq_id = _signed(value)
        elif number == 3 and wire == _LEN:
            out.data.append(_datum(value))
        elif number == 4 and wire == _LEN:
            out.loss_fn = _text(value)
        elif number == 5 and wire == _LEN:
            key, rest = _entry(value)
            for vn, vw, raw in rest:
                if vn == 2 and vw == _I64:
                    out.loss_fn_config[key] = _double(raw)
        elif number == 6 and wire == _VARINT:
            out.forward_only = bool(value)
        elif number == 7 and wire == _LEN:
            _config_v2(value, v2)
    out.loss_fn_config.update(v2)  # the SDK dual-writes; the v2 map wins (it also carries strings)
    return out


# -- encoding ------------------------------------------------------------------------------------

def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _put_len(out: bytearray, number: int, payload: bytes) -> None:
    _put_varint(out, number << 3 | _LEN)
    _put_varint(out, len(payload))
    out += payload


def _put_int(out: bytearray, number: int, value: int) -> None:
    if value:
        _put_varint(out, number << 3 | _VARINT)
        _put_varint(out, value)


def _put_double(out: bytearray, number: int, value: float) -> None:
    _put_varint(out, number << 3 | _I64)
    out += struct.pack("<d", value)


def _le(values: Sequence[Any], code: str) -> bytes:
    arr = array(code, values)
    if struct.pack("=I", 1) != struct.pack("<I", 1):
        arr.byteswap()
    return arr.tobytes()


def _batched(per_datum: list[list[Any]], dtype: int) -> bytes:
    code = "f" if dtype == DTYPE_FLOAT32 else "q"
    data, offsets, at = bytearray(), [0], 0
    for values in per_datum:
        chunk = _le(values, code)
        data += chunk
        at += len(chunk)
        offsets.append(at)
    out = bytearray()
    _put_len(out, 1, bytes(data))
    _put_len(out, 2, _le(offsets, "q"))
    _put_int(out, 3, dtype)
    return bytes(out)


def encode_forward_backward_output(outputs: Sequence[Mapping[str, Sequence[Any]]], metrics: Mapping[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ``ArrayRecord`` holding every datum's output tensors
    (1-D, float32, or int64 for integer-valued fields), and the metrics."""
    record = bytearray()
    _put_len(record, 1, b"ArrayRecord")
    names = sorted({name for datum in outputs for name in datum})
    for name in names:
        per_datum = [[*datum.get(name, ())] for datum in outputs]
        is_int = all(isinstance(v, int) and not isinstance(v, bool) for d in per_datum for v in d) and any(per_datum)
        entry = bytearray()
        _put_len(entry, 1, name.encode())
        _put_len(entry, 2, _batched(per_datum, DTYPE_INT64 if is_int else DTYPE_FLOAT32))
        _put_len(record, 2, bytes(entry))
    _put_int(record, 3, len(outputs))
    out = bytearray()
    _put_len(out, 1, b"ArrayRecord")
    _put_len(out, 2, bytes(record))
    for key, value in metrics.items():
        entry = bytearray()
        _put_len(entry, 1, str(key).encode())
        _put_double(entry, 2, float(value))
        _put_len(out, 3, bytes(entry))
    return bytes(out)


@dataclass
class WireSequence:
    tokens: list[int]
    logprobs: list[float] | None
    stop_reason: str


def encode_sample_response(sequences: list[WireSequence]) -> bytes:
    out = bytearray()
    for seq in sequences:
        msg = bytearray()
        _put_int(msg, 1, STOP_REASON.get(seq.stop_reason, 1))
        _put_len(msg, 2, _le(seq.tokens, "i"))
        if seq.logprobs is not None:
            _put_len(msg, 3, _le(seq.logprobs, "f"))
        _put_len(out, 1, bytes(msg))
    return bytes(out)
