"""The PS service, one subpackage per process.

``coordinator/`` is the coordinator process (the control plane), ``host/`` the per-host
supervisor that starts shard processes across hosts, and ``shard/`` one shard process (the
data plane). The modules at this level are what they share: the wire (``proto/``,
``wire``, ``auth``, ``tls``), timeouts, process plumbing, key routing, checkpoints,
replication's step logic and the server functions (``functions/``). A process's package
imports these and never another process's package (``tests/test_import_layers.py``).
"""
