"""A stand-in for the image's torch, used only where no torch exists for the interpreter under test.

No torch wheel for Python 3.8 is installable here (PyPI has CUDA builds only for it), yet Azure's torch 1.13
environment runs its nodes on Python 3.8. The bootstrap and cloudtrain's node-side modules are what must run on
that interpreter; torch comes with the image. So tests/test_bootstrap.py puts this folder on PYTHONPATH only when
``import torch`` fails, and everything before and after torchrun is cloudtrain's real code.
"""
