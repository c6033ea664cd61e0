"""The gym's hand-written codec of Tinker's protobuf wire format (services/training/tinker_api/
protowire.py) against the SDK's own generated messages and converters (tinker 0.38.0): requests
the SDK encodes decode to the same values here, outputs encoded here decode in the SDK to the same
values, and malformed or unsupported bodies are refused as 422 naming the problem."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from services.training.tinker_api import protowire
from services.training.tinker_api.protowire import WireError, WireSequence

tinker = pytest.importorskip("tinker")
np = pytest.importorskip("numpy")
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response  # noqa: E402


def datum(tokens: list[int], **inputs: Any) -> Any:
    """The SDK's datum; plain lists as loss inputs (the SDK makes the tensors)."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=dict[str, Any](inputs))


def sdk_request(data: list[Any], loss_fn: Any = "importance_sampling", config: dict[str, Any] | None = None,
                *, model_id: str = "m_1", seq_id: int = 3, forward_only: bool = False) -> bytes:
    """The bytes the SDK posts to ``/api/v1/forward_backward`` (resources/training.py does exactly this)."""
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id=model_id, seq_id=seq_id)
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return bytes(msg.SerializeToString())


def f32(values: list[float]) -> list[float]:
    """``values`` as float32 round-trips them (the wire's float width)."""
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


# -- the SDK encodes, the gym decodes ------------------------------------------------------------


def test_rl_data_from_the_sdk_decode_to_the_same_values() -> None:
    rows = [
        ([5, 6, 7, 8], [6, 7, 8, 9], [-0.5, -1.25, -3.0, -0.125], [0.0, 0.0, 0.75, 0.75]),
        ([300, 2, 459], [2, 459, 0], [-2.5, -1e-6, -17.0], [0.0, -1.5, -1.5]),
        ([1], [2], [-0.1], [1.0 / 3.0]),
    ]
    data = [datum(tokens, target_tokens=targets, logprobs=logprobs, advantages=adv)
            for tokens, targets, logprobs, adv in rows]

    decoded = protowire.decode_forward_backward(sdk_request(data, "ppo", {"clip_low_threshold": 0.7,
                                                                          "clip_high_threshold": 1.3}))

    assert (decoded.model_id, decoded.seq_id, decoded.loss_fn, decoded.forward_only) == ("m_1", 3, "ppo", False)
    assert decoded.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "clip_high_threshold": pytest.approx(1.3)}
    assert len(decoded.data) == 3
    for got, (tokens, targets, logprobs, adv) in zip(decoded.data, rows, strict=True):
        assert got.tokens == tokens
        assert set(got.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
        assert got.loss_fn_inputs["target_tokens"] == targets  # int64 on the wire: exact ints
        assert all(isinstance(t, int) for t in got.loss_fn_inputs["target_tokens"])
        assert got.loss_fn_inputs["logprobs"] == f32(logprobs)
        assert got.loss_fn_inputs["advantages"] == f32(adv)


def test_chunks_numpy_and_torch_tensors_config_strings_and_forward_only() -> None:
    torch = pytest.importorskip("torch")
    chunked = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), types.EncodedTextChunk(tokens=[3]),
                                       types.EncodedTextChunk(tokens=[2**31 - 1])])
    weights = types.TensorData.from_numpy(np.array([0.0, 1.0, 0.5, 2.0], dtype=np.float32))
    targets = types.TensorData.from_torch(torch.tensor([2, 3, 4, 5], dtype=torch.int64))
    data = [types.Datum(model_input=chunked, loss_fn_inputs={"target_tokens": targets, "weights": weights}),
            datum([9], target_tokens=[10])]

    decoded = protowire.decode_forward_backward(
        sdk_request(data, "cross_entropy", {"scale": 2.0, "mode": "mean"}, model_id="tm_x", seq_id=2**31 - 1,
                    forward_only=True))

    assert decoded.model_id == "tm_x" and decoded.seq_id == 2**31 - 1 and decoded.forward_only is True
    assert decoded.loss_fn_config == {"scale": 2.0, "mode": "mean"}  # v2 carries the string; numbers agree
    assert decoded.data[0].tokens == [1, 2, 3, 2**31 - 1]
    assert decoded.data[0].loss_fn_inputs == {"target_tokens": [2, 3, 4, 5], "weights": [0.0, 1.0, 0.5, 2.0]}
    assert decoded.data[1].tokens == [9] and decoded.data[1].loss_fn_inputs == {"target_tokens": [10]}


def test_an_empty_request_and_an_empty_tensor_decode() -> None:
    assert protowire.decode_forward_backward(b"") == protowire.ForwardBackwardRequest()
    data = [types.Datum(model_input=types.ModelInput.from_ints([4]),
                        loss_fn_inputs={"weights": types.TensorData.from_numpy(np.zeros(0, dtype=np.float32))})]
    decoded = protowire.decode_forward_backward(sdk_request(data))
    assert decoded.data[0].loss_fn_inputs == {"weights": []}


def test_int32_tensors_and_unknown_fields_are_read() -> None:
    """A hand-built request with fields the codec does not know (spans, future fields) and an
    int32 tensor (the proto's enum has it; the SDK sends int64)."""
    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=-1, loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.array([7, 8], dtype=np.int32).tobytes()
    datum.loss_fn_inputs["target_tokens"].CopyFrom(
        pb.Tensor(dense=np.array([8, 9], dtype=np.int32).tobytes(), dtype=pb.DTYPE_INT32, shape=[2]))
    datum.model_input_spans.add().prompt_tokens.length = 2
    raw = bytes(msg.SerializeToString()) + b"\xa0\x06\x01"  # field 100, varint 1: unknown, skipped
    decoded = protowire.decode_forward_backward(raw)
    assert decoded.seq_id == -1
    assert decoded.data[0].tokens == [7, 8] and decoded.data[0].loss_fn_inputs == {"target_tokens": [8, 9]}


# -- the gym encodes, the SDK decodes ------------------------------------------------------------


def test_forward_backward_output_decodes_in_the_sdk() -> None:
    outputs: list[dict[str, list[float]]] = [{"logprobs": [-0.5, -1.25, -3.0]}, {"logprobs": [-2.0]},
                                             {"logprobs": []}, {"logprobs": [-0.1, -0.2]}]
    metrics = {"loss:sum": 12.5, "grad_norm:mean": 0.25}

    out = deserialize_forward_backward_output(protowire.encode_forward_backward_output(outputs, metrics))

    assert out.loss_fn_output_type == "ArrayRecord"
    assert out.metrics == metrics
    assert len(out.loss_fn_outputs) == 4
    for got, want in zip(out.loss_fn_outputs, outputs, strict=True):
        assert got["logprobs"].dtype == "float32"
        assert got["logprobs"].tolist() == f32(want["logprobs"])
        assert got["logprobs"].shape == [len(want["logprobs"])]


def test_integer_outputs_stay_integers_and_mixed_fields_are_per_datum() -> None:
    outputs: list[dict[str, list[Any]]] = [{"logprobs": [-1.0, -2.0], "argmax": [4, 2**40]},
                                           {"logprobs": [-3.0], "argmax": [7]}]
    out = deserialize_forward_backward_output(protowire.encode_forward_backward_output(outputs, {}))
    assert [o["argmax"].dtype for o in out.loss_fn_outputs] == ["int64", "int64"]
    assert [o["argmax"].tolist() for o in out.loss_fn_outputs] == [[4, 2**40], [7]]
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]
    # A field a datum lacks is an empty tensor for it; no datum: no outputs.
    sparse = deserialize_forward_backward_output(
        protowire.encode_forward_backward_output([{"logprobs": [-1.0]}, {}], {"loss:sum": 1.0}))
    assert [o["logprobs"].tolist() for o in sparse.loss_fn_outputs] == [[-1.0], []]
    empty = deserialize_forward_backward_output(protowire.encode_forward_backward_output([], {"loss:sum": 0.0}))
    assert empty.loss_fn_outputs == [] and empty.metrics == {"loss:sum": 0.0}


def test_the_output_parses_as_the_sdks_message() -> None:
    raw = protowire.encode_forward_backward_output([{"logprobs": [-1.0, -2.0]}, {"logprobs": [-3.0]}],
                                                   {"loss:sum": 6.0})
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(raw)
    record = msg.loss_fn_outputs[0]
    assert record.type_tag == "ArrayRecord" and record.num_datums == 2
    batched = record.fields["logprobs"]
    assert batched.dtype == pb.DTYPE_FLOAT32
    assert np.frombuffer(batched.offsets, dtype=np.int64).tolist() == [0, 8, 12]  # byte offsets per datum
    assert dict(msg.metrics) == {"loss:sum": 6.0}


def test_sample_response_decodes_in_the_sdk() -> None:
    sequences = [WireSequence([21, 21, 5], [-0.25, -0.5, -4.0], "length"),
                 WireSequence([2**31 - 1, 0], [-1e-7, -30.0], "stop"),
                 WireSequence([], [], "length"),
                 WireSequence([3], None, "stop")]

    out = deserialize_sample_response(protowire.encode_sample_response(sequences))

    assert len(out.sequences) == 4
    for got, want in zip(out.sequences, sequences, strict=True):
        assert got.tokens == want.tokens
        assert got.stop_reason == want.stop_reason
    assert out.sequences[0].logprobs == f32([-0.25, -0.5, -4.0])
    assert out.sequences[1].logprobs == f32([-1e-7, -30.0])
    assert out.sequences[3].logprobs is None
    assert out.prompt_logprobs is None
    assert deserialize_sample_response(protowire.encode_sample_response([])).sequences == []


# -- refusals --------------------------------------------------------------------------------------


def _refused(raw: bytes, *words: str) -> WireError:
    with pytest.raises(WireError) as err:
        protowire.decode_forward_backward(raw)
    assert err.value.status == 422 and err.value.type == "invalid_request_error"
    message = str(err.value)
    assert "malformed forward_backward body" in message
    for word in words:
        assert word in message, message
    return err.value


def test_truncated_and_garbled_bodies_are_422() -> None:
    good = sdk_request([datum([1, 2, 3], target_tokens=[2, 3, 4])], "cross_entropy",
                       {"clip_low_threshold": 0.5})
    for cut in range(1, len(good)):
        try:
            protowire.decode_forward_backward(good[:cut])
        except WireError:
            continue  # refused as malformed: fine; any other exception fails the test
    _refused(b"\x80", "truncated varint")
    _refused(b"\xff" * 11, "truncated varint")
    _refused(b"\x0a\x05ab", "truncated field")  # model_id says 5 bytes, 2 follow
    _refused(b"\x09\x00\x00", "truncated field")  # a fixed64 cut short
    _refused(b"\x0d\x00", "truncated field")  # a fixed32 cut short
    _refused(b"\x0b", "wire type 3")  # groups are not used by these messages
    _refused(b"\x0a\x02\xff\xfe", "UTF-8")  # model_id not text
    _refused(b"\x22\x01\xc3", "UTF-8")  # loss_fn cut inside a character


def _datum_bytes(tensor: Any, name: str = "weights", tokens: bytes | None = None) -> bytes:
    msg = pb.ForwardBackwardRequest(model_id="m", loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.array([1, 2], dtype=np.int32).tobytes() if tokens is None else tokens
    datum.loss_fn_inputs[name].CopyFrom(tensor)
    return bytes(msg.SerializeToString())


def test_bad_tensors_and_unsupported_inputs_are_422() -> None:
    _refused(_datum_bytes(pb.Tensor(dense=b"\x00" * 6, dtype=pb.DTYPE_FLOAT32)), "whole number of elements")
    _refused(_datum_bytes(pb.Tensor(dense=b"\x00" * 4, dtype=pb.DTYPE_INT64)), "whole number of elements")
    _refused(_datum_bytes(pb.Tensor(dense=b"\x00" * 4)), "dtype 0")  # no dtype
    _refused(_datum_bytes(pb.Tensor(dense=b"\x00" * 4, dtype=pb.DTYPE_BFLOAT16)), "dtype 4")
    _refused(_datum_bytes(pb.Tensor(dense=b"", dtype=pb.DTYPE_INT64), tokens=b"\x01\x00\x00"), "whole number")
    sparse = types.TensorData(data=np.array([1.0], dtype=np.float32), dtype="float32", shape=[1, 2],
                              sparse_crow_indices=[0, 1], sparse_col_indices=[1])
    _refused(sdk_request([types.Datum(model_input=types.ModelInput.from_ints([1]),
                                      loss_fn_inputs={"weights": sparse})]), "sparse", "dense")
    image = types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png")])
    _refused(sdk_request([types.Datum(model_input=image, loss_fn_inputs={})]), "image")


def test_config_values_of_another_wire_type_are_not_read() -> None:
    entry = b"\x0a\x01k" + b"\x12\x05" + b"\x0d" + struct.pack("<f", 1.0)  # key "k", LossConfigValue{1: fixed32}
    raw = b"\x3a" + bytes([len(entry)]) + entry
    decoded = protowire.decode_forward_backward(raw)  # a fixed32 where a double belongs: not read
    assert decoded.loss_fn_config == {}
    bad_double = b"\x0a\x01k" + b"\x11" + b"\x00" * 8  # legacy map: key "k", value double 0
    assert protowire.decode_forward_backward(b"\x2a" + bytes([len(bad_double)]) + bad_double).loss_fn_config == {"k": 0.0}
