"""The gRPC client of the PS: routing, chunking, concurrent fan-out, retries."""

from spark_ps.client.client import PSClient, PSError, get_client
from spark_ps.client.reach import PSUnreachable
from spark_ps.client.spec import TensorSpec

__all__ = ["PSClient", "PSError", "PSUnreachable", "TensorSpec", "get_client"]
