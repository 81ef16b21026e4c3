"""The Redis store: :class:`~.store.WindowStore` (and :class:`~.store.WaitedStore`, its
writes each followed by ``WAIT``) on redis-py. Its transport, cluster and Sentinel
clients, scripts and key layout still sit in ``store/`` beside the contract; they move
here in steps (docs/design.md's module map says where each one is)."""
