"""Each platform's fake in one place, a module per platform: the server that stands in for the cloud's API on
127.0.0.1, and what tests share about it (a pod run as the kubelet runs it, ...). Their fixtures are in
tests/clouds.py (registered by conftest.py, each fake imported when its fixture starts)."""
