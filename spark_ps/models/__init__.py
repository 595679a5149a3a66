"""PSModel handles: small picklable references to sharded tensors on the PS."""

from spark_ps.models.tensors import PSEmbedding, PSMatrix, PSTensor, PSVector

__all__ = ["PSTensor", "PSVector", "PSMatrix", "PSEmbedding"]
