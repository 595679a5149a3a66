"""The host supervisor process: ``spark-ps-server shards --join HOST:PORT`` on every host.

It registers its host with the coordinator, heartbeats, and starts and stops the shard
processes (``python -m ps_server.shard``) the coordinator places on it.
"""
