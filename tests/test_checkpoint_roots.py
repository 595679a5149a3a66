"""A shard serving other hosts checkpoints only under its checkpoint directory: the URI
comes from the network, and the shard writes with its own credentials. Real gRPC."""

from __future__ import annotations

import grpc
import pytest

from ps_server import checkpoint
from ps_server.proto import ps_pb2 as pb
from ps_server.proto import ps_pb2_grpc as pb_grpc
from ps_server.shard.server import checkpoint_roots, serve_shard
from ps_server.wire import RequestError


def test_the_roots_follow_the_bind_address():
    assert checkpoint_roots("127.0.0.1", "/ckpt") is None  # embedded: its user's own
    assert checkpoint_roots("10.213.1.10", "/ckpt") == ["/ckpt"]
    assert checkpoint_roots("0.0.0.0", "") == []  # a service with no directory: none


@pytest.mark.parametrize(
    "uri, ok",
    [
        ("{root}", True),
        ("{root}/fit-1", True),
        ("{root}/../elsewhere", False),
        ("{root}-sibling", False),
        ("/etc", False),
        ("s3://bucket/ckpt/x", False),
    ],
)
def test_check_under_roots(tmp_path, uri, ok):
    root = str(tmp_path / "ckpt")
    uri = uri.format(root=root)
    if ok:
        checkpoint.check_under_roots(uri, [root], "shard 0")
    else:
        with pytest.raises(RequestError) as e:
            checkpoint.check_under_roots(uri, [root], "shard 0")
        assert e.value.code == "PERMISSION_DENIED" and repr(uri) in str(e.value)
    checkpoint.check_under_roots(uri, None, "shard 0")  # no roots: anything goes
    with pytest.raises(RequestError, match="none: this PS has no checkpoint directory"):
        checkpoint.check_under_roots(uri, [], "shard 0")


def test_a_restricted_shard_refuses_checkpoints_elsewhere_and_writes_nothing(tmp_path):
    server, port, servicer = serve_shard(0, "127.0.0.1", 0, "")
    servicer.checkpoint_roots = [str(tmp_path / "allowed")]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb_grpc.ShardStub(channel)
        spec = pb.ModelSpec(name="w", kind="dense", dim=4, cols=1, dtype="float64", length=4)
        stub.CreateModel(pb.CreateModelRequest(spec=spec), timeout=10)
        outside = str(tmp_path / "outside")
        for rpc in (stub.Checkpoint, stub.Restore):
            with pytest.raises(grpc.RpcError) as e:
                rpc(pb.CheckpointRequest(uri=outside, version=1), timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "outside the allowed roots" in e.value.details()
        assert not (tmp_path / "outside").exists()
        inside = str(tmp_path / "allowed" / "fit")
        assert stub.Checkpoint(pb.CheckpointRequest(uri=inside, version=1), timeout=10).nbytes
        assert (tmp_path / "allowed" / "fit" / "v000001" / "shard-0.npz").exists()
    finally:
        channel.close()
        server.stop(0)
        if servicer.direct is not None:
            servicer.direct.close()
