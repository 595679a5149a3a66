"""The coordinator process: the control plane (shard map, barriers, clocks, round board).

Started by ``spark-ps-server`` (with its shards, on one host: ``service``) or
``spark-ps-server coordinator`` (across hosts: ``host_service``). Clients and shards call
it over gRPC; across hosts it places partitions on the host supervisors (``ps_server.host``).
The ``status`` and ``drain`` commands and the status page read it.
"""
