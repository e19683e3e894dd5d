"""The local provider: each node is a real torchrun agent on this machine, started by the same bootstrap a cloud
node runs, from a bundle staged in a local object store."""
