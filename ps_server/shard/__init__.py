"""One shard process: the data plane, slices of every model and the ops on them.

Started as ``python -m ps_server.shard`` by the coordinator's service on one host or by a
host supervisor (``ps_server.host``). It registers with the coordinator; clients call it
over gRPC (and its direct lane), and a primary forwards its mutations to its backup shard.
"""
