"""A plugin whose import raises, as one built against another cloudtrain or missing a dependency does: it must never
break a command that does not name it (tests/test_plugins.py)."""

raise ImportError("brokenprov needs a module this machine does not have (cloudtrain's tests: on purpose)")
