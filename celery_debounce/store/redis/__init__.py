"""The Redis store: :class:`~.store.WindowStore` (and :class:`~.store.WaitedStore`, its
writes each followed by ``WAIT``) on redis-py, with everything it runs on: the
transport (one node, Cluster, Sentinel), the scripts and their Lua files (``lua/``), the
operators' and workers' calls, the wake channel and the deploy-time checks. The key
layout (``store/keys.py``) and the record codec (``store/codec.py``, ``store/records.py``)
still sit beside the contract (docs/design.md's module map says where each one is)."""
