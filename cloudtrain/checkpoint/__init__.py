"""The checkpoint component (node side, stdlib only, Python 3.8, shipped in every bundle): everything about
checkpoints but torch.

Module map, bottom up: ``manifest`` says what a step folder and its manifest must look like before they are trusted;
``files`` judges a folder's files without trusting them (torn, empty, a stack's last-written file missing);
``download`` brings one checkpoint's files down through a staging folder, verified; ``store`` lists the complete
checkpoints a store holds, uploads and publishes (manifest last) and quarantines a corrupt one; ``restore`` brings the
newest that verifies to a node (the node's restore, the Checkpointer's); ``retention`` keeps the newest K in the store
and the newest folder on a node's disk; ``parts`` carries the other nodes' files of a checkpoint through the store;
``snapshots`` publishes a script's own folder layout as checkpoints; ``sync`` is the node's plain-script sync
(``step-<N>`` folders and snapshots, while the script runs and after); ``saves`` is the in-worker Checkpointer's side
without torch (its settings, the files a rank writes, rank 0's publish, which step to restore: the torch face is
cloudtrain/runtime/checkpointer.py); ``lineage`` keeps a job chain's state and its watchers' lease in the store;
``copy`` carries the newest checkpoint from one store to another (a job that moves); ``__main__`` is the command line
(``python -m cloudtrain.checkpoint restore|sync``).
"""
