"""The Redis store: :class:`~.store.WindowStore` (and :class:`~.store.WaitedStore`, its
writes each followed by ``WAIT``) on redis-py, with everything it runs on: the
transport (one node, Cluster, Sentinel), the scripts and their Lua files (``lua/``), the
key names and the record codec (``keys.py``, ``fields.py``, ``codec.py``), the shard
layout (``tags.py``), the operators' and workers' calls, the wake channel and the
deploy-time checks (docs/design.md's module map says where each one is)."""
