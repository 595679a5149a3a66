"""``python -m ps_server.shard``: one shard process (see :mod:`ps_server.shard.server`)."""

from ps_server.shard.server import main

main()
