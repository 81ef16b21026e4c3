"""The store contract suite: what every windows' store must do (celery_debounce.store.api).

Written once against the Protocols and run against every implementation by the
``harness`` fixture (conftest.py): Redis single node, Redis Cluster, fakeredis. A new
store proves itself by adding its harness there and passing every case.
"""
